"""Local parallelism strategies, one per module, found by name in REGISTRY."""

import importlib

from ddlstudy.strategies.base import REGISTRY, Job, Strategy, get_strategy

# Each module registers its strategies when imported, in the order `ddlstudy strategies`
# lists them.
for _module in ("single", "threads", "processes", "pipeline"):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["REGISTRY", "Job", "Strategy", "get_strategy"]
