"""The worker of every strategy that trains one model per process (sequential,
cpu-intraop, cpu-processes, gpu-data), wherever its process runs: alone, as one of a
process group on this host, as an MPI node or a Spark task.

It takes its slice of every global batch (all of it alone) and averages its gradients with
the other workers through its ``Link``: where every worker is in its process group
(``link.group``), through this host's shared memory (``training.shm``: 4.6 ms for
tiny's 13.6 MiB between 2 ranks here, against 19.2 over gloo) or DistributedDataParallel
(gloo's TCP, NCCL on GPUs), which all-reduces buckets while backward runs; elsewhere by
the link's own exchange, which the backend provides (MPI's reducers, a node's leader).
Each worker weights its loss by world x its slice / global batch so that the average is
the global batch's mean gradient even when the slices differ by an image.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from ddlstudy.training import shm
from ddlstudy.training.flat import exchange_step, flat_gradients
from ddlstudy.training.job import Job, Link, States
from ddlstudy.training.loaders import make_loaders
from ddlstudy.training.steps import (
    Batch,
    StepFn,
    accumulate_grads,
    make_scaler,
    optimizer_step,
)
from ddlstudy.training.worker import new_model, new_optimizer, train_worker


def ddp_step(model: nn.Module, optimizer: torch.optim.Optimizer,
             loss_fn: nn.Module, global_batch: int, world: int,
             device: torch.device | None = None, accumulate: int = 1,
             scaler: torch.amp.GradScaler | None = None,
             no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
             between: Callable[[int], None] | None = None) -> StepFn:
    """A rank's slice of the batch (as ``accumulate`` micro-batches, all but the last under
    ``no_sync``: DDP's own unless given, e.g. FSDP's), its loss scaled by world x n /
    global batch since DDP (and FSDP) divide by world; ``between(step)``, where given,
    averages the gradients between nodes before the optimizer steps."""
    count = 0

    def step(batch: Batch) -> tuple[float, int, int]:
        nonlocal count
        images, labels = batch
        if device is not None:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        n = labels.numel()
        optimizer.zero_grad(set_to_none=True)
        loss_sum, correct = accumulate_grads(model, loss_fn, images, labels, accumulate,
                                             scale=world * n / global_batch,
                                             no_sync=no_sync or model.no_sync,
                                             scaler=scaler)
        if between is not None:
            between(count)
        count += 1
        optimizer_step(optimizer, scaler)
        return loss_sum, correct, n

    return step


def train_one_model(job: Job, link: Link, device: torch.device,
                    loader_workers: int | None = None, zero: bool = False) -> None:
    """Train one model in this process: its slice of every batch, averaged over ``link``;
    with ``zero``, its optimizer state sharded over the process group (ZeRO-1)."""
    cfg = job.cfg
    # Alone, the baseline's generator stream; else the same weights, each its own dropout.
    model = new_model(cfg, None if link.world == 1 else link.rank, device)
    cuda = device.type == "cuda"
    shared = None
    if link.group and not cuda:
        shared = shm.join(cfg.transport, link.rank, link.world,
                          sum(p.numel() for p in model.parameters()))
        if link.rank == 0 and job.folder is not None:  # the parent reloads the manifest
            job.folder.manifest["transport"] = shm.GLOO if shared is None else shm.SHARED
    train, val = make_loaders(cfg, job.data, shard=link.shard, loader_workers=loader_workers)
    scaler = make_scaler(cfg.precision, device.type)
    if link.group and shared is None:  # DDP all-reduces buckets during backward
        ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        optimizer = new_optimizer(ddp.parameters(), cfg, zero, _zero_group(zero, cfg, cuda))
        step = ddp_step(ddp, optimizer, nn.CrossEntropyLoss(), cfg.global_batch, link.world,
                        device, cfg.accumulate, scaler)
    else:
        optimizer = new_optimizer(model.parameters(), cfg, zero, _zero_group(zero, cfg, cuda))
        if zero and cfg.shared_buffers and link.world == dist.get_world_size():  # one node
            shm.share_weights(optimizer)
        flat = flat_gradients(model, None if shared is None else shared.buffer)
        if shared is not None:
            link = _through(link, shared)
        timer = link.attach(model, flat, train)
        step = exchange_step(model, optimizer, flat, link, cfg.global_batch, cfg.accumulate,
                             timer, scaler=scaler)
    try:
        train_worker(job, link, model, optimizer, step, train, val, device=device,
                     states=zero_states(model, optimizer, cuda) if zero else None)
    finally:
        if shared is not None:
            shared.close()


def _through(link: Link, shared: shm.HostMemory) -> Link:
    """``link``, averaging through this host's shared memory (its buffer holds the flat
    gradients of every rank)."""
    return dataclasses.replace(link, exchange=lambda _flat, _step: shared.average())



def _zero_group(zero: bool, cfg, cuda: bool = False) -> dist.ProcessGroup | None:
    """ZeRO's group: the node's processes, its weights' broadcasts through this host's
    shared memory with --transport auto (``shm.new_group``; on a run of one node the
    weights themselves live there, ``shm.share_weights``, and the broadcasts are a
    barrier), else the default group's (gloo, or NCCL on GPUs)."""
    if not zero or cuda or cfg.transport != "auto" or dist.get_world_size() == 1:
        return None
    return shm.new_group()


def zero_states(model: nn.Module, optimizer: ZeroRedundancyOptimizer,
                cuda: bool = False) -> States:
    """ZeRO-1's snapshot: the model as it is (every rank holds it), the optimizer's shards
    consolidated on rank 0 (a collective) and, from a snapshot, taken back by each rank."""

    def optimizer_state() -> dict:
        if cuda:
            optimizer.consolidate_state_dict(to=0)
        else:
            _consolidate(optimizer)
        state = optimizer.state_dict() if dist.get_rank() == 0 else {}
        optimizer._all_state_dicts = []  # the shards held until written, not after
        return state

    def load(model_state: dict, optimizer_state: dict) -> None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)

    return States(model.state_dict, optimizer_state, load)


def _consolidate(optimizer: ZeroRedundancyOptimizer) -> None:
    """What ``optimizer.consolidate_state_dict(to=0)`` does, without its copies: each
    rank's shard of the optimizer state sent to rank 0 alone, its tensors as they are (a
    small pickle of the shard's structure first), where torch's broadcasts every shard to
    every rank, and its sender copies the shard's pickle through a Python sequence of
    bytes (``torch.ByteTensor(bytearray)``): resnet18's 22 MB shard of SGD's momentum held
    rank 1 240 MB above its training peak at every snapshot. Over the default group, which
    ZeRO's spans (its shared-memory group has no point-to-point). Rank 0 then holds every
    shard where torch's consolidation leaves them (``_all_state_dicts``, which the
    optimizer's ``state_dict`` reads)."""
    optimizer._all_state_dicts = []  # the last snapshot's, not held beside the new
    optimizer._sync_param_groups(optimizer.param_groups, optimizer.optim.param_groups)
    local = optimizer.optim.state_dict()
    if dist.get_rank() != 0:
        tensors: list[torch.Tensor] = []
        dist.send_object_list([_hollow(local, tensors)], dst=0)
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=0)
        optimizer._all_state_dicts = []
        return
    shards = [local]
    for src in range(1, dist.get_world_size()):
        box: list = [None]
        dist.recv_object_list(box, src=src)
        shards.append(_filled(box[0], src))
    optimizer._all_state_dicts = shards


def _hollow(local: dict, tensors: list[torch.Tensor]) -> dict:
    """``local`` (an optimizer's state dict) with each tensor of its state replaced by its
    shape and dtype, the tensors appended to ``tensors`` in the same order."""
    state = {}
    for index, values in local["state"].items():
        state[index] = {}
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                value = _Hole(tuple(value.shape), value.dtype)
            state[index][key] = value
    return {"state": state, "param_groups": local["param_groups"]}


def _filled(hollow: dict, src: int) -> dict:
    """``hollow`` with each hole's tensor received from ``src``, in ``_hollow``'s order."""
    for values in hollow["state"].values():
        for key, value in values.items():
            if isinstance(value, _Hole):
                values[key] = torch.empty(value.shape, dtype=value.dtype)
                dist.recv(values[key], src=src)
    return hollow


@dataclasses.dataclass(frozen=True)
class _Hole:
    shape: tuple[int, ...]
    dtype: torch.dtype
