"""Bytes and numbers between MPI ranks through mpi4py's buffer (upper-case) calls: its
lower-case calls pickle, and unpickle whatever another rank sent (``ddlstudy.wire`` says
what travels instead). mpi4py is imported in the calls: importing it initialises MPI, which
the process that starts mpiexec must not do."""

from __future__ import annotations

import numpy as np


def _mpi():
    from mpi4py import MPI

    return MPI


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def bcast(comm, data: bytes | None, root: int = 0) -> bytes:
    """``root``'s ``data`` on every rank."""
    mine = comm.Get_rank() == root
    size = np.array([len(data) if mine else 0], dtype=np.int64)
    comm.Bcast(size, root=root)
    buffer = np.array(_bytes(data)) if mine else np.empty(int(size[0]), dtype=np.uint8)
    comm.Bcast(buffer, root=root)
    return data if mine else buffer.tobytes()


def _split(buffer: np.ndarray, sizes: np.ndarray) -> list[bytes]:
    ends = np.cumsum(sizes)
    return [buffer[end - n:end].tobytes() for n, end in zip(sizes, ends, strict=True)]


def gather(comm, data: bytes, root: int = 0) -> list[bytes] | None:
    """Every rank's ``data`` on ``root``, in rank order (None elsewhere)."""
    mine = comm.Get_rank() == root
    sizes = np.empty(comm.Get_size(), dtype=np.int64) if mine else None
    comm.Gather(np.array([len(data)], dtype=np.int64), sizes, root=root)
    buffer = np.empty(int(sizes.sum()) if mine else 0, dtype=np.uint8)
    counts = [buffer, (sizes, np.cumsum(sizes) - sizes), _mpi().BYTE] if mine else None
    comm.Gatherv(_bytes(data), counts, root=root)
    return _split(buffer, sizes) if mine else None


def gather_as(comm, obj, dump, load, root: int = 0) -> list | None:
    """Every rank's ``obj`` on ``root`` (None elsewhere), sent as ``dump`` writes it and
    read back with ``load``."""
    gathered = gather(comm, dump(obj), root)
    return None if gathered is None else [load(g) for g in gathered]


def allgather(comm, data: bytes) -> list[bytes]:
    """Every rank's ``data`` on every rank, in rank order."""
    sizes = np.empty(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([len(data)], dtype=np.int64), sizes)
    buffer = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv(_bytes(data), [buffer, (sizes, np.cumsum(sizes) - sizes), _mpi().BYTE])
    return _split(buffer, sizes)


def allgather_floats(comm, value: float) -> list[float]:
    out = np.empty(comm.Get_size(), dtype=np.float64)
    comm.Allgather(np.array([value], dtype=np.float64), out)
    return out.tolist()


def sum_floats(comm, values, op=None) -> list[float]:
    """The element-wise sum (or ``op``) of every rank's ``values``, on every rank."""
    buffer = np.array(values, dtype=np.float64)
    comm.Allreduce(_mpi().IN_PLACE, buffer, op=_mpi().SUM if op is None else op)
    return buffer.tolist()
