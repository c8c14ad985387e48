"""Run under mpiexec: ddlstudy's MPI messages (bytes through buffer calls, never pickles)
arrive whole and in rank order, whatever their sizes (empty ones included). Rank 0 prints
one JSON line; the exit code is 1 on a failure.

    mpiexec -n 3 python tests/mpi/check_messages.py
"""

import json
import sys

from mpi4py import MPI

from ddlstudy.backends.mpi import messages

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures = []


def data_of(r: int) -> bytes:
    """Rank r's message: r * 1000 bytes (rank 0's is empty), each byte telling its rank."""
    return bytes([r % 256]) * (1000 * r)


def check(name: str, got, want) -> None:
    if got != want:
        failures.append(f"{name}: {str(got)[:80]} != {str(want)[:80]}")


for root in range(size):
    check(f"bcast from {root}", messages.bcast(comm, data_of(root) if rank == root else None,
                                               root=root), data_of(root))
    gathered = messages.gather(comm, data_of(rank), root=root)
    check(f"gather on {root}", gathered,
          [data_of(r) for r in range(size)] if rank == root else None)
check("allgather", messages.allgather(comm, data_of(rank)), [data_of(r) for r in range(size)])
check("allgather_floats", messages.allgather_floats(comm, rank + 0.5),
      [r + 0.5 for r in range(size)])
check("sum_floats", messages.sum_floats(comm, [rank, 1.0]),
      [sum(range(size)), float(size)])
check("max", messages.sum_floats(comm, [rank], op=MPI.MAX), [size - 1])

failures = messages.gather(comm, json.dumps(failures).encode())
if rank == 0:
    flat = [f"rank {r}: {f}" for r, fs in enumerate(failures) for f in json.loads(fs)]
    print(json.dumps({"ranks": size, "failures": flat}))
    sys.exit(1 if flat else 0)
