"""MPI nodes of several processes: ``--backend mpi --strategy cpu-processes`` (gpu-data,
pipeline, hybrid: any strategy whose node has several processes).

    ddlstudy run --usecase tiny --backend mpi --nodes 2 --strategy cpu-processes --workers 2
    mpiexec -n 4 -hosts a,b,c,d ddlstudy run --usecase simple-big --backend mpi \\
        --strategy cpu-processes --workers 2

Each MPI rank leads a node: it is the node's process 0 and spawns the node's other K - 1,
which meet it in a process group on the node's loopback (gloo; NCCL on GPUs); each runs
the strategy's worker. Only the leaders are MPI processes; the spawned processes never
touch MPI. Worker w of node i is worker i * K + w of the run's N * K: it takes that slice
of every global batch and that dropout seed, exactly as rank i * K + w of N * K local
cpu-processes would.

A step is a hierarchical all-reduce (as Horovod's): each worker's gradient, its loss
weighted by N * K x its slice / global batch, is summed on the leader (one reduce over the
node's group), divided by K, averaged between the leaders by the ``--reduce`` algorithm,
and sent back to the node's workers (one broadcast). Every gradient is a view of one flat
buffer, so no step copies a gradient on a CPU node. The node's workers write their
resource samples to a folder on their own host; the leader hands them to MPI rank 0.

A node of pipelines (``pipeline``, ``hybrid``: R replicas of S stages) averages through its
leader's ``between`` (``training.pipeline.exchange.node_exchange``). Every node cuts its
pipelines where rank 0's measurement says (``job.plan``), and takes slice i * R + r of
every batch, as pipeline r of N * R would.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from ddlstudy.backends.mpi import messages
from ddlstudy.backends.mpi.node import averaging, gather_tensors, on_host, record_compression
from ddlstudy.machine.sampler import ResourceSampler, read_rows
from ddlstudy.strategies import Layout, Strategy
from ddlstudy.training.distributed import (
    Work,
    WorkerDied,
    exit_reason,
    first_found,
    free_port,
    gather_to_first,
    process_group,
    spawn,
    spawned_rank,
    stop_ranks,
)
from ddlstudy.training.job import Job, Link, Nodes

log = logging.getLogger("ddlstudy")


def node_link(comm, reducer, node: int, nodes: int, local: int, k: int,
              device: torch.device, spread: int, exact: bool = True) -> Link:
    """Process ``local`` of node ``node``'s ``k``; ``comm`` and ``reducer`` on the leader
    only. ``spread``: the node's processes whose gradients are of the same weights (its
    data-parallel workers, or its pipelines' replicas), whose sum the leader divides by;
    ``exact``: the reducer leaves every node the same average (step-wise does not)."""
    leader = local == 0

    def between(flat: torch.Tensor, step: int) -> None:
        on_host(flat, lambda array: reducer(comm, array, step=step))

    def broadcast(tensor: torch.Tensor) -> None:  # node 0's leader is the run's worker 0
        if leader:
            on_host(tensor, lambda array: comm.Bcast(array, root=0))
        dist.broadcast(tensor, src=0)

    def exchange(flat: torch.Tensor, step: int) -> None:
        dist.reduce(flat, dst=0)  # the node's gradient, summed on its leader
        if leader:
            flat /= spread
            between(flat, step)
        dist.broadcast(flat, src=0)

    def total(*values: float) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.reduce(t, dst=0)
        if leader:
            t.copy_(torch.tensor(messages.sum_floats(comm, t.tolist()), dtype=t.dtype))
        dist.broadcast(t, src=0)
        return t.tolist()

    def gather(obj: object) -> list | None:
        mine = gather_to_first(obj, device)  # the node's workers, in order, on the leader
        if not leader:
            return None
        per_node = gather_tensors(comm, mine)
        return None if per_node is None else [o for node_objs in per_node for o in node_objs]

    def barrier() -> None:
        dist.barrier()
        if leader:
            comm.Barrier()
        dist.barrier()

    return Link(node * k + local, nodes * k, exchange, total, gather, barrier, broadcast,
                local=(local, k), nodes=Nodes(node, nodes, between if leader else None, exact))


def _spawned(index: int, k: int, port: int, job: Job, work: Work, threads: int, level: int,
             device_type: str, node: int, nodes: int, spread: int, exact: bool,
             drop: Path) -> None:
    """A node's process 1..K-1, spawned by its leader: the strategy's worker."""
    local = index + 1
    with spawned_rank(local, k, port, job, threads, level, device_type,
                      tag=node * k + local, drop=drop) as device:
        work(job, node_link(None, None, node, nodes, local, k, device, spread, exact),
             device)


def fit(job: Job, comm, strategy: Strategy, layout: Layout) -> list[dict]:
    """Lead this MPI rank's node of ``layout.processes`` processes through the run, each
    the strategy's worker. Returns the samples of the node's processes (for rank 0's
    samples.parquet)."""
    cfg = job.cfg
    k, threads, device_type = layout.processes, layout.threads_per_process, layout.device_type
    node, nodes = comm.Get_rank(), comm.Get_size()
    reducer, compressor, exact = averaging(cfg, nodes)
    # The node's processes whose gradients are of the same weights: their sum is divided
    # by this many (its data-parallel workers, or its pipelines' replicas).
    spread = strategy.data_parallel(cfg)
    port = free_port()
    level = logging.getLogger("ddlstudy").level
    with node_folder() as tmp:
        drop = Path(tmp)
        context = spawn(_spawned, k - 1, (k, port, job, strategy.worker, threads, level,
                                           device_type, node, nodes, spread, exact, drop))
        torch.set_num_threads(threads)
        sampler = ResourceSampler(cfg.sample_hz, rank=node * k, scope="worker").start()
        try:
            with process_group(0, k, port, device_type, context.processes) as device:
                strategy.worker(job, node_link(comm, reducer, node, nodes, 0, k, device,
                                               spread, exact), device)
            while not context.join():  # the others end on their own after the last epoch
                pass
        except Exception as exc:
            dead = _dead(context.processes)
            if dead:  # a process that died made the leader's collective fail: name it
                local, proc = dead
                raise WorkerDied(f"worker {local} of node {node} (PID {proc.pid}) died: "
                                 f"{exit_reason(proc.exitcode)}") from exc
            raise
        finally:
            stop_ranks(context.processes)
            own = sampler.stop()
        if node == 0:
            record_compression(job, compressor)
        # The others' samples, from the files they wrote on this host as they ended.
        return own + [row for part in sorted(drop.glob("rank*.parquet"))
                      for row in read_rows(part)]


NODE_FOLDER = "ddlstudy-node-"


def node_folder(parent: Path | None = None) -> tempfile.TemporaryDirectory:
    """The folder on this host where a node's spawned processes leave their samples, named
    after the leader's PID. A leader killed with SIGKILL cannot remove its own, so each new
    one first removes those of leaders that no longer run (``sweep_node_folders``)."""
    parent = Path(parent or tempfile.gettempdir())
    sweep_node_folders(parent)
    return tempfile.TemporaryDirectory(prefix=f"{NODE_FOLDER}{os.getpid()}-", dir=parent)


def sweep_node_folders(parent: Path) -> list[Path]:
    """Remove the node folders in ``parent`` whose leader has ended; returns them."""
    swept = []
    for folder in parent.glob(f"{NODE_FOLDER}*-*"):
        pid = folder.name[len(NODE_FOLDER):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
    return swept


def _dead(processes: list, wait_s: float = 3.0) -> tuple[int, object] | None:
    """The first of the node's processes that ended with an error, as (its local rank,
    it), waiting a little for it (``first_found``)."""
    return first_found(lambda: next(((i + 1, proc) for i, proc in enumerate(processes)
                                     if not proc.is_alive() and proc.exitcode), None),
                       wait_s)
