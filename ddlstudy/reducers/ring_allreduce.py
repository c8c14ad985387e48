"""ring-allreduce: the buffer cut into n chunks; n-1 reduce-scatter steps, then n-1
allgather steps (each chunk travels the ring twice), all with Sendrecv."""

from __future__ import annotations

import numpy as np

from ddlstudy.reducers.base import TAG, Reducer, register


def ring_allreduce(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    chunks = np.array_split(buf, size)  # views: sizes need not divide evenly
    incoming = np.empty(max(len(c) for c in chunks), dtype=buf.dtype)
    for i in range(size - 1):  # reduce-scatter: rank r ends owning chunk r+1
        send, recv = chunks[(rank - i) % size], chunks[(rank - i - 1) % size]
        comm.Sendrecv(send, dest=nxt, sendtag=TAG, recvbuf=incoming[:len(recv)],
                      source=prev, recvtag=TAG)
        recv += incoming[:len(recv)]
    for i in range(size - 1):  # allgather: pass the reduced chunks on
        send, recv = chunks[(rank - i + 1) % size], chunks[(rank - i) % size]
        comm.Sendrecv(send, dest=nxt, sendtag=TAG, recvbuf=incoming[:len(recv)],
                      source=prev, recvtag=TAG)
        recv[:] = incoming[:len(recv)]
    buf /= size


def terms(n: int) -> tuple[float, float]:
    """2 (n - 1) steps, each sending a chunk of 1/n of the buffer."""
    return 2 * (n - 1), 2 * (n - 1) / n


register(Reducer("ring-allreduce", ring_allreduce, terms, exact=True))
