"""Gradient (or weight) averaging between nodes, on mpi4py.

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

from collections.abc import Callable

import numpy as np

from ddlstudy.errors import ConfigError

Reducer = Callable[..., None]
"""``reducer(comm, buf, step=0)``: average ``buf`` in place across ``comm``."""

_TAG = 77


def allreduce(comm, buf: np.ndarray, step: int = 0) -> None:
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    buf /= comm.Get_size()


def parameter_server(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        incoming = np.empty_like(buf)
        for worker in range(1, size):
            comm.Recv(incoming, source=worker, tag=_TAG)
            buf += incoming
        buf /= size
        for worker in range(1, size):
            comm.Send(buf, dest=worker, tag=_TAG)
    else:
        comm.Send(buf, dest=0, tag=_TAG)
        comm.Recv(buf, source=0, tag=_TAG)


def ring_reduce(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    # Reduce: 1 starts, each adds its own and passes on; 0 receives the total last.
    if rank != 1:
        incoming = np.empty_like(buf)
        comm.Recv(incoming, source=prev, tag=_TAG)
        buf += incoming
    if rank != 0:
        comm.Send(buf, dest=nxt, tag=_TAG)
    else:
        buf /= size
    # Broadcast: 0 -> 1 -> ... -> n-1.
    if rank != 0:
        comm.Recv(buf, source=prev, tag=_TAG + 1)
    if rank != size - 1:
        comm.Send(buf, dest=nxt, tag=_TAG + 1)


def ring_allreduce(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    chunks = np.array_split(buf, size)  # views: sizes need not divide evenly
    incoming = np.empty(max(len(c) for c in chunks), dtype=buf.dtype)
    for i in range(size - 1):  # reduce-scatter: rank r ends owning chunk r+1
        send, recv = chunks[(rank - i) % size], chunks[(rank - i - 1) % size]
        comm.Sendrecv(send, dest=nxt, sendtag=_TAG, recvbuf=incoming[:len(recv)],
                      source=prev, recvtag=_TAG)
        recv += incoming[:len(recv)]
    for i in range(size - 1):  # allgather: pass the reduced chunks on
        send, recv = chunks[(rank - i + 1) % size], chunks[(rank - i) % size]
        comm.Sendrecv(send, dest=nxt, sendtag=_TAG, recvbuf=incoming[:len(recv)],
                      source=prev, recvtag=_TAG)
        recv[:] = incoming[:len(recv)]
    buf /= size


def step_wise(comm, buf: np.ndarray, step: int = 0) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    start = step % size
    position = (rank - start) % size  # 0 for the rank that starts this step's pass
    if position > 0:  # buf becomes the running sum of the pass so far...
        incoming = np.empty_like(buf)
        comm.Recv(incoming, source=(rank - 1) % size, tag=_TAG)
        buf += incoming
    if position < size - 1:
        comm.Send(buf, dest=(rank + 1) % size, tag=_TAG)
    if position > 0:  # ...and, once passed on, the running mean
        buf /= position + 1


REDUCERS: dict[str, Reducer] = {
    "allreduce": allreduce,
    "parameter-server": parameter_server,
    "ring-reduce": ring_reduce,
    "ring-allreduce": ring_allreduce,
    "step-wise": step_wise,
}
EXACT = ("allreduce", "parameter-server", "ring-reduce", "ring-allreduce")


def get_reducer(name: str) -> Reducer:
    try:
        return REDUCERS[name]
    except KeyError:
        raise ConfigError("--reduce", f"unknown reducer {name!r}; choose one of: "
                          f"{', '.join(REDUCERS)}") from None


def step_wise_expected(buffers: list[np.ndarray], rank: int, step: int) -> np.ndarray:
    """What ``step_wise`` leaves on ``rank``: the mean of the buffers from the pass's start
    up to and including ``rank``, in ring order."""
    size = len(buffers)
    start = step % size
    position = (rank - start) % size
    members = [buffers[(start + k) % size] for k in range(position + 1)]
    return np.mean(members, axis=0, dtype=np.float64).astype(buffers[0].dtype)
