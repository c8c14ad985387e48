"""Starting MPI ranks: ddlstudy's own ``mpiexec`` (``--nodes N``, ``--hosts``), or joining
someone else's. Nothing here imports torch or mpi4py, so a refused run answers fast."""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddlstudy import hosts as emulated
from ddlstudy import signals
from ddlstudy.backends.mpi.leftovers import Leftovers
from ddlstudy.config.fields import MAX_PROCESSES
from ddlstudy.config.mpi import check_hosts, read_hostfile
from ddlstudy.errors import ConfigError, Unavailable
from ddlstudy.machine.environment import python_module, under_launcher
from ddlstudy.machine.sampler import TREE_ROOT_ENV
from ddlstudy.records.runfolder import CHILD_ENV, RUN_ID_ENV

log = logging.getLogger("ddlstudy")


_BAD_TERMINATION = re.compile(r"^=\s+PID (\d+) RUNNING AT")
"""How hydra's mpiexec names a rank that died ("=   PID 12868 RUNNING AT host")."""


ONE_HOST = (["-iface", "lo"], {"UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo",
                                "MPIR_CVAR_NEMESIS_TCP_NETWORK_IFACE": "lo"})
"""Ranks on this host alone talk over the loopback: hydra's proxies reach mpiexec there,
and the netmod (UCX in the mpich wheel; OFI's TCP or ch3's nemesis elsewhere) listens there
rather than on the machine's external address. Hydra's own control port is the exception:
it binds every interface and has no option against that (it speaks hydra's proxy
protocol, not pickles; the port lives as long as the run)."""


RANK_FAILED = "run failed: "
"""What a rank logs before its MPI_Abort; mpi.launch reads the first such line, to record
why in the manifest when that rank is not rank 0 (which mpiexec then ends unannounced)."""


def under_mpiexec() -> bool:
    return under_launcher() or CHILD_ENV in os.environ


_SLURM_STEP = {"job_id": "SLURM_JOB_ID", "step_id": "SLURM_STEP_ID",
               "node_count": "SLURM_STEP_NUM_NODES", "tasks": "SLURM_STEP_NUM_TASKS",
               "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID"}
_SLURM_TEXT = {"nodes": "SLURM_STEP_NODELIST", "partition": "SLURM_JOB_PARTITION",
               "cluster": "SLURM_CLUSTER_NAME", "mpi": "SLURM_MPI_TYPE"}
"""What the manifest records of the Slurm step srun started the ranks as (numbers, text),
from the task's environment."""


def slurm_step() -> dict[str, int | str | None] | None:
    """The Slurm job step this task belongs to (None outside Slurm)."""
    env = os.environ
    if not env.get("SLURM_JOB_ID", "").isdigit():
        return None
    numbers = {k: int(env[v]) if env.get(v, "").isdigit() else None
               for k, v in _SLURM_STEP.items()}
    return numbers | {k: env.get(v) or None for k, v in _SLURM_TEXT.items()}


def launcher_world() -> int:
    """The ranks the MPI launcher this process runs under started (1 outside one)."""
    env = os.environ
    return int(env.get("PMI_SIZE") or env.get("OMPI_COMM_WORLD_SIZE") or
               (env.get("SLURM_NTASKS") if under_mpiexec() else None) or 1)


def local_rank() -> int:
    """This rank among the ranks on its host (MPICH's hydra, Open MPI and Slurm say it):
    which of the host's GPUs a one-process node takes."""
    env = os.environ
    for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


def require_mpiexec() -> str:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise Unavailable("--backend", "mpi needs mpiexec, which was not found; pip install "
                          "mpich mpi4py (make install does) or load your cluster's MPI module")
    return mpiexec


def placement(hosts: str | None, nodes: int,
              hostfile: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """mpiexec's flags and environment for ``--hosts``: a list of real hosts, or the
    emulated hosts (their launcher, and a netmod that sends over their network); without
    either, this host's loopback (``ONE_HOST``); for ``--hostfile``, its hosts and slots
    (in hydra's host:slots, whichever format the file had). More ranks than
    ``MAX_PROCESSES`` are refused here, before anything starts them."""
    check_ranks(nodes)
    if hostfile is not None:
        return ["-hosts", ",".join(f"{h}:{n}" for h, n in read_hostfile(hostfile))], {}
    if hosts is None:
        return ONE_HOST[0], dict(ONE_HOST[1])
    check_hosts(hosts)  # every host list reaches mpiexec through here
    prefix = emulated.emulated_prefix(hosts)
    if prefix is not None:
        found = emulated.load(prefix)
        if nodes > found.count:
            log.warning("%d ranks on %d emulated hosts: some hosts run several", nodes,
                        found.count)
        return found.mpiexec_args(nodes), dict(emulated.MPI_ENV)
    return ["-hosts", hosts], {}


def memory_watch(hosts: str | None, nodes: int) -> emulated.MemoryWatch | None:
    """A watch on the kernel's memory kills, where ``--hosts`` names emulated hosts given
    a memory size (``hosts up --memory``); None elsewhere."""
    prefix = emulated.emulated_prefix(hosts)
    if prefix is None:
        return None
    found = emulated.load(prefix)
    return emulated.MemoryWatch.start(found.names[:nodes], found.memory) \
        if found.memory else None


def killed_for_memory(watch: emulated.MemoryWatch, nodes: int) -> str | None:
    """The kernel's memory kills on the watched hosts since the run started, in words
    naming the ranks each host ran (hydra's round robin, a slot a host); None if none."""
    killed = watch.killed()
    if not killed:
        return None
    on = {n: [str(r) for r in range(nodes) if r % len(watch.names) == i]
          for i, n in enumerate(watch.names)}
    return emulated.out_of_memory(killed, {
        n: f"a process of MPI rank{'s' * (len(r) > 1)} {', '.join(r)}" for n, r in on.items()})


class FirstToEnd(threading.Thread):
    """Which of the ranks mpiexec started on this host ended first, seen through their pidfds.

    Hydra's own report is not enough: its proxy SIGKILLs the other ranks as soon as one dies
    by a signal, and then names the lowest rank among those that ended by a signal, which is
    rank 0 whenever the proxy reaped it before it sent the report (seen in CI: rank 1 was
    killed and the run said rank 0). The ranks are found among mpiexec's descendants by
    their ``PMI_RANK``; ranks on other hosts are not watched, and hydra's report stands."""

    FIND_EVERY_S = 0.5
    FIND_FOR_S = 120.0

    def __init__(self, mpiexec: int, nodes: int) -> None:
        super().__init__(name="ddlstudy-mpi-watch", daemon=True)
        self.mpiexec, self.nodes = mpiexec, nodes
        self.ranks: dict[int, int] = {}  # pidfd -> PID
        self.first: list[int] = []  # the PIDs that had ended when the first end was seen
        self.stop = threading.Event()

    def _find(self) -> None:
        try:
            children = psutil.Process(self.mpiexec).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid in self.ranks.values():
                continue
            try:  # a rank's own workers inherit its PMI_RANK
                if "PMI_RANK" in child.environ() and \
                        "PMI_RANK" not in child.parent().environ():
                    self.ranks[os.pidfd_open(child.pid)] = child.pid
            except (psutil.Error, OSError, AttributeError):
                continue

    def run(self) -> None:
        poller, watched = select.poll(), set()
        waited, ready = 0.0, []
        while not self.stop.is_set() and not ready:
            if len(self.ranks) < self.nodes and waited < self.FIND_FOR_S:
                self._find()
                waited += self.FIND_EVERY_S
            for fd in self.ranks.keys() - watched:
                poller.register(fd, select.POLLIN)
                watched.add(fd)
            ready = poller.poll(self.FIND_EVERY_S * 1000)
        self.first = sorted(self.ranks[fd] for fd, _ in ready)
        for fd in self.ranks:
            os.close(fd)

    def dead_pid(self) -> int | None:
        """The PID of the rank that ended first, if it alone had ended when that was seen."""
        return self.first[0] if len(self.first) == 1 else None


@dataclass
class Launched:
    """How mpiexec ended: its exit code, the PID it reported for a rank that died, the
    first error a failing rank logged, and the signal (SIGINT, SIGTERM) that ended it."""

    code: int
    dead_pid: int | None = None
    failure: str | None = None
    signal: int | None = None
    cause: str | None = None
    """What ended the run that the ranks could not see (the kernel killing one for its
    host's memory): it replaces what they recorded."""
    hosts_memory: dict | None = None
    """Emulated hosts of a given size: each one's limit, the peak it was charged and the
    kernel's kills (``MemoryWatch.record``), for the manifest's ``backend.memory``."""


STOP_GRACE_S = 30.0
"""How long the ranks have, after a SIGINT or SIGTERM passed on to them, to record the run
as interrupted and end; then they are killed (one stuck in a collective cannot)."""


def check_ranks(nodes: int, flag: str = "--nodes") -> None:
    """Refuse more ranks than ``MAX_PROCESSES`` before mpiexec starts any."""
    if nodes > MAX_PROCESSES:
        raise ConfigError(flag, f"{nodes} is above the limit of {MAX_PROCESSES} MPI ranks "
                          f"(every one is a process: more would exhaust the machine)")


def launch(argv: list[str], nodes: int, run_id: str,
           where: tuple[list[str], dict[str, str]] = ([], {})) -> Launched:
    """Run this same command as ``mpiexec -n nodes`` and say how it ended (its output is
    passed on to stderr line by line while it is read for that).

    A SIGINT or SIGTERM to this process goes to mpiexec, which passes it on to the ranks
    (``signals.Forwarded``); this one waits for them. However the run ends, the files
    MPICH and hydra leave on this host are removed once mpiexec has (``leftovers``)."""
    check_ranks(nodes)
    mpiexec = require_mpiexec()
    flags, netmod = where  # placement(--hosts, nodes)
    env = os.environ | netmod | {CHILD_ENV: "1", RUN_ID_ENV: run_id,
                                 TREE_ROOT_ENV: str(os.getpid())}
    cmd = [mpiexec, *flags, "-n", str(nodes), *python_module("ddlstudy", *argv)]
    log.info("launching %d MPI ranks: %s", nodes, " ".join(cmd))
    ended = Launched(0)
    left = None
    with signals.Forwarded(STOP_GRACE_S) as forwarded:
        try:  # mpiexec in a session of its own: a Ctrl-C reaches it from this process alone
            with subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
                                  start_new_session=True) as proc:
                forwarded.attach(proc)
                left = Leftovers(proc.pid)
                left.start()
                watch = _relay(proc, nodes, ended)
        finally:  # mpiexec has ended (Popen's exit waits for it)
            if left is not None:
                left.remove()
    ended.code, ended.signal = proc.returncode, forwarded.signum
    if ended.code and watch.dead_pid() is not None:
        ended.dead_pid = watch.dead_pid()  # hydra's names the lowest rank killed
    return ended


def _relay(proc: subprocess.Popen, nodes: int, ended: Launched) -> FirstToEnd:
    """Pass mpiexec's output on, noting in ``ended`` what it says of a rank that died."""
    watch = FirstToEnd(proc.pid, nodes)
    if hasattr(os, "pidfd_open"):  # Linux 5.3 and later
        watch.start()
    for line in proc.stdout:
        sys.stderr.write(line)
        found = _BAD_TERMINATION.search(line)
        if found and ended.dead_pid is None:
            ended.dead_pid = int(found.group(1))
        if RANK_FAILED in line and ended.failure is None:
            ended.failure = line.split(RANK_FAILED, 1)[1].strip()
    proc.wait()
    watch.stop.set()
    if watch.is_alive():
        watch.join()
    return watch


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def find_mpiexec() -> str | None:
    """The mpiexec beside this Python (the mpich wheel puts it there), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")
