"""What every reducer is: a function that averages a buffer in place across an MPI
communicator, whether it is exact, and its cost terms for ``ddlstudy predict``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddlstudy.registry import Registry

TAG = 77
"""The MPI tag of the reducers' point-to-point messages."""

ReduceFn = Callable[..., None]
"""``reduce(comm, buf, step=0)``: average ``buf`` (float32 numpy) in place across ``comm``."""


@dataclass(frozen=True)
class Reducer:
    name: str
    reduce: ReduceFn
    terms: Callable[[int], tuple[float, float]]
    """(messages, buffer sizes) on its critical path between n >= 2 nodes (predict's
    alpha-beta model: messages x alpha + sizes x bytes x beta)."""
    exact: bool = True
    """Whether every node ends with the exact average (step-wise does not)."""


REGISTRY: Registry[Reducer] = Registry("--reduce", "reducer", group="ddlstudy.reducers",
                                       base=Reducer, instances=True)
"""The reducers by name: ddlstudy's own and installed plugins' (entry points of the group
``ddlstudy.reducers``, each a ``Reducer``)."""
register = REGISTRY.register
get = REGISTRY.named
