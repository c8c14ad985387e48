"""What a manifest records about the machine and the software a run used."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from ddlstudy.config import REPO_ROOT
from ddlstudy.machine import collector

STARTED_ENV = "DDLSTUDY_STARTED_AT"
"""When the user's command started (seconds since the epoch): set by the first ddlstudy
process, inherited by every rank, worker and task it starts."""


SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}
"""The environment of a Python that ddlstudy does not start itself (Spark's workers): the
working directory is not put first on its path (``python_module``'s ``-P``)."""


RANK_ENV = ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
"""Set in a rank an MPI launcher started: hydra's mpiexec, srun --mpi=pmi2 (PMI_FD), srun
--mpi=pmix or another PMIx launcher (PMIX_RANK), Open MPI's mpirun."""


def under_launcher() -> bool:
    """Whether an MPI launcher started this process as one of its ranks."""
    return any(v in os.environ for v in RANK_ENV)


def python_module(module: str, *argv: str) -> list[str]:
    """``python -P -m module argv`` with this interpreter: how ddlstudy starts every Python
    of its own (study cells, advise probes, MPI ranks, bench runs). ``-P`` keeps the working
    directory off the child's path, so that a ``ddlstudy/`` folder there (a clone's root,
    a project of one's own) cannot hide the installed package; PYTHONPATH still comes
    first, as the tests' checkout does."""
    return [sys.executable, "-P", "-m", module, *argv]


def mark_command_start(from_command_line: bool, launched: bool) -> None:
    """Note when the user's command started: this process's start where it is the command
    (the CLI's own process), now where Python called the CLI; a process ddlstudy
    ``launched`` (a rank of its own mpiexec) keeps its launcher's."""
    if not (launched and STARTED_ENV in os.environ):
        started = process_start() if from_command_line else time.time()
        os.environ[STARTED_ENV] = repr(started)
        os.environ.pop(PHASES_ENV, None)  # a new command: its own start
    mark_phase("python")


def process_start() -> float:
    """When this process started, on the wall clock: its age (its start in /proc, clock
    ticks since boot, against CLOCK_BOOTTIME) taken from now. psutil's ``create_time``
    adds the start to /proc/stat's boot time, whole seconds that drift from the wall clock
    on a VM: it read 0.96 s early, and every ``first_step_s`` with it."""
    try:
        with open("/proc/self/stat") as stat:  # the name, field 2, may hold spaces
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return psutil.Process().create_time()


def seconds_since_command() -> float | None:
    """Seconds since the user's command started (None when no ddlstudy CLI started it)."""
    started = os.environ.get(STARTED_ENV)
    try:
        return time.time() - float(started) if started else None
    except ValueError:
        return None


PHASES_ENV = "DDLSTUDY_STARTUP"
"""The phases of the run's start so far, as JSON: inherited, as the clock is, by every
process the command starts, so that rank 0 holds the whole path to its first step."""
MOST_PHASES = 64
"""The phases kept (the last): a process that calls many runs (a test session) does not
grow its environment without bound (one variable may hold 128 KiB)."""
_process = {"name": None}


def this_process(name: str) -> None:
    """How this process's phases are named in the manifest (``rank 1``); by default the
    user's command, or the MPI rank a launcher started."""
    _process["name"] = name


def mark_phase(phase: str) -> None:
    """Note that ``phase`` of this process's start ended now (seconds since the command):
    the manifest's ``startup`` block, where a run's first seconds go."""
    at = seconds_since_command()
    if at is None:
        return
    rank = next((os.environ[v] for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
                 if os.environ.get(v, "").isdigit()), None)
    name = _process["name"] or (f"MPI rank {rank}" if rank is not None else "command")
    marks = [*started_phases(), [name, phase, round(at, 3)]]
    os.environ[PHASES_ENV] = json.dumps(marks[-MOST_PHASES:])  # runs called in one process


def started_phases() -> list[list]:
    """The phases noted so far on the way to this point, this process's and its
    ancestors': [process, phase, seconds from the command to its end]."""
    try:
        marks = json.loads(os.environ.get(PHASES_ENV) or "[]")
    except ValueError:
        return []
    return marks if isinstance(marks, list) else []


def startup() -> dict[str, Any]:
    """The manifest's ``startup`` block: each phase of the start with its seconds, in the
    order they ran, up to where this process stands (its first step's end)."""
    rows, last = [], 0.0
    for process, phase, at in started_phases():
        rows.append({"process": process, "phase": phase, "s": round(max(at - last, 0), 3),
                     "at_s": at})
        last = max(last, at)
    passes = collector.figures()
    return {"phases": rows} | ({"collector": passes} if passes is not None else {})


PACKAGES = ("ddlstudy", "torch", "torchvision", "numpy", "mpi4py", "pyspark", "psutil",
            "pandas", "pillow")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [{"index": i, "name": torch.cuda.get_device_name(i),
             "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
            for i in range(torch.cuda.device_count())]


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable_cores(),
        "ram_bytes": psutil.virtual_memory().total,
        "gpus": gpus(),
        "free_page_reporting": free_page_reporting(),
        **({"slurm_partition": os.environ["SLURM_JOB_PARTITION"]}  # a job's: alike nodes
           if os.environ.get("SLURM_JOB_PARTITION") else {}),
    }


REPORTING_BIT = 5
"""VIRTIO_BALLOON_F_REPORTING: the virtio balloon's feature bit of free page reporting."""


def free_page_reporting(sys_root: Path = Path("/sys")) -> dict[str, int] | None:
    """Whether this machine is a VM whose virtio balloon hands its free memory back to the
    hypervisor (free page reporting; Firecracker's and QEMU's balloons offer it): every
    2 s the kernel reports its free blocks of ``2^order`` pages (order 9: 2 MiB), and the
    host drops them, so that the next fault on one costs the host a fault and a zeroing of
    its own. A process that unmaps a large tensor and maps another more than 2 s later
    pays it: 151 MiB faulted in took 17 ms back to back here, 109-266 ms after 3 s idle.
    None where no virtio balloon reports (a real machine, a VM without one; other
    hypervisors' balloons are not read); else ``{"order"}`` (-1 where the kernel does not
    say; 9 is 2 MiB on 4 KiB pages)."""
    for device in sorted((sys_root / "bus/virtio/drivers/virtio_balloon").glob("virtio*")):
        try:
            bits = (device / "features").read_text().strip()
        except OSError:
            continue
        if len(bits) > REPORTING_BIT and bits[REPORTING_BIT] == "1":
            try:
                order = int((sys_root / "module/page_reporting/parameters/"
                             "page_reporting_order").read_text())
            except (OSError, ValueError):
                order = -1
            return {"order": order}
    return None


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def command_line() -> list[str]:
    return [sys.executable, *sys.argv]


BEHAVIOUR_ENV = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "MPICH_", "MPIR_CVAR_", "HYDRA_", "FI_",
                 "UCX_", "CUDA_VISIBLE_DEVICES", "CUBLAS_", "GLOO_", "NCCL_", "TORCH_",
                 "PYTORCH_", "PYTHONHASHSEED", "SPARK_", "PYSPARK_", "JAVA_HOME", "THP_")
"""Environment variables that change what a run computes or how fast (threads, the MPI
netmod, the devices, gloo and NCCL, torch's own switches): a manifest records those set."""


HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"


def use_huge_pages() -> None:
    """torch's CPU tensors of 2 MiB or more on transparent huge pages, in this process and
    every one it starts (they inherit it), for every strategy alike, so that speedups
    compare like with like. torch reads the switch at its first allocation: the command
    sets it before any. Freed and allocated anew every step (FSDP2's gathered weights and
    buffers, any strategy's activations), such tensors are fresh memory from the kernel,
    faulted in 4 KiB at a time (sharded on simple-big: 346,000 faults a step, 10,000 on
    2 MiB pages). A value already set is kept (0 turns them off); the manifest records it."""
    os.environ.setdefault(HUGE_PAGES, "1")


def launch(nodes: int, launched: dict[str, Any]) -> dict[str, Any]:
    """How this run was started, for an exact replay: the launcher and the world it made
    (``launched``: the backend's ``Backend.launched``, with what else says which one ran),
    the working directory, the behaviour-changing environment and torch's build."""
    import torch

    env = os.environ
    return {"launcher": launched["launcher"], "world": nodes, "cwd": os.getcwd(),
            "env": {k: v for k, v in sorted(env.items()) if k.startswith(BEHAVIOUR_ENV)
                    and not any(w in k for w in ("SECRET", "TOKEN", "PASSWORD", "KEY"))},
            "torch_build": {"version": torch.__version__, "cuda": torch.version.cuda,
                            "git": getattr(torch.version, "git_version", None),
                            "debug": torch.version.debug},
            **{k: v for k, v in launched.items() if k != "launcher"}}


def mpi_library() -> str | None:
    try:
        from mpi4py import MPI

        return " ".join(MPI.Get_library_version().splitlines()[0].split())
    except Exception:  # noqa: BLE001 - a version string is not worth failing a run for
        return None


def first_line(cmd: list[str], containing: str = "") -> str | None:
    """The first line of ``cmd``'s output that holds ``containing`` (None if it failed)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if containing in ln]
    return lines[0] if out.returncode == 0 and lines else None


def find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def java_version() -> str | None:
    """``java -version``'s first line, or None without a working Java."""
    java = find_java()
    return first_line([java, "-version"]) if java else None
