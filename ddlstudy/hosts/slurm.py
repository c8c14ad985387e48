"""Slurm on the hosts: munge, a ``slurmctld`` on the bridge's gateway and a ``slurmd`` on
each host, as a small real cluster whose ``srun --mpi=pmi2`` starts MPI ranks on them.

Everything lives in one folder of the set's own, ``<state dir>/<prefix>-slurm``: munge's
key and socket, the ``slurm.conf`` the daemons read, their spool folders, pid and log
files, and ``slurm.json``, the record of the daemons started (PID and start time, so that a
PID the kernel has since given to another process is never signalled). ``slurm_down``
stops what that record lists, and the slurmd of the hosts' namespaces, then deletes the
folder. The controller runs in the root namespace (with a UTS and mount namespace of its
own that name it ``<prefix>-gw``) and listens on the gateway's address alone
(``CommunicationParameters=NoCtldInAddrAny``); each slurmd runs in its host's namespaces
under the host's name, so Slurm sees N distinct nodes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

import ddlstudy.hosts.spec as spec
from ddlstudy.errors import Unavailable, UsageError
from ddlstudy.hosts.processes import _kill
from ddlstudy.hosts.spec import MPI_ENV, Hosts, check_prefix
from ddlstudy.hosts.state import read

INSTALL = "apt-get install slurm-wlm munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")
_PLUGINS = """ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
MailProg=/bin/true
"""


def slurm_folder(prefix: str) -> Path:
    return spec.STATE_DIR / f"{check_prefix(prefix)}-slurm"


def slurm_conf(prefix: str) -> Path:
    """The ``slurm.conf`` of the hosts' Slurm (``SLURM_CONF`` for srun, sinfo, sbatch)."""
    return slurm_folder(prefix) / "slurm.conf"


def can_slurm() -> str | None:
    """Why Slurm cannot be started on emulated hosts here, or None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"{', '.join(missing)} not found; install Slurm and munge: {INSTALL}"
    if os.geteuid() != 0:
        return "Slurm's daemons on emulated hosts run as root; run ddlstudy hosts slurm as root"
    return None


def require_slurm() -> None:
    why = can_slurm()
    if why:
        raise Unavailable("hosts slurm", why)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _cpus(hosts: Hosts) -> list[int]:
    """Each host's CPUs as Slurm counts them: its share rounded up, else the machine's."""
    return [max(1, math.ceil(c)) for c in hosts.cpus] if hosts.cpus \
        else [os.cpu_count() or 1] * hosts.count


def _memory_mb(hosts: Hosts) -> int:
    """A node's memory: its host's --memory, else the machine's."""
    machine = psutil.virtual_memory().total
    return min(machine, hosts.memory or machine) >> 20


def _conf(hosts: Hosts, folder: Path, port: int) -> str:
    """The slurm.conf: a controller on the gateway, one node per host, one partition."""
    nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs={c} RealMemory={_memory_mb(hosts)} "
                    "State=UNKNOWN\n"
                    for (n, a), c in zip(hosts.members, _cpus(hosts), strict=True))
    return (f"# ddlstudy hosts slurm --prefix {hosts.prefix}: written by ddlstudy, removed by "
            f"hosts down\nClusterName={hosts.prefix}\n"
            f"SlurmctldHost={hosts.prefix}-gw({hosts.gateway})\nSlurmctldPort={port}\n"
            "CommunicationParameters=NoCtldInAddrAny\n"
            f"AuthInfo=socket={folder}/munge.socket\n{_PLUGINS}"
            f"StateSaveLocation={folder}/ctld\nSlurmctldPidFile={folder}/slurmctld.pid\n"
            f"SlurmctldLogFile={folder}/slurmctld.log\nSlurmdSpoolDir={folder}/%n\n"
            f"SlurmdPidFile={folder}/slurmd-%n.pid\nSlurmdLogFile={folder}/slurmd-%n.log\n"
            f"TaskProlog={folder}/task-prolog\n{nodes}"
            f"PartitionName={hosts.prefix} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode),
                   "w") as f:
        f.write(text)


def _files(hosts: Hosts, folder: Path) -> tuple[Path, int]:
    """The folder's files: munge's key (this user's alone), slurm.conf, cgroup.conf (the
    cgroup plugin slurmd loads even with proctrack/linuxproc: v1, which needs no mount in
    the host's namespace), the task prolog that gives every task the netmod that crosses
    the hosts' links (``MPI_ENV``), the names the controller resolves, the nodes' spool
    folders; with the controller's port (a free one on the gateway)."""
    folder.mkdir(parents=True)
    folder.chmod(0o755)  # munged wants every folder above its socket searchable
    (folder / "ctld").mkdir()
    _write(folder / "munge.key", os.urandom(1024).hex(), 0o600)
    conf = folder / "slurm.conf"
    port = _free_port(hosts.gateway)
    _write(conf, _conf(hosts, folder, port))
    _write(folder / "cgroup.conf", "CgroupPlugin=cgroup/v1\n")
    _write(folder / "task-prolog", "#!/bin/sh\n" + "".join(
        f"echo export {k}={v}\n" for k, v in MPI_ENV.items()), 0o755)
    _write(folder / "hosts", "127.0.0.1 localhost\n" + "".join(
        f"{a} {n}\n" for n, a in [*hosts.members, (f"{hosts.prefix}-gw", hosts.gateway)]))
    for name in hosts.names:  # slurmd's spool folders (SlurmdSpoolDir)
        (folder / name).mkdir()
    return conf, port


def _record(folder: Path, started: list[dict]) -> None:
    tmp = folder / "slurm.json.tmp"
    tmp.unlink(missing_ok=True)
    _write(tmp, json.dumps({"daemons": started}, indent=2) + "\n")
    tmp.replace(folder / "slurm.json")


def _start(folder: Path, started: list[dict], name: str, command: list[str]) -> None:
    """Start one daemon in the foreground of a session of its own, logging to
    ``<name>.out``, and record it at once (before the next one starts)."""
    with open(folder / f"{name}.out", "w") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        born = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        born = None
    started.append({"name": name, "pid": proc.pid, "started": born})
    _record(folder, started)


def slurm_up(hosts: Hosts, timeout: float = 60) -> Path:
    """munged, slurmctld and a slurmd per host, replacing any the set had; returns the
    slurm.conf once every node is idle. Daemons that did not come up are stopped (their
    logs stay in the folder until ``hosts down``)."""
    require_slurm()
    slurm_down(hosts.prefix)
    folder = slurm_folder(hosts.prefix)
    conf, port = _files(hosts, folder)
    try:
        _daemons(hosts, folder, conf, port, timeout)
    except BaseException:
        _stop(hosts.prefix, folder)
        raise
    return conf


def _daemons(hosts: Hosts, folder: Path, conf: Path, port: int, timeout: float) -> None:
    """Each daemon once the one it needs answers: slurmd that starts before its controller
    listens registers only at its next try, half a minute later."""
    started: list[dict] = []
    _record(folder, started)
    _start(folder, started, "munged", [
        "munged", "-F", f"--key-file={folder}/munge.key", f"--socket={folder}/munge.socket",
        f"--pid-file={folder}/munged.pid", f"--seed-file={folder}/munged.seed"])
    _wait(lambda: (folder / "munge.socket").exists(), timeout, folder, "munged")
    _start(folder, started, "slurmctld", [
        "unshare", "--uts", "--mount", "sh", "-c",
        f'hostname {hosts.prefix}-gw && mount --bind "$0/hosts" /etc/hosts && '
        'exec slurmctld -D -f "$0/slurm.conf"', str(folder)])
    _wait(lambda: " is UP" in ask(hosts.prefix, "scontrol", "ping"), timeout, folder,
          f"slurmctld answering on {hosts.gateway}:{port}")
    for i, name in enumerate(hosts.names, start=1):
        _start(folder, started, f"slurmd-{name}",
               hosts.command(i, ["slurmd", "-D", "-N", name, "-f", str(conf)]))
    _wait(lambda: idle_nodes(hosts.prefix) >= hosts.count, timeout, folder,
          f"{hosts.count} idle Slurm node(s)")


def _wait(done, timeout: float, folder: Path, what: str) -> None:
    deadline = time.time() + timeout
    while not done():
        if time.time() > deadline:
            raise Unavailable("hosts slurm", f"no {what} within {timeout:.0f} s; see the "
                              f"logs (*.out, *.log) in {folder}")
        time.sleep(0.2)


def ask(prefix: str, *command: str) -> str:
    """What a Slurm command (sinfo, scontrol) answers of the hosts' Slurm ('' if none)."""
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=20,
                              env=os.environ | {"SLURM_CONF": str(slurm_conf(prefix))}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def idle_nodes(prefix: str) -> int:
    return sum(line.split()[1:] == ["idle"] for line in
               ask(prefix, "sinfo", "-h", "-N", "-o", "%N %t").splitlines())


def _alive(daemon: dict) -> psutil.Process | None:
    """The process the record names, if it is still the one started (same start time)."""
    try:
        proc = psutil.Process(daemon["pid"])
        if proc.create_time() == daemon["started"] and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.Error, KeyError, TypeError):
        pass
    return None


def slurm_down(prefix: str) -> bool:
    """Stop the set's Slurm (``_stop``) and delete its folder; whether there was one."""
    folder = slurm_folder(prefix)
    if not folder.is_dir():
        return False
    _stop(prefix, folder)
    shutil.rmtree(folder)
    return True


def _stop(prefix: str, folder: Path) -> None:
    """Stop the daemons the set's record lists (slurmd first, munged last), then every
    slurmd or slurmstepd left in the hosts' namespaces."""
    try:
        daemons = json.loads((folder / "slurm.json").read_text())["daemons"]
    except (OSError, ValueError, KeyError, TypeError):
        daemons = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = [p for p in map(_alive, reversed(daemons)) if p is not None]
        for proc in running:
            proc.send_signal(sig)
        psutil.wait_procs(running, timeout=10)
    made = read(prefix)
    if made is not None:
        _kill(made.made["namespaces"], signal.SIGKILL, only="slurm")


def slurm_status(prefix: str) -> str:
    """A line on the hosts' Slurm controller and nodes ('' where none is up)."""
    conf = slurm_conf(prefix)
    if not conf.is_file():
        return ""
    keys = dict(line.split("=", 1) for line in conf.read_text().splitlines()
                if line.startswith("Slurmctld") and "=" in line)
    nodes = ask(prefix, "sinfo", "-h", "-o", "%D %t").split()
    return (f"Slurm controller {keys.get('SlurmctldHost')} port {keys.get('SlurmctldPort')}: "
            f"{' '.join(nodes) or 'not answering'} node(s); "
            f"export SLURM_CONF={conf}")


def slurm_call(*command: str, env: dict[str, str] | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """A Slurm command's answer; refused in one line where it cannot be run or (``check``)
    fails."""
    try:
        out = subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                             env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--submit slurm: {command[0]} did not answer ({exc})") from None
    if check and out.returncode != 0:
        said = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--submit slurm: {' '.join(command)} failed: {said}")
    return out


def require_client() -> None:
    """Refuse where sbatch is missing or no Slurm controller answers."""
    missing = [c for c in ("sbatch", "scontrol") if shutil.which(c) is None]
    if missing:
        raise UsageError(f"--submit slurm: {', '.join(missing)} not found; install Slurm's "
                         "client commands (apt-get install slurm-client) or run the study "
                         "here without --submit")
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # Slurm's commands would retry for a minute
        raise UsageError(f"--submit slurm: SLURM_CONF names {conf}, which is not a file; "
                         "set it to your cluster's slurm.conf (on emulated hosts, `ddlstudy "
                         "hosts slurm` prints it)")
    out = slurm_call("scontrol", "ping", check=False)
    if " is UP" not in out.stdout:
        said = (out.stdout + out.stderr).strip().splitlines() or ["no answer"]
        raise UsageError(f"--submit slurm: Slurm's controller does not answer ({said[-1]}); "
                         "set SLURM_CONF to your cluster's slurm.conf (on emulated hosts, "
                         "`ddlstudy hosts slurm` prints it)")


@dataclass(frozen=True)
class Sbatch:
    """What the user asks of every job: --partition, --account, --time, --sbatch-arg."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    args: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        named = [f"--{k}={v}" for k, v in (("partition", self.partition),
                                           ("account", self.account), ("time", self.time))
                 if v]
        return [*named, *self.args]
