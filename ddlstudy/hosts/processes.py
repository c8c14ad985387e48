"""What runs on the hosts: their network namespaces, the processes in them, signalled."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _namespaces() -> set[str]:
    out = _ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _pids(name: str) -> list[int]:
    """The processes in host ``name``'s network namespace."""
    return [int(p) for p in _ip("netns", "pids", name, check=False).stdout.split()]


def _kill(names: list[str], sig: int, only: str | None = None) -> None:
    """Send ``sig`` to every process in the namespaces ``names`` (whose name holds
    ``only``, if given): those ``hosts up`` made, never others that share a prefix."""
    for name in set(names) & _namespaces():
        for pid in _pids(name):
            if only is None or only in _comm(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""
