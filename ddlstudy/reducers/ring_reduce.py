"""ring-reduce: partial sums travel the ring 1 -> 2 -> ... -> n-1 -> 0, rank 0 divides, then
the average travels the ring again from rank 0 (a reduce, then a broadcast)."""

from __future__ import annotations

import numpy as np

from ddlstudy.reducers.base import TAG, Reducer, register


def ring_reduce(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    # Reduce: 1 starts, each adds its own and passes on; 0 receives the total last.
    if rank != 1:
        incoming = np.empty_like(buf)
        comm.Recv(incoming, source=prev, tag=TAG)
        buf += incoming
    if rank != 0:
        comm.Send(buf, dest=nxt, tag=TAG)
    else:
        buf /= size
    # Broadcast: 0 -> 1 -> ... -> n-1.
    if rank != 0:
        comm.Recv(buf, source=prev, tag=TAG + 1)
    if rank != size - 1:
        comm.Send(buf, dest=nxt, tag=TAG + 1)


def terms(n: int) -> tuple[float, float]:
    """The whole buffer passes n - 1 links twice, one after the other."""
    return 2 * (n - 1), 2 * (n - 1)


register(Reducer("ring-reduce", ring_reduce, terms, exact=True))
