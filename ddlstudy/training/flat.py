"""Every gradient as a view of one flat buffer, so a step's exchange is one collective on
one buffer and no gradient is copied: backward accumulates into the views, an exchange
averages the buffer in place (MPI reducers through its numpy view, torch.distributed
through ``average``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def flat_gradients(model: nn.Module) -> torch.Tensor:
    """One buffer holding every parameter's gradient; each ``.grad`` becomes a view of it."""
    params = list(model.parameters())
    ranges = param_ranges(model)
    flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device)
    for p in params:
        lo, hi = ranges[id(p)]
        p.grad = flat[lo:hi].view_as(p)
    return flat


def check_views(model: nn.Module, flat: torch.Tensor) -> None:
    """Autograd accumulates into an existing .grad in place; make sure it still does."""
    start, end = flat.data_ptr(), flat.data_ptr() + flat.element_size() * flat.numel()
    if not all(start <= p.grad.data_ptr() < end for p in model.parameters()):
        raise RuntimeError("a gradient is no longer a view of the flat buffer; the reducer "
                           "would not see it")


def param_ranges(model: nn.Module) -> dict[int, tuple[int, int]]:
    """Each parameter's (start, end) in ``model``'s flat buffer, by ``id``."""
    ranges, offset = {}, 0
    for p in model.parameters():
        ranges[id(p)] = (offset, offset + p.numel())
        offset += p.numel()
    return ranges


def average(flat: torch.Tensor, group=None, size: int | None = None) -> None:
    """Average ``flat`` in place over the processes of ``group`` (equal slices: the mean
    of their mean gradients)."""
    dist.all_reduce(flat, group=group)
    flat /= size if size is not None else dist.get_world_size(group)
