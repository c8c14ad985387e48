"""Times every reducer on one gradient-sized buffer; run under mpiexec by `ddlstudy bench
reduce`, which launches it:

    mpiexec -n 2 python -m ddlstudy.tools.bench.reduce --floats 57016131 --repeats 5

``--floats`` can list several sizes (``--floats 4194304,262144``): one launch times them all.

``--compress fp16,topk:0.01`` times those compressors too (each replaces the reducer: an
allgather of the compressed gradient, see ``ddlstudy.reducers.compress``).

Each repeat starts after a barrier and counts the slowest rank's time. Rank 0 prints one
JSON line per size with the milliseconds of every repeat per reducer.
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
    from ddlstudy.reducers.compress import parse

    parser = argparse.ArgumentParser()
    parser.add_argument("--floats", required=True, help="comma-separated buffer sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compress", default="", help="comma-separated compressors")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    for floats in (int(f) for f in args.floats.split(",")):
        # new compressors for each size: top-k keeps a residual of the buffer's size
        methods = dict(REDUCERS) | {spec: parse(spec) for spec in args.compress.split(",")
                                    if spec}
        buf = np.random.default_rng(comm.Get_rank()).standard_normal(floats, np.float32)
        timings: dict[str, list[float]] = {}
        for name, reducer in methods.items():
            reducer(comm, buf)  # warm-up: first-touch pages, connection set-up
            timings[name] = []
            for step in range(args.repeats):
                comm.Barrier()
                start = time.perf_counter()
                reducer(comm, buf, step=step)
                elapsed = sum_floats(comm, [time.perf_counter() - start], op=MPI.MAX)[0]
                timings[name].append(1e3 * elapsed)
        if comm.Get_rank() == 0:
            print(json.dumps({"ranks": comm.Get_size(), "floats": floats, "ms": timings}),
                  flush=True)


if __name__ == "__main__":
    main()
