"""Where the nodes are (``Setting``), and the MPI probes of the fastest local strategies on
the node counts that can be placed there."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ddlstudy.tools.advise.exchange import COMPRESSORS, Exchange
from ddlstudy.tools.advise.probes import Candidate


@dataclass
class Setting:
    """Where the nodes are: the cores each gets, how they exchange, how many can be probed
    for real (MPI ranks on this host or on ``hosts``; none for a predicted ``link``)."""

    cores: int
    shared: bool
    """Whether the nodes share this machine's cores (this host, or emulated hosts)."""
    exchange: Exchange | None
    hosts: str | None
    link: str | None
    placeable: int
    host_memory: int | None = None
    """The memory of one host the nodes share (this host's available memory, or the
    emulated hosts' --memory); None where each node is a machine of its own."""

    def per_node(self, n: int) -> int:
        return self.cores // n if self.shared else self.cores

    def on_one_host(self, n: int) -> int:
        """How many of ``n`` nodes share one host: all on this host, hydra's round robin
        on ``--hosts``, one a machine for a predicted ``--link``."""
        if self.link is not None:
            return 1
        return -(-n // max(1, self.placeable)) if self.hosts else n

    def methods(self) -> list[str]:
        return [*self.exchange.reduce, *self.exchange.compress] if self.exchange else []


def _so_far(c: Candidate) -> float:
    """A probed candidate's speed so far: its quiet probes', else its noisy ones' (a busy
    host must not keep the nodes of its fastest strategies from being probed)."""
    return c.speed if c.speeds else max(n["images_per_s"] for n in c.noisy)


def mpi_candidates(cands: list[Candidate], nodes: list[int], where: Setting,
                   gradient_bytes: int, best: int = 2) -> list[Candidate]:
    """MPI probes: for each node count that can be placed, the ``best`` fastest probed
    local strategies that fit a node's cores, exchanging with the cheapest method there,
    each with strong scaling (a node computes its share of the batch) and weak (a node
    computes a whole batch). Both are probed because a node's step is not proportional to
    its batch: on tiny, 2 nodes sharing a 2-core host took 1.6 times, not 2 times, as long
    for a batch of 16 as for 8, so a weak step taken as N strong ones was predicted 24-36 %
    slow."""
    local = sorted((c for c in cands if (c.speeds or c.noisy) and c.nodes == 1
                    and not c.skip), key=lambda c: -_so_far(c))
    out = []
    for n in nodes:
        if not 1 < n <= where.placeable:
            continue
        cost = functools.partial(_cost, where, n, gradient_bytes)
        method = min(where.methods(), key=cost)
        fits = [c for c in local if c.cores <= where.per_node(n)]
        for c in fits[:best]:
            out += [_on_nodes(c, n, method, where), _on_nodes(c, n, method, where, weak=True)]
        # a compressor's cast and sum slow inside a run unlike a reducer's copies: its
        # own in-run exchange is probed once (on tiny, fitted from step-wise's it was
        # predicted 23 % slow)
        squeeze = min([m for m in where.methods() if m in COMPRESSORS], key=cost,
                      default=None)
        if fits and squeeze and squeeze != method:
            out.append(_on_nodes(fits[0], n, squeeze, where))
    return out


def _cost(where: Setting, n: int, gradient_bytes: int, method: str) -> float:
    return where.exchange.seconds(method, n, gradient_bytes)


def _on_nodes(c: Candidate, n: int, method: str, where: Setting,
              weak: bool = False) -> Candidate:
    """Local candidate ``c`` as ``n`` MPI nodes exchanging with ``method``."""
    flags = c.flags | {"backend": "mpi", "nodes": n} | (
        {"compress": method} if method in COMPRESSORS else {"reduce": method}) | (
        {"hosts": where.hosts} if where.hosts else {}) | ({"scaling": "weak"} if weak else {})
    label = f"{c.label} x {n} MPI nodes, {method}" + (" weak" if weak else "")
    return Candidate(label, flags, c.cores, c.replicas, nodes=n, node=c)
