"""The training loop every strategy shares: epochs of steps, validation, timing.

A strategy decides what one step is (one model, k thread replicas, a DDP process, a
pipeline) by giving the Trainer a ``step`` function; the loop around it, the metrics and
the clock are the same for all, so their numbers compare.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ddlstudy.config import WARMUP_STEPS
from ddlstudy.machine import collector
from ddlstudy.machine.environment import mark_phase, seconds_since_command
from ddlstudy.progress import progress
from ddlstudy.training.memory import SavedForBackward, give_back
from ddlstudy.training.metrics import Tally, scores, unpack
from ddlstudy.training.steps import Batch, StepFn

log = logging.getLogger("ddlstudy")
MIN_PACED = 3
"""The fewest steady steps an epoch paced by ``steady_seconds`` takes (a spread needs a few)."""


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    """The confusion matrix's trace over its total (``metrics.scores``)."""
    val_macro_f1: float
    train_images: int
    steps: int
    train_time_s: float
    images_per_s: float
    steady_images_per_s: float
    """Images per second after the first warm-up steps of the epoch."""
    val_time_s: float
    epoch_time_s: float
    first_step_s: float | None = None
    """Seconds from the user's command to this process's first training step (imports,
    scan, spawning, set-up); a field of the run, not of the epoch: not in ``as_dict``."""
    val_scores: dict = dataclasses.field(default_factory=dict)
    """Each class's accuracy and the top-k accuracy (``metrics.scores``' other keys),
    flat in ``as_dict``."""
    confusion: list = dataclasses.field(default_factory=list)
    """The validation's confusion matrix (rows: true class, columns: predicted), summed
    over every worker; not in ``as_dict`` (the run folder keeps the last epoch's)."""

    def as_dict(self) -> dict:
        record = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in ("first_step_s", "val_scores", "confusion")}
        return record | self.val_scores


@torch.no_grad()
def validate(model: nn.Module, loader: Iterable[Batch], loss_fn: nn.Module,
             tally: Tally | None = None,
             device: torch.device | None = None) -> tuple[float, Tally | None]:
    """(summed loss, the images counted in ``tally``) over the loader, in eval mode (no
    dropout); without ``tally``, one for as many classes as the model has outputs."""
    was_training = model.training
    model.eval()
    total_loss = 0.0
    for images, labels in loader:
        if device is not None:
            images, labels = images.to(device), labels.to(device)
        logits = model(images)
        total_loss += loss_fn(logits, labels).item() * labels.numel()
        tally = tally or Tally(logits.shape[1], logits.device)
        tally.add(logits, labels)
    model.train(was_training)
    return total_loss, tally


def evaluate(model: nn.Module, loader: Iterable[Batch], loss_fn: nn.Module,
             device: torch.device | None = None) -> tuple[float, int, int]:
    """(summed loss, correct, images) over the loader, in eval mode (no dropout)."""
    loss, tally = validate(model, loader, loss_fn, None, device)
    if tally is None:
        return loss, 0, 0
    matrix = tally.confusion.view(tally.classes, tally.classes)
    return loss, int(matrix.trace()), int(matrix.sum())


class Trainer:
    """Runs epochs of ``step`` over ``train_loader`` and validates ``model`` after each."""

    def __init__(self, model: nn.Module, step: StepFn, train_loader: Iterable[Batch],
                 val_loader: Iterable[Batch], *, max_steps: int | None = None,
                 warmup_steps: int = WARMUP_STEPS,
                 show_progress: bool = True, sync: Callable[[], None] = lambda: None,
                 reduce: Callable[..., list[float]] | None = None,
                 before_eval: Callable[[], None] = lambda: None,
                 device: torch.device | None = None, classes: int = 0) -> None:
        self.model = model
        self.step = step
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        self.show_progress = show_progress
        self.sync = sync  # e.g. torch.cuda.synchronize: the clock is read after the device
        # Data-parallel ranks each see a slice: ``reduce`` sums their counts (all-reduce).
        self.reduce = reduce or (lambda *values: list(values))
        self.before_eval = before_eval  # e.g. gather pipeline stages into one model
        self.device = device
        self.classes = classes
        """The use case's classes: the confusion matrix validation fills (0: no validation)."""
        self.loss_fn = nn.CrossEntropyLoss()
        self.precision = "fp32"
        """bf16: each step runs under torch.autocast (set by train_epochs from the config)."""
        self.steady_seconds: float | None = None
        """End each epoch once its steady steps have taken about this long (``paced``)."""
        self.after_step: Callable[[int, int], None] = lambda epoch, step: None
        """Called after every step with (epoch, steps done in it), e.g. to snapshot."""
        self.sums = _zero_sums()
        """The running sums of the epoch in progress (part of a snapshot)."""
        self.epoch_start_generator: torch.Tensor | None = None
        self._clock: tuple[float, float | None, int] = (time.perf_counter(), None, 0)
        self.first_step_s: float | None = None
        self.activation_bytes: int | None = None
        """What the first step saved for backward in this thread (its activations)."""
        self.step_log: list[tuple[int, int, float, int, float]] = []
        """This process's steps since the run folder last took them: (epoch, step in the
        epoch, mean loss, images, seconds since the step before)."""

    @property
    def generator(self) -> torch.Generator | None:
        """The generator that shuffles the training batches."""
        return getattr(self.train_loader, "generator", None)

    @property
    def steps_per_epoch(self) -> int:
        """The optimizer steps of an epoch (``max_steps`` at most)."""
        total = len(self.train_loader)
        return min(total, self.max_steps) if self.max_steps else total

    def _timing(self) -> tuple[float, int, float]:
        """(train time, steady images, steady time) of the epoch so far, earlier attempts of
        a resumed epoch included; each attempt's first warm-up steps are not steady."""
        now = time.perf_counter()
        start, steady_start, steady_from = self._clock
        sums = self.sums
        train_time = sums["time_s"] + now - start
        if steady_start is None:
            return train_time, sums["steady_images"], sums["steady_time_s"]
        return (train_time, sums["steady_images"] + sums["images"] - steady_from,
                sums["steady_time_s"] + now - steady_start)

    def position(self) -> dict:
        """Where training stands, for a snapshot: the shuffling generator as it was when the
        epoch in progress began, and that epoch's running sums and times."""
        gen = self.epoch_start_generator
        train_time, steady_images, steady_time = self._timing()
        return {"generator": gen if gen is not None else self.generator.get_state(),
                "sums": self.sums | {"time_s": train_time, "steady_images": steady_images,
                                     "steady_time_s": steady_time}}

    def resume_epoch(self, position: dict) -> None:
        """Make the next ``train_epoch`` continue an epoch a snapshot interrupted."""
        self.generator.set_state(position["generator"])
        self.sums = _zero_sums() | position["sums"]
        self.train_loader.batch_sampler.skip = self.sums["steps"]

    def autocast(self) -> contextlib.AbstractContextManager:
        """The mixed-precision context each step runs in (reusable, re-entrant)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        device = self.device.type if self.device is not None else "cpu"
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        return torch.autocast(device, dtype=dtype)

    def paced(self, done: int, step_s: float) -> float:
        """With ``steady_seconds``: the step after which the epoch ends, ``done`` steps in
        and the last warm-up step having taken ``step_s``: as many steady steps as fill
        ``steady_seconds`` at that pace (the ranks' mean through ``reduce``, a collective
        every rank calls at the same step, so that all end at the same step; their steps
        wait for each other, so they take alike), at least MIN_PACED."""
        if not self.steady_seconds:
            return math.inf
        total, ranks = self.reduce(step_s, 1.0)
        return done + max(MIN_PACED, math.ceil(self.steady_seconds / max(total / ranks, 1e-6)))

    def _first(self) -> contextlib.AbstractContextManager:
        """The first step's context: when it started noted, what it saves for backward
        counted (``activation_bytes``), its end noted (the start's last phase); nothing
        for the others."""
        if self.first_step_s is not None:
            return contextlib.nullcontext()
        self.first_step_s = seconds_since_command()
        collector.settled()  # what the start made: never scanned again
        mark_phase("setup")
        first = contextlib.ExitStack()
        first.callback(mark_phase, "first step")
        first.enter_context(SavedForBackward(self.model, lambda n: setattr(
            self, "activation_bytes", n)))
        return first

    def train_epoch(self, epoch: int) -> EpochResult:
        self.model.train()
        gen = self.generator
        self.epoch_start_generator = gen.get_state() if gen is not None else None
        sums = self.sums
        resumed = sums["steps"]  # > 0 when resume_epoch set up a partial epoch
        total = self.steps_per_epoch
        start = time.perf_counter()
        self._clock = (start, None, 0)
        batches = progress(self.train_loader, total=total, desc=f"epoch {epoch}", unit="batch",
                           enabled=self.show_progress, initial=resumed)
        if self.max_steps and sums["steps"] >= self.max_steps:
            batches = []
        autocast = self.autocast()
        last, stop = start, math.inf
        for batch in batches:
            with autocast, self._first():
                batch_loss, batch_correct, n = self.step(batch)
            now = time.perf_counter()
            took, last = now - last, now
            self.step_log.append((epoch, sums["steps"] + 1, batch_loss / max(n, 1), n, took))
            sums["loss"] += batch_loss
            sums["correct"] += batch_correct
            sums["images"] += n
            sums["steps"] += 1
            if sums["steps"] - resumed == self.warmup_steps:
                self.sync()
                self._clock = (start, time.perf_counter(), sums["images"])
                stop = self.paced(sums["steps"], took)
            self.after_step(epoch, sums["steps"])
            if self.max_steps and sums["steps"] >= self.max_steps or sums["steps"] >= stop:
                break
        self.sync()
        train_time, steady_images, steady_time = self._timing()
        self.sums = _zero_sums()
        val_start = time.perf_counter()
        self.before_eval()
        tally = Tally(self.classes, self.device)
        val_loss, _ = validate(self.model, self.val_loader, self.loss_fn, tally, self.device)
        val_time = time.perf_counter() - val_start
        give_back()  # what the epoch freed: the next one's peak is its own (memory.give_back)
        loss_sum, correct, images, steady_n, val_loss, *counts = self.reduce(
            sums["loss"], sums["correct"], sums["images"], steady_images, val_loss,
            *tally.sums())
        confusion, in_top_k = unpack(self.classes, counts)
        val = scores(confusion, in_top_k)
        val_seen = max(int(confusion.sum()), 1)
        images, steady_n = int(images), int(steady_n)
        return EpochResult(
            epoch=epoch, train_loss=loss_sum / max(images, 1),
            train_accuracy=correct / max(images, 1), val_loss=val_loss / val_seen,
            val_accuracy=val.pop("val_accuracy"), val_macro_f1=val.pop("val_macro_f1"),
            val_scores=val, confusion=confusion.tolist(), train_images=images, steps=sums["steps"],
            train_time_s=train_time,
            images_per_s=images / train_time if train_time else 0.0,
            steady_images_per_s=(steady_n / steady_time if steady_n and steady_time
                                 else images / max(train_time, 1e-9)),
            val_time_s=val_time, epoch_time_s=train_time + val_time,
            first_step_s=self.first_step_s)


def _zero_sums() -> dict:
    return {"loss": 0.0, "correct": 0, "images": 0, "steps": 0, "time_s": 0.0,
            "steady_images": 0, "steady_time_s": 0.0}


def log_epoch(result: EpochResult, epochs: int) -> None:
    log.info("epoch %d/%d  train loss %.4f acc %.3f | val loss %.4f acc %.3f F1 %.3f | "
             "%.1f img/s | %.1f s", result.epoch, epochs, result.train_loss,
             result.train_accuracy, result.val_loss, result.val_accuracy, result.val_macro_f1,
             result.steady_images_per_s, result.epoch_time_s)
