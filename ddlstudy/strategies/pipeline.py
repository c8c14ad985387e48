"""pipeline: the model cut into stages, one process each, a batch run as micro-batches.

The network is cut into ``--stages`` contiguous stages whose measured cost of a step is as
even as possible (on node 0, once: ``prepare``): each piece's forward and backward on a
micro-batch, times the micro-batches, plus its optimizer step. Each process trains its
stage under torch.distributed.pipelining's schedule ``--schedule`` (``training.pipeline``):
GPipe (every micro-batch forward, then every one backward), 1F1B (after a warm-up, one
forward then one backward: stage i of S holds S - i micro-batches' activations, not M) or
interleaved 1F1B (two stages a process, stage q on process q mod S: a bubble half as
long). With equal micro-batches one step is exactly the baseline's step on the same
global batch whatever the schedule: that is why the global batch must be a multiple of
``--micro-batches`` and an epoch's last, smaller batch is dropped. Stages run on one GPU
each (NCCL) when the machine has a GPU for every stage, on CPU processes (gloo)
otherwise.

Every process times its steps' phases and its micro-batches' passes and counts the
activations it holds; the run records them as ``backend.stages_time`` (``stage_times``),
with the step its own stage times allow (``bound``), which the report draws as a schedule
timeline.

``hybrid`` (strategies/hybrid.py) is the same worker with R > 1 replicas.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.config.run import stages_a_process
from ddlstudy.errors import ConfigError
from ddlstudy.machine.environment import usable_cores
from ddlstudy.strategies.base import (
    Footprint,
    Layout,
    Probe,
    Strategy,
    register,
    warn_if_oversubscribed,
)
from ddlstudy.strategies.processes import gpu_each

log = logging.getLogger("ddlstudy")


@register
class Pipeline(Strategy):
    name = "pipeline"
    summary = ("model parallel: the network cut into --stages processes balanced by measured "
               "cost, each batch run as --micro-batches micro-batches under --schedule")
    shards = "the layers: each stage holds its own (model parallelism)"
    flags = ("--stages S (default: usable cores), --micro-batches M (default 4), --schedule "
             "gpipe|1f1b|interleaved-1f1b, --stage-starts")
    table = 2
    options = ("stages", "stage_starts", "micro_batches", "schedule")
    checkpoints = False
    not_composed = {
        "tensor": "a pipeline's stages are not split over tensor-parallel processes yet "
                  "(PP x TP): each stage is one process, its stage module traced from the "
                  "model; for tensor parallel inside data parallel use --strategy sharded "
                  "--tensor T, for tensor parallel alone --strategy tensor",
        "reshard_after_forward": "a pipeline's stages are not sharded yet (PP x FSDP): "
                                 "FSDP2 would gather and reduce each stage's weights every "
                                 "micro-batch, where torch's own pipeline schedules hold "
                                 "the reduction to the last one and ddlstudy's do not yet; "
                                 "hybrid's replicas each hold their stage whole; for FSDP "
                                 "use --strategy sharded"}

    def replicas(self, cfg: RunConfig) -> int:
        return 1

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.replicas(cfg)

    def footprint(self, cfg: RunConfig) -> Footprint:
        """R pipelines of S processes, each pipeline one model cut into stages; GPipe holds
        every micro-batch's activations until its backward, 1F1B at most S of the M."""
        r, s, m = self.replicas(cfg), self.stages(cfg), cfg.micro_batches
        held = 1.0 if cfg.schedule == "gpipe" else min(s, m) / m
        return Footprint(r * s, r, r, held)

    def stages(self, cfg: RunConfig) -> int:
        """Processes a pipeline (each holds ``chunks`` stages)."""
        if cfg.stage_starts is not None:
            return max(1, len(cfg.stage_starts) // chunks(cfg))
        return cfg.stages or max(2, usable_cores() // self.replicas(cfg))

    def check(self, cfg: RunConfig) -> None:
        from ddlstudy.training.pipeline import layers_of  # torch: the model's layers

        r, s, m, v = self.replicas(cfg), self.stages(cfg), cfg.micro_batches, chunks(cfg)
        batch, pipelines = cfg.global_batch, cfg.data_parallel()  # x nodes under MPI
        layers, arch = layers_of(cfg.usecase), cfg.usecase.model.arch
        if cfg.stage_starts is not None and len(cfg.stage_starts) != s * v:
            each = f" ({v} a process under {cfg.schedule})" if v > 1 else ""
            fix = (f"give {s * v}, or set --stages to match" if cfg.stages is not None
                   else f"give a multiple of {v}")
            raise ConfigError("--stage-starts", f"{len(cfg.stage_starts)} starts for {s} "
                              f"process(es){each}: {fix}")
        if s < 2:
            if cfg.stages is None and cfg.stage_starts is not None:
                raise ConfigError("--stage-starts", f"{len(cfg.stage_starts)} starts make {s} "
                                  f"process under {cfg.schedule}; a pipeline needs at least "
                                  f"2: give {2 * v} or more")
            raise ConfigError("--stages", f"a pipeline needs at least 2 stages, got {s}")
        if s * v > len(layers.starts):
            per = f" ({v} stages a process under {cfg.schedule}: {s * v})" if v > 1 else ""
            raise ConfigError("--stages", f"{s} stages{per} but {arch} has only "
                              f"{len(layers.starts)} layers a stage can start at (of "
                              f"{len(layers)}); use at most {len(layers.starts) // v}, or "
                              f"a data-parallel strategy")
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
        if cfg.schedule == "1f1b" and m < s:
            raise ConfigError("--micro-batches", f"{cfg.schedule} needs at least one micro-"
                              f"batch a stage: {m} for {s} stages; use --micro-batches {s} "
                              f"or more, or --schedule gpipe")
        rounds = max(1, m // s)
        if v > 1 and m % rounds:
            raise ConfigError("--micro-batches", f"interleaved-1f1b runs micro-batches in "
                              f"rounds of {s} (the stages): {m} is not a multiple of "
                              f"{rounds} rounds; use a multiple of {s}")
        if self.device_type(cfg) == "cpu":
            warn_if_oversubscribed(r * s)

    def device_type(self, cfg: RunConfig) -> str:
        """Stages on GPUs when there is one for each, else on CPU processes."""
        return gpu_each(self.replicas(cfg) * self.stages(cfg))

    def layout(self, cfg: RunConfig) -> Layout:
        r, s = self.replicas(cfg), self.stages(cfg)
        cuda = self.device_type(cfg) == "cuda"
        return Layout(processes=r * s,
                      threads_per_process=1 if cuda else max(1, usable_cores() // (r * s)),
                      replicas=r, stages=s, micro_batches=cfg.micro_batches,
                      device=self.device_type(cfg), collectives="nccl" if cuda else "gloo",
                      schedule=cfg.schedule)

    def label(self, layout: dict[str, Any]) -> str:
        return (f"{self.name} ({layout.get('stages', '?')} stages x "
                f"{layout.get('micro_batches', '?')} mb{schedule_note(layout)})")

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        """2 stages x 4 micro-batches under each schedule: GPipe, 1F1B (the same bubble,
        fewer activations held) and interleaved 1F1B (2 stages a process, a smaller
        bubble; the one ``bench all`` times)."""
        return [Probe(f"pipeline (2 stages x 4 mb{note})",
                      {"strategy": self.name, "stages": 2, "micro_batches": 4,
                       **({"schedule": schedule} if note else {})}, 2)
                for schedule, note in (("gpipe", ""), ("1f1b", ", 1f1b"),
                                       ("interleaved-1f1b", ", interleaved 1f1b"))]

    def prepare(self, job) -> dict[str, Any]:
        """Where each stage starts, from the pieces' measured cost of a step (recorded),
        measured on the threads a stage will have (every usable core for GPU stages)."""
        from ddlstudy.training.pipeline import cuts  # torch: measures the model

        cfg = job.cfg
        r, s, v = self.replicas(cfg), self.stages(cfg), chunks(cfg)
        layout = self.layout(cfg)
        threads = usable_cores() if layout.device_type == "cuda" else layout.threads_per_process
        starts = cuts(job, s * v, cfg.micro_batches, threads)
        log.info("%s: %d replica(s) of %d stages starting at layers %s (%s)", self.name, r,
                 s * v, starts, cfg.schedule)
        return {"starts": starts}

    def worker(self, job, link, device) -> None:
        from ddlstudy.training.pipeline import train_stage  # torch: in workers only
        from ddlstudy.training.worker import record

        stages = self.stages(job.cfg)
        clock = train_stage(job, link, device, job.plan["starts"], job.cfg.micro_batches,
                            self.replicas(job.cfg), job.cfg.schedule)
        # Every stage's times on worker 0, recorded beside the MPI exchange's (the section
        # of the manifest a run takes from its workers): backend.stages_time.
        everyone = link.gather(clock.report(link.rank))  # a collective
        if everyone is not None and link.rank == 0:
            record(job, "stages_time", {**stage_times(everyone, stages), **clock.transport})


def chunks(cfg: RunConfig) -> int:
    """Stages a pipeline process holds: 2 under an interleaved schedule, else 1."""
    return stages_a_process(cfg.schedule)


def schedule_note(layout: dict[str, Any]) -> str:
    """The schedule in a label, where it is not GPipe (older runs record 'GPipe')."""
    schedule = str(layout.get("schedule") or "gpipe")
    return "" if schedule.lower() == "gpipe" else f", {schedule}"


NOTE = ("seconds over the steps but each process's first (since its last resume). comm: "
        "sending and receiving activations and gradients; wait: for a neighbour (a "
        "receive before it sent, a send before it was ready to receive: the bubble, and "
        "any imbalance); exchange: the replicas' or nodes' gradient exchange; other: the "
        "schedule's own work. peak_activation_bytes: the most activation bytes a process held "
        "at once: micro-batches whose forward is done and backward not yet, x the bytes "
        "autograd saved for one (peak_micro_batches_held: each stage's most). Under an "
        "interleaved schedule, whose receives are posted ahead and waited for inside the "
        "schedule, wait holds the transfers, the waits and the schedule's own work. "
        "timeline: pipeline 0's last step, from its earliest start")


def stage_times(everyone: list[dict], stages: int) -> dict[str, Any]:
    """The record ``stages_time`` from every process's ``StageClock.report`` (rank =
    pipeline x stages + stage): per process its phases' seconds, the time of its receives
    and sends split into the wait for a neighbour and the transfer (on the host's clock
    they share), the activations it held at most; and pipeline 0's last step, box by
    box. Under an interleaved schedule a process holds ``chunks`` stages, whose receives
    are waited for inside torch's runtime: its transfers and waits are counted together."""
    by_rank = {e["rank"]: {**e, "rows": e["rows"].tolist()} for e in everyone}

    def rows(pipe: int, stage: int) -> list[list[float]] | None:
        """Stage ``stage``'s rows of pipeline ``pipe`` (None outside the pipeline)."""
        return by_rank[pipe * stages + stage]["rows"] if 0 <= stage < stages else None

    per_stage = []
    for rank, e in sorted(by_rank.items()):
        pipe, stage = divmod(rank, stages)
        s, chunks = e["sums"], e.get("chunks", 1)
        mine = e["rows"]
        if chunks == 1:
            wait = _waited(mine, rows(pipe, stage - 1), rows(pipe, stage + 1))
        else:  # receives posted ahead, waited for inside the schedule: together
            wait, s = s["recv"] + s["send"] + s["other"], {**s, "recv": 0.0, "send": 0.0,
                                                          "other": 0.0}
        held = e.get("peak_held") or [0] * chunks
        saved = e.get("saved_bytes") or [0] * chunks
        per_stage.append({
            "rank": rank, "pipeline": pipe, "stage": stage, "steps": len(mine),
            "step_s": sum(r[1] - r[0] for r in mine), "forward_s": s["forward"],
            "backward_s": s["backward"], "comm_s": max(0.0, s["recv"] + s["send"] - wait),
            "wait_s": wait, "exchange_s": s["exchange"], "optimizer_s": s["optimizer"],
            "other_s": s["other"], "chunks": chunks, "peak_micro_batches_held": held,
            "activation_bytes": saved,
            "peak_activation_bytes": e.get("peak_bytes", 0),
            **({"peak_gpu_bytes": e["peak_gpu_bytes"]} if e.get("peak_gpu_bytes") else {})})
    first = sorted((e for e in everyone if e["rank"] < stages), key=lambda e: e["rank"])
    origin = min(e["origin"] for e in first)
    timeline = [{"stage": e["rank"], "micro_batch": int(box[0]),
                 "phase": "backward" if box[1] else "forward",
                 "start_s": box[2] - origin, "end_s": box[3] - origin,
                 "chunk": int(box[4]) if len(box) > 4 else 0}
                for e in first for box in e["boxes"]]
    return {"per_stage": per_stage, "timeline": timeline, "note": NOTE,
            **bound(per_stage, stages, *_micro_chunks(by_rank[0]))}


def _micro_chunks(e: dict) -> tuple[int, int]:
    """A process's micro-batches and stages, from its report's row width."""
    chunks = e.get("chunks", 1)
    return (len(e["rows"][0]) - 3) // 6 // chunks if e["rows"] else 0, chunks


def bound(per_stage: list[dict], stages: int, micro: int, chunks: int) -> dict[str, float]:
    """The step the first pipeline's own stage times allow, and the share of it its
    measured step reaches: the slowest stage's compute (forward, backward, optimizer) plus
    the bubble, (stages - 1) of its forward-backward slices
    (GPipe's and 1F1B's fill and drain), a slice being 1/(chunks x micro) of a stage's
    passes (an interleaved schedule's slices are half as big)."""
    mine = [p for p in per_stage if p["pipeline"] == 0 and p["steps"]]
    if not mine:
        return {}
    steps = mine[0]["steps"]
    passes = max(p["forward_s"] + p["backward_s"] for p in mine) / steps
    slowest = max(p["forward_s"] + p["backward_s"] + p["optimizer_s"] for p in mine) / steps
    ideal = slowest + (stages - 1) * passes / (chunks * micro)
    measured = max(p["step_s"] for p in mine) / steps
    return {"bound_step_s": ideal, "of_bound": ideal / measured if measured else 0.0}


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
