"""One optimizer step, in its forms every strategy shares: a batch as micro-batches (the
gradient accumulation of ``--accumulate``), fp16's gradient scaler, and the random states
a snapshot holds."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
StepFn = Callable[[Batch], tuple[float, int, int]]
"""One optimizer step on a batch -> (summed loss, correct predictions, images)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """This process's random states (torch, numpy, Python) as tensors and plain lists, so a
    snapshot holding them loads with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
            "python": {"version": version, "internal": list(internal), "gauss": gauss}}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


def micro_batches(images: torch.Tensor, labels: torch.Tensor,
                  k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A batch as ``k`` nearly equal non-empty micro-batches (gradient accumulation)."""
    return [(x, y) for x, y in zip(images.tensor_split(k), labels.tensor_split(k), strict=True)
            if y.numel()]


def make_scaler(precision: str, device_type: str = "cpu") -> torch.amp.GradScaler | None:
    """fp16's gradient scaler (None for fp32 and bf16, which need none): the loss is
    multiplied before backward so small gradients survive float16, the gradients divided
    back before the step, and a step whose gradients overflowed is skipped with the
    scale halved."""
    return torch.amp.GradScaler(device_type) if precision == "fp16" else None


def optimizer_step(optimizer: torch.optim.Optimizer,
                   scaler: torch.amp.GradScaler | None = None) -> None:
    """The optimizer's step, through the fp16 scaler when there is one. A step whose
    gradients overflowed leaves the weights as they were and lowers the scale: the
    optimizer's ``skipped_step`` says so (the learning-rate warm-up does not count it)."""
    if scaler is None:
        optimizer.step()
    else:
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.skipped_step = scaler.get_scale() < scale  # type: ignore[attr-defined]


def accumulate_grads(model: nn.Module, loss_fn: nn.Module, images: torch.Tensor,
                     labels: torch.Tensor, k: int, scale: float = 1.0,
                     no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                     scaler: torch.amp.GradScaler | None = None) -> tuple[float, int]:
    """Forward and backward of a batch as ``k`` micro-batches, each micro-batch's mean loss
    weighted by its share of the batch (x ``scale``), so the summed gradient is the whole
    batch's; with ``no_sync`` (DDP) only the last backward communicates. With k = 1 it is a
    plain forward and backward. Returns (summed loss, correct predictions)."""
    parts = micro_batches(images, labels, k)
    n = labels.numel()
    loss_sum, correct = 0.0, 0
    for i, (x, y) in enumerate(parts):
        last = i == len(parts) - 1
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            logits = model(x)
            loss = loss_fn(logits, y)
            weighted = loss * (scale if len(parts) == 1 else scale * y.numel() / n)
            (weighted if scaler is None else scaler.scale(weighted)).backward()
        loss_sum += loss.item() * y.numel()
        correct += int((logits.argmax(1) == y).sum())
    return loss_sum, correct


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               loss_fn: nn.Module, accumulate: int = 1,
               scaler: torch.amp.GradScaler | None = None) -> StepFn:
    """One model, one batch (as ``accumulate`` micro-batches): the baseline's step."""

    def step(batch: Batch) -> tuple[float, int, int]:
        images, labels = batch
        optimizer.zero_grad(set_to_none=True)
        loss_sum, correct = accumulate_grads(model, loss_fn, images, labels, accumulate,
                                             scaler=scaler)
        optimizer_step(optimizer, scaler)
        return loss_sum, correct, labels.numel()

    return step
