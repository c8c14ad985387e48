"""What a manifest records about the machine and the software a run used."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

import psutil

from ddlstudy.config import REPO_ROOT

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
    }


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
