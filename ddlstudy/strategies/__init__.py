"""Local parallelism strategies (how one node trains), one per module, found by name in
REGISTRY; each module registers its strategy when imported, in the order `ddlstudy
strategies` lists them."""

# Imported in the order `ddlstudy strategies` lists them: each registers itself.
# isort: off
from ddlstudy.strategies import single, threads, processes, pipeline, hybrid  # noqa: F401
# isort: on
from ddlstudy.strategies.base import REGISTRY, Layout, Strategy, get_strategy

__all__ = ["REGISTRY", "Layout", "Strategy", "get_strategy"]
