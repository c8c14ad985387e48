"""Where tensor parallelism splits a model: every pair of Linear layers through which one
activation flows with only element-wise layers between them (an activation function,
dropout), for any model torch.fx can trace.

The first of a pair is split column-wise (each process computes its share of the output
features), the second row-wise (each its share of the input features, the partial sums
all-reduced): Megatron-LM's MLP split, one all-reduce forward and one backward per pair.
An element-wise layer between them works on each process's share unchanged. AlexNet's and
VGG16's classifiers give one pair each (``classifier.1``/``classifier.4``, 96 % and 89 %
of their weights), a ResNet none.
"""

from __future__ import annotations

from functools import lru_cache

import torch.nn.functional as F
from torch import fx, nn

from ddlstudy.config import ModelSpec
from ddlstudy.models import shapes_only
from ddlstudy.models.cuts import unit_names

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Mish, nn.ELU, nn.Tanh,
               nn.Sigmoid, nn.Hardswish, nn.Dropout, nn.Identity)
"""Layers that act on each feature alone: one between the halves of a pair keeps it a
pair."""
ELEMENTWISE_FUNCTIONS = (F.relu, F.gelu, F.silu, F.dropout, F.leaky_relu, F.tanh,
                         F.sigmoid)


class _Units(fx.Tracer):
    """Traces with the model's units (and every Linear) as leaves."""

    def __init__(self, units: set[str]) -> None:
        super().__init__()
        self.units = units

    def is_leaf_module(self, module: nn.Module, qualname: str) -> bool:
        return (qualname in self.units or isinstance(module, nn.Linear)
                or super().is_leaf_module(module, qualname))


def pairs_in(model: nn.Module) -> list[tuple[str, str]]:
    """The (column-wise, row-wise) Linear pairs of ``model`` by qualified name, in the order
    its forward pass reaches them; none where it cannot be traced."""
    try:
        graph = _Units(set(unit_names(model))).trace(model)
    except Exception:  # noqa: BLE001 - any model's Python: untraceable means no plan
        return []
    modules = dict(model.named_modules())

    def linear(node: fx.Node) -> nn.Linear | None:
        if node.op == "call_module" and isinstance(modules.get(node.target), nn.Linear):
            return modules[node.target]
        return None

    def elementwise(node: fx.Node) -> bool:
        if node.op == "call_module":
            return isinstance(modules.get(node.target), ELEMENTWISE)
        return node.op == "call_function" and node.target in ELEMENTWISE_FUNCTIONS

    pairs, used = [], set()
    for node in graph.nodes:
        first = linear(node)
        if first is None or node.target in used:
            continue
        after = node
        while len(after.users) == 1:  # one activation on, through element-wise layers
            after = next(iter(after.users))
            second = linear(after)
            if second is not None:
                if second.in_features == first.out_features and after.target not in used:
                    pairs.append((node.target, after.target))
                    used |= {node.target, after.target}
                break
            if not elementwise(after):
                break
    return pairs


@lru_cache(maxsize=16)
def linear_pairs(spec: ModelSpec, num_classes: int) -> tuple[tuple[str, str], ...]:
    """``pairs_in`` the use case's model, built on the meta device (nothing allocated)."""
    model, _ = shapes_only(spec, num_classes)
    return tuple(pairs_in(model))


@lru_cache(maxsize=16)
def split_features(spec: ModelSpec, num_classes: int) -> tuple[tuple[str, int], ...]:
    """Each pair's first layer and the features its split cuts (its output features, the
    second's input features): the processes must divide them evenly (DTensor's uneven
    shards give the two halves of a pair mismatched shapes)."""
    model, _ = shapes_only(spec, num_classes)
    modules = dict(model.named_modules())
    return tuple((first, modules[first].out_features) for first, _ in pairs_in(model))
