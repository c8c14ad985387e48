"""What a command's process tree listens on, polled while it runs (for the tests that hold
single-host runs to the loopback)."""

from __future__ import annotations

import subprocess
import time

import psutil

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening_while_running(proc: subprocess.Popen, every_s: float) -> set[tuple[str, str, int]]:
    """Every (process name, address, port) a process of ``proc``'s tree listened on, until
    it ends. A socket a child inherited is listed under each process that holds it."""
    listening = set()
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                listening |= {(p.name(), c.laddr.ip, c.laddr.port)
                              for c in p.net_connections("inet")
                              if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                pass
        time.sleep(every_s)
    return listening


def addresses(listening: set[tuple[str, str, int]]) -> set[str]:
    return {ip for _, ip, _ in listening}
