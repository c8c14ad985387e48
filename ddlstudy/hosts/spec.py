"""What a set of emulated hosts is (``Hosts``: names, addresses, the launcher), where its
state lives, and the flags that describe it, checked."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddlstudy.errors import ConfigError
from ddlstudy.reading import what_is

STATE_DIR = Path(os.environ.get("DDLSTUDY_HOSTS_DIR", "/run/ddlstudy"))
DEFAULT_PREFIX = "ddl"
DEFAULT_SUBNET = "10.77.0"
SPARK_PORT = 7077
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
"""The netmod that sends between emulated hosts over TCP (UCX would use shared memory)."""
MIN_MEMORY = 64 << 20
"""The smallest ``--memory`` a host may be given."""
# Checked with fullmatch: "$" would pass a name that ends in a newline.
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,5}")
_RATE = re.compile(r"[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit)")
_DELAY = re.compile(r"[0-9]+(\.[0-9]+)?(us|ms|s)")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_SUBNET = re.compile(rf"10\.{_OCTET}\.{_OCTET}")


@dataclass(frozen=True)
class Hosts:
    prefix: str
    count: int
    subnet: str
    delay: str | None = None
    rate: str | None = None
    cpus: list[float] | None = None
    """CPU time each host may use, in cores (a CFS quota): unequal nodes on one machine."""
    memory: int | None = None
    """Memory each host's processes may hold together, in bytes (a cgroup's limit): past
    it the kernel kills one of them, as on a machine of that size."""

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}-h{i}" for i in range(1, self.count + 1)]

    @property
    def addresses(self) -> list[str]:
        return [f"{self.subnet}.{i}" for i in range(1, self.count + 1)]

    @property
    def members(self) -> list[tuple[str, str]]:
        """(name, address) of every host."""
        return list(zip(self.names, self.addresses, strict=True))

    @property
    def veths(self) -> list[str]:
        """Each host's link: the root namespace's end of its veth pair, on the bridge."""
        return [f"{self.prefix}-v{i}" for i in range(1, self.count + 1)]

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: mpiexec and the Spark driver."""
        return f"{self.subnet}.254"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def launcher(self) -> Path:
        return STATE_DIR / f"{self.prefix}-launch"

    @property
    def spark_master(self) -> str:
        return f"spark://{self.addresses[0]}:{SPARK_PORT}"

    def mpiexec_args(self, nodes: int) -> list[str]:
        """mpiexec's flags that place ``nodes`` ranks round-robin on the hosts, started
        through the namespace launcher, with mpiexec itself on the bridge address."""
        return ["-launcher", "ssh", "-launcher-exec", str(self.launcher),
                "-localhost", self.gateway,
                "-hosts", ",".join(self.addresses[:min(nodes, self.count)])]

    def command(self, host: int, command: list[str]) -> list[str]:
        """``command`` run on host ``host`` (1-based), through the launcher as hydra does."""
        return [str(self.launcher), self.addresses[host - 1], shlex.join(command)]

    def run_on(self, host: int, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, command), **kwargs)


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a set's name (it names namespaces, links, a bridge and state
    files, so nothing else may pass: no path, no other tool's interface)."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ConfigError("--prefix", f"{prefix!r}; use 1-6 lower-case letters or digits, "
                          "starting with a letter (it names namespaces and a bridge)")
    return prefix


def _state_file(prefix: str) -> Path:
    return state_dir() / f"{check_prefix(prefix)}.json"


def state_dir() -> Path:
    """Where the sets' records are (DDLSTUDY_HOSTS_DIR): refused where something other
    than a folder is there, rather than read as a folder that holds no set."""
    there = what_is(STATE_DIR)
    if there not in ("", "a folder"):
        raise ConfigError("DDLSTUDY_HOSTS_DIR", f"{STATE_DIR} is {there}, not a folder; set it "
                          "to a folder for the emulated hosts' records (default /run/ddlstudy)")
    return STATE_DIR


def validate(count: int, prefix: str, subnet: str, delay: str | None, rate: str | None,
             cpus: list[float] | None = None, memory: int | None = None) -> None:
    if not 1 <= count <= 16:
        raise ConfigError("--count", f"{count} hosts; between 1 and 16 can be emulated")
    check_prefix(prefix)
    if not _SUBNET.fullmatch(subnet):
        raise ConfigError("--subnet", f"{subnet!r}; give the first three numbers of a private "
                          "10.x.y address, e.g. 10.77.0")
    if delay is not None and not _DELAY.fullmatch(delay):
        raise ConfigError("--delay", f"{delay!r}; a tc time such as 500us, 2ms or 0.1s")
    if rate is not None and not _RATE.fullmatch(rate):
        raise ConfigError("--rate", f"{rate!r}; a tc rate such as 100mbit or 1gbit")
    if cpus is not None and (len(cpus) != count or not all(0.05 <= c <= 64 for c in cpus)):
        raise ConfigError("--cpus", f"{','.join(map(str, cpus))}; give one CPU share per host "
                          f"({count}), each from 0.05 to 64 cores, e.g. 1,0.5")
    if memory is not None and not MIN_MEMORY <= memory <= 2**50:
        raise ConfigError("--memory", f"{memory} bytes a host; give from "
                          f"{MIN_MEMORY >> 20} MiB (a Python process with torch holds about "
                          "0.5 GiB) to 1 PiB, e.g. 2GiB")


def parse_cpus(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(c) for c in text.split(",")]
    except ValueError:
        raise ConfigError("--cpus", f"{text!r}; give one number of cores per host, "
                          "e.g. 1,0.5") from None


_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def emulated_prefix(spec: str | None) -> str | None:
    """The prefix of the emulated hosts a ``--hosts`` value names (``emulated`` or
    ``emulated:PREFIX``); None for real hosts, or for none."""
    if spec is not None and (spec == "emulated" or spec.startswith("emulated:")):
        return spec.partition(":")[2] or DEFAULT_PREFIX
    return None


def rate_bits(rate: str, flag: str = "--rate") -> float:
    """A tc rate ("100mbit") in bits per second (ConfigError naming ``flag`` if not one)."""
    found = _RATE.fullmatch(rate)
    if not found:
        raise ConfigError(flag, f"{rate!r}; a tc rate such as 100mbit or 1gbit")
    return float(rate[:found.start(2)]) * _UNITS[found.group(2)]
