"""The MPI backend: each MPI rank is a node that trains with a local strategy on its slice
of every global batch, and the nodes average their gradients with a reducer.

    ddlstudy run --usecase tiny --backend mpi --nodes 2 --reduce ring-allreduce
    mpiexec -n 4 -hosts a,b,c,d ddlstudy run --usecase simple-big --backend mpi

``--nodes N`` makes ddlstudy start ``mpiexec -n N`` on this machine itself; a run started
under someone else's mpiexec (hosts file, scheduler) just joins. Rank 0 checks and scans
the data and sends the list to the others, writes the run folder, and gathers every rank's
resource samples. Every rank reads only its own slice of the images.

Gradients are averaged without a copy: each parameter's ``.grad`` is a view into one flat
buffer, backward accumulates into it, and the reducer averages the buffer in place through
its numpy view. Each node weights its loss by nodes x (its images / global batch), so the
average is the global batch's mean gradient even when the slices differ by an image. A
rank that raises aborts the whole job (MPI_Abort), so no rank waits forever.

A node whose strategy runs several processes (cpu-processes, gpu-data, pipeline, hybrid)
is led by its rank: see ``ddlstudy.nodes``.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ddlstudy import compress
from ddlstudy.doctor import find_mpiexec
from ddlstudy.errors import ConfigError, Unavailable
from ddlstudy.models import build_model
from ddlstudy.reducers import get_reducer
from ddlstudy.strategies import get_strategy
from ddlstudy.strategies.base import Job, Link, train_epochs
from ddlstudy.training import (
    Batch,
    ShardedBatches,
    StepFn,
    Trainer,
    accumulate_grads,
    make_loaders,
    make_scaler,
    optimizer_step,
    seed_everything,
)

log = logging.getLogger("ddlstudy")

CHILD_ENV = "DDLSTUDY_MPI_CHILD"
RUN_ID_ENV = "DDLSTUDY_RUN_ID"
_BAD_TERMINATION = re.compile(r"^=\s+PID (\d+) RUNNING AT")
"""How hydra's mpiexec names a rank that died ("=   PID 12868 RUNNING AT host")."""
RANK_FAILED = "run failed: "
"""What a rank logs before its MPI_Abort; mpi.launch reads the first such line, to record
why in the manifest when that rank is not rank 0 (which mpiexec then ends unannounced)."""


def under_mpiexec() -> bool:
    return any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", CHILD_ENV))


def check(cfg) -> None:
    """What a node's strategy can do under MPI (the strategy has checked its own flags).
    Every local strategy can: a one-process one runs in the rank, a multi-process one in a
    node the rank leads (``ddlstudy.nodes``)."""
    if get_strategy(cfg.strategy).layout(cfg).get("processes", 1) > 1:
        what = f"{cfg.strategy} nodes (their workers sum on the leader first)"
        if cfg.balance != "equal":
            raise Unavailable("--balance", f"throughput balancing is not written for {what}; "
                              "use sequential or cpu-intraop nodes")
        if cfg.bucket_mb:
            raise Unavailable("--bucket-mb", f"buckets are not written for {what}; use "
                              "sequential or cpu-intraop nodes")
    workers = cfg.data_parallel()
    if cfg.global_batch < workers:
        raise ConfigError("--batch-size", f"{cfg.global_batch} is smaller than the {workers} "
                          "data-parallel workers of all the nodes; each needs at least one "
                          "image of every batch")


def require_mpiexec() -> str:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise Unavailable("--backend", "mpi needs mpiexec, which was not found; pip install "
                          "mpich mpi4py (make install does) or load your cluster's MPI module")
    return mpiexec


def placement(hosts: str | None, nodes: int) -> tuple[list[str], dict[str, str]]:
    """mpiexec's flags and environment for ``--hosts``: a list of real hosts, or the
    emulated hosts (their launcher, and a netmod that sends over their network)."""
    if hosts is None:
        return [], {}
    if hosts == "emulated" or hosts.startswith("emulated:"):
        from ddlstudy import hosts as emulated

        found = emulated.load(hosts.partition(":")[2] or emulated.DEFAULT_PREFIX)
        if nodes > found.count:
            log.warning("%d ranks on %d emulated hosts: some hosts run several", nodes,
                        found.count)
        return found.mpiexec_args(nodes), dict(emulated.MPI_ENV)
    return ["-hosts", hosts], {}


@dataclass
class Launched:
    """How mpiexec ended: its exit code, the PID it reported for a rank that died, and
    the first error a failing rank logged."""

    code: int
    dead_pid: int | None = None
    failure: str | None = None


def launch(argv: list[str], nodes: int, run_id: str,
           where: tuple[list[str], dict[str, str]] = ([], {})) -> Launched:
    """Run this same command as ``mpiexec -n nodes`` and say how it ended (its output is
    passed on to stderr line by line while it is read for that)."""
    mpiexec = require_mpiexec()
    flags, netmod = where  # placement(--hosts, nodes)
    env = os.environ | netmod | {CHILD_ENV: "1", RUN_ID_ENV: run_id}
    cmd = [mpiexec, *flags, "-n", str(nodes), sys.executable, "-m", "ddlstudy", *argv]
    log.info("launching %d MPI ranks: %s", nodes, " ".join(cmd))
    ended = Launched(0)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stderr.write(line)
            found = _BAD_TERMINATION.search(line)
            if found and ended.dead_pid is None:
                ended.dead_pid = int(found.group(1))
            if RANK_FAILED in line and ended.failure is None:
                ended.failure = line.split(RANK_FAILED, 1)[1].strip()
    ended.code = proc.returncode
    return ended


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def flat_gradients(model: nn.Module) -> torch.Tensor:
    """One buffer holding every parameter's gradient; each ``.grad`` becomes a view of it."""
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def check_views(model: nn.Module, flat: torch.Tensor) -> None:
    """Autograd accumulates into an existing .grad in place; make sure it still does."""
    start, end = flat.data_ptr(), flat.data_ptr() + flat.element_size() * flat.numel()
    if not all(start <= p.grad.data_ptr() < end for p in model.parameters()):
        raise RuntimeError("a gradient is no longer a view of the flat buffer; the reducer "
                           "would not see it")


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
            rates = self.comm.allgather(self.images / max(self.seconds, 1e-9))
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
        offsets, offset = [], 0
        for p in params:
            offsets.append(offset)
            offset += p.numel()
        # Walk the parameters backwards, closing a bucket when it holds bucket_bytes.
        self.ranges: list[tuple[int, int]] = []
        self.owner: dict[int, int] = {}
        end, size = offset, 0
        for i in reversed(range(len(params))):
            self.owner[id(params[i])] = len(self.ranges)
            size += 4 * params[i].numel()
            if size >= bucket_bytes or i == 0:
                self.ranges.append((offsets[i], end))
                end, size = offsets[i], 0
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


def node_link(comm, reducer) -> Link:
    """One process per node: the reducer averages between the MPI ranks."""

    def exchange(flat: torch.Tensor, step: int) -> None:
        reducer(comm, flat.numpy(), step=step)  # shares memory with flat, hence every .grad

    def sum_over_nodes(*values: float) -> list[float]:
        return comm.allreduce(np.asarray(values, dtype=np.float64)).tolist()

    return Link(comm.Get_rank(), comm.Get_size(), exchange, sum_over_nodes,
                lambda obj: comm.gather(obj, root=0), comm.Barrier)


def mpi_step(model: nn.Module, optimizer: torch.optim.Optimizer, flat: torch.Tensor,
             link: Link, global_batch: int, accumulate: int = 1,
             balancer: Balancer | None = None, local=None, after=None,
             scaler: torch.amp.GradScaler | None = None) -> StepFn:
    """One worker's step: its gradients (``local``, e.g. cpu-threads' replicas, or the model
    on its slice as ``accumulate`` micro-batches), weighted by the slice's share of the
    global batch, then averaged over every worker by ``link``, then the optimizer (and
    ``after``: cpu-threads copies the new weights to its other replicas)."""
    count = 0

    def step(batch: Batch) -> tuple[float, int, int]:
        nonlocal count
        images, labels = batch
        n = labels.numel()
        optimizer.zero_grad(set_to_none=False)  # zero in place: the grads stay views
        start = time.perf_counter()
        scale = link.world * n / global_batch
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
        link.exchange(flat, count)  # once per step, after every micro-batch
        optimizer_step(optimizer, scaler)  # fp16: every worker sees the same averaged inf
        if after is not None:
            after()
        count += 1
        return loss_sum, correct, n

    return step


def fit(job: Job, comm) -> list[dict]:
    """Train this rank's node and average across nodes. Returns the samples of the node's
    other processes (none unless its strategy runs several)."""
    cfg, uc = job.cfg, job.cfg.usecase
    # The node's processes, threads and replicas as its strategy lays them out (and records).
    layout = get_strategy(cfg.strategy).layout(cfg)
    if layout.get("processes", 1) > 1:
        from ddlstudy import nodes

        return nodes.fit(job, comm, layout)
    rank = comm.Get_rank()
    replicas = layout.get("replicas", 1)
    torch.set_num_threads(layout.get("intraop_threads", layout["threads_per_process"]))
    seed_everything(uc.train.seed)
    model = build_model(uc.model, len(uc.classes))  # the same weights on every node
    torch.manual_seed(uc.train.seed + rank)  # each node its own dropout masks and flips
    flat = flat_gradients(model)
    if replicas == 1:
        _fit(job, comm, model, flat)
        return []
    from ddlstudy.strategies.threads import replica_grads, sync_replicas

    copies = [model] + [copy.deepcopy(model) for _ in range(replicas - 1)]
    with ThreadPoolExecutor(replicas, thread_name_prefix="replica") as pool:
        _fit(job, comm, model, flat, local=replica_grads(copies, nn.CrossEntropyLoss(), pool),
             after=lambda: sync_replicas(copies))
    return []


def _fit(job: Job, comm, model: nn.Module, flat: torch.Tensor, local=None,
         after=None) -> None:
    cfg = job.cfg
    rank, nodes = comm.Get_rank(), comm.Get_size()
    compressor = compress.parse(cfg.compress)
    link = node_link(comm, compressor or get_reducer(cfg.reduce))
    buckets = Buckets(model, flat, comm, int(cfg.bucket_mb * 2**20), cfg.accumulate) \
        if cfg.bucket_mb else None
    if buckets is not None:  # the buckets' exchange, begun during backward
        link.exchange = lambda flat, step: buckets.finish()
    train, val = make_loaders(cfg, job.data, shard=(rank, nodes))
    balancer = Balancer(comm, train.batch_sampler.batches) \
        if cfg.balance == "throughput" and nodes > 1 else None
    optimizer = new_optimizer(model, cfg)
    step = mpi_step(model, optimizer, flat, link, cfg.global_batch, cfg.accumulate,
                    balancer, local, after, make_scaler(cfg.precision))
    train_worker(job, link, model, optimizer, step, train, val)
    if buckets is not None:
        record(job, "buckets", buckets.describe())
    if balancer is not None:
        record(job, "balance", balancer.result or {
            "after_steps": None, "note": f"fewer than {balancer.WARMUP + balancer.STEPS} "
                                         "steps: never measured, slices stayed equal"})
    record_compression(job, compressor)


def new_optimizer(model: nn.Module, cfg) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.usecase.train.momentum)


def train_worker(job: Job, link: Link, model: nn.Module, optimizer: torch.optim.Optimizer,
                 step: StepFn, train, val, device: torch.device | None = None) -> None:
    """The epochs of one worker; worker 0 writes the run folder."""
    cuda = device is not None and device.type == "cuda"
    trainer = Trainer(model, step, train, val, max_steps=job.cfg.max_steps,
                      show_progress=job.show_progress and link.rank == 0, reduce=link.sum,
                      device=device, sync=torch.cuda.synchronize if cuda else (lambda: None))
    train_epochs(job, trainer, optimizer, rank=link.rank, writer=link.rank == 0,
                 gather=link.gather, barrier=link.barrier)


def record(job: Job, key: str, value: dict) -> None:
    """Add what the backend measured to the manifest (the writer's ``backend`` section)."""
    if job.folder is not None:
        job.folder.manifest["backend"][key] = value
        job.folder.write_manifest()


def record_compression(job: Job, compressor) -> None:
    if compressor is not None:
        record(job, "compress", {
            "method": compressor.name, "bytes_sent_per_step": compressor.sent_bytes,
            "uncompressed_bytes": compressor.buffer_bytes,
            "factor": compressor.buffer_bytes / max(compressor.sent_bytes, 1)})
