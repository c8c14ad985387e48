"""A run's memory figures from its manifest's ``backend.memory``: its largest process's
peak, its largest node's (what the node's memory is held to), what rank 0 holds."""

from __future__ import annotations

from typing import Any

GIB = 2**30
MEMORY = {"peak_process_bytes": "peak resident memory of its largest process",
          "peak_node_bytes": "peak memory of its largest node: what the node's memory is held "
                             "to (node_bytes)",
          "held_parameters_bytes": "parameters rank 0 holds",
          "held_gradients_bytes": "gradients rank 0 holds",
          "held_optimizer_state_bytes": "optimizer state rank 0 holds"}
"""A run's memory figures (``memory_of``), with what each is."""


def memory_of(manifest: dict[str, Any]) -> dict[str, int | None]:
    """The ``MEMORY`` figures of a run from its manifest's ``backend.memory`` (None each
    where it recorded none: a run from before memory was recorded, or a damaged block)."""
    backend = manifest.get("backend") or {}
    memory = backend.get("memory")
    memory = memory if isinstance(memory, dict) else {}
    ranks = [r for r in memory.get("per_rank") or [] if isinstance(r, dict)]
    held = next((r.get("held_bytes") for r in ranks if r.get("rank") == 0), None)
    held = held if isinstance(held, dict) else {}
    nodes = backend.get("nodes")
    return {"peak_process_bytes": _size(memory.get("peak_rss_bytes")),
            "peak_node_bytes": node_bytes(memory, nodes if isinstance(nodes, int) else 1),
            **{f"held_{k}_bytes": _size(held.get(k))
               for k in ("parameters", "gradients", "optimizer_state")}}


def node_bytes(memory: dict[str, Any], nodes: int = 1) -> int | None:
    """A run's peak memory a node, from its manifest's ``backend.memory``: the one figure
    of a node's memory that advise predicts, --memory holds configurations to and the
    report shows. It is what the node's memory is held to: on a host of a given size
    (``hosts up --memory``), the peak its memory cgroup was charged; elsewhere its
    processes' peaks summed, less the files' pages each maps (the libraries, shared by
    every process of the machine: a cgroup does not charge a node for pages already
    cached), the shared memory among them counted once (``node_share``). ``nodes`` MPI
    nodes sharing a host (one hostname) divide its figure. The largest host's; None where
    none was recorded. Measured on tiny, 2 emulated hosts: charged 497 MB against 515 MB
    so summed for a sequential node, 958 against 985 MB for 2 processes."""
    hosts = _host_bytes(memory)
    if not hosts:
        return None
    return round(max(v / _nodes_on(memory, h, nodes, len(hosts)) for h, v in hosts.items()))


def _nodes_on(memory: dict[str, Any], host: str, nodes: int, hosts: int) -> int:
    """How many of the run's ``nodes`` ran on ``host``: its ranks over a node's (hydra's
    round robin puts 3 nodes on 2 hosts as 2 and 1), else an even share."""
    ranks = [str(r.get("host")) for r in memory.get("per_rank") or [] if isinstance(r, dict)]
    if ranks and len(ranks) % max(nodes, 1) == 0:
        return max(1, ranks.count(host) // (len(ranks) // max(nodes, 1)))
    return max(1, -(-nodes // hosts))


def _host_bytes(memory: dict[str, Any]) -> dict[str, int]:
    """Each host's figure for ``node_bytes``: its cgroup's charge where recorded, else its
    processes' (the recorded sum for runs that did not record the files' pages)."""
    charged = {h: v.get("peak_charged_bytes") for h, v in (memory.get("hosts") or {}).items()
               if isinstance(v, dict)}
    if charged and all(_size(v) for v in charged.values()):
        return charged
    ranks = [r for r in memory.get("per_rank") or [] if isinstance(r, dict)]
    if ranks and all(_size(r.get(k)) is not None for r in ranks
                     for k in ("peak_rss_bytes", "setup_file_bytes")):
        out: dict[str, int] = {}
        for r in ranks:
            mine = max(node_share(r) - files_bytes(r), 0)
            out[str(r.get("host"))] = out.get(str(r.get("host")), 0) + mine
        return out
    hosts = memory.get("per_host_bytes")
    return {h: v for h, v in hosts.items() if _size(v) is not None} \
        if isinstance(hosts, dict) else {}


def files_bytes(row: dict) -> int:
    """A process's files' pages, which its node holds once and the kernel can drop before
    it kills (clean pages of its libraries and of the data set's decoded cache): the most
    it had resident once set up or at the end. A process forked from a warm server (a
    study's cell, an advise probe) maps them as it first touches them: own's baseline had
    32 MiB of them once set up and 106 at the end (libraries 57, the 224 px cache the
    rest), where a process of its own had its libraries' 311 from its imports."""
    return max(row.get("setup_file_bytes") or 0, _size(row.get("end_file_bytes")) or 0)


def node_share(row: dict) -> int:
    """What a process's peak adds to its node's: the peak, its shared memory counted by its
    proportional share (a page mapped by k processes is in each one's peak, and the node's
    memory holds it once); the peak alone where the share was not recorded. The shared
    pages are as at the end of training: the buffers stay mapped, and are touched, from the
    first step on."""
    peak, shared, share = (row.get(k) for k in ("peak_rss_bytes", "shmem_bytes",
                                                "shmem_pss_bytes"))
    if shared is None or share is None:
        return peak
    return max(peak - shared, 0) + share


def _size(value: Any) -> int | None:
    """A byte count as recorded, or None where it is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None
