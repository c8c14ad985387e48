"""Times every reducer on one gradient-sized buffer; run under mpiexec by `ddlstudy bench
reduce`, which launches it:

    mpiexec -n 2 python -m ddlstudy.tools.bench_reduce --floats 57016131 --repeats 5

Each repeat starts after a barrier and counts the slowest rank's time. Rank 0 prints one
JSON line with the milliseconds of every repeat per reducer.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    from mpi4py import MPI

    from ddlstudy.backends.mpi.messages import sum_floats
    from ddlstudy.reducers import REDUCERS

    parser = argparse.ArgumentParser()
    parser.add_argument("--floats", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    buf = np.random.default_rng(comm.Get_rank()).standard_normal(args.floats, np.float32)
    timings: dict[str, list[float]] = {}
    for name, reducer in REDUCERS.items():
        reducer(comm, buf)  # warm-up: first-touch pages, connection set-up
        timings[name] = []
        for step in range(args.repeats):
            comm.Barrier()
            start = time.perf_counter()
            reducer(comm, buf, step=step)
            elapsed = sum_floats(comm, [time.perf_counter() - start], op=MPI.MAX)[0]
            timings[name].append(1e3 * elapsed)
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": comm.Get_size(), "floats": args.floats, "ms": timings}))


if __name__ == "__main__":
    main()
