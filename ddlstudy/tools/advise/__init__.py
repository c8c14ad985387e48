"""`ddlstudy advise`: how to train this use case here. The paper's thesis as a command: find
the fastest local strategy on one node first, then spread it over nodes.

    ddlstudy advise --usecase tiny [--nodes 1,2,4 | --hosts emulated:ddl] [--link 10gbit]
                    [--budget 120] [--runs runs/demo] [--out runs/advise]

1. **Probe** every local strategy and layout that fits this machine (threads, replicas,
   processes, pipeline stages and micro-batches; GPUs where present) with real ``ddlstudy
   run`` processes of a few epochs of a few steps each, the framework's own loop and the
   use case's real model and batch. Their steady images/s (warm-up steps left out) are the
   node speeds. After the first round, MPI probes of the fastest strategies on the node
   counts that can be placed here (ranks on this host or on ``--hosts``) measure a node's
   compute as it is when the nodes run together (sharing cores, memory and the link);
   further rounds, while the budget lasts, probe again only the contenders (within 80 %
   of the leader), fastest first; the spread of a candidate's probes is how sure its
   figure is. What cannot fit (cores, memory, no GPU) is listed with the reason.
2. **Exchange**: every reducer and compressor timed on two buffer sizes between 2 MPI ranks
   placed where the nodes will be (``--hosts``, else this host's shared memory), fitted as
   ``predict`` fits them (alpha per message, beta per byte). ``--link RATE`` instead
   predicts separate machines like this one joined by that link (the fitted alpha, beta =
   8 / rate).
3. **Predict** every node count x node strategy x reducer or compressor x scaling:
   a step costs the node's compute plus the exchange (``predict``'s terms; a compressor's
   allgather costs ``(N-1)`` messages, its compute per byte as measured and its compressed
   bytes over the link), scaled by how much slower the N-node probe's own exchange was in
   its run than its fit. The compute is the N-node probe's step time less its measured
   exchange ("probe + model"; the probed configuration itself: "probed"), or, for node
   counts that cannot be placed here, the node's share of the batch at its one-node
   probe's speed ("model"). Nodes on this machine (no ``--hosts``, or emulated ones) share
   its cores: a node gets ``cores / N`` of them and only strategies that fit that many
   are used. Both scalings are probed, since a node's step is not proportional to its
   batch; where one has no probe, its compute is taken as N shares of the other's.
4. **Rank** by images/s, or, with ``--runs`` holding earlier runs that reached the use
   case's target accuracy, by predicted time to accuracy: configurations that change
   convergence (weak scaling, step-wise, top-k) have their epochs to target measured there
   against the baseline's; without such runs they are ranked as if they converged like
   the baseline and flagged.

``advise.json`` and ``advise.md`` go to ``--out``; the probes' run folders to
``<out>/probes``. ``ddlstudy study --from-advice <out>/advise.json`` runs the top
recommendations and says whether the first-ranked is the fastest measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ddlstudy.config import UseCase
from ddlstudy.errors import ConfigError
from ddlstudy.hosts import emulated_prefix
from ddlstudy.hosts import load as load_hosts
from ddlstudy.machine import environment
from ddlstudy.models import facts
from ddlstudy.records.plan import cell_config
from ddlstudy.tools.advise.checking import (
    NOT_THE_CONFIGURATION,
    check,
    check_runs,
    check_study,
    check_text,
    write_check,
)
from ddlstudy.tools.advise.exchange import COMPRESSORS, Exchange, measure_exchange, on_link
from ddlstudy.tools.advise.history import last_check_line
from ddlstudy.tools.advise.memory import (
    gib,
    linear_share,
    probe_box,
    refault_note,
    refaults,
)
from ddlstudy.tools.advise.nodes import Setting, mpi_candidates
from ddlstudy.tools.advise.output import as_csv, as_json, markdown, write
from ddlstudy.tools.advise.probes import (
    CONTENDER,
    PROBE_SECONDS,
    Candidate,
    admit,
    candidates,
    check_fit,
    over,
    probe,
    probe_settings,
    refuse_if_all_failed,
    say,
    settle_noisy,
    train_images,
)
from ddlstudy.tools.advise.ranking import (
    command,
    convergence,
    convergence_key,
    finite,
    predictions,
    rank,
    sureness,
)
from ddlstudy.tools.advise.schedule import Pace, probe_all


def say_skipped(cands: list[Candidate]) -> None:
    for c in cands:
        if c.skip:
            say(f"  skip {c.label}: {c.skip}")


def skip_unasked(cands: list[Candidate], strategies: list[str] | None) -> list[Candidate]:
    """``cands``, where only the layouts of ``strategies`` (--strategies; None: every one)
    are probed, and the sequential baseline always (speedups are against it)."""
    if strategies is None:
        return cands
    for name in strategies:
        if not any(c.flags.get("strategy") == name for c in cands):
            raise ConfigError("--strategies", f"{name} has no layout to probe: its "
                              "strategy class gives advise none (Strategy.probes)")
    for c in cands:
        name = c.flags.get("strategy", "sequential")
        if not c.skip and name != "sequential" and name not in strategies:
            c.skip = f"{name} is not among --strategies {','.join(strategies)}"
    return cands


def skip_non_nodes(cands: list[Candidate], nodes: list[int], where: Setting) -> None:
    """Without 1 in ``nodes`` a local configuration is ranked only as a node of MPI
    nodes: one wider than any node's cores here would spend the budget on a probe that
    ranks nothing. The sequential baseline is probed always (speedups are against it)."""
    if 1 in nodes:
        return
    room = max(where.per_node(n) for n in nodes)
    for c in cands:
        if not c.skip and c.label != "sequential" and c.cores > room:
            c.skip = (f"it needs {c.cores} cores and each of --nodes "
                      f"{','.join(map(str, nodes))} gets at most {room} here; add 1 to "
                      "--nodes to rank it on its own")


def advise(usecase: str | None, nodes: list[int], hosts: str | None, link: str | None,
           budget: float | None, out: Path, runs: Path | None = None, rounds: int = 3,
           box: float | None = None, datasets_dir: Path | None = None,
           host_count: int | None = None, wait: bool = False,
           data: dict[str, Any] | None = None, strategies: list[str] | None = None,
           memory: int | None = None, checkpointed: bool = False,
           precisions: tuple[str, ...] = ()) -> dict:
    """Probe, measure, predict and rank (the module's docstring): advise.json's content.
    ``budget``: seconds (None: auto, every layout once and then some); ``box``: a probe's
    steady seconds (None: ``probe_box``'s); ``host_count``: how many ``hosts`` (MPI probes
    up to that many); ``wait``: each probe waits for a quiet host; ``data``: every probe's
    run flags that say what it trains (``data_dir``, ``model``, ``heap``); ``strategies``:
    the only ones probed (and sequential); ``memory``: --memory's bytes (``_memory``);
    ``checkpointed``, ``precisions``: each layout also checkpointed, and in each of these."""
    started = time.monotonic()
    deadline, probes_dir = None if budget is None else started + budget, out / "probes"
    given = (data or {}) | ({"datasets_dir": str(datasets_dir)} if datasets_dir else {})
    uc = cell_config(usecase, given, probes_dir).usecase  # its folder's classes, its model
    cores, gpus = environment.usable_cores(), len(environment.gpus())
    gradient = (model := facts(uc.model, len(uc.classes))).gradient_bytes
    refaulted = refaults(model.largest_bytes, environment.free_page_reporting(), given.get("heap"))
    conv, pace = convergence(runs, uc), Pace(uc, box := probe_box(box, refaulted))
    cands = skip_unasked(candidates(cores, gpus, checkpointed, precisions), strategies)
    check_fit(cands, usecase, probes_dir, given)
    where = _setting(cores, hosts, link, host_count)
    limit, fits = _memory(cands, uc, memory, where)
    skip_non_nodes(cands, nodes, where)
    say(f"advise {uc.name}: {sum(not c.skip for c in cands)} local configurations to probe "
        f"on {cores} cores, {gpus} GPU(s); budget "
        f"{'auto' if budget is None else f'{budget:.0f} s'}, {gib(limit)} a node")
    say_skipped(cands)
    if any(n > 1 for n in nodes):
        t0 = time.monotonic()
        measured = measure_exchange(gradient, hosts)
        where.exchange = on_link(measured, link) if link else measured
        say(f"  exchange measured between 2 ranks on {measured.link} in "
            f"{time.monotonic() - t0:.0f} s")
    how = probe_all(cands, usecase, given, probes_dir, pace, deadline, rounds,
                    lambda done: mpi_candidates(done, nodes, where, gradient), wait, fits)
    refuse_if_all_failed(cands)
    rows, notes = predictions(cands, nodes, where, uc.train.batch_size, gradient,
                              train_images(uc, given.get("data_dir")))
    rows, left_out = fitting(rows, limit, where)
    notes = _shared(where, nodes) + _over(cands, limit) + notes + refault_note(refaulted)
    rank(rows, conv, max(c.speed for c in cands if c.speeds and c.nodes == 1))
    for r in rows:
        r["command"] = command(usecase, (data or {}) | r["flags"])
    return {"usecase": uc.name, "origin": origin(usecase, uc, given), "nodes": nodes,
            "hosts": hosts, "link": link, "budget_s": budget,
            "seconds": round(time.monotonic() - started, 1),
            "waited_s": round(how["waited_s"], 1), "rounds": how["rounds"],
            "every_layout": how["every_layout"],
            "budget_needed_s": how.get("budget_needed_s"), "probe_seconds": box,
            "cores": cores, "gpus": gpus, "batch": uc.train.batch_size,
            "gradient_bytes": gradient, "probe_settings": pace.settings(box) | given,
            "memory_bytes": limit, "probes": [c.record() for c in cands],
            "exchange": where.exchange.record() if where.exchange else None,
            "convergence": _recorded(conv), "notes": notes, "sureness": sureness(rows),
            "ranking": rows, "left_out": left_out, "host": environment.host(),
            "refaults": refaulted, "last_check": last_check_line(uc.name)}


def _recorded(conv: dict[str, Any]) -> dict[str, Any]:
    """The convergence as advise.json holds it (JSON has no infinity: never is null)."""
    return conv | ({"factor": {k: finite(v) for k, v in conv["factor"].items()}}
                   if "factor" in conv else {})


def _setting(cores: int, hosts: str | None, link: str | None, host_count: int | None
             ) -> Setting:
    """Where the nodes are: sharing this machine (this host, or emulated hosts) or not,
    how many can be probed for real, the memory of the one host nodes share."""
    return Setting(cores, shared=link is None and (hosts is None
                                                  or emulated_prefix(hosts) is not None),
                   exchange=None, hosts=hosts, link=link,
                   placeable=0 if link else host_count or cores,
                   host_memory=_host_memory(hosts, link))


def _memory(cands: list[Candidate], uc: UseCase, memory: int | None, where: Setting
            ) -> tuple[int, Callable[[list[Candidate]], None]]:
    """--memory's bytes (None: what this host has available now), and the check that
    leaves out what would need more once the baseline has been probed (``admit``): a
    node alone, and the nodes sharing one host together."""
    limit = memory or psutil.virtual_memory().available
    linear = linear_share(uc.model, len(uc.classes)) if any(
        c.footprint and c.footprint.tensor > 1 for c in cands if not c.skip) else 0.0
    return limit, lambda them: admit(them, limit, uc.train.batch_size, linear,
                                     where.on_one_host, where.host_memory)


def fitting(rows: list[dict], limit: int, where: Setting | None = None
            ) -> tuple[list[dict], list[dict]]:
    """The rows whose predicted need a node fits ``limit`` bytes, and whose nodes sharing
    one host fit its memory together (``where.host_memory``), the baseline's whatever it
    measured; and the others, each with why it was left out."""
    fit, left = [], []
    for r in rows:
        need = r.get("predicted_need_node_bytes")
        why = None if need is None or r["label"] == "sequential" else over(
            need, limit, where.on_one_host(r["nodes"]) if where else 1,
            where.host_memory if where else None)
        if why is None:
            fit.append(r)
        else:
            left.append({"label": r["label"], "nodes": r["nodes"],
                         "predicted_peak_node_bytes": r.get("predicted_peak_node_bytes"),
                         "predicted_need_node_bytes": need, "skipped": why})
    return fit, left


def _host_memory(hosts: str | None, link: str | None) -> int | None:
    """The memory of the one host nodes share: this one's available, or the emulated
    hosts' --memory; None for real hosts or a predicted --link (a machine a node)."""
    if link is not None:
        return None
    if hosts is None:
        return psutil.virtual_memory().available
    prefix = emulated_prefix(hosts)
    return load_hosts(prefix).memory if prefix else None


def origin(usecase: str | None, uc: UseCase, given: dict[str, Any]) -> dict[str, Any]:
    """Where what advise trained came from, as a run's manifest records it: the use case
    as given (a name, or its file; None: --data-dir's folder alone), its file, and the
    data flags (``study --from-advice`` gives them again)."""
    return {"usecase": usecase, "file": uc.source or None,
            "data_dir": given.get("data_dir"), "model": given.get("model"),
            "datasets_dir": given.get("datasets_dir")}


def _over(cands: list[Candidate], limit: int) -> list[str]:
    """The note a baseline that measured more than --memory needs."""
    base = next((c for c in cands if c.label == "sequential" and c.memory), None)
    peak = base.measured_peak() if base else None
    if peak is None or peak <= limit:
        return []
    return [f"the baseline (sequential) measured {gib(peak)} a node, over --memory "
            f"{gib(limit)}: it is ranked all the same, the reference of every speedup"]


def _shared(where: Setting, nodes: list[int]) -> list[str]:
    """The note a ranking of nodes that all share this host needs."""
    if not where.shared or all(n == 1 for n in nodes):
        return []
    return [f"every candidate shares this one host: its MPI 'nodes' are processes splitting "
            f"its {where.cores} cores and memory, so more nodes add exchange, not compute; "
            "to plan for separate machines give --link RATE (predicted) or --hosts"]


__all__ = ["COMPRESSORS", "CONTENDER", "NOT_THE_CONFIGURATION", "PROBE_SECONDS", "Pace",
           "Candidate", "Exchange", "Setting", "admit", "advise", "as_csv", "as_json",
           "candidates", "check", "check_fit", "check_runs", "check_study", "check_text",
           "last_check_line", "write_check", "command", "convergence",
           "convergence_key", "finite", "fitting", "markdown", "measure_exchange",
           "mpi_candidates", "on_link", "predictions", "probe", "probe_all", "probe_settings",
           "rank", "say", "settle_noisy", "sureness", "train_images", "write"]
