"""Activation checkpointing of any model, block by block (``--checkpoint-activations``).

A checkpointed block keeps only its input through the forward pass; its backward runs its
forward again (torch's non-reentrant ``torch.utils.checkpoint``) to get the activations
it needs. Less memory held between the forward and the backward, about one more forward's
time. The blocks are found the way a pipeline finds its units (``cuts.unit_names``):

- a plain ``nn.Sequential`` (AlexNet's ``features`` and ``classifier``, ResNet's
  ``layer1``) is run as segments of about the square root of its length, each
  checkpointed but the last (whose activations the backward needs at once), as
  ``torch.utils.checkpoint.checkpoint_sequential`` does;
- any other module holding two or more modules with weights (a ResNet ``BasicBlock``, a
  block of one's own) is checkpointed whole;
- the model itself never is (its backward would recompute everything and hold as much).

The module tree is left as it is (only the blocks' ``forward`` is replaced, on the
instance): parameter names, state dicts, snapshots and exported weights do not change.
Recomputing a block in train mode would update BatchNorm's running statistics twice, so
its buffers are restored after the recomputation: a checkpointed run steps, and ends
with, the same weights and buffers as one without.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpoint_blocks"]


@contextlib.contextmanager
def _buffers_kept(module: nn.Module) -> Iterator[None]:
    """Around a recomputation: ``module``'s buffers end as they began (BatchNorm's
    running statistics are updated once a step, by the forward pass)."""
    kept = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, before in kept:
                buffer.copy_(before)


class _Checkpointed:
    """A block's ``forward`` that checkpoints it (pickles and deep-copies with its
    module: replicas and spawned processes get their own)."""

    def __init__(self, module: nn.Module, segments: int) -> None:
        self.module, self.size = module, 0
        if segments:
            children = list(module)
            self.size = math.ceil(len(children) / segments)
            for first in children[::self.size]:  # a segment's input is kept for its
                if getattr(first, "inplace", False):  # recomputation: a ReLU(inplace)
                    first.inplace = False  # must not change it

    def _contexts(self, part: nn.Module):
        return lambda: (contextlib.nullcontext(), _buffers_kept(part))

    def __call__(self, *args, **kwargs):
        module = self.module
        if not torch.is_grad_enabled() or is_fx_symbolic_tracing():  # validation keeps
            return type(module).forward(module, *args, **kwargs)  # nothing; fx: the graph
        if not self.size:  # the block whole
            return checkpoint(type(module).forward, module, *args, use_reentrant=False,
                              context_fn=self._contexts(module), **kwargs)
        (x,) = args
        children = list(module)  # now: a strategy may have replaced some (tensor parallel)
        for start in range(0, len(children) - self.size, self.size):
            part = nn.Sequential(*children[start:start + self.size])
            x = checkpoint(part, x, use_reentrant=False, context_fn=self._contexts(part))
        last = (len(children) - 1) // self.size * self.size
        return nn.Sequential(*children[last:])(x)


def _weighted(module: nn.Module) -> int:
    """How many of ``module``'s own submodules hold weights directly."""
    return sum(1 for m in module.modules() if m is not module and
               any(True for _ in m.parameters(recurse=False)))


def checkpoint_blocks(model: nn.Module) -> list[str]:
    """Checkpoint ``model``'s blocks in place; their names (empty: none found, as in a
    model of one layer)."""
    done: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            plain = isinstance(child, nn.Sequential) and \
                type(child).forward is nn.Sequential.forward
            if plain and len(child) > 1:
                child.forward = _Checkpointed(child, math.ceil(math.sqrt(len(child))))
                done.append(f"{prefix}{name}")
            elif not plain and _weighted(child) >= 2:
                child.forward = _Checkpointed(child, 0)
                done.append(f"{prefix}{name}")
            else:
                walk(f"{prefix}{name}.", child)

    walk("", model)
    return done
