"""step-wise: the ring's first pass only, its start rotating with the step (see the package's
docstring): half the traffic of a ring reduce with broadcast, nodes left with partial
averages."""

from __future__ import annotations

import numpy as np

from ddlstudy.reducers.base import TAG, Reducer, register


def step_wise(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    start = step % size
    position = (rank - start) % size  # 0 for the rank that starts this step's pass
    if position > 0:  # buf becomes the running sum of the pass so far...
        incoming = np.empty_like(buf)
        comm.Recv(incoming, source=(rank - 1) % size, tag=TAG)
        buf += incoming
    if position < size - 1:
        comm.Send(buf, dest=(rank + 1) % size, tag=TAG)
    if position > 0:  # ...and, once passed on, the running mean
        buf /= position + 1


def terms(n: int) -> tuple[float, float]:
    """One pass of the whole buffer over n - 1 links."""
    return n - 1, n - 1


register(Reducer("step-wise", step_wise, terms, exact=False))
