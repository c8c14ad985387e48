"""pipeline: the model cut into stages, one process each, a batch run as GPipe micro-batches.

The network is cut into ``--stages`` contiguous stages whose measured forward time is as
even as possible (on node 0, once: ``prepare``); each process trains one stage with
torch.distributed.pipelining's ScheduleGPipe (``training.stages``). With equal
micro-batches one step is exactly the baseline's step on the same global batch: that is
why the global batch must be a multiple of ``--micro-batches`` and an epoch's last, smaller
batch is dropped. Stages run on one GPU each (NCCL) when the machine has a GPU for every
stage, on CPU processes (gloo) otherwise.

Every stage times its steps' phases and its micro-batches' passes; the run records them as
``backend.stages_time`` (``stage_times``), which the report draws as a schedule timeline.

``hybrid`` (strategies/hybrid.py) is the same worker with R > 1 replicas.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.environment import usable_cores
from ddlstudy.errors import ConfigError
from ddlstudy.strategies.base import Layout, Probe, Strategy, register, warn_if_oversubscribed
from ddlstudy.strategies.processes import cuda_devices

log = logging.getLogger("ddlstudy")


@register
class Pipeline(Strategy):
    name = "pipeline"
    summary = ("model parallel: the network cut into --stages processes balanced by measured "
               "cost, each batch run as --micro-batches GPipe micro-batches")
    flags = "--stages S (default: usable cores), --micro-batches M (default 4), --stage-starts"
    table = 2
    options = ("stages", "stage_starts", "micro_batches")

    def replicas(self, cfg: RunConfig) -> int:
        return 1

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.replicas(cfg)

    def stages(self, cfg: RunConfig) -> int:
        if cfg.stage_starts is not None:
            return len(cfg.stage_starts)
        return cfg.stages or max(2, usable_cores() // self.replicas(cfg))

    def check(self, cfg: RunConfig) -> None:
        from ddlstudy.training.stages import layers_of  # torch: the model's layers

        r, s, m = self.replicas(cfg), self.stages(cfg), cfg.micro_batches
        batch, pipelines = cfg.global_batch, cfg.data_parallel()  # x nodes under MPI
        layers, arch = layers_of(cfg.usecase), cfg.usecase.model.arch
        if s < 2:
            raise ConfigError("--stages", f"a pipeline needs at least 2 stages, got {s}")
        if s > len(layers.starts):
            raise ConfigError("--stages", f"{s} stages but {arch} has only "
                              f"{len(layers.starts)} layers a stage can start at (of "
                              f"{len(layers)}); use at most {len(layers.starts)}, or a "
                              f"data-parallel strategy")
        if cfg.stage_starts is not None:
            if cfg.stage_starts[-1] >= len(layers):
                raise ConfigError("--stage-starts", f"the last stage starts at layer "
                                  f"{cfg.stage_starts[-1]} but {arch} has layers 0 to "
                                  f"{len(layers) - 1}")
            layers.check(list(cfg.stage_starts))
        if batch % (pipelines * m):
            nodes = f"{pipelines // r} nodes x " if pipelines != r else ""
            raise ConfigError("--micro-batches", f"the batch of {batch} does not split into "
                              f"{nodes}{r} replica(s) x {m} equal micro-batches; choose "
                              f"sizes whose product divides {batch}")
        if self.device_type(cfg) == "cpu":
            warn_if_oversubscribed(r * s)

    def device_type(self, cfg: RunConfig) -> str:
        """Stages on GPUs when there is one for each, else on CPU processes."""
        return "cuda" if cuda_devices() >= self.replicas(cfg) * self.stages(cfg) else "cpu"

    def layout(self, cfg: RunConfig) -> Layout:
        r, s = self.replicas(cfg), self.stages(cfg)
        cuda = self.device_type(cfg) == "cuda"
        return Layout(processes=r * s,
                      threads_per_process=1 if cuda else max(1, usable_cores() // (r * s)),
                      replicas=r, stages=s, micro_batches=cfg.micro_batches,
                      device=self.device_type(cfg), collectives="nccl" if cuda else "gloo",
                      schedule="GPipe")

    def label(self, layout: dict[str, Any]) -> str:
        return (f"{self.name} ({layout.get('stages', '?')} stages x "
                f"{layout.get('micro_batches', '?')} mb)")

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe(f"pipeline (2 stages x {mb} mb)",
                      {"strategy": self.name, "stages": 2, "micro_batches": mb}, 2)
                for mb in (2, 4)]

    def prepare(self, job) -> dict[str, Any]:
        """Where each stage starts, from the layers' measured forward times (recorded)."""
        from ddlstudy.training.stages import cuts  # torch: measures the model

        cfg = job.cfg
        r, s = self.replicas(cfg), self.stages(cfg)
        starts = cuts(job, s, cfg.global_batch // cfg.data_parallel() // cfg.micro_batches)
        log.info("%s: %d replica(s) of %d stages starting at layers %s", self.name, r, s,
                 starts)
        return {"starts": starts}

    def worker(self, job, link, device) -> None:
        from ddlstudy.training.stages import train_stage  # torch: in workers only
        from ddlstudy.training.worker import record

        stages = self.stages(job.cfg)
        clock = train_stage(job, link, device, job.plan["starts"], job.cfg.micro_batches,
                            self.replicas(job.cfg))
        # Every stage's times on worker 0, recorded beside the MPI exchange's (the section
        # of the manifest a run takes from its workers): backend.stages_time.
        everyone = link.gather(clock.report(link.rank))  # a collective
        if everyone is not None and link.rank == 0:
            record(job, "stages_time", stage_times(everyone, stages))


NOTE = ("seconds over the steps but each process's first (since its last resume). comm: "
        "sending and receiving activations and gradients; wait: for a neighbour (a "
        "receive before it sent, a send before it was ready to receive: the bubble, and "
        "any imbalance); exchange: the replicas' or nodes' gradient exchange; other: the "
        "schedule's own work. timeline: pipeline 0's last step, from its earliest start")


def stage_times(everyone: list[dict], stages: int) -> dict[str, Any]:
    """The record ``stages_time`` from every process's ``StageClock.report`` (rank =
    pipeline x stages + stage): per stage its phases' seconds, the time of its receives
    and sends split into the wait for a neighbour and the transfer (on the host's clock
    they share); and pipeline 0's last step, box by box."""
    rows = {e["rank"]: e["rows"].tolist() for e in everyone}
    per_stage = []
    for e in sorted(everyone, key=lambda e: e["rank"]):
        pipe, stage = divmod(e["rank"], stages)
        s, mine = e["sums"], rows[e["rank"]]
        wait = _waited(mine, *(rows[pipe * stages + peer] if 0 <= peer < stages else None
                               for peer in (stage - 1, stage + 1)))
        per_stage.append({
            "rank": e["rank"], "pipeline": pipe, "stage": stage, "steps": len(mine),
            "step_s": sum(r[1] - r[0] for r in mine), "forward_s": s["forward"],
            "backward_s": s["backward"], "comm_s": max(0.0, s["recv"] + s["send"] - wait),
            "wait_s": wait, "exchange_s": s["exchange"], "optimizer_s": s["optimizer"],
            "other_s": s["other"]})
    first = sorted((e for e in everyone if e["rank"] < stages), key=lambda e: e["rank"])
    origin = min(e["origin"] for e in first)
    timeline = [{"stage": e["rank"], "micro_batch": int(m),
                 "phase": "backward" if backward else "forward",
                 "start_s": start - origin, "end_s": end - origin}
                for e in first for m, backward, start, end in e["boxes"]]
    return {"per_stage": per_stage, "timeline": timeline, "note": NOTE}


def _waited(mine: list[list[float]], before: list[list[float]] | None,
            after: list[list[float]] | None) -> float:
    """Seconds of a stage's receives and sends spent waiting for its neighbours, the stage
    ``before`` and ``after`` it (their rows of the same steps: ``StageClock``). A receive
    waits until the neighbour issues its send; a send (gloo's meet the receive) until the
    neighbour posts its receive: the stage waits for its sends after the last one."""
    n = min(len(r) for r in (mine, before, after) if r is not None)  # the steps they share
    waits = []  # (from, to, what it waited for)
    for k, row in enumerate(mine[len(mine) - n:], start=-n):  # k: the step from the end
        last = len(row) - 6  # the last micro-batch's columns
        if before is not None:
            other = before[k]
            waits += [(row[c], row[c + 1], other[c + 2]) for c in range(3, len(row), 6)]
            waits.append((row[last + 5], row[2], other[last + 3]))
        if after is not None:
            other = after[k]
            waits += [(row[c], row[c + 1], other[c + 2]) for c in range(6, len(row), 6)]
            waits.append((row[last + 2], row[6], other[last]))
    return sum(max(0.0, min(until, end) - start) for start, end, until in waits
               if not math.isnan(start + end + until))
