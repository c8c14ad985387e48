"""The worker of pipeline and hybrid: the stages of a pipeline, one process each (two
under an interleaved schedule).

The network is traced into its layers (``models.cuts``: any model torch.fx can trace) and
cut, where one activation flows on, into stages whose measured cost of a step (forward and
backward of every micro-batch, and the optimizer's step) is as even as possible (``cuts``,
on node 0). A torch.distributed.pipelining schedule (``SCHEDULES``: GPipe, 1F1B,
interleaved 1F1B) runs the micro-batches through the stages: on CPU processes through
this host's shared memory (``training.shm``'s pipes; gloo with --transport gloo or where
it cannot), NCCL on GPUs. The loss is the mean over a micro-batch and the schedule
divides the gradients by the number of micro-batches, so with equal micro-batches one
step is exactly the baseline's step on the same global batch.

The first stage reads the images, the last one only the labels (same seeded order). After
each epoch the stages send their weights to rank 0, which validates the whole model and
writes the run folder. R replicas of the pipeline (hybrid) average each stage's gradients
over the replicas that hold it (``exchange.replica_exchange``: through shared memory
too); a node among others (an MPI rank leading R x S processes) also averages the whole
model's gradients with the other nodes through its leader (``node_exchange``: in shared
memory too). Each process times its step's phases and its micro-batches' passes
(``clock.StageClock``): the manifest's ``backend.stages_time``.
"""

from __future__ import annotations

import logging
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
from ddlstudy.training import shm
from ddlstudy.training.job import Job, Link
from ddlstudy.training.loaders import image_dataset, train_loader, val_loader
from ddlstudy.training.pipeline.clock import StageClock
from ddlstudy.training.pipeline.exchange import (
    gather_weights,
    node_exchange,
    rank_module,
    replica_exchange,
    transport_of,
)
from ddlstudy.training.steps import Batch, StepFn
from ddlstudy.training.worker import new_model, new_optimizer, train_worker

if TYPE_CHECKING:  # 3 s of imports (torch._dynamo, DTensor): only in a pipeline's ranks
    from torch.distributed.pipelining.schedules import _PipelineSchedule

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


def pipeline_step(schedule: _PipelineSchedule, optimizer: torch.optim.Optimizer, first: bool,
                  last: bool, average: Callable[[], None] = lambda: None,
                  device: torch.device | None = None,
                  zero: Callable[[], None] | None = None,
                  clock: StageClock | None = None) -> StepFn:
    """One pipeline step under ``schedule``; only the last stage knows the loss and the
    predictions.

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


def _groups(replicas: int, stages: int, pipes: shm.PipesOptions | None = None):
    """Process groups: one pipeline per replica (through this host's shared memory where
    ``pipes`` is given, else the default backend), one data-parallel group per stage index.

    Global rank = replica * stages + stage. Every rank creates every group, in one order.
    """
    kind = {} if pipes is None else {"backend": shm.PIPES_BACKEND, "pg_options": pipes}
    pipe_groups = [dist.new_group(list(range(r * stages, (r + 1) * stages)), **kind)
                   for r in range(replicas)]
    data = [dist.new_group(list(range(s, replicas * stages, stages))) for s in range(stages)]
    return pipe_groups, data


def _pipes(cfg: RunConfig, device: torch.device, examples: list[torch.Tensor], micro: int,
           stages: int) -> shm.PipesOptions | None:
    """Rings for the stages' activations and gradients in this host's shared memory
    (--transport auto, on CPUs), room for every micro-batch each stage has in flight."""
    why = "--transport gloo" if cfg.transport != "auto" else \
        "stages on GPUs" if device.type != "cpu" else shm.usable()
    if why:
        log.info("pipeline stages send through %s: %s", dist.get_backend(), why)
        return None
    shm.register_pipes()
    largest = max(e.numel() * e.element_size() for e in examples[1:])
    return shm.PipesOptions(shm.ring_bytes(
        largest, micro * len(examples) // stages + 1))


def layers_of(uc: UseCase) -> Layers:
    """``uc``'s model traced into its layers (shapes only where its maker allows)."""
    return Layers(shapes_only(uc.model, len(uc.classes))[0], str(uc.model.arch))


def cuts(job: Job, stages: int, micro: int, threads: int) -> list[int]:
    """Where each of ``stages`` stages starts: --stage-starts, or where the pieces'
    measured cost of a step balances (``Layers.step_costs``: ``micro`` micro-batches'
    forward and backward and the optimizer's step, on the stages' ``threads``); recorded
    in the manifest."""
    cfg = job.cfg
    micro_batch = cfg.global_batch // cfg.data_parallel() // micro
    if cfg.stage_starts is not None:  # given: nothing measured
        starts, costs = list(cfg.stage_starts), None
    else:
        log.info("measuring each layer's forward, backward and optimizer time to balance %d "
                 "stages ...", stages)
        uc = cfg.usecase
        torch.manual_seed(0)
        layers = Layers(build_model(uc.model, len(uc.classes)).train(), str(uc.model.arch))
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            costs = layers.step_costs(torch.randn(micro_batch, 3, uc.train.image_size,
                                                  uc.train.image_size), micro,
                                      lambda params: new_optimizer(params, cfg))
        finally:
            torch.set_num_threads(before)
        pieces = balanced_cuts([c["step_s"] for c in costs], stages)
        starts = [layers.starts[k] for k in pieces]
        costs = [{"start": start, **c} for start, c in zip(layers.starts, costs, strict=True)]
    if job.folder is not None:
        job.folder.manifest["strategy"].update(stage_starts=starts, piece_costs=costs)
        job.folder.write_manifest()
    return starts


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved-1f1b": "ScheduleInterleaved1F1B"}
"""--schedule: torch.distributed.pipelining's schedule class of each."""


def stage_inputs(layers: Layers, starts: list[int], micro_input: torch.Tensor
                 ) -> list[torch.Tensor]:
    """The input of each stage of ``layers`` cut at ``starts`` for ``micro_input``, a
    micro-batch of images (run through the stages on the CPU, in eval mode: no running
    statistics move), which gives each stage its input's shape."""
    examples, example = [], micro_input
    training = layers.model.training
    with torch.no_grad():
        layers.model.eval()
        for q in range(len(starts)):
            examples.append(example)
            if q < len(starts) - 1:
                example = layers.stage(starts, q)(example)
        layers.model.train(training)
    return examples


def build_schedule(name: str, layers: Layers, starts: list[int], rank: int, stages: int,
                   micro: int, examples: list[torch.Tensor], device: torch.device, group
                   ) -> tuple[_PipelineSchedule, list, nn.Module]:
    """Rank ``rank``'s part of a ``stages``-process pipeline of ``micro`` micro-batches run
    by schedule ``name`` (``SCHEDULES``): its PipelineStages (one, or one a chunk when
    interleaved), the schedule over them and the module they train (moved to
    ``device``). ``examples``: each stage's input (``stage_inputs``)."""
    from torch.distributed import pipelining

    mine = list(range(rank, len(starts), stages))
    module = rank_module(layers, starts, rank, stages).to(device)
    parts = list(module) if isinstance(module, nn.ModuleList) else [module]
    made = [pipelining.PipelineStage(part, q, len(starts), device,
                                     input_args=(examples[q].to(device),), group=group)
            for part, q in zip(parts, mine, strict=True)]
    cls = getattr(pipelining, SCHEDULES[name])
    multi = issubclass(cls, pipelining.schedules.PipelineScheduleMulti)  # takes a list
    schedule = cls(made if multi else made[0], micro,
                   loss_fn=nn.CrossEntropyLoss())
    return schedule, made, module


def train_stage(job: Job, link: Link, device: torch.device, starts: list[int], micro: int,
                replicas: int, schedule_name: str = "gpipe") -> StageClock:
    """Stage ``rank % stages`` of replica ``rank // stages`` of this node's process group
    (``rank`` its rank in the group; under an interleaved schedule, its stages); ``link``:
    this process among every process of the run (the group's alone; among several nodes,
    its ``between`` on the node's rank 0).

    What the stage does with its gradients before each step: alone, the replicas of a
    stage average them (``replica_exchange``); a node among others exchanges the whole
    model's with the other nodes through its rank 0 (``node_exchange``).
    """
    cfg = job.cfg
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = world // replicas
    replica, index = divmod(rank, stages)
    node_index, nodes = link.rank // world, link.world // world
    shared = cfg.transport == "auto" and device.type == "cpu"
    exchange = partial(replica_exchange, shared=shared) if nodes == 1 else \
        partial(node_exchange, link, shared=shared)
    pipelines = nodes * replicas  # each takes its slice of every global batch
    full = new_model(cfg)  # the same weights on every rank
    layers = Layers(full, str(cfg.usecase.model.arch))
    size = cfg.usecase.train.image_size
    examples = stage_inputs(layers, starts, torch.zeros(
        cfg.global_batch // pipelines // micro, 3, size, size))
    pipes, data_groups = _groups(replicas, stages,
                                 _pipes(cfg, device, examples, micro, stages))
    schedule, made, module = build_schedule(schedule_name, layers, starts, index, stages,
                                            micro, examples, device, pipes[replica])
    del examples  # every stage's input: its shape is all the stages needed
    first, last = index == 0, index == stages - 1
    # Rank 0 also validates the whole model; in an MPI node every rank's stage is a part of
    # the buffer of the whole model's gradients.
    if rank == 0 or nodes > 1:
        full.to(device)
    clock = StageClock(micro, len(made), device)
    clock.watch(schedule, made)
    clock.transport["transport"] = transport_of(pipes[replica])
    # A stage of only functions (a pooling, a flatten) has nothing to update: its optimizer
    # holds an empty placeholder, since SGD refuses an empty parameter list.
    optimizer = new_optimizer(list(module.parameters()) or [nn.Parameter(torch.zeros(0))], cfg)
    average, zero, how = exchange(full, module, layers, starts, rank, replicas,
                                  data_groups[index], stages)
    if zero is not None:  # replicas average this stage's gradients, or a node its model's
        clock.transport["replicas_transport"] = how
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
