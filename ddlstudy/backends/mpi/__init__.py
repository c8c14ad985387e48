"""The MPI backend: each MPI rank is a node that trains with a local strategy on its slice
of every global batch, and the nodes average their gradients with a reducer.

    ddlstudy run --usecase tiny --backend mpi --nodes 2 --reduce ring-allreduce
    mpiexec -n 4 -hosts a,b,c,d ddlstudy run --usecase simple-big --backend mpi

``--nodes N`` makes ddlstudy start ``mpiexec -n N`` on this machine itself (``launch``); a
run started under someone else's mpiexec (hosts file, scheduler) just joins. Rank 0 checks
and scans the data and sends the list to the others, writes the run folder, and gathers
every rank's resource samples. Each node runs its strategy's worker: a node of one
process in its rank (``node``), a node of several in the processes its rank leads
(``nodes``). A rank that raises aborts the whole job
(MPI_Abort), so no rank waits forever.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ddlstudy import signals, wire
from ddlstudy.backends.base import Backend, Environment, register
from ddlstudy.backends.mpi import launch, messages
from ddlstudy.config import RunConfig
from ddlstudy.errors import ConfigError, Unavailable, UsageError
from ddlstudy.machine import environment
from ddlstudy.records.runfolder import MANIFEST, RunFolder
from ddlstudy.reducers import AUTO
from ddlstudy.strategies import Strategy, get_strategy

if TYPE_CHECKING:  # the launcher (``--nodes N`` from a shell) trains nothing: no torch
    from ddlstudy.training import Job

DEATH_WAIT_S = 1.0
"""How long a rank whose MPI call failed waits to see a neighbour's death (its sockets
close as it exits, a moment before it ends)."""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class MpiEnvironment(Environment):
    """This process is MPI rank ``rank`` of ``world`` nodes."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self.where = f" on MPI rank {self.rank}"
        self.neighbours: dict[int, int] = {}  # rank -> PID, the other ranks on this host

    def share(self, make, dump, load) -> Any:
        message = None
        if self.rank == 0:
            try:
                message = dump(make())
            except UsageError as exc:
                message = dump(wire.refusal(exc))
        received = load(messages.bcast(self.comm, message))
        wire.raise_if_refused(received)
        return received

    def gather(self, obj, dump, load) -> list[Any] | None:
        return messages.gather_as(self.comm, obj, dump, load)

    def placement(self) -> dict[str, Any]:
        here = socket.gethostname()
        everyone = [wire.from_json(m) for m in
                    messages.allgather(self.comm, wire.to_json([here, os.getpid()]))]
        self.neighbours = {rank: pid for rank, (host, pid) in enumerate(everyone)
                           if host == here and rank != self.rank}
        hosts, pids = zip(*everyone, strict=True)
        return {"hosts": list(hosts), "pids": list(pids)}

    def cause(self, exc: Exception) -> str | None:
        """A rank killed on this host closes its sockets before mpiexec ends the job: the
        MPI call waiting on it fails here first, and this rank may record the failure
        before mpiexec kills it (seen on a busy CI host: the manifest named rank 0's
        "See the MPI_ERROR field", not rank 1's death). Name the dead rank."""
        from mpi4py import MPI

        if not isinstance(exc, MPI.Exception):
            return None
        from ddlstudy.training.distributed import first_found

        return first_found(lambda: next((f"MPI rank {rank} (PID {pid}) died" for rank, pid
                                         in sorted(self.neighbours.items())
                                         if not _alive(pid)), None), DEATH_WAIT_S)

    def failed(self, message: str) -> str:
        return launch.RANK_FAILED + message

    def abort(self, code: int) -> None:
        """MPICH's MPI_Abort returns once it has told mpiexec, which ends the job a moment
        later. Rank 0 reports the run meanwhile; another rank, which has no run folder to
        report, ends now rather than carry on (seen: a traceback from its report)."""
        self.comm.Abort(code)
        if self.rank != 0:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _record_stop(path: Path, signum: int) -> None:
    """The ranks were passed a SIGINT or SIGTERM: rank 0 records the run as interrupted,
    unless it ended first (another rank's MPI_Abort, or killed when the grace ran out);
    then the manifest says so here. Before rank 0 wrote one, this process ends as that
    signal ends a run: with its exit code and one line."""
    code, error = signals.STOPPED[signum]
    if not (path / MANIFEST).is_file():
        print(f"ddlstudy: {error} before the run started", file=sys.stderr)
        raise SystemExit(code)
    folder = RunFolder.open(path)
    if folder.manifest["status"] == "running":
        folder.finish("interrupted", code, error)


@register
class Mpi(Backend):
    name = "mpi"
    summary = ("each MPI rank a node running the local strategy; nodes average gradients "
               "with --reduce (ddlstudy's own mpiexec with --nodes, or yours)")
    srun_tasks = True  # srun --mpi=pmi2 makes its tasks one MPI world

    def launched(self) -> dict[str, Any]:
        env = os.environ
        how = ("ddlstudy's mpiexec" if launch.CHILD_ENV in env else
               "srun" if "SLURM_JOB_ID" in env else "your mpiexec")
        step = launch.slurm_step() if how == "srun" else None
        return {"launcher": how, "mpich": environment.mpi_library()} | (
            {"slurm": step} if step else {})

    def check(self, cfg: RunConfig, strategy: Strategy, resuming: bool) -> None:
        """What MPI can do with the node's strategy (the strategy has checked its own
        flags): every strategy's worker runs, in the rank or in the processes it leads;
        buckets and throughput balance need a node of one process."""
        if cfg.bucket_mb and not strategy.grads_in_backward:
            raise ConfigError("--bucket-mb", f"a bucket is sent when backward fills it, but "
                              f"{strategy.name} sums its replicas' gradients after backward; "
                              "use sequential or cpu-intraop nodes")
        if cfg.bucket_mb and strategy.layout(cfg).device_type == "cuda":
            raise Unavailable("--bucket-mb", "buckets are written for nodes on the CPU (MPI "
                              "reduces them in place in host memory); leave it out on GPUs")
        if strategy.layout(cfg).processes > 1:
            what = f"{cfg.strategy} nodes (their workers sum on the leader first)"
            if cfg.balance != "equal":
                raise Unavailable("--balance", f"throughput balancing is not written for "
                                  f"{what}; use sequential or cpu-intraop nodes")
            if cfg.bucket_mb:
                raise Unavailable("--bucket-mb", f"buckets are not written for {what}; use "
                                  "sequential or cpu-intraop nodes")
        workers = cfg.data_parallel()
        if cfg.global_batch < workers:
            raise ConfigError("--batch-size", f"{cfg.global_batch} is smaller than the "
                              f"{workers} data-parallel workers of all the nodes; each needs "
                              "at least one image of every batch")
        if resuming and cfg.reduce == "step-wise":
            raise Unavailable("--resume", "step-wise leaves every node with different "
                              "weights and the snapshot holds rank 0's only; an exact "
                              "reducer resumes")
        if not launch.under_mpiexec():
            if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
                raise Unavailable("--backend", "srun started this task without a PMI for "
                                  "MPI, so the tasks cannot form one MPI world; start them "
                                  "with srun --mpi=pmi2")
            launch.require_mpiexec()
        elif cfg.nodes is not None and launch.CHILD_ENV not in os.environ and \
                cfg.nodes != launch.launcher_world():
            raise ConfigError("--nodes", f"{cfg.nodes} nodes asked, but the mpiexec this runs "
                              f"under started {launch.launcher_world()} ranks; leave --nodes "
                              "out under your own mpiexec (its -n decides)")

    def nodes(self, cfg: RunConfig) -> int:
        # Under someone else's mpiexec, the world size it set.
        return cfg.nodes or launch.launcher_world()

    def describe(self, cfg: RunConfig) -> dict[str, Any]:
        # What the nodes run: auto's choice by name (the reports compare reducers).
        from ddlstudy.backends.mpi import node

        return super().describe(cfg) | {"reduce": node.reducer_name(cfg, self.nodes(cfg))} | (
            {"reduce_asked": cfg.reduce} if cfg.reduce == AUTO else {})

    def outside_tree(self, cfg: RunConfig) -> str | None:
        if launch.launcher_world() > 1 and launch.CHILD_ENV not in os.environ:
            return ("the ranks another launcher started are outside this process tree "
                    "(give --sample-hz to sample them)")
        return None

    def launches(self, cfg: RunConfig) -> bool:
        return not launch.under_mpiexec()  # else this process is a rank already

    def launch(self, cfg: RunConfig, argv: list[str], run_id: str) -> launch.Launched | None:
        if not self.launches(cfg):
            return None
        # emulated hosts that are not up are refused here
        where = launch.placement(cfg.hosts, self.nodes(cfg), cfg.hostfile)
        watch = launch.memory_watch(cfg.hosts, self.nodes(cfg))
        ended = launch.launch(argv, self.nodes(cfg), run_id, where)
        if watch is not None:
            ended.hosts_memory = watch.record()
            if ended.code:
                ended.cause = launch.killed_for_memory(watch, self.nodes(cfg))
        if ended.signal in signals.STOPPED:
            _record_stop(Path(cfg.runs_dir) / run_id, ended.signal)
        return ended

    def environment(self, cfg: RunConfig) -> Environment:
        env = MpiEnvironment(launch.world())
        environment.mark_phase("MPI")
        return env

    def fit(self, job: Job, env: Environment) -> list[dict]:
        assert isinstance(env, MpiEnvironment)
        # The node's processes, threads and replicas as its strategy lays them out.
        strategy = get_strategy(job.cfg.strategy)
        layout = strategy.layout(job.cfg)
        from ddlstudy.backends.mpi import node, nodes

        fit = nodes.fit if layout.processes > 1 else node.fit
        return fit(job, env.comm, strategy, layout)
