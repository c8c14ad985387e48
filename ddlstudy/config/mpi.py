"""The MPI backend's flags (``MpiOptions``, part of every ``RunConfig``) and their checks:
torch-free, so a bad combination is refused before anything is imported."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ddlstudy.config.fields import NODES, option
from ddlstudy.errors import ConfigError
from ddlstudy.reading import BadFile, MiB, read_text
from ddlstudy.reducers import AUTO, get_reducer
from ddlstudy.reducers import REGISTRY as REDUCERS
from ddlstudy.reducers.compress import parse as parse_compress

BALANCES = ("equal", "throughput")
ALLREDUCE_OR_AUTO = (AUTO, "allreduce")
"""``--reduce`` values that leave MPI's own Allreduce available: buckets and compression
need one of them, and only these are allowed without ``--backend mpi``."""
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?$")
MPI = ("mpi",)


def check_hosts(hosts: str) -> str:
    """A ``--hosts`` value (of ``run``, ``advise``, ``predict`` or ``bench``): host names
    separated by commas, or ``emulated[:PREFIX]``; anything else (a ``;``, a space, an
    option) is refused before it could reach mpiexec."""
    names = hosts.split(",")
    emulated = len(names) == 1 and names[0].partition(":")[0] == "emulated"
    if not emulated and not all(HOST_NAME.fullmatch(n) for n in names):
        raise ConfigError("--hosts", f"{hosts!r}; give host names (letters, digits, dots, "
                          "dashes) separated by commas, or emulated[:PREFIX]")
    return hosts


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """The hosts of an mpiexec host file and their slots: ``host``, ``host:N`` (hydra) or
    ``host slots=N`` (Open MPI) per line, ``#`` comments."""
    try:
        lines = read_text(path, "host file", cap=MiB).splitlines()
    except BadFile as exc:
        raise ConfigError("--hostfile", f"{exc}; give a file with one host[:slots] per "
                          "line") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        found = re.fullmatch(r"^([^\s:]+)(?::(\d+)|\s+slots=(\d+))?$", text)
        slots = int(found.group(2) or found.group(3) or 1) if found else 0
        if not found or not HOST_NAME.fullmatch(found.group(1)) or slots < 1:
            raise ConfigError("--hostfile", f"{path} line {number} is not host, host:slots or "
                              "host slots=N (a host name: letters, digits, dots and dashes)")
        hosts.append((found.group(1), slots))
    if not hosts:
        raise ConfigError("--hostfile", f"{path} lists no host")
    return hosts


@dataclass(frozen=True, kw_only=True)
class MpiOptions:
    """What only ``--backend mpi`` reads: where its ranks go and how they average."""

    hosts: str | None = option(None, "with --backend mpi --nodes N: place the ranks on "
                               "host1,host2,... (mpiexec's ssh launcher) or on "
                               "emulated[:PREFIX], the hosts of `ddlstudy hosts up`",
                               group=NODES, owners=MPI, purpose="places MPI ranks",
                               also=" (for Spark, give --spark-master spark://host:port)")
    hostfile: Path | None = option(None, "with --backend mpi: place the ranks on the hosts "
                                   "listed in FILE, mpiexec's format (one host[:slots] per "
                                   "line; --nodes defaults to the slots)", group=NODES,
                                   type=Path, metavar="FILE", owners=MPI,
                                   purpose="places MPI ranks")
    reduce: str = option(AUTO, "how MPI nodes average gradients (auto: MPI's Allreduce for "
                         "small gradients, ring-allreduce for large ones, by size and rank "
                         "count; a plugin's by its name)", group=NODES,
                         metavar="{" + ",".join((AUTO, *REDUCERS)) + "}")
    compress: str = option("none", "gradients on the wire between MPI nodes: none, fp16, or "
                           "topk:<ratio> with error feedback", group=NODES,
                           metavar="{none,fp16,topk:RATIO}", owners=MPI,
                           purpose="compresses the gradients sent between nodes")
    bucket_mb: float | None = option(None, "with --reduce auto or allreduce: reduce the "
                                     "gradients with MPI's Iallreduce in buckets of this "
                                     "many MiB, each as soon as backward has "
                                     "filled it, overlapping the exchange with the backward "
                                     "pass", group=NODES, type=float, most=65536,
                                     why=" MiB (a bucket holds part of one model's gradients)",
                                     owners=MPI, purpose="buckets MPI's own Iallreduce",
                                     also=" with --reduce allreduce (or auto) and no "
                                          "--compress")
    balance: str = option("equal", "equal: each node an equal slice of every global batch; "
                          "throughput: slices in proportion to each node's images/s, "
                          "measured over the first steps (MPI nodes of unequal speed)",
                          group=NODES, choices=BALANCES, noun="policy", owners=MPI,
                          purpose="throughput shares each global batch between MPI nodes "
                                  "of unequal speed")

    def check_mpi(self) -> None:
        """What the MPI flags need of each other (each alone is checked as declared)."""
        if self.reduce != AUTO:
            get_reducer(self.reduce)  # an unknown name is refused with the known ones
        if self.hosts is not None:
            check_hosts(self.hosts)
        if self.hostfile is not None:
            if self.hosts is not None:
                raise ConfigError("--hostfile", "places MPI ranks: give either --hosts or "
                                  "--hostfile, not both")
            slots = sum(n for _, n in read_hostfile(self.hostfile))
            object.__setattr__(self, "hostfile", Path(self.hostfile).absolute())
            if self.nodes is None:
                object.__setattr__(self, "nodes", slots)
        if self.bucket_mb is not None and (self.reduce not in ALLREDUCE_OR_AUTO or
                                           self.compress != "none"):
            raise ConfigError("--bucket-mb", "buckets MPI's own Iallreduce: it needs "
                              "--backend mpi with --reduce allreduce (or auto) and no "
                              "--compress")
        if parse_compress(self.compress) is not None and self.reduce not in ALLREDUCE_OR_AUTO:
            raise ConfigError("--compress", f"exchanges the compressed gradients itself "
                              f"(an allgather); leave --reduce at auto, not {self.reduce}")
        if self.reduce not in ALLREDUCE_OR_AUTO and self.backend != "mpi":
            raise ConfigError("--reduce", f"{self.reduce} averages gradients between MPI "
                              "nodes: it needs --backend mpi")
