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
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

import ddlstudy.hosts.spec as spec
from ddlstudy.errors import ConfigError, Unavailable, UsageError
from ddlstudy.hosts.processes import _kill
from ddlstudy.hosts.spec import MPI_ENV, Hosts, check_prefix
from ddlstudy.hosts.state import read

INSTALL = "apt-get install slurm-wlm munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")
_PLUGINS = """ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
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


_CONF_SAFE = re.compile(r"[\w./:@+-]+")
"""What a value of slurm.conf may hold: its lines are key=value pairs split at spaces, and
a ``#`` starts a comment; a newline would start a line of the writer's choosing, read by
daemons that run as root."""


def conf_value(value: object, what: str) -> str:
    """``value`` as written into slurm.conf (or a file beside it), refused where it holds
    anything but letters, digits and ``._/:@+-``."""
    text = str(value)
    if not _CONF_SAFE.fullmatch(text):
        bad = next((c for c in text if not _CONF_SAFE.fullmatch(c)), "nothing")
        raise ConfigError(what, f"{text!r} holds {bad!r}, which Slurm's configuration "
                          "cannot hold (its lines are key=value pairs split at spaces); use "
                          "letters, digits and ._/:@+-")
    return text


def _conf(hosts: Hosts, folder: Path, port: int) -> str:
    """The slurm.conf: a controller on the gateway, one node per host, one partition; each
    node with its host's memory, which Slurm schedules (``CR_CPU_Memory``): a job gets the
    memory it asks for (``--mem``), else its CPUs' share of its node's (``DefMemPerCPU``),
    and a job asking more than a node has is refused, one that does not fit beside others
    waits (reason ``Resources``)."""
    where = conf_value(folder, "DDLSTUDY_HOSTS_DIR")
    prefix, gateway = conf_value(hosts.prefix, "--prefix"), conf_value(hosts.gateway, "--subnet")
    mb, cpus = _memory_mb(hosts), _cpus(hosts)
    nodes = "".join(f"NodeName={conf_value(n, '--prefix')} NodeAddr={conf_value(a, '--subnet')} "
                    f"CPUs={c} RealMemory={mb} State=UNKNOWN\n"
                    for (n, a), c in zip(hosts.members, cpus, strict=True))
    return (f"# ddlstudy hosts slurm --prefix {prefix}: written by ddlstudy, removed by "
            f"hosts down\nClusterName={prefix}\n"
            f"SlurmctldHost={prefix}-gw({gateway})\nSlurmctldPort={port}\n"
            "CommunicationParameters=NoCtldInAddrAny\n"
            f"AuthInfo=socket={where}/munge.socket\n{_PLUGINS}"
            f"StateSaveLocation={where}/ctld\nSlurmctldPidFile={where}/slurmctld.pid\n"
            f"SlurmctldLogFile={where}/slurmctld.log\nSlurmdSpoolDir={where}/%n\n"
            f"SlurmdPidFile={where}/slurmd-%n.pid\nSlurmdLogFile={where}/slurmd-%n.log\n"
            f"TaskProlog={where}/task-prolog\n{nodes}"
            f"PartitionName={prefix} Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            f"DefMemPerCPU={max(1, mb // max(cpus))}\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode),
                   "w") as f:
        f.write(text)


def _files(hosts: Hosts, folder: Path, conf_text: str) -> Path:
    """The folder's files: munge's key (this user's alone), slurm.conf (``conf_text``),
    cgroup.conf (the cgroup plugin slurmd loads even with proctrack/linuxproc: v1, which
    needs no mount in the host's namespace), the task prolog that gives every task the
    netmod that crosses the hosts' links (``MPI_ENV``), the names the controller resolves,
    the nodes' spool folders."""
    folder.mkdir(parents=True)
    folder.chmod(0o755)  # munged wants every folder above its socket searchable
    (folder / "ctld").mkdir()
    _write(folder / "munge.key", os.urandom(1024).hex(), 0o600)
    conf = folder / "slurm.conf"
    _write(conf, conf_text)
    _write(folder / "cgroup.conf", "CgroupPlugin=cgroup/v1\n")
    _write(folder / "task-prolog", "#!/bin/sh\n" + "".join(
        f"echo export {conf_value(k, 'MPI_ENV')}={conf_value(v, 'MPI_ENV')}\n"
        for k, v in MPI_ENV.items()), 0o755)
    _write(folder / "hosts", "127.0.0.1 localhost\n" + "".join(
        f"{conf_value(a, '--subnet')} {conf_value(n, '--prefix')}\n"
        for n, a in [*hosts.members, (f"{hosts.prefix}-gw", hosts.gateway)]))
    for name in hosts.names:  # slurmd's spool folders (SlurmdSpoolDir)
        (folder / name).mkdir()
    return conf


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
    folder = slurm_folder(hosts.prefix)
    port = _free_port(hosts.gateway)
    text = _conf(hosts, folder, port)  # refused here, before anything is stopped or written
    slurm_down(hosts.prefix)
    conf = _files(hosts, folder, text)
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


def slurm_call(*command: str, env: dict[str, str] | None = None, check: bool = True,
               input: str | None = None) -> subprocess.CompletedProcess:  # noqa: A002
    """A Slurm command's answer (``input``: what it reads on stdin); refused in one line
    where it cannot be run or (``check``) fails."""
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    try:
        out = subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                             env=env, check=False, **stdin)
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
