"""The worker of pipeline and hybrid: a stage of a GPipe pipeline, one process each.

The network is traced into its layers (``models.cuts``: any model torch.fx can trace) and
cut, where one activation flows on, into stages whose measured forward time is as even as
possible (``cuts``, on node 0).
torch.distributed.pipelining's ScheduleGPipe runs every micro-batch forward through the
stages, then every one backward (fill-drain), over gloo on CPU processes (NCCL on GPUs).
The loss is the mean over a micro-batch and the schedule divides the gradients by the
number of micro-batches, so with equal micro-batches one step is exactly the baseline's
step on the same global batch.

The first stage reads the images, the last one only the labels (same seeded order). After
each epoch the stages send their weights to rank 0, which validates the whole model and
writes the run folder. R replicas of the pipeline (hybrid) average each stage's gradients
over the replicas that hold it (``replica_exchange``); a node among others (an MPI rank
leading R x S processes) also averages the whole model's gradients with the other nodes
through its leader (``node_exchange``). Each stage times its step's phases and its
micro-batches' passes (``StageClock``): the manifest's ``backend.stages_time``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from ddlstudy.config import RunConfig, UseCase
from ddlstudy.models import build_model, shapes_only
from ddlstudy.models.cuts import Layers
from ddlstudy.training.flat import average, check_views, flat_gradients, param_ranges
from ddlstudy.training.job import Job, Link
from ddlstudy.training.loaders import image_dataset, train_loader, val_loader
from ddlstudy.training.steps import Batch, StepFn
from ddlstudy.training.worker import new_model, new_optimizer, train_worker

if TYPE_CHECKING:  # 3 s of imports (torch._dynamo, DTensor): only in a pipeline's ranks
    from torch.distributed.pipelining import ScheduleGPipe

log = logging.getLogger("ddlstudy")


def balanced_cuts(costs: list[float], stages: int,
                  allowed: list[int] | None = None) -> list[int]:
    """Start index of each stage, minimising the slowest stage's cost (dynamic programme),
    each at a layer of ``allowed`` (default: any)."""
    n = len(costs)
    ok = set(range(n) if allowed is None else allowed)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: the slowest stage when the first i layers form s stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                if j not in ok:
                    continue
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    if best[stages][n] == inf:
        raise ValueError(f"{stages} stages do not fit between the layers {sorted(ok)}")
    starts, i = [], n
    for s in range(stages, 0, -1):
        i = cut[s][i]
        starts.append(i)
    return starts[::-1]


class _Labels(Dataset):
    """The labels of a dataset without decoding its images (for the last stage)."""

    def __init__(self, items: list[tuple[str, int]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.empty(0), self.items[i][1]


def pipeline_step(schedule: ScheduleGPipe, optimizer: torch.optim.Optimizer, first: bool,
                  last: bool, average: Callable[[], None] = lambda: None,
                  device: torch.device | None = None,
                  zero: Callable[[], None] | None = None,
                  clock: StageClock | None = None) -> StepFn:
    """One GPipe step; only the last stage knows the loss and the predictions.

    ``average`` runs between the backward passes and the optimizer step: the hybrid's
    all-reduce of this stage's gradients over the replicas (or an MPI node's exchange).
    ``zero`` clears the gradients first (the optimizer's, unless given). ``clock`` times
    the step's phases (one that watches the schedule: its micro-batches' too).
    """
    zero = zero or (lambda: optimizer.zero_grad(set_to_none=True))
    clock = clock or StageClock(0)

    def step(batch: Batch) -> tuple[float, int, int]:
        images, labels = batch
        if device is not None:
            images, labels = images.to(device), labels.to(device)
        clock.start()
        zero()
        losses: list[torch.Tensor] = []
        args = (images,) if first else ()
        clock.mark("other")
        out = schedule.step(*args, target=labels if last else None, losses=losses)
        clock.mark("exchange")
        average()
        clock.mark("optimizer")
        optimizer.step()
        clock.end()
        if not last:
            return 0.0, 0, 0
        n = labels.numel()
        loss = torch.stack(losses).mean().item()
        return loss * n, int((out.argmax(1) == labels).sum()), n

    return step


PHASES = ("forward", "backward", "recv", "send", "exchange", "optimizer", "other")


class StageClock:
    """A stage's steps split into ``PHASES`` (each second in one) by timestamps taken
    where the schedule calls into its stage (``watch``: nothing rewritten, nothing waits)
    on ``time.perf_counter``, the host's monotonic clock: a pipeline's processes share it.

    ``sums``: seconds per phase over the steps but the first (it meets the neighbours);
    ``rows``: those steps' start, end, end of the wait for its gradients' sends, then per
    micro-batch the start and end of its activation's receive and its send's issue, the
    same for its gradient (the strategy tells a wait for a neighbour from a transfer with
    them); ``boxes``: the last step's forward and backward of each micro-batch,
    [micro-batch, 0 | 1, start, end].
    """

    def __init__(self, micro: int) -> None:
        self.micro, self.sums = micro, dict.fromkeys(PHASES, 0.0)
        self.rows: list[list[float]] = []
        self.row: list[float] = []
        self.boxes: list[list[float]] = []
        self.phase, self.last, self.origin, self.steps = "other", 0.0, 0.0, 0

    def mark(self, phase: str) -> float:
        """``phase`` from now on; the time since the last mark was the last phase's."""
        now = time.perf_counter()
        if self.row and self.steps:  # the first step is not counted
            self.sums[self.phase] += now - self.last
        self.phase, self.last = phase, now
        return now

    def start(self) -> None:
        self.row, self.boxes = [math.nan] * (3 + 6 * self.micro), []
        self.row[0] = self.last = self.origin = time.perf_counter()
        self.phase = "optimizer"  # zeroing the gradients

    def end(self) -> None:
        self.row[1] = self.mark("other")
        self.rows += [self.row] if self.steps else []
        self.row, self.steps = [], self.steps + 1

    def _at(self, column: int, now: float) -> float:
        if self.row:
            self.row[column] = now
        return now

    def watch(self, schedule: ScheduleGPipe, stage) -> None:
        """Timestamps at the schedule's calls into ``stage`` (instance attributes that
        shadow their methods), the loss counted in the forward pass."""
        def wrap(obj, name: str, before: Callable, after: Callable) -> None:
            inner = getattr(obj, name)

            def timed(*args, **kwargs):
                before(*args)
                out = inner(*args, **kwargs)
                after(*args)
                return out
            setattr(obj, name, timed)

        def begin(phase: str, column: int, box: bool = False) -> Callable:
            def at(i: int, *_) -> None:
                now = self._at(3 + 6 * i + column, self.mark(phase))
                if box:
                    self.boxes.append([i, phase == "backward", now, now])
            return at

        def close(*_) -> None:
            self.boxes[-1][3] = self.mark("other")

        def loss_end(stage_, *_) -> None:
            now = self.mark("send")  # then the waits for the forward sends
            if stage_.is_last and self.boxes:
                self.boxes[-1][3] = now

        for way, phase, recv in (("fwd", "forward", 0), ("bwd", "backward", 3)):
            wrap(stage, f"get_{way}_recv_ops", begin("recv", recv), lambda *_: None)
            wrap(stage, f"{phase}_one_chunk", begin(phase, recv + 1, box=True), close)
            wrap(stage, f"get_{way}_send_ops", lambda *_: self.mark("send"),
                 lambda i, *_, c=recv + 2: self._at(3 + 6 * i + c, time.perf_counter()))
        wrap(schedule, "_maybe_compute_loss", lambda *_: self.mark("forward"), loss_end)
        wrap(stage, "perform_reduce_grad", lambda *_: self._at(2, self.mark("backward")),
             lambda *_: self.mark("other"))

    def report(self, rank: int) -> dict:
        """What the run's writer needs of this stage (``strategies.pipeline``)."""
        return {"rank": rank, "sums": self.sums, "boxes": self.boxes, "origin": self.origin,
                "rows": torch.tensor(self.rows, dtype=torch.float64).reshape(
                    -1, 3 + 6 * self.micro)}


def replica_exchange(full: nn.Module, module: nn.Module, layers: Layers,
                     starts: list[int], rank: int, replicas: int,
                     data_group) -> tuple[Callable[[], None], Callable[[], None] | None]:
    """A stage alone on its node: its replicas average its gradients, one collective on
    one buffer of which every gradient is a view."""
    if replicas == 1 or not list(module.parameters()):
        return (lambda: None), None
    flat = flat_gradients(module)
    return (lambda: average(flat, data_group, replicas)), flat.zero_


def gather_weights(full: nn.Module | None, layers: Layers, starts: list[int],
                   rank: int, world: int) -> None:
    """Send every stage's parameters and floating-point buffers (BatchNorm's running
    statistics: each stage owns its own) to rank 0, which loads them into its whole
    model."""
    for stage in range(1, world):
        module = layers.stage(starts, stage)
        state = [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]
        if not state or rank not in (0, stage):
            continue
        flat = torch.cat([t.detach().flatten() for t in state])
        if rank == stage:
            dist.send(flat, dst=0)
        else:
            dist.recv(flat, src=stage)
            with torch.no_grad():
                torch._foreach_copy_(state, [part.view_as(t) for part, t in zip(
                    flat.split([t.numel() for t in state]), state, strict=True)])


def _groups(replicas: int, stages: int):
    """Process groups: one pipeline per replica, one data-parallel group per stage index.

    Global rank = replica * stages + stage. Every rank creates every group, in one order.
    """
    pipes = [dist.new_group(list(range(r * stages, (r + 1) * stages)))
             for r in range(replicas)]
    data = [dist.new_group(list(range(s, replicas * stages, stages))) for s in range(stages)]
    return pipes, data


def layers_of(uc: UseCase) -> Layers:
    """``uc``'s model traced into its layers (shapes only where its maker allows)."""
    return Layers(shapes_only(uc.model, len(uc.classes))[0], str(uc.model.arch))


def cuts(job: Job, stages: int, micro_batch: int) -> list[int]:
    """Where each of ``stages`` stages starts: --stage-starts, or where the layers'
    measured forward times on a micro-batch balance (recorded in the manifest)."""
    cfg = job.cfg
    if cfg.stage_starts is not None:  # given: nothing measured
        starts, costs = list(cfg.stage_starts), None
    else:
        log.info("measuring each layer's forward time to balance %d stages ...", stages)
        uc = cfg.usecase
        torch.manual_seed(0)
        layers = Layers(build_model(uc.model, len(uc.classes)).eval(), str(uc.model.arch))
        costs = layers.costs(torch.randn(micro_batch, 3, uc.train.image_size,
                                         uc.train.image_size))
        starts = balanced_cuts(costs, stages, layers.starts)
    if job.folder is not None:
        job.folder.manifest["strategy"].update(stage_starts=starts, layer_costs_s=costs)
        job.folder.write_manifest()
    return starts


def train_stage(job: Job, link: Link, device: torch.device, starts: list[int], micro: int,
                replicas: int) -> StageClock:
    """Stage ``rank % stages`` of replica ``rank // stages`` of this node's process group
    (``rank`` its rank in the group); ``link``: this process among every process of the
    run (the group's alone; among several nodes, its ``between`` on the node's rank 0).

    What the stage does with its gradients before each step: alone, the replicas of a
    stage average them (``replica_exchange``); a node among others exchanges the whole
    model's with the other nodes through its rank 0 (``node_exchange``).
    """
    cfg = job.cfg
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = world // replicas
    replica, index = divmod(rank, stages)
    pipes, data_groups = _groups(replicas, stages)
    node_index, nodes = link.rank // world, link.world // world
    exchange = replica_exchange if nodes == 1 else partial(node_exchange, link)
    pipelines = nodes * replicas  # each takes its slice of every global batch
    full = new_model(cfg)  # the same weights on every rank
    layers = Layers(full, str(cfg.usecase.model.arch))
    module = layers.stage(starts, index)
    first, last = index == 0, index == stages - 1
    example = torch.zeros(cfg.global_batch // pipelines // micro, 3,
                          cfg.usecase.train.image_size, cfg.usecase.train.image_size)
    with torch.no_grad():  # in eval mode: no running statistics moved by this
        full.eval()
        for earlier in range(index):
            example = layers.stage(starts, earlier)(example)
        full.train()
    example = example.to(device)
    # Rank 0 also validates the whole model; in an MPI node every rank's stage is a part of
    # the buffer of the whole model's gradients.
    (full if rank == 0 or nodes > 1 else module).to(device)
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(module, index, stages, device, input_args=(example,),
                          group=pipes[replica])
    schedule = ScheduleGPipe(stage, micro, loss_fn=nn.CrossEntropyLoss())
    clock = StageClock(micro)
    clock.watch(schedule, stage)
    optimizer = new_optimizer(module.parameters(), cfg)
    average, zero = exchange(full, module, layers, starts, rank, replicas, data_groups[index])
    train = _train_loader(cfg, job, first, (node_index * replicas + replica, pipelines))
    val = val_loader(cfg, job.data) if link.rank == 0 else []  # rank 0 validates it all

    def collect() -> None:
        if replica == 0:
            gather_weights(full, layers, starts, rank, stages)

    train_worker(job, link, full if rank == 0 else module, optimizer,
                 pipeline_step(schedule, optimizer, first, last, average, device, zero, clock),
                 train, val, device=device, before_eval=collect, whole=False)
    return clock


def _train_loader(cfg: RunConfig, job: Job, first: bool, shard: tuple[int, int]):
    """First stages read their replica's slice of the images; the other stages only its
    labels, in the same seeded order."""
    dataset = (image_dataset(cfg, job.data, job.data.train, True) if first
               else _Labels(job.data.train))
    return train_loader(dataset, cfg, shard=shard, drop_last=True,
                        loader_workers=None if first else 0)


def node_exchange(node: Link, full: nn.Module, module: nn.Module, layers: Layers,
                  starts: list[int], rank: int, replicas: int,
                  data_group) -> tuple[Callable[[], None], Callable[[], None]]:
    """An MPI node's exchange after every step's backward passes, and the zeroing of this
    stage's gradients before them. Every gradient is a view of one buffer of the whole
    model's, where each stage's part is one contiguous range (parameters in layer order).

    The replicas of this stage average its range; the first pipeline's stages send theirs
    to the leader (stage 0 of pipeline 0), which averages the whole buffer between the
    nodes and sends each range back; the replicas then take it from the first pipeline.
    """
    stages = len(starts)
    replica, index = divmod(rank, stages)
    flat = flat_gradients(full)
    offsets = param_ranges(full)
    ranges = []
    for s in range(stages):
        spans = sorted(offsets[id(p)] for p in layers.stage(starts, s).parameters())
        lo, hi = (spans[0][0], spans[-1][1]) if spans else (0, 0)
        if sum(b - a for a, b in spans) != hi - lo:
            raise RuntimeError(f"stage {s}'s parameters are not one range of the buffer")
        ranges.append((lo, hi))
    mine = flat[slice(*ranges[index])]
    count = 0

    def exchange() -> None:
        nonlocal count
        if count == 0:
            check_views(full, flat)
        if replicas > 1 and mine.numel():
            average(mine, data_group, replicas)  # this stage over the node's replicas
        if node.between is not None:  # the leader
            others = [(s, flat[lo:hi]) for s, (lo, hi) in enumerate(ranges) if s and hi > lo]
            for s, part in others:
                dist.recv(part, src=s)
            node.between(flat, count)
            for s, part in others:
                dist.send(part, dst=s)
        elif replica == 0 and mine.numel():
            dist.send(mine, dst=0)
            dist.recv(mine, src=0)
        if replicas > 1 and mine.numel():
            dist.broadcast(mine, src=index, group=data_group)  # from pipeline 0's stage
        count += 1

    return exchange, mine.zero_
