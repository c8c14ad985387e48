"""``--spark-sync allgather`` (SparkNet): each task's worker trains on its own slice with
local SGD (its link exchanges no gradient) and every ``--sync-every`` steps (and at every
epoch end) the weights are averaged through Spark's barrier ``allGather`` itself, in
chunks small enough for Spark's RPC messages."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ddlstudy import wire
from ddlstudy.logs import setup_logging
from ddlstudy.machine.sampler import ResourceSampler
from ddlstudy.machine.sparkjvm import RPC_MAX_MB
from ddlstudy.training import Job, Link, Nodes
from ddlstudy.training.distributed import Work

SPARK_DEFAULT_HEAP_MB = 1024
"""spark.driver.memory and spark.executor.memory when nobody sets them."""
JVM_BASE_MB = 512
"""What a Spark JVM holds besides the allGather messages."""


def chunk_floats(world: int) -> int:
    """Floats in one allGather of the weights: every task's chunk, base64-encoded, in one
    reply under spark.rpc.message.maxSize (with room to spare), at least 1 Mi floats."""
    return max(1 << 20, (RPC_MAX_MB << 20) // 2 // world * 3 // 4 // 4)


def heap_mb(parameters: int, world: int) -> int:
    """JVM heap an allGather of ``parameters`` weights over ``world`` tasks needs, on the
    driver (its barrier coordinator holds every task's message and a reply for each) and
    on an executor (its message, the reply and their serialised copies): the base plus
    (2 + 2 world + world^2) base64 chunks. Measured: AlexNet's 57 M weights over 2 tasks
    (128 MiB chunks, 1.8 GiB) ran Spark's default 1 GiB executors out of heap."""
    b64_mb = min(chunk_floats(world), parameters) * 4 * 4 / 3 / 2**20
    return math.ceil(JVM_BASE_MB + (2 + 2 * world + world * world) * b64_mb)


def _gather(ctx, data: bytes) -> list[bytes]:
    """Every task's ``data``, in rank order, through Spark's barrier allGather (``wire``
    encodes it: never a pickle, which the other tasks would run)."""
    return [base64.b64decode(m) for m in ctx.allGather(base64.b64encode(data).decode())]


def average_weights(ctx, model: nn.Module, world: int) -> None:
    """Replace every task's weights by their mean, sent through allGather in chunks that
    keep each reply under spark.rpc.message.maxSize."""
    params = [p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    chunk = chunk_floats(world)
    out = np.empty_like(flat)
    for start in range(0, flat.size, chunk):
        part = flat[start:start + chunk]
        msgs = ctx.allGather(base64.b64encode(part.tobytes()).decode())
        stacked = np.stack([np.frombuffer(base64.b64decode(m), dtype=np.float32) for m in msgs])
        out[start:start + chunk] = stacked.mean(axis=0, dtype=np.float64)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(torch.from_numpy(out[offset:offset + p.numel()]).view_as(p))
            offset += p.numel()


def broadcast_first(ctx, rank: int, tensor: torch.Tensor, world: int) -> None:
    """Task 0's ``tensor`` on every task, through allGather in chunks that keep each reply
    under spark.rpc.message.maxSize (the other tasks send nothing)."""
    flat = tensor.detach().cpu().reshape(-1).clone()
    step = chunk_floats(world)
    for start in range(0, flat.numel(), step):
        part = flat[start:start + step]
        mine = part.numpy().tobytes() if rank == 0 else b""
        first = base64.b64decode(ctx.allGather(base64.b64encode(mine).decode())[0])
        part.copy_(torch.frombuffer(bytearray(first), dtype=flat.dtype))
    with torch.no_grad():
        tensor.copy_(flat.view_as(tensor))


def allgather_rank(ctx, rank: int, world: int, job: Job, work: Work, threads: int,
                   level: int) -> None:
    """Task ``rank`` of ``world``: its strategy's worker with local SGD, the weights
    averaged through ``ctx.allGather`` every --sync-every steps and before validating."""
    cfg = job.cfg
    torch.set_num_threads(threads)
    setup_logging(level)
    sampler = ResourceSampler(cfg.sample_hz, rank=rank, scope="worker").start()

    def sum_over_tasks(*values: float) -> list[float]:
        every = [wire.from_json(m) for m in _gather(ctx, wire.to_json(values))]
        return np.sum(np.asarray(every, dtype=np.float64), axis=0).tolist()

    def gather(obj: Any) -> list[Any]:  # random states: tensors and plain values
        return [wire.from_tensors(m) for m in _gather(ctx, wire.to_tensors(obj))]

    def settle(model: nn.Module, steps: int | None) -> None:
        if steps is None or steps % cfg.sync_every == 0:
            average_weights(ctx, model, world)

    def broadcast(tensor: torch.Tensor) -> None:
        broadcast_first(ctx, rank, tensor, world)

    try:
        work(job, Link(rank, world, lambda flat, step: None, sum_over_tasks, gather,
                       ctx.barrier, broadcast, nodes=Nodes(rank, world, settle=settle)),
             torch.device("cpu"))
    finally:
        rows = sampler.stop()
        if job.folder is not None and sampler.enabled:
            job.folder.write_worker_samples(rank, rows)
