"""Predicting every node count x node strategy x reducer or compressor x scaling from the
probes and the exchange, and ranking them by images/s or by predicted time to accuracy."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from ddlstudy.config import UseCase
from ddlstudy.records.memory import memory_of
from ddlstudy.records.plan import run_flags
from ddlstudy.report import load_runs
from ddlstudy.tools.advise.exchange import COMPRESSORS
from ddlstudy.tools.advise.memory import snapshot_more
from ddlstudy.tools.advise.nodes import Setting
from ddlstudy.tools.advise.probes import Candidate, typical


def convergence(runs_dir: Path | None, uc: UseCase) -> dict[str, Any]:
    """Epochs to the use case's target accuracy of the baseline, and each
    convergence-changing configuration's factor against it (median over its runs; a run
    that ended below the target counts as never: an infinite factor), from the completed
    runs in ``runs_dir``."""
    if runs_dir is None:
        return {}
    runs = [m for m in load_runs(runs_dir) if m.get("status") == "completed"
            and m.get("usecase") == uc.name
            and (m.get("time_to_target") or {}).get("target") == uc.train.target_accuracy
            and (m.get("time_to_target") or {}).get("reached") is not None]
    epochs: dict[str, list[float]] = {}
    for m in runs:
        key = convergence_key(m["config"], m["effective"]["global_batch"],
                              uc.train.batch_size)
        tta = m["time_to_target"]
        epochs.setdefault(key, []).append(tta["epoch"] if tta["reached"] else math.inf)
    base = statistics.median(epochs.get("baseline") or [math.inf])
    if math.isinf(base):
        return {"note": f"no run in {runs_dir} of {uc.name} that converges like the "
                        f"baseline reached its target accuracy {uc.train.target_accuracy}: "
                        "ranked by images/s"}
    return {"baseline_epochs": base, "target": uc.train.target_accuracy,
            "factor": {k: statistics.median(v) / base for k, v in epochs.items()},
            "runs": len(runs)}


def convergence_key(config: dict[str, Any], global_batch: int, batch: int) -> str:
    """What, of a configuration, changes how many epochs it needs ('baseline' if nothing):
    a global batch other than the use case's (weak scaling), top-k, step-wise."""
    parts = []
    if global_batch != batch:
        parts.append(f"batch {global_batch}")
    if config.get("backend", "local") != "local":
        if config.get("compress", "none").startswith("topk"):
            parts.append(config["compress"])
        elif config.get("reduce") == "step-wise":
            parts.append("step-wise")
    return " + ".join(parts) or "baseline"


def predictions(cands: list[Candidate], nodes: list[int], where: Setting, batch: int,
                gradient_bytes: int, train_images: int) -> tuple[list[dict], list[str]]:
    """Every row to rank, and why node counts were left out. On n nodes a step costs the
    node's compute plus the exchange: the compute is measured by an MPI probe of n nodes
    of that scaling where there is one (its step time less its exchange; a weak probe's
    node computes a whole batch, a strong one's its share), else by the other scaling's
    probe (a whole batch taken as n shares), else it is a node's share of the batch at its
    one-node probe's speed (nodes on other machines like this one)."""
    probed = [c for c in cands if c.speeds]
    base = next(c for c in probed if c.label == "sequential").speed
    rows, notes = [], []
    for n in nodes:
        if n == 1:
            rows += [_row(c.node or c, 1, None, c.speeds, base, train_images,
                          (batch, batch), "probed", busy=c.busy, probe=c)
                     for c in probed if c.nodes == 1]
            continue
        nodes_ = _computes([c for c in probed if c.nodes == n], batch, n)
        if not nodes_:
            fit_ = [c for c in probed if c.nodes == 1 and c.cores <= where.per_node(n)]
            if not fit_:
                notes.append(f"{n} nodes: they would share this machine's {where.cores} "
                             "cores, less than one each")
                continue
            nodes_ = [(c, {False: ([math.ceil(batch / n) / s for s in c.speeds], [])})
                      for c in fit_]
        for node, by_scaling in nodes_:
            rows += _node_rows(node, by_scaling, n, where, batch, gradient_bytes,
                               train_images, base)
    return rows, notes


def _computes(runs: list[Candidate], batch: int, n: int) -> list[tuple[Candidate, dict]]:
    """For each local candidate probed on ``n`` MPI nodes: by scaling (weak or not), every
    probe's compute seconds a step on a node (its step less its exchange, whatever its
    method), and the probes."""
    out: dict[str, tuple[Candidate, dict]] = {}
    for c in runs:
        weak = c.flags.get("scaling") == "weak"
        images = batch * n if weak else batch
        computes, probes = out.setdefault(c.node.label, (c.node, {}))[1].setdefault(
            weak, ([], []))
        computes += [images / s - e for s, e in zip(c.speeds, c.exchanges, strict=True)]
        probes.append(c)
    return list(out.values())


def method_of(c: Candidate | None) -> str | None:
    return c and (c.flags.get("compress") or c.flags.get("reduce"))


def reference(probes: list[Candidate], method: str) -> Candidate | None:
    """The probe whose exchange tells how ``method``'s goes inside a run: one of the same
    method, else of the same kind (a compressor's cast and sum are compute that training
    slows, a reducer's copies are not), else any."""
    same = [p for p in probes if method_of(p) == method]
    kind = [p for p in probes if (method_of(p) in COMPRESSORS) == (method in COMPRESSORS)]
    return (same or kind or probes or [None])[0]


def _node_rows(node: Candidate, by_scaling: dict, n: int, where: Setting, batch: int,
               gradient_bytes: int, train_images: int, base: float) -> list[dict]:
    """The rows of local candidate ``node`` on ``n`` nodes: every method, both scalings.
    A method's exchange is its fitted cost scaled by how the exchange of its reference
    probe (of the same scaling where there is one) compared with that probe's fit
    (``in_run``)."""
    rows = []
    everyone = [p for _, probes in by_scaling.values() for p in probes]
    extra = rank_extra(everyone, batch)
    for method in where.methods():
        for weak in (False, True):
            computes, probes = by_scaling.get(weak) or by_scaling[not weak]
            ref = reference([*probes, *everyone], method)  # this scaling's first
            exchange = in_run(ref, where, n, gradient_bytes) * \
                where.exchange.seconds(method, n, gradient_bytes)
            if weak not in by_scaling:  # the other scaling's node: n shares = one batch
                computes = [c * n if weak else c / n for c in computes]
            images = batch * n if weak else batch
            probed = next((p for p in by_scaling.get(weak, ((), ()))[1]
                           if method_of(p) == method), None)
            if probed:
                speeds, basis = probed.speeds, "probed"
            else:
                speeds = [images / (c + exchange) for c in computes]
                # probe + model: an n-node probe's compute, the exchange's alpha-beta;
                # model: one node's probe and the alpha-beta
                basis = "probe + model" if everyone else "model"
            rows.append(_row(node, n, method, speeds, base, train_images, (images, batch),
                             basis, where, exchange,
                             busy=node.busy or any(p.busy for p in probes), probe=probed,
                             process_extra=extra))
    return rows


def rank_extra(probes: list[Candidate], batch: int) -> int:
    """What an MPI rank's process holds beyond the same strategy's local process (its MPI
    library and its buffers, the exchange's own): the median over ``probes`` (MPI probes
    that recorded memory) of the measured process peak less the local prediction; 0
    without one. On tiny, 2 nodes on one host: 0.78 GiB measured against 0.50 predicted
    from the local process (-36 %), while the node's figure, which leaves out the
    libraries' pages, held within 4 %."""
    extras = []
    for p in probes:
        measured = memory_of({"backend": {"memory": p.memory or {}}})["peak_process_bytes"]
        local = p.node.process(p.node_batch(batch)) if p.node else None
        if measured and local:
            extras.append(measured - local)
    return round(statistics.median(extras)) if extras else 0


IN_RUN = (0.5, 4.0)
"""The bounds of ``in_run``: a probe whose exchange was further from its fit than this is
taken as a disturbed probe, not as how exchanges go in a run."""


def in_run(run: Candidate | None, where: Setting, n: int, gradient_bytes: int) -> float:
    """How much slower an exchange is inside a training run than when it was timed alone:
    the MPI probe's measured exchange a step over its method's fitted cost (1 without a
    probe). On tiny, 2 nodes on one 2-core host, step-wise took 3.98 ms a step in the probe
    against 3.16 ms fitted; the fitted costs alone predicted fp16 20 % fast."""
    method = method_of(run)
    fitted = where.exchange.seconds(method, n, gradient_bytes) if method else 0.0
    if not fitted or not run.exchanges:
        return 1.0
    low, high = IN_RUN
    return min(max(statistics.median(run.exchanges) / fitted, low), high)


def _row(c: Candidate, n: int, method: str | None, speeds: list[float], base: float,
         train_images: int, batches: tuple[int, int], basis: str,
         where: Setting | None = None, exchange: float = 0.0,
         busy: bool = False, probe: Candidate | None = None,
         process_extra: int = 0) -> dict[str, Any]:
    """A ranked row of local candidate ``c`` on ``n`` nodes: ``batches`` is (global batch,
    the use case's batch); ``busy``: its figures come from noisy probes only; ``probe``:
    the probe of this very configuration, if any (its measured memory); ``process_extra``:
    what an MPI rank holds beyond a local process (``rank_extra``)."""
    flags = dict(c.flags)
    label = c.label
    weak = batches[0] != batches[1]
    if n > 1:
        flags |= {"backend": "mpi", "nodes": n}
        flags |= {"compress": method} if method in COMPRESSORS else {"reduce": method}
        if weak:
            flags["scaling"] = "weak"
        label += f" x {n} MPI nodes, {method}" + (f" weak (batch {batches[0]})" if weak
                                                   else "")
        if where.hosts:
            flags["hosts"] = where.hosts
    speed = typical(speeds, busy)
    node_batch = math.ceil(batches[0] / n)
    need, process = c.need(node_batch), _plus(c.process(node_batch), process_extra)
    measured = _probed_memory(c, probe, node_batch)
    if measured:
        need, process = measured
    return {"label": label, "nodes": n, "flags": flags, "images_per_s": speed,
            "low": min(speeds), "high": max(speeds), "speedup": speed / base,
            "exchange_s": exchange, "epoch_s": train_images / speed, "basis": basis,
            "convergence_key": convergence_key(flags, *batches),
            "runnable": n == 1 or where.link is None, "noisy": busy,
            "predicted_peak_node_bytes": c.peak(node_batch),
            "predicted_need_node_bytes": need, "predicted_peak_process_bytes": process,
            "memory_basis": None if need is None else "probe" if measured else "model",
            "measured_peak_node_bytes": probe.measured_peak() if probe else None,
            "not_predicted": unpredicted(c)}


def _plus(value: int | None, extra: int) -> int | None:
    return None if value is None else value + extra


def _probed_memory(c: Candidate, probe: Candidate | None,
                   node_batch: int) -> tuple[int, int] | None:
    """A probed configuration's node need and largest process as its own probe measured
    them, each raised by what writing a snapshot adds (``snapshot_more``: a probe writes
    none); None where it was not probed or recorded no memory. Its probe measures what the
    baseline's parts scale only roughly: on an own ResNet, cpu-processes' node as its
    probe measured it was 2.7 % under its run's, as scaled from the baseline 10.5 %
    under; the pipelines' on tiny, tiny-resnet and tiny-full 0 to -4 % as probed, -7 to
    +6 % as scaled."""
    if probe is None or not probe.memory or c.split is None or c.footprint is None:
        return None
    node = probe.measured_peak()
    process = memory_of({"backend": {"memory": probe.memory}})["peak_process_bytes"]
    if node is None or process is None:
        return None
    more = snapshot_more(c.footprint, c.split, node_batch)
    return node + more, process + more


def unpredicted(c: Candidate) -> list[str]:
    """What a row cannot predict, in words (empty: its speed and memory both are)."""
    out = []
    if c.split is None:
        out.append("memory: the baseline's probe recorded none")
    if c.flags.get("precision", "fp32") != "fp32":
        out.append(f"memory: as in fp32 (autocast keeps the weights in fp32; the share of "
                   f"its activations kept in {c.flags['precision']} is not modelled)")
    if c.flags.get("strategy") in ("pipeline", "hybrid"):
        out.append("a process's memory: an even share of the node's, where a pipeline's "
                   "stages hold unequal parts")
    return out


SAME, CHANGES = "same convergence", "changes convergence"
"""The two lists of the ranking: configurations that train the baseline's model (or whose
epochs to target were measured), and those that train another whose cost in epochs is
not known, ranked after them by images/s only."""


def rank(rows: list[dict], conv: dict[str, Any], one_node: float | None = None) -> None:
    """Sort ``rows`` best first, in two lists (``list``: SAME, then CHANGES): by predicted
    time to target when earlier runs give the baseline's epochs to target, else by
    images/s. A row's scaling efficiency is its images/s over its nodes times ``one_node``
    (the fastest one-node probe; by default the fastest one-node row, which ``--nodes 2``
    alone does not rank): not the report's efficiency, speedup / cores."""
    factors = conv.get("factor") or {}
    for r in rows:
        key = r["convergence_key"]
        r["list"] = SAME if key == "baseline" or key in factors else CHANGES
        if key == "baseline":
            r["convergence"] = "like the baseline"
        elif key in factors and math.isinf(factors[key]):
            r["convergence"] = f"changes convergence ({key}): did not reach the target there"
        elif key in factors:
            r["convergence"] = f"measured: x{factors[key]:.2f} the baseline's epochs"
        else:
            r["convergence"] = (f"changes convergence ({key}); not measured"
                                + (" in --runs" if conv else ": give --runs"))
        if factors:
            epochs = conv["baseline_epochs"] * factors.get(key, 1.0)
            r["time_to_target_s"] = epochs * r["epoch_s"]
    if factors:
        rows.sort(key=lambda r: (r["list"] == CHANGES, r["time_to_target_s"],
                                 -r["images_per_s"]))
        for r in rows:  # JSON has no infinity: never is null
            r["time_to_target_s"] = finite(r["time_to_target_s"])
    else:
        rows.sort(key=lambda r: (r["list"] == CHANGES, -r["images_per_s"]))
    best_one = one_node or max(r["images_per_s"] for r in rows if r["nodes"] == 1)
    for i, r in enumerate(rows, 1):
        r["rank"] = i
        r["scaling_efficiency"] = r["images_per_s"] / (r["nodes"] * best_one)


def command(usecase: str, flags: dict[str, Any]) -> str:
    words = ["ddlstudy", "run", *run_flags(usecase, flags, Path("."))]
    i = words.index("--runs-dir")
    return " ".join(words[:i] + words[i + 2:])


def sureness(rows: list[dict]) -> str:
    """How sure the first place is, from the probes' spread."""
    if len(rows) < 2:
        return "one configuration: nothing to compare"
    a, b = rows[0], rows[1]
    if a["low"] == a["high"]:
        return "one probe each: no spread to judge by (give a larger --budget for more rounds)"
    if a["low"] > b["high"]:
        return (f"sure: the first's slowest probe ({a['low']:.1f} images/s) beats the "
                f"second's fastest ({b['high']:.1f})")
    return (f"a toss-up: the first two's probe ranges overlap ({a['low']:.1f}-{a['high']:.1f} "
            f"and {b['low']:.1f}-{b['high']:.1f} images/s); either will do")


def finite(value: float | None) -> float | None:
    """``value``, or None for an infinite one (a target never reached)."""
    return None if value is None or math.isinf(value) else value
