"""What a folder's runs project for other machines: nodes of many cores joined by a link.

The findings are measured on the folder's hosts (here often one host of 2 cores that every
"node" shares); the paper's came from a cluster. Each run is projected onto nodes of
``cores`` cores joined by ``link`` (``--project 32@10gbit``: the default) with a model of
three parts, each taken from the folder's own runs of the use case:

- **compute**: one process of ``c`` cores trains at ``r1 * A(c)`` images/s, where ``r1`` is
  the sequential baseline's speed (one thread) and ``A(c) = 1 / (f + (1 - f) / c)``
  Amdahl's law, its serial share ``f`` fitted to the cpu-intraop run (``t`` threads at
  ``s`` times the baseline: ``f = (t / s - 1) / (t - 1)``). Below one core a process runs
  at ``r1 * c`` (processes sharing cores, as emulated nodes on one host do). A step's
  compute is a data-parallel worker's share of the batch at that speed; a pipeline of
  ``S`` stages and ``M`` micro-batches splits it in ``S`` and pays GPipe's bubble,
  ``(M + S - 1) / M``.
- **the rest, as measured**: a run's measured step minus its modelled compute on the
  folder's host (the processes' cores there: their threads, at most the host's cores
  shared among all of them) is the exchange over shared memory or loopback, Spark's
  scheduling and serialisation, the pipeline's transfers: kept as measured.
- **the link**: runs of several nodes add their gradient exchange over ``link``, with the
  reducer's messages and bytes (``ddlstudy.reducers.terms``), ``alpha`` = 50 us a message
  and 8 / rate a byte (Spark: gloo's ring; its allgather: every node's gradient, once
  every ``sync_every`` steps).

A projected node keeps the run's layout (its processes, stages, replicas and nodes) and
gives each process ``cores / processes`` cores. The projection is a model, marked as one
wherever it is shown: it says which way a verdict could go on the paper's kind of machine,
not what such a machine measures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddlstudy.errors import ConfigError
from ddlstudy.hosts import rate_bits
from ddlstudy.reducers import terms

ALPHA_S = 50e-6
"""Latency of one message between nodes (TCP over Ethernet, tens of microseconds)."""
DEFAULT = "32@10gbit"


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
        if not found or not 0 < int(found.group(1)) <= 4096:
            raise ConfigError(flag, f"{text!r}; give CORES@LINK, cores a node (1-4096) and "
                              "the link's rate, e.g. 32@10gbit")
        rate_bits(found.group(2), flag)
        return cls(int(found.group(1)), found.group(2))

    def __str__(self) -> str:
        return f"nodes of {self.cores} cores joined by {self.link}"


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


def _layout(manifest: dict) -> tuple[int, int, int, int, int]:
    """(processes a node, threads each, data-parallel workers, stages, micro-batches)."""
    s = manifest.get("strategy") or {}
    processes = int(s.get("processes") or 1)
    threads = int(s.get("intraop_threads") or s.get("threads_per_process") or 1)
    workers_a_node = processes
    if processes == 1 and s.get("replicas") and not s.get("stages"):
        workers_a_node = int(s["replicas"])  # cpu-threads: replicas share one process
    dp = int((manifest.get("effective") or {}).get("data_parallel_workers") or 1)
    return (workers_a_node, threads, dp, int(s.get("stages") or 1),
            int(s.get("micro_batches") or 1))


def _compute_s(manifest: dict, speeds: Speeds, cores_each: float) -> float:
    """A step's compute with ``cores_each`` cores a process."""
    _, _, dp, stages, micro = _layout(manifest)
    batch = (manifest.get("effective") or {})["global_batch"]
    seconds = batch / dp / speeds.rate(cores_each)
    return seconds if stages == 1 else seconds / stages * (micro + stages - 1) / micro


def _link_s(manifest: dict, hardware: Hardware) -> float:
    """A step's gradient exchange between nodes over the projected link."""
    nodes = int((manifest.get("backend") or {}).get("nodes") or 1)
    if nodes < 2:
        return 0.0
    config = manifest.get("config") or {}
    nbytes = 4 * int((manifest.get("model") or {}).get("parameters") or 0)
    per_byte = 8 / rate_bits(hardware.link)
    if manifest["backend"].get("name") == "spark":
        if config.get("spark_sync") == "allgather":
            every = max(int(config.get("sync_every") or 1), 1)
            return ((nodes - 1) * ALPHA_S + (nodes - 1) * nbytes * per_byte) / every
        messages, sizes = terms("ring-allreduce", nodes)
    else:
        messages, sizes = terms(config.get("reduce") or "allreduce", nodes)
    return messages * ALPHA_S + sizes * nbytes * per_byte


def project(manifest: dict, images_per_s: float, speeds: Speeds,
            hardware: Hardware) -> float | None:
    """The images/s a run measured at ``images_per_s`` would train at on ``hardware``
    (None where its manifest lacks the batch or layout to model it)."""
    try:
        workers, threads, _, _, _ = _layout(manifest)
        batch = manifest["effective"]["global_batch"]
        nodes = int(manifest["backend"].get("nodes") or 1)
        cores = int(manifest["host"].get("usable_cores") or 1)
        hosts = max(len(set(manifest["backend"].get("hosts") or [])), 1)
    except (KeyError, TypeError, ValueError):
        return None
    here_each = min(threads, cores * hosts / (workers * nodes))
    rest = max(batch / images_per_s - _compute_s(manifest, speeds, here_each), 0.0)
    step = (_compute_s(manifest, speeds, hardware.cores / workers) + rest
            + _link_s(manifest, hardware))
    return batch / step
