"""The networks a use case trains, named by a ``ModelSpec``: the paper's AlexNet and VGG16
(``paper``), any torchvision classification model, timm's, or a factory of one's own
(``sources``). Nothing else in ddlstudy names an architecture: it asks the spec, here, for
the model (``build_model``) and what it is (``facts``): its weights and gradient bytes, its
buffers (BatchNorm's running statistics), its smallest usable image (found by a forward
pass), and where it came from (``describe``, for the manifest).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import psutil

from ddlstudy.config import ModelSpec
from ddlstudy.errors import ConfigError
from ddlstudy.models import memo
from ddlstudy.models.sources import FLAG, made, maker, origin, torchvision_names

if TYPE_CHECKING:  # torch where a model is built: a check remembered (``memo``) needs none
    from torch import nn

__all__ = ["Facts", "build_model", "check", "count_parameters",
           "describe", "facts", "parameter_count", "shapes_only", "torchvision_names"]


def build_model(spec: ModelSpec, num_classes: int,
                alongside: Callable[[], object] | None = None) -> nn.Module:
    """A freshly initialised network (seed torch first for identical weights);
    ``alongside``: what to do meanwhile (``sources.made``)."""
    return made(spec, num_classes, alongside)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@lru_cache(maxsize=16)
def shapes_only(spec: ModelSpec, num_classes: int) -> tuple[nn.Module, bool]:
    """The model built on the meta device (shapes, nothing allocated), or, where its
    maker cannot build there (torchvision's regnets compute with tensors), on the CPU.
    Returns (model, on meta)."""
    import torch

    maker(spec)  # an unknown name, file or function is refused here
    try:
        with torch.device("meta"):
            return made(spec, num_classes), True  # refused here if it is no module
    except ConfigError as exc:
        if "raised" not in str(exc):
            raise
    return made(spec, num_classes), False  # a maker that needs real tensors (or fails)


def _forward(model: nn.Module, size: int, meta: bool, train: bool = False):
    """One forward pass of 2 images of ``size`` px (the output, or the error it raised)."""
    import torch

    x = torch.empty(2, 3, size, size, device="meta" if meta else "cpu")
    model.train(train)
    try:
        with torch.no_grad():
            return model(x)
    except Exception as exc:  # noqa: BLE001 - too small an image, or an op meta lacks
        return exc


def _smallest(model: nn.Module, meta: bool, most: int = 2048) -> int | None:
    """The smallest image side the model takes, by bisection over forward passes (a model
    takes every size from its smallest up); None where it takes none up to ``most``."""
    if isinstance(_forward(model, most, meta), Exception):
        return None
    low, high = 1, most  # high works
    while low < high:
        mid = (low + high) // 2
        if isinstance(_forward(model, mid, meta), Exception):
            low = mid + 1
        else:
            high = mid
    return high


@dataclass(frozen=True)
class Facts:
    """What a model is, from the model itself."""

    name: str
    parameters: int
    buffers: int
    """Elements of its floating-point buffers (BatchNorm's running statistics)."""
    min_image_size: int | None
    """The smallest image side a forward pass takes (None: not measurable on the meta
    device)."""
    largest: int = 0
    """Elements of its largest parameter (its gradient, and an optimizer's temporaries,
    are made afresh that large every step)."""

    @property
    def largest_bytes(self) -> int:
        return 4 * self.largest

    @property
    def gradient_bytes(self) -> int:
        return 4 * self.parameters


@lru_cache(maxsize=64)
def facts(spec: ModelSpec, num_classes: int) -> Facts:
    """What ``spec``'s model is, with ``num_classes`` outputs (cached per process, and on
    this machine for the paper's and torchvision's: ``memo``)."""
    known = memo.recalled(spec, num_classes).get("facts")
    if isinstance(known, dict) and set(known) == {"parameters", "buffers", "min_image_size",
                                                  "largest"}:
        return Facts(str(spec.arch), **known)
    model, meta = shapes_only(spec, num_classes)
    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    found = Facts(str(spec.arch), count_parameters(model), buffers,
                  _smallest(model, meta) if meta else None,
                  max((p.numel() for p in model.parameters()), default=0))
    memo.keep(spec, num_classes, facts={"parameters": found.parameters, "buffers": buffers,
                                        "min_image_size": found.min_image_size,
                                        "largest": found.largest})
    return found


def parameter_count(spec: ModelSpec, num_classes: int) -> int:
    """The weights of the model ``spec`` names, from its shapes where it can (nothing
    allocated, nothing initialised)."""
    return facts(spec, num_classes).parameters


@lru_cache(maxsize=64)
def check(spec: ModelSpec, num_classes: int, image_size: int,
          checkpointed: bool = False) -> None:
    """Refuse (ConfigError) a model that cannot train on this use case: one that cannot
    be built, does not give ``num_classes`` outputs an image, or does not take images of
    ``image_size`` px (saying the smallest it takes); with ``checkpointed``, one with no
    block to checkpoint. A size the paper's or torchvision's model passed before, with
    the same code, is not checked again (``memo``): nothing is built."""
    found = facts(spec, num_classes)
    if [image_size, checkpointed] in memo.recalled(spec, num_classes).get("checked", []):
        _built_for_real(spec, num_classes, found)  # the memory free now
        return
    import torch

    from ddlstudy.models.checkpointing import checkpoint_blocks

    model, meta = shapes_only(spec, num_classes)
    out = _forward(model, image_size, meta, train=True)
    if isinstance(out, Exception) and meta:  # a forward that needs real values (.item())
        model, meta = made(spec, num_classes), False
        out = _forward(model, image_size, meta, train=True)
    odd = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if odd:
        raise ConfigError(FLAG, f"{spec.arch}'s weights are {', '.join(odd)}; ddlstudy "
                          f"trains float32 weights (--precision bf16 or fp16 computes in "
                          f"half precision under autocast): build it in float32")
    if isinstance(out, Exception):
        smallest = found.min_image_size
        if smallest is not None and image_size < smallest:
            raise ConfigError("train.image_size", f"{image_size} px is too small for "
                              f"{spec.arch}; use at least {smallest}")
        raise ConfigError(FLAG, f"{spec.arch} fails on images of {image_size} px "
                          f"({type(out).__name__}: {str(out).splitlines()[0][:300]}); a "
                          f"model made for one size takes only that one (torchvision's: "
                          f"--image-size 224)")
    if isinstance(out, torch.Tensor) and not out.is_floating_point():
        raise ConfigError(FLAG, f"{spec.arch} gives {out.dtype} outputs; the loss needs "
                          f"one floating-point score per class")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        what = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(FLAG, f"{spec.arch} gives {what} for 2 images, not (2, "
                          f"{num_classes}): its output must be one score per class of the "
                          f"use case; build its last layer with num_classes")
    if checkpointed and not checkpoint_blocks(copy.deepcopy(model)):
        raise ConfigError("--checkpoint-activations", f"{spec.arch} has no block to "
                          f"checkpoint (no Sequential of several layers, no module of "
                          f"several with weights); train it without the flag")
    if meta:
        _built_for_real(spec, num_classes, found)
    memo.keep(spec, num_classes, sizes=(image_size, checkpointed))


def _built_for_real(spec: ModelSpec, num_classes: int, found: Facts) -> None:
    """Refuse a model checked on the meta device (shapes only) that could not be built
    as training builds it: its weights beyond this machine's free memory, or a factory of
    one's own that fails, or returns no module, when it really allocates (called here
    once, so that it fails before the run folder exists, not in the run)."""
    need = 4 * (found.parameters + found.buffers)
    free = psutil.virtual_memory().available
    if need > free:
        raise ConfigError(FLAG, f"{spec.arch}'s weights take {need / 2**30:,.1f} GiB but "
                          f"this machine has {free / 2**30:,.1f} GiB of memory free; give a "
                          f"smaller model (or width)")
    if spec.kind in ("file", "module"):  # someone else's code may build only on meta
        made(spec, num_classes)


def describe(spec: ModelSpec, num_classes: int) -> dict[str, Any]:
    """The manifest's ``model`` block: its name, where it came from (the library's
    version, or the factory file's sha256), its weights, buffers and smallest image."""
    found = facts(spec, num_classes)
    return {"name": str(spec.arch), **({"width": spec.width} if spec.width != 1 else {}),
            **origin(spec), "parameters": found.parameters, "buffers": found.buffers,
            "min_image_size": found.min_image_size}
