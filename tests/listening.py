"""What a command's process tree listens on, polled while it runs (for the tests that hold
single-host runs to the loopback)."""

from __future__ import annotations

import subprocess
import time

import psutil

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening_while_running(proc: subprocess.Popen, every_s: float) -> set[tuple[str, int]]:
    """Every (address, port) a process of ``proc``'s tree listened on, until it ends."""
    listening = set()
    while proc.poll() is None:
        try:
            tree = {proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(True))}
            listening |= {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                          if c.pid in tree and c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
        time.sleep(every_s)
    return listening
