"""Gradient (or weight) averaging between nodes, on mpi4py: one file per reducer, each
beside its cost terms for ``ddlstudy predict``, registered by name.

Every reducer averages a contiguous float32 numpy buffer in place across the ranks of an
MPI communicator. The buffer can be a view of a torch tensor (``tensor.numpy()`` shares
its memory), so gradients are averaged where they lie, without a copy. All but
``allreduce`` are written on point-to-point calls:

- ``allreduce``: MPI's own Allreduce (the reference).
- ``auto`` (the default of ``--reduce``; not a reducer of its own): MPI's Allreduce or the
  ring, chosen from the gradient's size and the rank count (``choose``), the same on every
  rank. Both are exact.
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

__all__ = ["AUTO", "EXACT", "REDUCERS", "REGISTRY", "RING_FROM_MIB", "ReduceFn", "Reducer",
           "choose", "get", "get_reducer", "step_wise_expected", "terms"]

REDUCERS: dict[str, ReduceFn] = {name: r.reduce for name, r in REGISTRY.items()}
EXACT = tuple(name for name, r in REGISTRY.items() if r.exact)


AUTO = "auto"
RING_FROM_MIB = {True: 16, False: 8}
"""``auto``: the gradient size (MiB) from which the ring beats MPICH's Allreduce, for rank
counts that are (True) or are not (False) a power of two. Measured with `bench reduce`
(median of 5-7, ms, Allreduce against ring-allreduce) on the 2-core development machine,
MPICH 4 from its PyPI wheel, shared memory:

- 2 ranks: 13.6 MiB 4.8 / 5.3; 16 MiB 5.4 / 4.7; 24 MiB 7.6 / 7.7; 32 MiB 21.8 / 10.2;
  53 MiB 36.5 / 22.4; 217 MiB (AlexNet) 153.7 / 82.3. MPICH's time jumps between 24 and
  32 MiB; below 13 MiB it is the faster (1 MiB: 0.6 / 0.6).
- 3 ranks (not a power of two: MPICH adds a step for the extra rank): 8 MiB 9.3 / 6.1,
  16 MiB 22.3 / 10.8, 53 MiB 138.4 / 38.7.
- 4 ranks (2 a core): 4 MiB 4.1 / 2.4, 8 MiB 6.1 / 6.1, 16 MiB 13.1 / 13.3, 53 MiB
  94.2 / 54.9, 217 MiB 371.7 / 229.7."""


def choose(gradient_bytes: int, ranks: int) -> str:
    """The reducer ``--reduce auto`` runs for a gradient of ``gradient_bytes`` between
    ``ranks`` ranks: the ring from RING_FROM_MIB on, MPI's own Allreduce below (and for
    one rank). A function of the model and the rank count only, so every rank (and the
    manifest) makes the same choice, and a run repeats bit for bit."""
    power_of_two = ranks & (ranks - 1) == 0
    if ranks > 1 and gradient_bytes >= RING_FROM_MIB[power_of_two] * 2**20:
        return "ring-allreduce"
    return "allreduce"


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
