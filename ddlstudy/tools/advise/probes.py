"""Probing: every local strategy and layout that fits this machine, and the MPI nodes of the
fastest, timed with real ``ddlstudy run`` processes in rounds while the budget lasts."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlstudy.config import PROBE_SECONDS, UseCase
from ddlstudy.data.folder import IMAGE_EXTENSIONS
from ddlstudy.errors import ConfigError, Unavailable, UsageError
from ddlstudy.machine import forkserver
from ddlstudy.machine.sampler import NOISY_CORES, OthersLoad
from ddlstudy.records.memory import node_bytes
from ddlstudy.records.plan import cell_config, run_flags
from ddlstudy.records.runfolder import MANIFEST, load_manifest, new_run_id, run_env
from ddlstudy.runner import preflight
from ddlstudy.strategies import REGISTRY as STRATEGIES
from ddlstudy.strategies.base import Footprint
from ddlstudy.tools.advise.memory import (
    Split,
    gib,
    need,
    predict,
    process_peak,
    split,
)
from ddlstudy.training import WARMUP_STEPS

log = logging.getLogger("ddlstudy")
CONTENDER = 0.8
"""After the first round, only candidates whose figure (``typical``) reaches this share of
the leader's are probed again."""


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
    """Each probe's wall time, start-up included."""
    trained_s: list[float] = field(default_factory=list)
    """Each probe's time in its epochs (the rest of ``seconds`` is its start-up)."""
    step_s: list[float] = field(default_factory=list)
    """Each probe's steady seconds a step."""
    noisy: list[dict[str, Any]] = field(default_factory=list)
    """Probes during which other processes kept more than NOISY_CORES of the host busy:
    kept for the record, left out of ``speeds`` unless no quiet probe came (``busy``)."""
    busy: bool = False
    """Whether its figure comes from noisy probes only."""
    footprint: Footprint | None = None
    """What a node of it holds, in the baseline's units (``check_fit``)."""
    split: Split | None = None
    """The baseline's probe's memory in parts, once it has run (``admit``)."""
    memory: dict[str, Any] | None = None
    """Its last probe's ``backend.memory`` record."""

    @property
    def speed(self) -> float:
        return typical(self.speeds, self.busy)

    def node_batch(self, batch: int) -> int:
        """The images a node of it computes a step, of the use case's ``batch``."""
        weak = self.flags.get("scaling") == "weak"
        return batch if weak else math.ceil(batch / self.nodes)

    def peak(self, node_batch: int) -> int | None:
        """Its predicted peak bytes a node computing ``node_batch`` images a step (None
        before the baseline's probe)."""
        fp = (self.node or self).footprint
        return predict(fp, self.split, node_batch) if fp and self.split else None

    def need(self, node_batch: int) -> int | None:
        """What a node of it is predicted to need of its memory (``memory.need``)."""
        fp = (self.node or self).footprint
        return need(fp, self.split, node_batch) if fp and self.split else None

    def process(self, node_batch: int) -> int | None:
        """Its predicted peak of a node's largest process (``memory.process_peak``)."""
        fp = (self.node or self).footprint
        return process_peak(fp, self.split, node_batch) if fp and self.split else None

    def measured_peak(self) -> int | None:
        """Its last probe's peak a node, as recorded."""
        return node_bytes(self.memory, self.nodes) if self.memory else None

    def record(self) -> dict[str, Any]:
        out = {"label": self.label, "flags": self.flags, "cores": self.cores}
        if self.split:  # the baseline's probe: in the parts every prediction scales
            out["predicted_peak_node_bytes"] = self.peak(self.node_batch(self.split.batch))
            out["predicted_need_node_bytes"] = self.need(self.node_batch(self.split.batch))
            out |= {"memory_split": self.split.record()} if self.label == "sequential" else {}
        if self.memory:
            out["measured_peak_node_bytes"] = self.measured_peak()
        if self.skip:
            return out | {"skipped": self.skip}
        return out | {"images_per_s": [round(s, 2) for s in self.speeds], "runs": self.runs,
                      "probe_s": [round(s, 1) for s in self.seconds]} | (
            {"exchange_s": [round(e, 5) for e in self.exchanges]} if self.nodes > 1 else {}) | (
            {"noisy": self.noisy, "only_noisy": self.busy} if self.noisy else {})


def candidates(cores: int, gpus: int, checkpointed: bool = False,
               precisions: tuple[str, ...] = ()) -> list[Candidate]:
    """Every strategy's layouts worth probing on a machine of ``cores`` and ``gpus`` (its
    ``Strategy.probes``; those that cannot fit carry the reason in ``skip``); with
    ``checkpointed``, each one whose strategy checkpoints again with its activations
    checkpointed (the memory saved against the recomputation's time, both probed); and
    each again in every one of ``precisions`` (bf16, fp16: a strategy that refuses one
    says why, as preflight does)."""
    out = []
    for cls in STRATEGIES.loaded().values():
        for p in cls().probes(cores, gpus):
            skip = "" if p.gpus or p.cores <= cores else (
                f"needs {p.cores} processes, one a core, and this machine has {cores} "
                f"usable cores")
            out.append(Candidate(p.label, p.flags, p.cores, p.replicas, skip=skip))
            if checkpointed and cls.checkpoints:
                out.append(Candidate(f"{p.label}, checkpointed", p.flags | {
                    "checkpoint_activations": True}, p.cores, p.replicas, skip=skip))
            out += [Candidate(f"{p.label}, {precision}", p.flags | {"precision": precision},
                              p.cores, p.replicas, skip=skip) for precision in precisions]
    if cores < 2:
        out.append(Candidate("layouts of 2 or more workers", {}, 2,
                             skip=f"this machine has {cores} usable core"))
    return out


def check_fit(cands: list[Candidate], usecase: str, runs_dir: Path,
              given: dict[str, Any] | None = None) -> None:
    """Mark what this machine cannot run (preflight's refusals: no GPU, a layout the model
    does not allow); give the rest their strategy's ``Footprint`` (memory: ``admit``)."""
    for c in cands:
        if c.skip:
            continue
        try:
            cfg = cell_config(usecase, (given or {}) | c.flags, runs_dir)
            preflight(cfg)
            c.footprint = STRATEGIES.named(cfg.strategy)().footprint(cfg)
        except (Unavailable, ConfigError) as exc:
            c.skip = str(exc)


def admit(cands: list[Candidate], limit: int, batch: int, linear: float = 0.0,
          sharing: Callable[[int], int] = lambda nodes: 1, host: int | None = None) -> None:
    """Once the baseline has been probed: every candidate's predicted need a node from
    its probe, and those over ``limit`` bytes (--memory), or whose nodes sharing one host
    (``sharing``: how many of N do) need more than its ``host`` bytes together, left out,
    never started (the baseline is ranked whatever it measured: speedups are against it)."""
    base = next((c for c in cands if c.label == "sequential" and c.memory), None)
    found = base and (base.split or split(base.memory, batch, linear))
    if not found:
        return
    for c in cands:
        c.split = found
        needs = c.need(c.node_batch(batch))
        if c is not base and not c.skip and needs is not None:
            c.skip = over(needs, limit, sharing(c.nodes), host) or ""


def over(need: int, limit: int, together: int = 1, host: int | None = None) -> str | None:
    """Why a configuration is left out for memory (None: it fits): a node's need over
    --memory, or its ``together`` nodes on one host over the host's ``host`` bytes."""
    if need > limit:
        return f"needs about {gib(need)} a node, and --memory is {gib(limit)}"
    if together > 1 and host is not None and need * together > host:
        return (f"its {together} nodes on one host need about {gib(need * together)} "
                f"together, and the host has {gib(host)}")
    return None


def train_images(uc: UseCase, folder: Path | None = None) -> int:
    """About how many images an epoch trains on (the split rounds each class): of the
    synthetic set, or of the images in ``folder`` (or the use case's own)."""
    folder = folder or uc.data.dir
    images = uc.data.images if folder is None else sum(
        1 for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    return images - round(images * uc.train.val_fraction)


def refuse_if_all_failed(cands: list[Candidate]) -> None:
    """Nothing to rank when the baseline's probe failed: say why, with its error."""
    base = next((c for c in cands if c.label == "sequential"), None)
    if base is not None and not base.speeds and not base.noisy:
        raise UsageError(f"the baseline's probe did not run ({base.skip or 'no time left'}); "
                         f"nothing can be ranked without it")


def steps_per_epoch(uc: UseCase, folder: Path | None = None) -> int:
    """The optimizer steps of one of ``uc``'s epochs (of the images in ``folder`` if given)."""
    return max(1, math.ceil(train_images(uc, folder) / uc.train.batch_size))


def probe_settings(uc: UseCase, steady_s: float = PROBE_SECONDS,
                   warmup: int = WARMUP_STEPS, epochs: int = 1,
                   per_epoch: int | None = None) -> dict[str, Any]:
    """The run flags of a probe: ``epochs`` of at most an epoch's ``per_epoch`` steps, each
    ending once its steady steps (after ``warmup``) have taken about ``steady_s`` (the
    time box: as many steps as a figure needs, whatever a step costs), one validation
    batch an epoch, no snapshot, no sampler. An epoch of one step has no warm-up to leave
    out: the run's own default then stands."""
    per_epoch = per_epoch or steps_per_epoch(uc)
    warm = {"warmup_steps": min(warmup, per_epoch - 1)} if per_epoch > 1 else {}
    return {"epochs": epochs, "max_steps": per_epoch, **warm,
            "steady_seconds": round(steady_s, 2), "max_val_steps": 1, "no_snapshot": True,
            "sample_hz": 0}


def probe(c: Candidate, usecase: str, settings: dict[str, Any], runs_dir: Path) -> None:
    """One real ``ddlstudy run`` of ``c``: its steady images/s (median of its epochs), and
    the cores other processes used meanwhile (above NOISY_CORES: a noisy probe)."""
    run_id = new_run_id("probe", c.flags.get("strategy", "sequential"),
                        c.flags.get("backend", "local"))
    env = run_env(run_id)
    argv = ["run", "--quiet", *run_flags(usecase, settings | c.flags, runs_dir)]
    start, others = time.monotonic(), OthersLoad()
    out = forkserver.captured(argv, env)  # `python -m ddlstudy` forked warm
    c.seconds.append(time.monotonic() - start)
    load = others.cores()
    manifest = runs_dir / run_id / MANIFEST
    if out.returncode or not manifest.is_file():
        tail = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        c.skip = f"the probe failed: {tail}"
        return
    m = load_manifest(manifest)
    c.memory = (m.get("backend") or {}).get("memory") or c.memory
    speed = steady_speed(m)
    c.trained_s.append(sum(e["epoch_time_s"] for e in m["epochs"]))
    c.step_s.append(m["effective"]["global_batch"] / speed if speed else 0.0)
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


def steady_speed(manifest: dict) -> float:
    """A run's images/s as advise ranks and checks them: the median of its epochs' steady
    images/s."""
    return statistics.median(e["steady_images_per_s"] for e in manifest["epochs"])


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


def typical(speeds: list[float], busy: bool = False) -> float:
    """A configuration's images/s from several probes of it: their median, what a run of
    it is likely to measure; a busy host's probes only (``busy``): the fastest, since
    another tenant only ever slows a run, and not evenly. On a quiet host the probes of
    one configuration still differ process by process (a 2-thread cpu-intraop run of tiny
    measured about 800 or about 1,170 images/s): their fastest, advise's figure until
    2026-11-29, put the contenders 5-20 % above their runs and made the first choice the
    luckiest probe rather than the fastest configuration."""
    return max(speeds) if busy else statistics.median(speeds)
