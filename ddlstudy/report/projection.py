"""What a folder's runs project for other machines: nodes of many cores joined by a link.

The findings are measured on the folder's hosts (here often one host of 2 cores that every
"node" shares); the paper's came from a cluster. Each run is projected onto nodes of
``cores`` cores joined by ``link`` (``--project 32@10gbit``, the default) with a model of
two parts, each taken from the folder's own runs of the use case:

- **compute**: one process of ``c`` cores trains at ``r1 * A(c)`` images/s, where ``r1`` is
  the sequential baseline's speed (one thread) and ``A(c) = 1 / (f + (1 - f) / c)``
  Amdahl's law, its serial share ``f`` fitted to the cpu-intraop run (``t`` threads at
  ``s`` times the baseline: ``f = (t / s - 1) / (t - 1)``); below one core (processes
  sharing cores, as emulated nodes on one host do) at ``r1 * c``. A run's compute is its
  measured step less the gradient exchange it measured (``backend.exchange``), scaled by
  ``A(c here) / A(c there)``: its processes' cores on the folder's host (their threads, at
  most the host's cores shared among all of them) against the projected node's. What
  the run spent besides (a pipeline's bubble and transfers, Spark's scheduling) is taken
  as part of its compute and scales with it.
- **the exchange**: within one node, as measured (shared memory); between nodes, the
  longer of what it measured (its software: Spark's allgather through the JVMs takes
  seconds where the bytes take tenths) and what ``link`` needs for the reducer's messages
  and bytes (``ddlstudy.reducers.terms``), ``alpha`` = 50 us a message and 8 / rate a
  byte (Spark: gloo's ring; its allgather: every node's gradient, once every
  ``sync_every`` steps; ``--compress``: the bytes it sent).

A projected node keeps the run's layout (its processes, stages, replicas and nodes). A
run whose processes took every core of its host (cpu-intraop, cpu-processes, a pipeline's
stages; MPI or Spark nodes that shared the host between them, as emulated nodes do) fills
each projected node: a process takes ``cores / processes`` of its node's cores, as the
paper's nodes used theirs. The sequential baseline keeps its one thread, and a run that
left cores idle keeps its threads. The projection is a model, marked as one
wherever it is shown: it says which way a verdict could go on the paper's kind of machine,
not what such a machine measures.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from ddlstudy.errors import ConfigError
from ddlstudy.hosts import emulated_prefix, rate_bits
from ddlstudy.reducers import REGISTRY, terms

ALPHA_S = 50e-6
"""Latency of one message between nodes (TCP over Ethernet, tens of microseconds)."""


@dataclass(frozen=True)
class Hardware:
    """The nodes a projection is for."""

    cores: int
    link: str

    @classmethod
    def parse(cls, text: str, flag: str = "--project") -> Hardware:
        """``CORES@LINK`` (``32@10gbit``): cores a node, the tc rate of the link between
        nodes; a ConfigError naming ``flag`` otherwise."""
        found = re.fullmatch(r"(\d+)@(\S+)", text.strip())
        if not found or not 0 < int(found.group(1)) <= 4096 or \
                not rate_bits(found.group(2), flag) > 0:
            raise ConfigError(flag, f"{text!r}; give CORES@LINK, cores a node (1-4096) and "
                              "the link's rate above 0, e.g. 32@10gbit, or none")
        return cls(int(found.group(1)), found.group(2))

    def __str__(self) -> str:
        return f"nodes of {self.cores} cores joined by {self.link}"


DEFAULT_HARDWARE = Hardware(32, "10gbit")
"""What findings are projected onto where no one says: the issue's example of nodes like
the paper's cluster (its core count is not stated), 32 cores, 10 Gbit/s Ethernet."""


@dataclass(frozen=True)
class Speeds:
    """A use case's measured speeds the projection starts from."""

    r1: float  # the sequential baseline's images/s
    serial: float  # Amdahl's serial share, fitted to the cpu-intraop run

    def rate(self, cores: float) -> float:
        """Images/s of one process with ``cores`` cores."""
        if cores < 1:
            return self.r1 * cores
        return self.r1 / (self.serial + (1 - self.serial) / cores)


def serial_share(threads: int, speedup: float) -> float:
    """Amdahl's serial share from ``threads`` threads running ``speedup`` times one."""
    if threads <= 1 or not speedup > 0:
        return 1.0
    return min(max((threads / speedup - 1) / (threads - 1), 0.0), 1.0)


def _layout(manifest: dict) -> tuple[int, int]:
    """(processes that compute a node, threads each)."""
    s = manifest.get("strategy") or {}
    processes = int(s.get("processes") or 1)
    threads = int(s.get("intraop_threads") or s.get("threads_per_process") or 1)
    if processes == 1 and s.get("replicas") and not s.get("stages"):
        return int(s["replicas"]), threads  # cpu-threads: replicas share one process
    return processes, threads


def _link_s(manifest: dict, nodes: int, hardware: Hardware) -> float:
    """A step's gradient exchange between ``nodes`` nodes over the projected link."""
    config = manifest.get("config") or {}
    compress = (manifest["backend"].get("compress") or {}).get("factor") or 1.0
    nbytes = 4 * int((manifest.get("model") or {}).get("parameters") or 0) / compress
    per_byte = 8 / rate_bits(hardware.link)
    if manifest["backend"].get("name") == "spark":
        if config.get("spark_sync") == "allgather":
            every = max(int(config.get("sync_every") or 1), 1)
            return ((nodes - 1) * ALPHA_S + (nodes - 1) * nbytes * per_byte) / every
        messages, sizes = terms("ring-allreduce", nodes)
    else:  # the reducer the run resolved (auto: by size), a plugin's as a ring
        reducer = manifest["backend"].get("reduce") or config.get("reduce")
        messages, sizes = terms(reducer if reducer in REGISTRY else "ring-allreduce", nodes)
    return messages * ALPHA_S + sizes * nbytes * per_byte


def _hosts(manifest: dict) -> int:
    """The machines a run's ranks had: its distinct hosts, one for emulated hosts (each
    names itself, all share one machine's cores)."""
    if emulated_prefix((manifest.get("config") or {}).get("hosts")):
        return 1
    return max(len(set(manifest["backend"].get("hosts") or [])), 1)


def _exchange_s(manifest: dict) -> float:
    """The gradient exchange a step of the run measured: its ranks' median."""
    ranks = ((manifest["backend"].get("exchange") or {}).get("per_rank") or [])
    per_step = [r["exchange_s"] / r["steps"] for r in ranks if r.get("steps")]
    return statistics.median(per_step) if per_step else 0.0


def project(manifest: dict, images_per_s: float, speeds: Speeds,
            hardware: Hardware) -> float | None:
    """The images/s a run measured at ``images_per_s`` would train at on ``hardware``
    (None where its manifest lacks the batch or layout to model it)."""
    try:
        workers, threads = _layout(manifest)
        batch = manifest["effective"]["global_batch"]
        nodes = int(manifest["backend"].get("nodes") or 1)
        cores = int(manifest["host"].get("usable_cores") or 1)
        hosts = _hosts(manifest)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    here_each = min(threads, cores * hosts / (workers * nodes))
    baseline = nodes == 1 and (manifest.get("strategy") or {}).get("name") == "sequential"
    filled = threads * workers * nodes >= cores * hosts and not baseline
    there_each = hardware.cores / workers if filled else threads
    exchange = _exchange_s(manifest)
    compute = max(batch / images_per_s - exchange, 0.0)
    compute *= speeds.rate(here_each) / speeds.rate(there_each)
    if nodes > 1:
        exchange = max(exchange, _link_s(manifest, nodes, hardware))
    return batch / (compute + exchange)
