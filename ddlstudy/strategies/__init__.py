"""Local parallelism strategies, one per module, found by name in REGISTRY."""

from ddlstudy.strategies import single  # noqa: F401  (registers)
from ddlstudy.strategies.base import REGISTRY, Job, Strategy, get_strategy

__all__ = ["REGISTRY", "Job", "Strategy", "get_strategy"]
