"""allreduce: MPI's own Allreduce, the reference the others are measured against."""

from __future__ import annotations

import math

import numpy as np

from ddlstudy.reducers.base import Reducer, register


def allreduce(comm, buf: np.ndarray, step: int = 0) -> None:
    from mpi4py import MPI  # here, not above: importing mpi4py initialises MPI

    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    buf /= comm.Get_size()


def terms(n: int) -> tuple[float, float]:
    """MPICH's long-message algorithm (Rabenseifner): reduce-scatter and allgather by
    recursive halving and doubling among p = 2^floor(log2 n) ranks; the n - p extra ranks
    first hand their whole buffer to a partner and get the result back."""
    p = 2 ** int(math.log2(n))
    extra = 2 if n > p else 0
    return 2 * math.log2(p) + extra, 2 * (p - 1) / p + extra


register(Reducer("allreduce", allreduce, terms, exact=True))
