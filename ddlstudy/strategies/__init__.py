"""Local parallelism strategies (how one node trains), one per module, found by name in
REGISTRY; each module registers its strategy when imported, in the order `ddlstudy
strategies` lists them, and installed plugins' strategies follow. Nothing here imports
torch: a strategy's worker does, when it trains."""

# Imported in the order `ddlstudy strategies` lists them: each registers itself.
# isort: off
from ddlstudy.strategies import single, threads, processes, sharded, pipeline, hybrid  # noqa: F401,E501
# isort: on
from ddlstudy.strategies.base import REGISTRY, Layout, Probe, Strategy, get_strategy, register

__all__ = ["REGISTRY", "Layout", "Probe", "Strategy", "get_strategy", "register"]
