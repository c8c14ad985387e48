"""Run under mpiexec: every reducer against the exact average, and step-wise against its
documented partial averages. Rank 0 prints one JSON line; the exit code is 1 on a failure.

    mpiexec -n 3 python tests/mpi/check_reducers.py
"""

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from ddlstudy.reducers import EXACT, REDUCERS, step_wise_expected

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures, checked = [], 0


def buffers_for(n: int) -> list[np.ndarray]:
    """Every rank's input, known to all so each can compute what it should end with."""
    return [np.random.default_rng([n, r]).standard_normal(n).astype(np.float32)
            for r in range(size)]


for n in (1, 2, 7, 1000, 1001, 100_003):
    inputs = buffers_for(n)
    exact = np.mean(inputs, axis=0, dtype=np.float64).astype(np.float32)
    for name in EXACT:
        buf = inputs[rank].copy()
        REDUCERS[name](comm, buf)
        checked += 1
        if not np.allclose(buf, exact, rtol=1e-5, atol=1e-6):
            failures.append(f"{name} n={n}: max error {np.abs(buf - exact).max():.3g}")
    for step in range(size + 1):
        buf = inputs[rank].copy()
        REDUCERS["step-wise"](comm, buf, step=step)
        checked += 1
        want = step_wise_expected(inputs, rank, step)
        if not np.allclose(buf, want, rtol=1e-5, atol=1e-6):
            failures.append(f"step-wise n={n} step={step}: max error "
                            f"{np.abs(buf - want).max():.3g}")

# Zero copy: a torch gradient averaged through its numpy view changes in place.
grad = torch.full((10,), float(rank))
REDUCERS["ring-allreduce"](comm, grad.numpy())
checked += 1
if not torch.allclose(grad, torch.full((10,), (size - 1) / 2)):
    failures.append(f"torch view not averaged in place: {grad.tolist()}")

everyone = comm.gather(failures, root=0)
if rank == 0:
    flat = [f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs]
    print(json.dumps({"ranks": size, "checked": checked, "failures": flat}))
    sys.exit(1 if flat else 0)
