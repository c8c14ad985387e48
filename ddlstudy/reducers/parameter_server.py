"""parameter-server: rank 0 receives every buffer, averages, and sends the average back."""

from __future__ import annotations

import numpy as np

from ddlstudy.reducers.base import TAG, Reducer, register


def parameter_server(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        incoming = np.empty_like(buf)
        for worker in range(1, size):
            comm.Recv(incoming, source=worker, tag=TAG)
            buf += incoming
        buf /= size
        for worker in range(1, size):
            comm.Send(buf, dest=worker, tag=TAG)
    else:
        comm.Send(buf, dest=0, tag=TAG)
        comm.Recv(buf, source=0, tag=TAG)


def terms(n: int) -> tuple[float, float]:
    """Rank 0 receives n - 1 buffers, then sends n - 1."""
    return 2 * (n - 1), 2 * (n - 1)


register(Reducer("parameter-server", parameter_server, terms, exact=True))
