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
   bytes over the link). The compute is the N-node probe's step time less its measured
   exchange ("probe + model"; the probed configuration itself: "probed"), or, for node
   counts that cannot be placed here, the node's share of the batch at its one-node
   probe's speed ("model"). Nodes on this machine (no ``--hosts``, or emulated ones) share
   its cores: a node gets ``cores / N`` of them and only strategies that fit that many
   are used. Weak scaling's compute is taken as N times the strong one's.
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

import json
import logging
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddlstudy import environment, reducers
from ddlstudy.config import UseCase, load_usecase
from ddlstudy.errors import ConfigError, Unavailable
from ddlstudy.files import atomic_write_text
from ddlstudy.hosts import emulated_prefix, rate_bits
from ddlstudy.models import parameter_count
from ddlstudy.plan import cell_config, run_flags
from ddlstudy.reducers.compress import parse as parse_compress
from ddlstudy.report import load_runs
from ddlstudy.runfolder import MANIFEST, new_run_id, run_env
from ddlstudy.runner import preflight
from ddlstudy.sampler import NOISY_CORES, OthersLoad, wait_quiet_at_most
from ddlstudy.strategies import REGISTRY as STRATEGIES
from ddlstudy.tools.predict import Cost, fit, measure_sizes
from ddlstudy.training import WARMUP_STEPS

log = logging.getLogger("ddlstudy")
COMPRESSORS = ("fp16", "topk:0.01")
"""The compressions advise weighs against the reducers."""
PROBE_STEADY_STEPS = 24
"""Steady steps (after each epoch's warm-up) a probe times, over as many epochs as that
takes: enough that a tiny probe's figure is not one step's noise."""
CONTENDER = 0.8
"""After the first round, only candidates whose fastest probe reaches this share of the
leader's speed (its fastest probe, ``fastest``) are probed again."""
MEMORY_SHARE = 0.8
"""Of the memory available now, what the probes' replicas may plan to use."""
BYTES_PER_WEIGHT = 16
"""A training replica's weights, gradients, momentum and one copy in flight (float32)."""


@dataclass
class Candidate:
    """A configuration to probe: a local strategy and layout, or (``nodes`` > 1) that
    strategy on MPI nodes; its ``ddlstudy run`` flags and the cores one node occupies."""

    label: str
    flags: dict[str, Any]
    cores: int
    replicas: int = 1
    nodes: int = 1
    node: Candidate | None = None
    """For MPI nodes: the local candidate each node runs."""
    skip: str = ""
    speeds: list[float] = field(default_factory=list)
    exchanges: list[float] = field(default_factory=list)
    """For MPI nodes: each probe's exchange seconds a step (its slowest rank's, which
    waits for no other)."""
    runs: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    noisy: list[dict[str, Any]] = field(default_factory=list)
    """Probes during which other processes kept more than NOISY_CORES of the host busy:
    kept for the record, left out of ``speeds`` unless no quiet probe came (``busy``)."""
    busy: bool = False
    """Whether its figure comes from noisy probes only."""

    @property
    def speed(self) -> float:
        return fastest(self.speeds)

    def record(self) -> dict[str, Any]:
        out = {"label": self.label, "flags": self.flags, "cores": self.cores}
        if self.skip:
            return out | {"skipped": self.skip}
        return out | {"images_per_s": [round(s, 2) for s in self.speeds], "runs": self.runs,
                      "probe_s": [round(s, 1) for s in self.seconds]} | (
            {"exchange_s": [round(e, 5) for e in self.exchanges]} if self.nodes > 1 else {}) | (
            {"noisy": self.noisy, "only_noisy": self.busy} if self.noisy else {})


def candidates(cores: int, gpus: int) -> list[Candidate]:
    """Every strategy's layouts worth probing on a machine of ``cores`` and ``gpus`` (its
    ``Strategy.probes``; those that cannot fit carry the reason in ``skip``)."""
    out = []
    for cls in STRATEGIES.loaded().values():
        for p in cls().probes(cores, gpus):
            skip = "" if p.gpus or p.cores <= cores else (
                f"needs {p.cores} processes, one a core, and this machine has {cores} "
                f"usable cores")
            out.append(Candidate(p.label, p.flags, p.cores, p.replicas, skip=skip))
    if cores < 2:
        out.append(Candidate("layouts of 2 or more workers", {}, 2,
                             skip=f"this machine has {cores} usable core"))
    return out


def check_fit(cands: list[Candidate], usecase: str, params: int, available: int,
              runs_dir: Path) -> None:
    """Mark what this machine cannot run: preflight's refusals (no GPU, a layout the model
    does not allow) and replicas whose weights would not fit in memory."""
    for c in cands:
        if c.skip:
            continue
        need = c.replicas * params * BYTES_PER_WEIGHT
        if need > MEMORY_SHARE * available:
            c.skip = (f"{c.replicas} replica(s) need about {need / 2**30:.1f} GiB of weights, "
                      f"gradients and momentum; {available / 2**30:.1f} GiB is available")
            continue
        try:
            preflight(cell_config(usecase, c.flags, runs_dir))
        except (Unavailable, ConfigError) as exc:
            c.skip = str(exc)


def train_images(uc: UseCase) -> int:
    """About how many images an epoch trains on (the split rounds each class)."""
    return uc.data.images - round(uc.data.images * uc.train.val_fraction)


def probe_settings(usecase: str, steps: int) -> dict[str, Any]:
    """The run flags of a probe: enough epochs of at most ``steps_per_epoch`` steps to time
    ``steps`` steady steps, one validation batch an epoch, no snapshot, no sampler."""
    uc = load_usecase(usecase)
    per_epoch = max(1, math.ceil(train_images(uc) / uc.train.batch_size))
    steady_per_epoch = max(1, min(per_epoch, WARMUP_STEPS + steps) - WARMUP_STEPS)
    return {"epochs": max(1, math.ceil(steps / steady_per_epoch)),
            "max_steps": min(per_epoch, WARMUP_STEPS + steps), "max_val_steps": 1,
            "no_snapshot": True, "sample_hz": 0}


def probe(c: Candidate, usecase: str, settings: dict[str, Any], runs_dir: Path) -> None:
    """One real ``ddlstudy run`` of ``c``: its steady images/s (median of its epochs), and
    the cores other processes used meanwhile (above NOISY_CORES: a noisy probe)."""
    run_id = new_run_id(usecase, c.flags.get("strategy", "sequential"))
    env = run_env(run_id)
    argv = ["run", "--quiet", *run_flags(usecase, settings | c.flags, runs_dir)]
    start, others = time.monotonic(), OthersLoad()
    out = subprocess.run([sys.executable, "-m", "ddlstudy", *argv], capture_output=True,
                         text=True, env=env)
    c.seconds.append(time.monotonic() - start)
    load = others.cores()
    manifest = runs_dir / run_id / MANIFEST
    if out.returncode or not manifest.is_file():
        tail = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        c.skip = f"the probe failed: {tail}"
        return
    m = json.loads(manifest.read_text())
    speed = statistics.median(e["steady_images_per_s"] for e in m["epochs"])
    exchange = None
    if c.nodes > 1:
        ranks = m["backend"]["exchange"]["per_rank"]
        exchange = min(r["exchange_s"] / max(r["steps"], 1) for r in ranks)
    if load > NOISY_CORES:
        c.noisy.append({"images_per_s": round(speed, 2), "others_cores": round(load, 2),
                        "run": run_id} | ({"exchange_s": exchange} if c.nodes > 1 else {}))
        return
    c.speeds.append(speed)
    c.runs.append(run_id)
    if exchange is not None:
        c.exchanges.append(exchange)


def settle_noisy(cands: list[Candidate]) -> None:
    """A candidate that got noisy probes only is ranked on them, flagged ``busy``."""
    for c in cands:
        if not c.speeds and c.noisy and not c.skip:
            c.busy = True
            c.speeds = [n["images_per_s"] for n in c.noisy]
            c.runs = [n["run"] for n in c.noisy]
            if c.nodes > 1:
                c.exchanges = [n["exchange_s"] for n in c.noisy]


def say(text: str) -> None:
    """Progress on stderr (not with --quiet)."""
    log.info("%s", text)


def probe_all(cands: list[Candidate], usecase: str, settings: dict[str, Any],
              runs_dir: Path, deadline: float, rounds: int,
              grow: Callable[[list[Candidate]], list[Candidate]] = lambda done: [],
              wait: bool = False) -> tuple[int, float]:
    """Rounds of probes while the deadline allows. The first probes every candidate; after
    it ``grow`` adds those that depend on it (MPI nodes of the fastest local strategies),
    probed first in the second round; later rounds probe first again those whose probes
    were all noisy (another process kept the host busy), then only the contenders, fastest
    first: those whose fastest probe reaches ``CONTENDER`` of the leader's speed (a
    candidate far behind needs no more probes to be ranked below it). A probe starts only
    if the slowest earlier probe of it (or of any, before its first) would end before the
    deadline; the baseline always runs once. With ``wait``, each probe first waits for a
    quiet host (at most WAIT_MOST_S), and the wait is not charged to the budget. Returns
    the rounds completed and the seconds waited."""
    count, waited = 0, 0.0
    try:
        for r in range(rounds):
            if r == 0:
                order = [c for c in cands if not c.skip]
            else:
                more = grow(cands) if r == 1 else []
                cands += more
                ran = [c for c in cands if c.speeds and not c.skip]
                lead = max((c.speed for c in ran), default=0.0)
                again = [c for c in cands if c.noisy and not c.speeds and not c.skip]
                order = more + again + sorted(
                    (c for c in ran if max(c.speeds) >= CONTENDER * lead),
                    key=lambda c: -c.speed)
            for c in order:
                if c.skip or len(c.speeds) > r:
                    continue
                if wait:
                    w = _wait_quiet()
                    deadline, waited = deadline + w, waited + w
                done = _probe_in_budget(c, cands, usecase, settings, runs_dir, deadline,
                                        count + 1, r)
                if done is None:
                    return r, waited
                count += 1
        return rounds, waited
    finally:
        settle_noisy(cands)


def _wait_quiet() -> float:
    """Wait for a quiet host (at most WAIT_MOST_S); the seconds waited."""
    start = time.monotonic()
    busy = wait_quiet_at_most()
    if busy > NOISY_CORES:
        say(f"  the host stayed busy ({busy:.2f} cores): probing anyway")
    return time.monotonic() - start


def _probe_in_budget(c: Candidate, cands: list[Candidate], usecase: str,
                     settings: dict[str, Any], runs_dir: Path, deadline: float, count: int,
                     r: int) -> bool | None:
    """Probe ``c`` if the deadline allows (None, every unprobed candidate marked skipped,
    when it does not)."""
    guess = max(c.seconds or [s for o in cands for s in o.seconds] or [0.0])
    left = deadline - time.monotonic()
    if guess > left and (c.speeds or c.noisy or c.label != "sequential"):
        for o in cands:
            if not o.speeds and not o.noisy and not o.skip:
                o.skip = "not probed: the time budget ran out (give a larger --budget)"
        say(f"  budget: {max(left, 0):.0f} s left, a probe takes about {guess:.0f} s;"
            " probing stops")
        return None
    quiet = len(c.speeds)
    probe(c, usecase, settings, runs_dir)
    if c.skip:
        got = c.skip
    elif len(c.speeds) > quiet:
        got = f"{c.speeds[-1]:.1f} images/s"
    else:
        n = c.noisy[-1]
        got = (f"{n['images_per_s']:.1f} images/s, noisy: other processes used "
               f"{n['others_cores']:.2f} cores (not counted; --wait-quiet waits)")
    say(f"  [probe {count}, round {r + 1}] {c.label}: {got} ({c.seconds[-1]:.1f} s; "
        f"{max(deadline - time.monotonic(), 0):.0f} s of the budget left)")
    return True


@dataclass(frozen=True)
class Exchange:
    """What averaging a gradient costs between nodes: each reducer's alpha-beta (predict's
    fit), and each compressor's alpha, compute per byte (gamma) and link per byte."""

    reduce: dict[str, Cost]
    compress: dict[str, tuple[float, float, float]]
    """spec -> (alpha s per message, gamma s per gradient byte, beta s per wire byte)."""
    link: str

    def seconds(self, method: str, n: int, nbytes: float) -> float:
        if n == 1:
            return 0.0
        if method in self.reduce:
            return self.reduce[method].seconds(method, n, nbytes)
        alpha, gamma, beta = self.compress[method]
        ratio = parse_compress(method).wire_ratio
        return (n - 1) * alpha + nbytes * (gamma + (n - 1) * ratio * beta)

    def record(self) -> dict[str, Any]:
        return {"link": self.link,
                "reduce": {r: {"alpha_s": c.alpha, "beta_s_per_byte": c.beta}
                           for r, c in self.reduce.items()},
                "compress": {s: {"alpha_s": a, "gamma_s_per_byte": g, "beta_s_per_byte": b}
                             for s, (a, g, b) in self.compress.items()}}


def measure_exchange(gradient_bytes: int, hosts: str | None, repeats: int = 3) -> Exchange:
    """Every reducer and compressor on the gradient's size (at most 16 MiB) and on 1/16 of
    it, between 2 ranks placed on ``hosts`` (this host if None)."""
    big = min(gradient_bytes // 4, 4 * 2**20)
    sizes = (big, max(big // 16, 1024))
    samples: dict[str, dict[int, float]] = {}
    for floats, ms in measure_sizes(list(sizes), 2, repeats, hosts, COMPRESSORS).items():
        for method, times in ms.items():
            samples.setdefault(method, {})[4 * floats] = statistics.median(times) / 1e3
    reduce = fit({r: samples[r] for r in reducers.REGISTRY})
    wire = reduce["allreduce"].beta  # between 2 ranks allreduce sends the buffer once
    compress = {}
    for spec in COMPRESSORS:
        (s1, t1), (s2, t2) = sorted(samples[spec].items())
        slope = max((t2 - t1) / (s2 - s1), 0.0)
        ratio = parse_compress(spec).wire_ratio
        compress[spec] = (max(t1 - s1 * slope, 0.0), max(slope - ratio * wire, 0.0), wire)
    return Exchange(reduce, compress, hosts or "this host (shared memory)")


def on_link(measured: Exchange, link: str) -> Exchange:
    """Separate machines like this one joined by ``link``: the fitted alphas and compute,
    beta = 8 / rate."""
    beta = 8 / rate_bits(link)
    return Exchange({r: Cost(c.alpha, beta) for r, c in measured.reduce.items()},
                    {s: (a, g, beta) for s, (a, g, _) in measured.compress.items()}, link)


def convergence(runs_dir: Path | None, usecase: str) -> dict[str, Any]:
    """Epochs to the use case's target accuracy of the baseline, and each
    convergence-changing configuration's factor against it (median over its runs; a run
    that ended below the target counts as never: an infinite factor), from the completed
    runs in ``runs_dir``."""
    if runs_dir is None:
        return {}
    uc = load_usecase(usecase)
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


@dataclass
class Setting:
    """Where the nodes are: the cores each gets, how they exchange, how many can be probed
    for real (MPI ranks on this host or on ``hosts``; none for a predicted ``link``)."""

    cores: int
    shared: bool
    """Whether the nodes share this machine's cores (this host, or emulated hosts)."""
    exchange: Exchange | None
    hosts: str | None
    link: str | None
    placeable: int

    def per_node(self, n: int) -> int:
        return self.cores // n if self.shared else self.cores

    def methods(self) -> list[str]:
        return [*self.exchange.reduce, *self.exchange.compress] if self.exchange else []


def mpi_candidates(cands: list[Candidate], nodes: list[int], where: Setting,
                   gradient_bytes: int, best: int = 2) -> list[Candidate]:
    """MPI probes: for each node count that can be placed, the ``best`` fastest probed
    local strategies that fit a node's cores, exchanging with the cheapest method there."""
    local = sorted((c for c in cands if c.speeds and c.nodes == 1), key=lambda c: -c.speed)
    out = []
    for n in nodes:
        if not 1 < n <= where.placeable:
            continue
        method = min(where.methods(), key=lambda m: where.exchange.seconds(m, n,
                                                                           gradient_bytes))
        for c in [c for c in local if c.cores <= where.per_node(n)][:best]:
            flags = c.flags | {"backend": "mpi", "nodes": n} | (
                {"compress": method} if method in COMPRESSORS else {"reduce": method}) | (
                {"hosts": where.hosts} if where.hosts else {})
            out.append(Candidate(f"{c.label} x {n} MPI nodes, {method}", flags, c.cores,
                                 c.replicas, nodes=n, node=c))
    return out


def predictions(cands: list[Candidate], nodes: list[int], where: Setting, batch: int,
                gradient_bytes: int, train_images: int) -> tuple[list[dict], list[str]]:
    """Every row to rank, and why node counts were left out. On n nodes a step costs the
    node's compute plus the exchange: the compute is measured by an MPI probe of n nodes
    where there is one (its step time less its exchange), else it is a node's share of the
    batch at its one-node probe's speed (nodes on other machines like this one)."""
    probed = [c for c in cands if c.speeds]
    base = next(c for c in probed if c.label == "sequential").speed
    rows, notes = [], []
    for n in nodes:
        if n == 1:
            rows += [_row(c.node or c, 1, None, c.speeds, base, train_images,
                          (batch, batch), "probed", busy=c.busy)
                     for c in probed if c.nodes == 1]
            continue
        runs = [c for c in probed if c.nodes == n]
        # compute seconds a step of batch/n a node, per probe
        if runs:
            nodes_ = [(c.node, [batch / s - e for s, e in zip(c.speeds, c.exchanges,
                                                               strict=True)], c)
                      for c in runs]
        else:
            fit_ = [c for c in probed if c.nodes == 1 and c.cores <= where.per_node(n)]
            if not fit_:
                notes.append(f"{n} nodes: they would share this machine's {where.cores} "
                             "cores, less than one each")
                continue
            nodes_ = [(c, [math.ceil(batch / n) / s for s in c.speeds], None) for c in fit_]
        for node, computes, run in nodes_:
            probed_method = run and (run.flags.get("compress") or run.flags.get("reduce"))
            for method in where.methods():
                exchange = where.exchange.seconds(method, n, gradient_bytes)
                for weak in (False, True):
                    images = batch * n if weak else batch
                    if run and method == probed_method and not weak:
                        speeds, basis = run.speeds, "probed"
                    else:
                        speeds = [images / (c * (n if weak else 1) + exchange)
                                  for c in computes]
                        # probe + model: the n-node probe's compute, the exchange's
                        # alpha-beta; model: one node's probe and the alpha-beta
                        basis = "probe + model" if run else "model"
                    rows.append(_row(node, n, method, speeds, base, train_images,
                                     (images, batch), basis, where, exchange,
                                     busy=node.busy or bool(run and run.busy)))
    return rows, notes


def _row(c: Candidate, n: int, method: str | None, speeds: list[float], base: float,
         train_images: int, batches: tuple[int, int], basis: str,
         where: Setting | None = None, exchange: float = 0.0,
         busy: bool = False) -> dict[str, Any]:
    """A ranked row of local candidate ``c`` on ``n`` nodes: ``batches`` is (global batch,
    the use case's batch); ``busy``: its figures come from noisy probes only."""
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
    speed = fastest(speeds)
    return {"label": label, "nodes": n, "flags": flags, "images_per_s": speed,
            "low": min(speeds), "high": max(speeds), "speedup": speed / base,
            "exchange_s": exchange, "epoch_s": train_images / speed, "basis": basis,
            "convergence_key": convergence_key(flags, *batches),
            "runnable": n == 1 or where.link is None, "noisy": busy}


def rank(rows: list[dict], conv: dict[str, Any]) -> None:
    """Sort ``rows`` best first: by predicted time to target when earlier runs give the
    baseline's epochs to target, else by images/s."""
    factors = conv.get("factor") or {}
    for r in rows:
        key = r["convergence_key"]
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
        rows.sort(key=lambda r: (r["time_to_target_s"], -r["images_per_s"]))
        for r in rows:  # JSON has no infinity: never is null
            r["time_to_target_s"] = finite(r["time_to_target_s"])
    else:
        rows.sort(key=lambda r: -r["images_per_s"])
    best_one = max((r["images_per_s"] for r in rows if r["nodes"] == 1), default=1.0)
    for i, r in enumerate(rows, 1):
        r["rank"] = i
        r["efficiency"] = r["images_per_s"] / (r["nodes"] * best_one)


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


def advise(usecase: str, nodes: list[int], hosts: str | None, link: str | None,
           budget: float, out: Path, runs: Path | None = None, rounds: int = 3,
           steps: int = PROBE_STEADY_STEPS, datasets_dir: Path | None = None,
           host_count: int | None = None, wait: bool = False) -> dict:
    """Probe, measure, predict and rank (see the module's docstring): advise.json's
    content. ``host_count``: how many ``hosts`` there are (MPI probes up to that many);
    ``wait``: each probe waits for a quiet host first."""
    started = time.monotonic()
    deadline = started + budget
    uc = load_usecase(usecase)
    probes_dir = out / "probes"
    settings = probe_settings(usecase, steps) | (
        {"datasets_dir": str(datasets_dir)} if datasets_dir else {})
    cores, gpus = environment.usable_cores(), len(environment.gpus())
    params = parameter_count(uc.model, len(uc.classes))
    cands = candidates(cores, gpus)
    check_fit(cands, usecase, params, psutil.virtual_memory().available, probes_dir)
    say(f"advise {usecase}: {sum(not c.skip for c in cands)} local configurations to probe "
        f"on {cores} cores, {gpus} GPU(s); budget {budget:.0f} s")
    for c in cands:
        if c.skip:
            say(f"  skip {c.label}: {c.skip}")
    where = Setting(cores, shared=link is None and (hosts is None
                                                   or emulated_prefix(hosts) is not None),
                    exchange=None, hosts=hosts, link=link,
                    placeable=0 if link else host_count or cores)
    if any(n > 1 for n in nodes):
        t0 = time.monotonic()
        measured = measure_exchange(4 * params, hosts)
        where.exchange = on_link(measured, link) if link else measured
        say(f"  exchange measured between 2 ranks on {measured.link} in "
            f"{time.monotonic() - t0:.0f} s")
    done, waited = probe_all(cands, usecase, settings, probes_dir, deadline, rounds,
                             lambda done: mpi_candidates(done, nodes, where, 4 * params),
                             wait)
    batch = uc.train.batch_size
    rows, notes = predictions(cands, nodes, where, batch, 4 * params, train_images(uc))
    conv = convergence(runs, uc.name)
    rank(rows, conv)
    for r in rows:
        r["command"] = command(usecase, r["flags"])
    result = {"usecase": uc.name, "nodes": nodes, "hosts": hosts, "link": link,
              "budget_s": budget, "seconds": round(time.monotonic() - started, 1),
              "waited_s": round(waited, 1),
              "rounds": done, "cores": cores, "gpus": gpus, "batch": batch,
              "gradient_bytes": 4 * params, "probe_settings": settings,
              "probes": [c.record() for c in cands],
              "exchange": where.exchange.record() if where.exchange else None,
              "convergence": conv | ({"factor": {k: finite(v) for k, v in
                                                 conv["factor"].items()}}
                                     if "factor" in conv else {}),
              "notes": notes, "sureness": sureness(rows),
              "ranking": rows, "host": environment.host()}
    return result


def markdown(result: dict, top: int = 10) -> str:
    where = result["link"] and f"a {result['link']} link between machines like this one" \
        or result["hosts"] or "this host (nodes share its cores and memory)"
    lines = [f"# ddlstudy advise: {result['usecase']}", "",
             f"{result['cores']} cores, {result['gpus']} GPU(s); nodes {result['nodes']} on "
             f"{where}; {result['rounds']} probe round(s) in {result['seconds']:.0f} s "
             f"(budget {result['budget_s']:.0f} s"
             + (f"; {result['waited_s']:.0f} s more waiting for a quiet host"
                if result.get("waited_s") else "") + ")", ""]
    conv = result["convergence"]
    ttt = bool(conv.get("factor"))
    lines.append(f"ranked by {'predicted time to ' + str(conv['target']) if ttt else 'images/s'}"
                 f"; {result['sureness']}")
    if conv.get("note"):
        lines.append(f"({conv['note']})")
    lines += ["", "| rank | configuration | nodes | images/s (probes) | basis | speedup | "
              "efficiency |" + (" time to target |" if ttt else "") + " convergence | how |",
              "|---|---|---|---|---|---|---|" + ("---|" if ttt else "") + "---|---|"]
    for r in result["ranking"][:top]:
        how = f"`{r['command']}`" if r["runnable"] else \
            "predicted for that link: run it with --hostfile on such machines"
        lines.append(f"| {r['rank']} | {r['label']} | {r['nodes']} | {r['images_per_s']:.1f} "
                     f"({r['low']:.1f}-{r['high']:.1f}) | {r['basis']}"
                     f"{', busy host' if r.get('noisy') else ''} | {r['speedup']:.2f} | "
                     f"{r['efficiency']:.0%} |"
                     + (f" {_figure(r['time_to_target_s'], ' s')} |" if ttt else "")
                     + f" {r['convergence']} | {how} |")
    best = {}
    for r in result["ranking"]:
        best.setdefault(r["nodes"], r)
    lines += ["", "best per node count:", ""]
    lines += [f"- {n}: {r['label']}, {r['images_per_s']:.1f} images/s (rank {r['rank']})"
              for n, r in sorted(best.items())]
    lines += [f"- {note}" for note in result["notes"]]
    noisy = [n for p in result["probes"] for n in p.get("noisy", [])]
    if noisy:
        lines.append(f"- {len(noisy)} probe(s) ran while other processes kept more than "
                     f"{NOISY_CORES} cores of this host busy (up to "
                     f"{max(n['others_cores'] for n in noisy):.2f}): not counted where the "
                     "configuration had a quiet probe; rows marked 'busy host' had none. "
                     "--wait-quiet waits for a quiet host before each probe")
    skipped = [p for p in result["probes"] if "skipped" in p]
    if skipped:
        lines += ["", "not probed:", ""] + [f"- {p['label']}: {p['skipped']}" for p in skipped]
    return "\n".join(lines)


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "advise.json", out / "advise.md"]
    atomic_write_text(paths[0], json.dumps(result, indent=2) + "\n")
    atomic_write_text(paths[1], markdown(result) + "\n")
    return paths


NOT_THE_CONFIGURATION = {"datasets_dir", "epochs", "max_steps", "max_val_steps"}
"""A study cell's flags that say how long it trains or where its data is, not what it
runs: left out when matching cells to the advice's rows."""


def check(advice: dict, runs_dir: Path, study: dict) -> dict:
    """The advice against a study of its recommendations (``study.json``'s record): each
    cell's measured figure (its best repeat, as advise ranks on its best probe) beside the
    predicted one, and whether the first-ranked is within 10 % of the best measured. Runs
    marked noisy (other processes kept the host busy) are left out, as the report leaves
    them out of speedups."""
    by_flags = {json.dumps(r["flags"], sort_keys=True): r for r in advice["ranking"]}
    manifests = {m["id"]: m for m in load_runs(runs_dir)}
    ttt = bool((advice.get("convergence") or {}).get("factor"))
    measured: dict[str, list[float]] = {}
    noisy = 0
    for cell in study["cells"]:
        m = manifests.get(cell["run"])
        what = {k: v for k, v in cell["flags"].items() if k not in NOT_THE_CONFIGURATION}
        row = by_flags.get(json.dumps(what, sort_keys=True))
        if row is None or m is None or m.get("status") != "completed":
            continue
        if (m.get("host_load") or {}).get("noisy") is True:
            noisy += 1
            continue
        if ttt:
            tta = m.get("time_to_target") or {}
            value = tta["seconds"] if tta.get("reached") else math.inf
        else:
            value = statistics.median(e["steady_images_per_s"] for e in m["epochs"])
        measured.setdefault(json.dumps(row["flags"], sort_keys=True), []).append(value)
    rows = []
    for key, values in measured.items():
        r = by_flags[key]
        rows.append({"rank": r["rank"], "label": r["label"],
                     "predicted": r["time_to_target_s"] if ttt else r["images_per_s"],
                     "measured": min(values) if ttt else fastest(values),
                     "runs": len(values)})
    rows.sort(key=lambda r: r["rank"])
    out: dict[str, Any] = {"criterion": "time to target (s)" if ttt else "images/s",
                           "rows": rows, "noisy_left_out": noisy}
    if rows and rows[0]["rank"] == 1 and not math.isinf(min(r["measured"] for r in rows)):
        better = min if ttt else max
        best = better(rows, key=lambda r: r["measured"])
        first = rows[0]["measured"]
        ratio = (best["measured"] / first) if ttt else (first / best["measured"])
        out |= {"best_rank": best["rank"], "first_over_best": ratio,
                "confirmed": ratio >= 0.9}
    for r in rows:
        r["measured"] = finite(r["measured"])
    return out


def fastest(speeds: list[float]) -> float:
    """A configuration's images/s from several runs of it: the fastest. On a shared host
    another tenant only ever slows a run, and not evenly: here a 2-thread cpu-intraop run
    of tiny measured about 800 or about 1,170 images/s, process by process, on a quiet
    host, while the sequential one stayed within 825-910. The median of 3 probes then
    ranked by which mode came up twice; the fastest run is the configuration's own speed."""
    return max(speeds)


def finite(value: float | None) -> float | None:
    """``value``, or None for an infinite one (a target never reached)."""
    return None if value is None or math.isinf(value) else value


def _figure(value: float | None, unit: str = "") -> str:
    return "never" if value is None else f"{value:.1f}{unit}"


def check_text(result: dict) -> str:
    lines = [f"advice against the measured runs ({result['criterion']}):", "",
             "| rank | configuration | predicted | measured | runs |", "|---|---|---|---|---|"]
    lines += [f"| {r['rank']} | {r['label']} | {_figure(r['predicted'])} | "
              f"{_figure(r['measured'])} | {r['runs']} |" for r in result["rows"]]
    if "confirmed" in result:
        verdict = "confirmed" if result["confirmed"] else "not confirmed"
        lines += ["", f"{verdict}: the first-ranked measured {result['first_over_best']:.0%} "
                  f"of the best measured (rank {result['best_rank']}); within 10 % confirms"]
    else:
        lines += ["", "not checked: the first-ranked configuration did not complete (or "
                  "only on a busy host), or none reached the target"]
    if result.get("noisy_left_out"):
        lines.append(f"({result['noisy_left_out']} run(s) left out: other processes kept "
                     "the host busy; --wait-quiet waits for a quiet host before each cell)")
    return "\n".join(lines)
