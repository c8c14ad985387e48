"""Every gradient as a view of one flat buffer, so a step's exchange is one collective on
one buffer and no gradient is copied: backward accumulates into the views, an exchange
averages the buffer in place (MPI reducers through its numpy view, torch.distributed
through ``average``, this host's shared memory through ``training.shm``); ``exchange_step``
is the step of every worker that exchanges so (MPI nodes, cpu-processes in shared
memory)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ddlstudy.training.job import Link
from ddlstudy.training.steps import Batch, StepFn, accumulate_grads, optimizer_step


def flat_gradients(model: nn.Module, buffer: torch.Tensor | None = None) -> torch.Tensor:
    """One buffer holding every parameter's gradient (``buffer``, zeroed, where given: a
    shared memory's); each ``.grad`` becomes a view of it."""
    params = list(model.parameters())
    ranges = param_ranges(model)
    size = sum(p.numel() for p in params)
    if buffer is None:
        flat = torch.zeros(size, device=params[0].device)
    else:
        flat = buffer[:size].zero_()
    for p in params:
        lo, hi = ranges[id(p)]
        p.grad = flat[lo:hi].view_as(p)
    return flat


def check_views(model: nn.Module, flat: torch.Tensor) -> None:
    """Autograd accumulates into an existing .grad in place; make sure it still does."""
    start, end = flat.data_ptr(), flat.data_ptr() + flat.element_size() * flat.numel()
    if not all(start <= p.grad.data_ptr() < end for p in model.parameters()):
        raise RuntimeError("a gradient is no longer a view of the flat buffer; the reducer "
                           "would not see it")


def param_ranges(model: nn.Module) -> dict[int, tuple[int, int]]:
    """Each parameter's (start, end) in ``model``'s flat buffer, by ``id``."""
    ranges, offset = {}, 0
    for p in model.parameters():
        ranges[id(p)] = (offset, offset + p.numel())
        offset += p.numel()
    return ranges


def average(flat: torch.Tensor, group=None, size: int | None = None) -> None:
    """Average ``flat`` in place over the processes of ``group`` (equal slices: the mean
    of their mean gradients)."""
    dist.all_reduce(flat, group=group)
    flat /= size if size is not None else dist.get_world_size(group)


def exchange_step(model: nn.Module, optimizer: torch.optim.Optimizer, flat: torch.Tensor,
                  link: Link, global_batch: int, accumulate: int = 1, balancer=None,
                  local=None,
                  scaler: torch.amp.GradScaler | None = None) -> StepFn:
    """One worker's step whose gradients are views of ``flat``: its gradients (``local``,
    e.g. cpu-threads' replicas, or the model on its slice as ``accumulate`` micro-batches),
    weighted by the slice's share of the global batch, then averaged over every worker by
    ``link``, then the optimizer (and ``link.nodes.settle``, where the backend averages weights).
    Alone (``link.world`` 1) it is the baseline's step. ``step.times`` adds up the seconds
    spent computing and in the exchange (waiting for the slowest worker included), for the
    manifest (``worker.record_exchange``). ``balancer``: MPI's ``--balance throughput``,
    which times each node's compute."""
    count = 0
    times = {"steps": 0, "compute_s": 0.0, "exchange_s": 0.0}

    def step(batch: Batch) -> tuple[float, int, int]:
        nonlocal count
        images, labels = batch
        n = labels.numel()
        optimizer.zero_grad(set_to_none=False)  # zero in place: the grads stay views
        start = time.perf_counter()
        # Each worker's share of the global batch; alone, a batch's mean (the baseline's
        # step, a final smaller batch included).
        scale = link.world * n / global_batch if link.world > 1 else 1.0
        if local is not None:
            loss_sum, correct, _ = local(batch, scale)
        else:
            if images.device != flat.device:
                images, labels = images.to(flat.device), labels.to(flat.device)
            loss_sum, correct = accumulate_grads(model, nn.CrossEntropyLoss(), images,
                                                 labels, accumulate, scale=scale,
                                                 scaler=scaler)
        if balancer is not None:
            balancer.timed(n, time.perf_counter() - start)
        if count == 0:
            check_views(model, flat)
        computed = time.perf_counter()
        link.exchange(flat, count)  # once per step, after every micro-batch
        exchange_s = time.perf_counter() - computed
        optimizer_step(optimizer, scaler)  # fp16: every worker sees the same averaged inf
        count += 1
        if link.nodes.settle is not None:  # local SGD: the weights averaged every so often
            settling = time.perf_counter()
            link.nodes.settle(model, count)
            exchange_s += time.perf_counter() - settling
        times["steps"] += 1
        times["exchange_s"] += exchange_s
        times["compute_s"] += time.perf_counter() - start - exchange_s
        return loss_sum, correct, n

    step.times = times
    return step
