"""A reducer of one's own for ddlstudy (docs: Extending): every rank's gradient sent to
every rank with MPI's Allgather, then averaged in rank order, so that every rank computes
the same sum. A package declares it in its pyproject.toml:

    [project.entry-points."ddlstudy.reducers"]
    gather-mean = "ddlstudy_reducer:GATHER_MEAN"

and `ddlstudy run --backend mpi --nodes 2 --reduce gather-mean` runs it.
"""

import numpy as np

from ddlstudy.reducers import Reducer


def gather_mean(comm, buf: np.ndarray, step: int = 0) -> None:
    """Average ``buf`` (float32) in place across ``comm``."""
    everyone = np.empty((comm.Get_size(), buf.size), dtype=buf.dtype)
    comm.Allgather(buf, everyone)
    buf[:] = everyone.sum(axis=0, dtype=np.float64) / comm.Get_size()


def terms(n: int) -> tuple[float, float]:
    """(messages, buffer sizes) on its critical path between n nodes, for `ddlstudy
    predict`: a ring allgather passes n - 1 whole buffers."""
    return n - 1, n - 1


GATHER_MEAN = Reducer("gather-mean", gather_mean, terms, exact=True)
