"""Backends (how a run's nodes are started and talk), one per module, found by name in
REGISTRY: ``local`` (one node), ``mpi`` (each MPI rank a node), ``spark`` (each barrier
task a node). Each module registers its backend when imported, in the order listed."""

from ddlstudy.backends import local, mpi, spark  # noqa: F401
from ddlstudy.backends.base import REGISTRY, Backend, Environment, get_backend

__all__ = ["REGISTRY", "Backend", "Environment", "get_backend"]
