"""An MPI node of one process (sequential, cpu-intraop, cpu-threads, any one-process
strategy): the rank runs its strategy's worker on its slice of every global batch, and the
nodes average their gradients with a reducer (the worker's ``Link``).

Every rank reads only its own slice of the images.

Gradients are averaged without a copy: each parameter's ``.grad`` is a view into one flat
buffer, backward accumulates into it, and the reducer averages the buffer in place through
its numpy view. A rank that raises aborts the whole job (MPI_Abort), so no rank waits
forever.

A node whose strategy runs several processes (cpu-processes, gpu-data, pipeline, hybrid)
is led by its rank: see ``nodes``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch import nn

from ddlstudy import wire
from ddlstudy.backends.mpi import launch, messages
from ddlstudy.config import RunConfig
from ddlstudy.models import facts
from ddlstudy.reducers import AUTO, choose, get, get_reducer
from ddlstudy.reducers.compress import Compressor
from ddlstudy.reducers.compress import parse as parse_compress
from ddlstudy.strategies import Layout, Strategy
from ddlstudy.training import ShardedBatches
from ddlstudy.training.distributed import device_of
from ddlstudy.training.flat import param_ranges
from ddlstudy.training.job import Job, Link, Nodes
from ddlstudy.training.worker import record

log = logging.getLogger("ddlstudy")


class Balancer:
    """``--balance throughput``: times this node's forward and backward (not the exchange,
    where a fast node waits for a slow one) over steps ``WARMUP + 1`` to ``WARMUP + STEPS``,
    then gives every node a share of each later global batch in proportion to its images/s.
    Each node's loss is weighted by its slice, so the update is still the global batch's
    mean gradient; only who computes which image changes."""

    WARMUP, STEPS = 2, 4

    def __init__(self, comm, sharded: ShardedBatches) -> None:
        self.comm, self.sharded = comm, sharded
        self.steps, self.seconds, self.images = 0, 0.0, 0
        self.result: dict | None = None

    def timed(self, images: int, seconds: float) -> None:
        """After every step's compute (a collective once, at the same step on every node)."""
        self.steps += 1
        if self.result is not None or self.steps <= self.WARMUP:
            return
        self.seconds += seconds
        self.images += images
        if self.steps == self.WARMUP + self.STEPS:
            rates = messages.allgather_floats(self.comm, self.images / max(self.seconds, 1e-9))
            total = sum(rates)
            self.sharded.shares = [r / total for r in rates]
            self.result = {"after_steps": self.steps,
                           "compute_images_per_s": [round(r, 2) for r in rates],
                           "shares": [round(r / total, 4) for r in rates]}
            if self.comm.Get_rank() == 0:
                log.info("balance: nodes compute %s images/s; slices of each global batch "
                         "from now on: %s", ", ".join(f"{r:.1f}" for r in rates),
                         ", ".join(f"{r / total:.0%}" for r in rates))


class Buckets:
    """``--bucket-mb``: the flat gradient buffer cut into buckets of about that size, in
    the order backward fills them (last layers first); each bucket's Iallreduce starts as
    soon as its last gradient is accumulated, while the backward pass goes on with the
    layers before it (as DDP's buckets do). Later hooks poke MPI's progress engine, and
    ``finish`` waits for every bucket and divides by the node count. Non-blocking
    collectives must start in the same order on every rank: they do, as every rank runs
    the same model, whose backward fills the buckets in the same order."""

    def __init__(self, model: nn.Module, flat: torch.Tensor, comm, bucket_bytes: int,
                 accumulate: int = 1) -> None:
        self.comm, self.flat, self.nodes = comm, flat.numpy(), comm.Get_size()
        params = [p for p in model.parameters() if p.requires_grad]
        spans = param_ranges(model)  # where each gradient lies in the flat buffer
        # Walk the parameters backwards, closing a bucket when it holds bucket_bytes.
        self.ranges: list[tuple[int, int]] = []
        self.owner: dict[int, int] = {}
        end, size = spans[id(params[-1])][1], 0
        for i in reversed(range(len(params))):
            self.owner[id(params[i])] = len(self.ranges)
            size += 4 * params[i].numel()
            if size >= bucket_bytes or i == 0:
                start = spans[id(params[i])][0]
                self.ranges.append((start, end))
                end, size = start, 0
        self.expected = [0] * len(self.ranges)
        for p in params:
            self.expected[self.owner[id(p)]] += accumulate  # one hook per micro-batch
        self.ready = [0] * len(self.ranges)
        self.requests: list = [None] * len(self.ranges)
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in params]
        self.early = self.total = 0

    def describe(self) -> dict:
        """For the manifest: the buckets, and the share of them whose exchange started
        while the backward pass was still running."""
        return {"count": len(self.ranges),
                "mib": [round(4 * (hi - lo) / 2**20, 2) for lo, hi in self.ranges],
                "started_during_backward": round(self.early / max(self.total, 1), 4)}

    def _ready(self, param: torch.Tensor) -> None:
        from mpi4py import MPI

        b = self.owner[id(param)]
        self.ready[b] += 1
        if self.ready[b] == self.expected[b]:
            lo, hi = self.ranges[b]
            self.requests[b] = self.comm.Iallreduce(MPI.IN_PLACE, self.flat[lo:hi],
                                                    op=MPI.SUM)
        started = [r for r in self.requests if r is not None]
        if started:
            MPI.Request.Testall(started)  # progress for the buckets already on their way

    def finish(self) -> None:
        """After backward: start any bucket whose hooks did not all fire, wait for all."""
        from mpi4py import MPI

        self.total += len(self.ranges)
        for b, (lo, hi) in enumerate(self.ranges):
            if self.requests[b] is not None:
                self.early += 1
            else:
                self.requests[b] = self.comm.Iallreduce(MPI.IN_PLACE, self.flat[lo:hi],
                                                        op=MPI.SUM)
        MPI.Request.Waitall(self.requests)
        self.flat /= self.nodes
        self.ready = [0] * len(self.ranges)
        self.requests = [None] * len(self.ranges)


def reducer_name(cfg: RunConfig, ranks: int) -> str:
    """The reducer the nodes run: ``--reduce``, or for ``auto`` the one ``reducers.choose``
    picks for the model's float32 gradient between ``ranks`` ranks (the same on every rank:
    the model is counted from its shapes, nothing allocated). Buckets are MPI's own
    Iallreduce."""
    if cfg.bucket_mb:
        return "allreduce"
    if cfg.reduce != AUTO:
        return cfg.reduce
    return choose(facts(cfg.usecase.model, len(cfg.usecase.classes)).gradient_bytes, ranks)


def averaging(cfg: RunConfig, nodes: int) -> tuple[Callable, Compressor | None, bool]:
    """What averages the gradient between ``nodes`` nodes: ``--compress``'s compressor in
    place of the reducer, else the reducer; the compressor (None without); and whether
    every node ends with the same average (compressors and every reducer but step-wise)."""
    compressor = parse_compress(cfg.compress)
    if compressor is not None:
        return compressor, compressor, True
    name = reducer_name(cfg, nodes)
    return get_reducer(name), None, get(name).exact


def on_host(tensor: torch.Tensor, act) -> None:
    """``act`` on ``tensor``'s numpy view: its own memory on the CPU (hence every .grad
    that is a view of it), a copy brought back on a GPU."""
    host = tensor.cpu()
    act(host.numpy())
    if host.data_ptr() != tensor.data_ptr():
        tensor.copy_(host)


def node_link(comm, reducer, hooks: NodeHooks | None = None, exact: bool = True) -> Link:
    """One process per node: the reducer averages between the MPI ranks (or the buckets
    ``hooks`` started during backward, where there are); ``exact``: it leaves every rank
    the same average (step-wise does not)."""

    def average(flat: torch.Tensor, step: int) -> None:
        on_host(flat, lambda array: reducer(comm, array, step=step))

    def exchange(flat: torch.Tensor, step: int) -> None:
        if hooks is not None and hooks.buckets is not None:
            hooks.buckets.finish()
        else:
            average(flat, step)

    def sum_over_nodes(*values: float) -> list[float]:
        return messages.sum_floats(comm, values)

    nodes = Nodes(comm.Get_rank(), comm.Get_size(), average, exact,
                  Nodes.attach if hooks is None else hooks.attach)
    return Link(nodes.index, nodes.count, exchange, sum_over_nodes,
                functools.partial(gather_tensors, comm), comm.Barrier,
                lambda tensor: on_host(tensor, lambda a: comm.Bcast(a, root=0)), nodes=nodes)


def gather_tensors(comm, obj: object) -> list | None:
    """Every node's ``obj`` (random states: tensors and plain values) on node 0."""
    return messages.gather_as(comm, obj, wire.to_tensors, wire.from_tensors)


class NodeHooks:
    """What MPI adds to a node's worker (``Link.attach``): ``--bucket-mb``'s buckets, sent
    as backward fills them, and ``--balance throughput``; recorded when training ends."""

    def __init__(self, cfg: RunConfig, comm) -> None:
        self.cfg, self.comm = cfg, comm
        self.buckets: Buckets | None = None
        self.balancer: Balancer | None = None

    def attach(self, model: nn.Module, flat: torch.Tensor, train) -> Balancer | None:
        cfg = self.cfg
        if cfg.bucket_mb:  # the exchange is then theirs, begun during backward
            self.buckets = Buckets(model, flat, self.comm, int(cfg.bucket_mb * 2**20),
                                   cfg.accumulate)
        if cfg.balance == "throughput" and self.comm.Get_size() > 1:
            self.balancer = Balancer(self.comm, train.batch_sampler.batches)
        return self.balancer

    def record(self, job: Job) -> None:
        if self.buckets is not None:
            record(job, "buckets", self.buckets.describe())
        if self.balancer is not None:
            balancer = self.balancer
            record(job, "balance", balancer.result or {
                "after_steps": None, "note": f"fewer than {balancer.WARMUP + balancer.STEPS} "
                                             "steps: never measured, slices stayed equal"})


def fit(job: Job, comm, strategy: Strategy, layout: Layout) -> list[dict]:
    """Train this rank's one-process node with its strategy's worker (its threads and
    replicas as the strategy lays them out), averaging across nodes. Returns no samples:
    the node has no other processes."""
    cfg = job.cfg
    torch.set_num_threads(layout.torch_threads)
    reducer, compressor, exact = averaging(cfg, comm.Get_size())
    hooks = NodeHooks(cfg, comm)
    link = node_link(comm, reducer, hooks, exact=exact)
    gpus = torch.cuda.device_count() if layout.device_type == "cuda" else 1
    strategy.worker(job, link, device_of(layout.device_type, launch.local_rank() % gpus))
    hooks.record(job)
    record_compression(job, compressor)
    return []


def record_compression(job: Job, compressor) -> None:
    if compressor is not None:
        record(job, "compress", {
            "method": compressor.name, "bytes_sent_per_step": compressor.sent_bytes,
            "uncompressed_bytes": compressor.buffer_bytes,
            "factor": compressor.buffer_bytes / max(compressor.sent_bytes, 1)})
