"""Processes that train together on one host: spawning them, their rendezvous (on the
loopback unless other hosts must reach it), their process group, and ending them."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlstudy import signals, wire
from ddlstudy.logs import setup_logging
from ddlstudy.machine import collector, environment, forkserver
from ddlstudy.machine.sampler import ResourceSampler, write_rows
from ddlstudy.training.flat import average
from ddlstudy.training.job import Job, Link

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


def spawn(fn, nprocs: int, args: tuple) -> mp.ProcessContext:
    """Start ``fn(i, *args)`` for i in 0..nprocs-1, each in a process forked from the warm
    server (``machine.forkserver``: torch and ddlstudy imported once, not by each) with
    this process's environment, which ends with ``os._exit(0)`` once ``fn`` returns (an
    error still ends it as torch's wrapper does, exit code 1 and the traceback for the
    parent)."""
    forkserver.warm()
    context = mp.start_processes(_then_exit, args=(fn, forkserver.inherited(), *args),
                                 nprocs=nprocs, join=False, start_method="forkserver")
    collector.settled()  # this process's start ends here: its ranks train
    return context


def _then_exit(index: int, fn, inherited: tuple, *args) -> None:
    """A finished rank skips the interpreter's teardown: there gloo's threads and the
    tensors they hold are destroyed in no set order, and one rank in a few full test
    suites died of it, SIGABRT ("terminate called without an active exception") after
    its last epoch, failing a run that had finished. Its files are written by now."""
    forkserver.adopt(*inherited)
    collector.starting()
    forkserver.die_with_parent()
    _named(f"ddlstudy-rank{index}")
    environment.this_process(f"rank {index}")
    environment.mark_phase("start")
    fn(index, *args)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _named(name: str) -> None:
    """The rank's name as ps, top and psutil show it (``ddlstudy-rank1``), where a forked
    process would otherwise show its server's command line. Linux only (prctl)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15])  # PR_SET_NAME


def run_ranks(fn, world: int, args: tuple) -> None:
    """Start ``fn(rank, world, *args)`` in ``world`` spawned processes and wait for all.

    The first rank that fails ends the others (torch's ProcessContext.join raises); if this
    process is interrupted, no rank is left behind.
    """
    log.info("starting %d worker processes ...", world)
    context = spawn(fn, world, (world, *args))
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


def first_found(find, wait_s: float, every_s: float = 0.05):
    """``find()``'s first answer that is not None, asked every ``every_s`` for at most
    ``wait_s`` (None if it never gave one): a killed process's sockets close before it is
    reaped, so its peers' errors come a moment before its death can be seen."""
    deadline = time.monotonic() + wait_s
    while True:
        found = find()
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(every_s)


def exit_reason(code: int) -> str:
    """A process's exit code in words: a signal's name, or the code."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def sum_over_ranks(*values: float, device: torch.device | None = None) -> list[float]:
    """Per-rank sums (loss, correct, images) added up, so rank 0 reports the whole batch."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_to_first(obj: Any, device: torch.device | None = None) -> list | None:
    """Every rank's ``obj`` (tensors and plain values) in a list on rank 0 (None
    elsewhere); a collective. It travels in torch's weights-only format (``ddlstudy.wire``),
    not all_gather_object's pickle."""
    data = torch.frombuffer(bytearray(wire.to_tensors(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    padded = torch.zeros(max(int(n) for n in sizes), dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    if dist.get_rank() != 0:
        return None
    return [wire.from_tensors(part[:int(n)].cpu().numpy().tobytes())
            for part, n in zip(parts, sizes, strict=True)]


JOINED = "ddlstudy/joined"
"""The store's count of the ranks but 0 that have reached it (``rendezvous``)."""


def rendezvous(host: str, port: int, rank: int, world: int,
               peers: Sequence[Any] = ()) -> dist.TCPStore:
    """The TCPStore the ranks meet through, its server listening on ``host`` only (torch's
    own would listen on every interface). Rank 0 waits for the others here, not in torch's
    constructor: ``peers``, processes it started (with ``exitcode``), end the wait as soon
    as one of them has ended, where torch would wait out COLLECTIVE_TIMEOUT for a process
    the kernel killed before it reached the store (an MPI node's leader on a host without
    the memory for its second process waited 120 s so)."""
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
    store = dist.TCPStore(host, port, world, rank == 0, timeout=COLLECTIVE_TIMEOUT,
                          master_listen_fd=fd, wait_for_workers=False)
    if rank:
        store.add(JOINED, 1)
    else:
        wait_for_peers(store, world, peers)
    return store


def wait_for_peers(store: dist.TCPStore, world: int, peers: Sequence[Any] = (),
                   every_s: float = 0.02) -> None:
    """Until the ``world - 1`` other ranks have reached ``store``; a RuntimeError once one
    of ``peers`` has ended first, or after COLLECTIVE_TIMEOUT."""
    def all_joined() -> bool | None:
        if store.add(JOINED, 0) >= world - 1:
            return True
        ended = next((p for p in peers if p.exitcode is not None), None)
        if ended is not None:
            raise RuntimeError(f"a process of the group (PID {ended.pid}) ended before it "
                               f"joined ({exit_reason(ended.exitcode)})")
        return None

    limit = COLLECTIVE_TIMEOUT.total_seconds()
    if first_found(all_joined, limit, every_s) is None:
        raise RuntimeError(f"timed out after {limit:g} s waiting for the group's processes: "
                           f"{store.add(JOINED, 0)} of {world - 1} joined")


def device_of(device_type: str, index: int) -> torch.device:
    """GPU ``index`` (made this process's current one), or the CPU."""
    if device_type != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


@contextlib.contextmanager
def process_group(rank: int, world: int, port: int | str, device_type: str = "cpu",
                  peers: Sequence[Any] = ()) -> Iterator[torch.device]:
    """Join the ranks' process group (gloo on CPU, NCCL on ``cuda:rank``) through the
    TCPStore at ``port`` ("host:port", or a port on the loopback); rank 0 stops waiting for
    the others once one of ``peers`` has ended (``rendezvous``). Yields the device."""
    cuda = device_type == "cuda"
    device = device_of(device_type, rank)
    host, port = port.rsplit(":", 1) if isinstance(port, str) else ("127.0.0.1", port)
    store = rendezvous(host, int(port), rank, world, peers)
    # NCCL bound to the rank's GPU: its barriers need not guess the device (a warning).
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                            world_size=world, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if cuda else None)
    environment.mark_phase("group")
    try:
        yield device
        dist.barrier()  # the group ends together: no rank closes its pairs (rank 0 the
        # store) while another still writes its last files beside them
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
    _named(f"ddlstudy-rank{rank}")  # its rank within its group (its node's, under MPI)
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


def group_link(rank: int, world: int, device: torch.device | None = None) -> Link:
    """Rank ``rank`` of a torch.distributed process group of ``world``, every worker of
    the run: the gradient buffer averaged over the group, counts summed, objects gathered
    on rank 0."""
    return Link(rank, world, lambda flat, step: average(flat),
                lambda *values: sum_over_ranks(*values, device=device),
                functools.partial(gather_to_first, device=device), dist.barrier,
                lambda tensor: dist.broadcast(tensor, src=0), local=(rank, world), group=True)


Work = Callable[[Job, Link, torch.device], None]
"""A worker's training (``Strategy.worker``): its job, its link to the others, its device."""


def run_group(work: Work, world: int, job: Job, threads: int, device_type: str = "cpu") -> None:
    """``work`` in ``world`` processes spawned here, one process group that is the whole
    run (each with ``threads`` intra-op threads, on GPU ``rank`` with ``device_type``
    cuda); waits for all (``run_ranks``)."""
    level = logging.getLogger("ddlstudy").level
    run_ranks(group_rank, world, (free_port(), job, work, threads, level, device_type))


def group_rank(rank: int, world: int, port: int | str, job: Job, work: Work, threads: int,
               log_level: int, device_type: str = "cpu") -> None:
    """Rank ``rank`` of a process group of ``world`` that is the whole run (the processes
    of a node alone, or Spark's tasks): ``work`` with the group's link."""
    with spawned_rank(rank, world, port, job, threads, log_level, device_type) as device:
        work(job, group_link(rank, world, device), device)
