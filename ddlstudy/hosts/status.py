"""What the hosts are doing: each one's link, traffic and Spark daemons."""

from __future__ import annotations

import subprocess

from ddlstudy.hosts.processes import _comm, _pids
from ddlstudy.hosts.spec import Hosts


def status(hosts: Hosts) -> str:
    """One line per host: address, link shaping, bytes each way, Spark daemons."""
    lines = []
    for name, address in hosts.members:
        counter = {what: int(subprocess.run(
            ["ip", "netns", "exec", name, "cat", f"/sys/class/net/eth0/statistics/{what}_bytes"],
            capture_output=True, text=True).stdout.strip() or 0) for what in ("tx", "rx")}

        qdisc = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev",
                                "eth0"], capture_output=True, text=True).stdout.split("\n")[0]
        java = sum(1 for pid in _pids(name) if "java" in _comm(pid))
        lines.append(f"{name} {address}  sent {counter['tx'] / 1e6:.1f} MB, received "
                     f"{counter['rx'] / 1e6:.1f} MB  [{qdisc.strip() or 'no qdisc'}]"
                     f"{f'  {java} Spark JVM(s)' if java else ''}")
    return "\n".join(lines)
