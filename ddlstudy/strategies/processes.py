"""cpu-processes: k processes, one replica each, gradients averaged every step (the paper's
fastest CPU strategy).

Every rank walks the same shuffled sequence of global batches (one seeded generator, as in
the sequential baseline) and loads only its slice of each, so the k slices together are
exactly the baseline's batch. DistributedDataParallel over gloo all-reduces the gradients in
buckets while the backward pass runs. DDP divides the summed gradients by k; each rank
scales its loss by k * n_rank / n so that the result is the full batch's mean gradient
even when n is not a multiple of k. Threads per process are cores // k, so k x threads
never oversubscribes the machine. Rank 0 validates together with the others (each a slice,
counts summed) and writes the run folder.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlstudy import signals
from ddlstudy.config import RunConfig
from ddlstudy.environment import usable_cores
from ddlstudy.errors import Unavailable
from ddlstudy.logs import setup_logging
from ddlstudy.models import build_model
from ddlstudy.sampler import ResourceSampler, write_rows
from ddlstudy.strategies.base import (
    Job,
    Strategy,
    register,
    require_batch_per_worker,
    train_epochs,
    warn_if_oversubscribed,
)
from ddlstudy.training import (
    Batch,
    StepFn,
    Trainer,
    accumulate_grads,
    make_loaders,
    make_scaler,
    optimizer_step,
    seed_everything,
)

log = logging.getLogger("ddlstudy")

WRITE_GRACE_S = 30.0
"""How long a terminated rank may take to finish the file it is writing before SIGKILL."""
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
"""A rank that stops answering ends the job after this long instead of hanging it."""


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (the loopback unless other hosts must reach it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class WorkerDied(RuntimeError):
    """A spawned rank ended without a Python error (SIGKILL, out of memory, os._exit)."""


def run_ranks(fn, world: int, args: tuple) -> None:
    """Start ``fn(rank, world, *args)`` in ``world`` spawned processes and wait for all.

    The first rank that fails ends the others (torch's ProcessContext.join raises); if this
    process is interrupted, no rank is left behind.
    """
    context = mp.start_processes(fn, args=(world, *args), nprocs=world, join=False,
                                 start_method="spawn")
    try:
        while not context.join():
            pass
    except mp.ProcessExitedException as exc:  # killed or exited without a Python error
        raise WorkerDied(f"worker rank {exc.error_index} (PID {exc.error_pid}) died: "
                         f"{exit_reason(exc.exit_code)}") from None
    finally:
        stop_ranks(context.processes)


def stop_ranks(processes: list) -> None:
    """End the ranks still running, giving each a grace to finish the file it writes."""
    for proc in processes:  # SIGTERM: a rank in a snapshot write finishes it
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=WRITE_GRACE_S)
        if proc.is_alive():  # stuck in a collective: signal handlers cannot run
            proc.kill()
            proc.join()


def exit_reason(code: int) -> str:
    """A process's exit code in words: a signal's name, or the code."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def ddp_step(model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
             loss_fn: nn.Module, global_batch: int, world: int,
             device: torch.device | None = None, accumulate: int = 1,
             scaler: torch.amp.GradScaler | None = None) -> StepFn:
    """A rank's slice of the batch (as ``accumulate`` micro-batches, all but the last under
    ``no_sync``), its loss scaled by world x n / global batch since DDP divides by world."""

    def step(batch: Batch) -> tuple[float, int, int]:
        images, labels = batch
        if device is not None:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        n = labels.numel()
        optimizer.zero_grad(set_to_none=True)
        loss_sum, correct = accumulate_grads(model, loss_fn, images, labels, accumulate,
                                             scale=world * n / global_batch,
                                             no_sync=model.no_sync, scaler=scaler)
        optimizer_step(optimizer, scaler)
        return loss_sum, correct, n

    return step


def sum_over_ranks(*values: float, device: torch.device | None = None) -> list[float]:
    """Per-rank sums (loss, correct, images) added up, so rank 0 reports the whole batch."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_to_first(obj: Any) -> list | None:
    """Every rank's ``obj`` in a list on rank 0 (None elsewhere); a collective."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out if dist.get_rank() == 0 else None


def rendezvous(host: str, port: int, rank: int, world: int) -> dist.TCPStore:
    """The TCPStore the ranks meet through, its server listening on ``host`` only (torch's
    own would listen on every interface)."""
    fd = None
    if host in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own sockets too
    if rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(world * 2)
            # The store owns the descriptor from now on and closes it itself: closing it
            # here as well would close whatever another thread opened under that number
            # since (the resource sampler's /proc reads failed with EBADF so).
            fd = listener.detach()
    return dist.TCPStore(host, port, world, rank == 0, timeout=COLLECTIVE_TIMEOUT,
                         master_listen_fd=fd)


@contextlib.contextmanager
def process_group(rank: int, world: int, port: int | str,
                  device_type: str = "cpu") -> Iterator[torch.device]:
    """Join the ranks' process group (gloo on CPU, NCCL on ``cuda:rank``) through the
    TCPStore at ``port`` ("host:port", or a port on the loopback). Yields the device."""
    cuda = device_type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    host, port = port.rsplit(":", 1) if isinstance(port, str) else ("127.0.0.1", port)
    store = rendezvous(host, int(port), rank, world)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                            world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        yield device
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def spawned_rank(rank: int, world: int, port: int | str, job: Job, threads: int, log_level: int,
                 device_type: str = "cpu", tag: int | None = None,
                 drop: Path | None = None) -> Iterator[torch.device]:
    """Everything a spawned rank needs around its training: threads, logging, its process
    group and its own resource sampler, whose rows go to the run folder when it ends (or
    to ``drop``, a folder its MPI node's leader collects, tagged ``tag``: the rank among
    every node's workers). Yields the rank's device."""
    tag = rank if tag is None else tag
    torch.set_num_threads(threads)
    os.environ["RANK"] = str(tag)
    setup_logging(log_level)
    sampler = ResourceSampler(job.cfg.sample_hz, rank=tag, scope="worker").start()
    try:
        with process_group(rank, world, port, device_type) as device, \
                signals.handled(once=True):  # Ctrl-C or SIGTERM wait for a write to end
            yield device
    except signals.Terminated:  # the parent ends this rank: no traceback, exit 143
        raise SystemExit(143) from None
    finally:
        rows = sampler.stop()
        if drop is not None and sampler.enabled:
            write_rows(drop / f"rank{tag}.parquet", rows)
        elif job.folder is not None and sampler.enabled:
            job.folder.write_worker_samples(rank, rows)


def data_parallel_rank(rank: int, world: int, port: int | str, job: Job, threads: int,
                       log_level: int, device_type: str = "cpu",
                       loader_workers: int | None = None) -> None:
    """One data-parallel rank: on CPU over gloo, or on GPU ``rank`` over NCCL (gpu-data);
    a spawned process of cpu-processes, or a Spark task (``port``: "host:port")."""
    cfg, uc = job.cfg, job.cfg.usecase
    cuda = device_type == "cuda"
    with spawned_rank(rank, world, port, job, threads, log_level, device_type) as device:
        seed_everything(uc.train.seed)
        model = build_model(uc.model, len(uc.classes)).to(device)  # the same weights everywhere
        torch.manual_seed(uc.train.seed + rank)  # but each rank its own dropout masks, flips
        ddp = DistributedDataParallel(model, device_ids=[rank] if cuda else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr,
                                    momentum=uc.train.momentum)
        train_loader, val_loader = make_loaders(cfg, job.data, shard=(rank, world),
                                                loader_workers=loader_workers)
        step = ddp_step(ddp, optimizer, nn.CrossEntropyLoss(), cfg.global_batch, world,
                        device, cfg.accumulate, make_scaler(cfg.precision, device.type))
        trainer = Trainer(model, step, train_loader, val_loader, max_steps=cfg.max_steps,
                          show_progress=job.show_progress and rank == 0,
                          reduce=lambda *v: sum_over_ranks(*v, device=device), device=device,
                          sync=torch.cuda.synchronize if cuda else (lambda: None))
        train_epochs(job, trainer, optimizer, rank=rank, writer=rank == 0,
                     gather=gather_to_first, barrier=dist.barrier)


@register
class CpuProcesses(Strategy):
    name = "cpu-processes"
    resumable = True
    accumulates = True
    summary = ("k processes, each a replica with its slice of every batch, gradients "
               "all-reduced every step over gloo (DDP); the paper's fastest CPU strategy")
    flags = "--workers K (processes, default: usable cores), --loader-workers"

    def check(self, cfg: RunConfig) -> None:
        k = self.workers(cfg)
        require_batch_per_worker(cfg, k, "processes")
        warn_if_oversubscribed(k)

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.workers(cfg)

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        k = self.workers(cfg)
        return {"processes": k, "threads_per_process": max(1, usable_cores() // k),
                "loader_workers": cfg.loader_workers, "backend": "gloo"}

    def fit(self, job: Job) -> None:
        k = self.workers(job.cfg)
        threads = max(1, usable_cores() // k)
        level = logging.getLogger("ddlstudy").level
        run_ranks(data_parallel_rank, k, (free_port(), job, threads, level))


@register
class GpuData(Strategy):
    name = "gpu-data"
    resumable = True
    accumulates = True
    summary = ("one process per GPU, DistributedDataParallel over NCCL, CPU loader workers "
               "decoding ahead so each GPU stays busy")
    flags = "--devices N (GPUs, default: all), --loader-workers (default: cores per GPU - 1)"

    def devices(self, cfg: RunConfig) -> int:
        return cfg.devices or torch.cuda.device_count()

    def data_parallel(self, cfg: RunConfig) -> int:
        return max(1, self.devices(cfg))

    def check(self, cfg: RunConfig) -> None:
        if not torch.cuda.is_available():
            raise Unavailable("--strategy", "gpu-data needs CUDA GPUs and this machine has none "
                              "(torch.cuda.is_available() is False); use cpu-processes for "
                              "data parallelism on CPU")
        if self.devices(cfg) > torch.cuda.device_count():
            raise Unavailable("--devices", f"{self.devices(cfg)} GPUs asked for but only "
                              f"{torch.cuda.device_count()} are visible")
        require_batch_per_worker(cfg, self.devices(cfg), "GPUs")

    def loader_workers(self, cfg: RunConfig) -> int:
        return cfg.loader_workers or max(1, usable_cores() // self.devices(cfg) - 1)

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        k = self.devices(cfg)
        return {"processes": k, "devices": k, "threads_per_process": 1,
                "loader_workers": self.loader_workers(cfg), "backend": "nccl"}

    def fit(self, job: Job) -> None:
        k = self.devices(job.cfg)
        level = logging.getLogger("ddlstudy").level
        run_ranks(data_parallel_rank, k, (free_port(), job, 1, level, "cuda",
                               self.loader_workers(job.cfg)))
