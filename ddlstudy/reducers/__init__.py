"""Gradient (or weight) averaging between nodes, on mpi4py: one file per reducer, each
beside its cost terms for ``ddlstudy predict``, registered by name.

Every reducer averages a contiguous float32 numpy buffer in place across the ranks of an
MPI communicator. The buffer can be a view of a torch tensor (``tensor.numpy()`` shares
its memory), so gradients are averaged where they lie, without a copy. All but
``allreduce`` are written on point-to-point calls:

- ``allreduce``: MPI's own Allreduce (the reference).
- ``parameter-server``: rank 0 receives every buffer, averages, and sends the average back.
- ``ring-reduce``: partial sums travel the ring 1 -> 2 -> ... -> n-1 -> 0, rank 0 divides,
  then the average travels the ring again from rank 0 (a reduce, then a broadcast).
- ``ring-allreduce``: the buffer cut into n chunks; n-1 reduce-scatter steps, then n-1
  allgather steps (each chunk travels the ring twice), all with Sendrecv.
- ``step-wise``: the ring's first pass only. On step t the pass starts at rank
  s = t mod n and goes s, s+1, ..., s+n-1 (mod n); the rank at position k of that order
  adds its buffer to the running sum it received, forwards it, and keeps the running mean
  of the first k+1 buffers. So after a step rank s holds only its own buffer, the next
  rank the mean of two, ..., and the last rank of the pass the exact average; the start
  rotates so that every rank in turn gets the full average. Half the traffic of a ring
  reduce with broadcast, at the price of nodes starting their next step from different,
  partial averages.
"""

from __future__ import annotations

import numpy as np

# Imported in the order the CLI lists them: each registers itself.
# isort: off
from ddlstudy.reducers import allreduce  # noqa: F401
from ddlstudy.reducers import parameter_server  # noqa: F401
from ddlstudy.reducers import ring_reduce  # noqa: F401
from ddlstudy.reducers import ring_allreduce  # noqa: F401
from ddlstudy.reducers import step_wise  # noqa: F401
# isort: on
from ddlstudy.reducers.base import REGISTRY, ReduceFn, Reducer, get

__all__ = ["EXACT", "REDUCERS", "REGISTRY", "ReduceFn", "Reducer", "get", "get_reducer",
           "step_wise_expected", "terms"]

REDUCERS: dict[str, ReduceFn] = {name: r.reduce for name, r in REGISTRY.items()}
EXACT = tuple(name for name, r in REGISTRY.items() if r.exact)


def get_reducer(name: str) -> ReduceFn:
    """The reduce function of the reducer ``name`` (ConfigError listing them if unknown)."""
    return get(name).reduce


def terms(name: str, n: int) -> tuple[float, float]:
    """(messages, buffer sizes) on reducer ``name``'s critical path between ``n`` nodes."""
    return (0.0, 0.0) if n <= 1 else get(name).terms(n)


def step_wise_expected(buffers: list[np.ndarray], rank: int, step: int) -> np.ndarray:
    """What ``step_wise`` leaves on ``rank``: the mean of the buffers from the pass's start
    up to and including ``rank``, in ring order."""
    size = len(buffers)
    start = step % size
    position = (rank - start) % size
    members = [buffers[(start + k) % size] for k in range(position + 1)]
    return np.mean(members, axis=0, dtype=np.float64).astype(buffers[0].dtype)
