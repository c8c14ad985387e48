"""The training loop every strategy shares: epochs of steps, validation, timing.

A strategy decides what one step is (one model, k thread replicas, a DDP process, a
pipeline) by giving the Trainer a ``step`` function; the loop around it, the metrics and
the clock are the same for all, so their numbers compare.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler

from ddlstudy.config import RunConfig
from ddlstudy.data import DataPlan
from ddlstudy.data.folder import ImageListDataset, make_transform
from ddlstudy.progress import progress

log = logging.getLogger("ddlstudy")

WARMUP_STEPS = 2
"""Steps left out of the steady-state throughput: allocator and cache warm-up."""

Batch = tuple[torch.Tensor, torch.Tensor]
StepFn = Callable[[Batch], tuple[float, int, int]]
"""One optimizer step on a batch -> (summed loss, correct predictions, images)."""


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    train_images: int
    steps: int
    train_time_s: float
    images_per_s: float
    steady_images_per_s: float
    """Images per second after the first WARMUP_STEPS steps of the epoch."""
    val_time_s: float
    epoch_time_s: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ShardedBatches(Sampler[list[int]]):
    """Rank ``rank``'s slice of every global batch of ``batches``.

    Slices are equal (to an image) unless ``shares`` is set: then rank r gets about
    ``shares[r]`` of each batch (``--balance throughput``), at least one image each. A
    final global batch smaller than the world size is dropped, so that no rank ever gets
    an empty slice (all ranks must take part in every all-reduce).
    """

    def __init__(self, batches: Iterable[list[int]], rank: int, world: int) -> None:
        self.batches, self.rank, self.world = batches, rank, world
        self.shares: list[float] | None = None

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            if len(batch) >= self.world:
                sizes = split_sizes(len(batch), self.world, self.shares)
                start = sum(sizes[:self.rank])
                yield list(batch[start:start + sizes[self.rank]])

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


def split_sizes(n: int, world: int, shares: list[float] | None = None) -> list[int]:
    """How many of ``n`` images each of ``world`` ranks takes: equal (the first ``n %
    world`` one more, as np.array_split), or by ``shares`` (largest remainders get the
    images rounding leaves), at least one each."""
    if shares is None:
        return [n // world + (r < n % world) for r in range(world)]
    total = sum(shares)
    want = [n * s / total for s in shares]
    sizes = [int(w) for w in want]
    for r in sorted(range(world), key=lambda r: sizes[r] - want[r])[:n - sum(sizes)]:
        sizes[r] += 1
    for r in range(world):
        if sizes[r] == 0:  # every rank takes part in every exchange
            sizes[max(range(world), key=sizes.__getitem__)] -= 1
            sizes[r] = 1
    return sizes


class ResumableBatches(Sampler[list[int]]):
    """``batches``, skipping the first ``skip`` of the next pass (a resume mid-epoch).

    The skip happens on indices, before any image is read, and the wrapped sampler is
    iterated exactly as in an uninterrupted run, so it draws the same random numbers.
    """

    def __init__(self, batches: Sampler[list[int]]) -> None:
        self.batches = batches
        self.skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        for i, batch in enumerate(self.batches):
            if i >= skip:
                yield batch

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


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


def _worker_args(workers: int) -> dict:
    return {"num_workers": workers,
            **({"persistent_workers": True, "prefetch_factor": 4} if workers else {})}


def train_loader(dataset: Dataset, cfg: RunConfig, *, shard: tuple[int, int] | None = None,
                 drop_last: bool = False, loader_workers: int | None = None) -> DataLoader:
    """The seeded sequence of global batches every strategy walks (``shard``: rank's slice).

    The generator goes to the DataLoader too, as ``shuffle=True`` does, so that every
    strategy draws from it in the same order and sees the baseline's batches.
    """
    uc = cfg.usecase
    gen = torch.Generator().manual_seed(uc.train.seed)
    batches: Sampler = BatchSampler(RandomSampler(dataset, generator=gen), cfg.global_batch,
                                    drop_last)
    if shard is not None:
        batches = ShardedBatches(batches, *shard)
    batches = ResumableBatches(batches)
    workers = cfg.loader_workers if loader_workers is None else loader_workers
    return DataLoader(dataset, batch_sampler=batches, generator=gen, **_worker_args(workers))


def val_loader(cfg: RunConfig, data: DataPlan, shard: tuple[int, int] | None = None,
               loader_workers: int | None = None) -> DataLoader:
    """The validation images in order (``shard``: this rank's share of them)."""
    items = data.val
    if shard is not None:
        items = [items[i] for i in np.array_split(np.arange(len(items)), shard[1])[shard[0]]]
    workers = cfg.loader_workers if loader_workers is None else loader_workers
    dataset = ImageListDataset(data.images.root, items,
                               make_transform(cfg.usecase.train.image_size, False))
    return DataLoader(dataset, batch_size=cfg.usecase.train.batch_size, **_worker_args(workers))


def make_loaders(cfg: RunConfig, data: DataPlan, loader_workers: int | None = None,
                 shard: tuple[int, int] | None = None,
                 drop_last: bool = False) -> tuple[DataLoader, DataLoader]:
    """Training loader (seeded, ``shard``: this rank's slice) and the validation loader
    (``shard``: this rank's share of the validation images)."""
    train_ds = ImageListDataset(data.images.root, data.train,
                                make_transform(cfg.usecase.train.image_size, True))
    train = train_loader(train_ds, cfg, shard=shard, drop_last=drop_last,
                         loader_workers=loader_workers)
    return train, val_loader(cfg, data, shard, loader_workers)


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
    """The optimizer's step, through the fp16 scaler when there is one."""
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


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


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Batch], loss_fn: nn.Module,
             device: torch.device | None = None) -> tuple[float, int, int]:
    """(summed loss, correct, images) over the loader, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        if device is not None:
            images, labels = images.to(device), labels.to(device)
        logits = model(images)
        total_loss += loss_fn(logits, labels).item() * labels.numel()
        correct += int((logits.argmax(1) == labels).sum())
        seen += labels.numel()
    model.train(was_training)
    return total_loss, correct, seen


class Trainer:
    """Runs epochs of ``step`` over ``train_loader`` and validates ``model`` after each."""

    def __init__(self, model: nn.Module, step: StepFn, train_loader: Iterable[Batch],
                 val_loader: Iterable[Batch], *, max_steps: int | None = None,
                 show_progress: bool = True, sync: Callable[[], None] = lambda: None,
                 reduce: Callable[..., list[float]] | None = None,
                 before_eval: Callable[[], None] = lambda: None,
                 device: torch.device | None = None) -> None:
        self.model = model
        self.step = step
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.max_steps = max_steps
        self.show_progress = show_progress
        self.sync = sync  # e.g. torch.cuda.synchronize: the clock is read after the device
        # Data-parallel ranks each see a slice: ``reduce`` sums their counts (all-reduce).
        self.reduce = reduce or (lambda *values: list(values))
        self.before_eval = before_eval  # e.g. gather pipeline stages into one model
        self.device = device
        self.loss_fn = nn.CrossEntropyLoss()
        self.precision = "fp32"
        """bf16: each step runs under torch.autocast (set by train_epochs from the config)."""
        self.after_step: Callable[[int, int], None] = lambda epoch, step: None
        """Called after every step with (epoch, steps done in it), e.g. to snapshot."""
        self.sums = _zero_sums()
        """The running sums of the epoch in progress (part of a snapshot)."""
        self.epoch_start_generator: torch.Tensor | None = None
        self._clock: tuple[float, float | None, int] = (time.perf_counter(), None, 0)

    @property
    def generator(self) -> torch.Generator | None:
        """The generator that shuffles the training batches."""
        return getattr(self.train_loader, "generator", None)

    def _timing(self) -> tuple[float, int, float]:
        """(train time, steady images, steady time) of the epoch so far, earlier attempts of
        a resumed epoch included; each attempt's first WARMUP_STEPS are not steady."""
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

    def train_epoch(self, epoch: int) -> EpochResult:
        self.model.train()
        gen = self.generator
        self.epoch_start_generator = gen.get_state() if gen is not None else None
        sums = self.sums
        resumed = sums["steps"]  # > 0 when resume_epoch set up a partial epoch
        total = len(self.train_loader) if hasattr(self.train_loader, "__len__") else None
        if self.max_steps and total:
            total = min(total, self.max_steps)
        start = time.perf_counter()
        self._clock = (start, None, 0)
        batches = progress(self.train_loader, total=total, desc=f"epoch {epoch}", unit="batch",
                           enabled=self.show_progress, initial=resumed)
        if self.max_steps and sums["steps"] >= self.max_steps:
            batches = []
        autocast = self.autocast()
        for batch in batches:
            with autocast:
                batch_loss, batch_correct, n = self.step(batch)
            sums["loss"] += batch_loss
            sums["correct"] += batch_correct
            sums["images"] += n
            sums["steps"] += 1
            if sums["steps"] - resumed == WARMUP_STEPS:
                self.sync()
                self._clock = (start, time.perf_counter(), sums["images"])
            self.after_step(epoch, sums["steps"])
            if self.max_steps and sums["steps"] >= self.max_steps:
                break
        self.sync()
        train_time, steady_images, steady_time = self._timing()
        self.sums = _zero_sums()
        val_start = time.perf_counter()
        self.before_eval()
        val_sums = evaluate(self.model, self.val_loader, self.loss_fn, self.device)
        val_time = time.perf_counter() - val_start
        loss_sum, correct, images, steady_n, val_loss, val_correct, val_seen = self.reduce(
            sums["loss"], sums["correct"], sums["images"], steady_images, *val_sums)
        images, steady_n, val_seen = int(images), int(steady_n), max(int(val_seen), 1)
        return EpochResult(
            epoch=epoch, train_loss=loss_sum / max(images, 1),
            train_accuracy=correct / max(images, 1), val_loss=val_loss / val_seen,
            val_accuracy=val_correct / val_seen, train_images=images, steps=sums["steps"],
            train_time_s=train_time,
            images_per_s=images / train_time if train_time else 0.0,
            steady_images_per_s=(steady_n / steady_time if steady_n and steady_time
                                 else images / max(train_time, 1e-9)),
            val_time_s=val_time, epoch_time_s=train_time + val_time)


def _zero_sums() -> dict:
    return {"loss": 0.0, "correct": 0, "images": 0, "steps": 0, "time_s": 0.0,
            "steady_images": 0, "steady_time_s": 0.0}


def log_epoch(result: EpochResult, epochs: int) -> None:
    log.info("epoch %d/%d  train loss %.4f acc %.3f | val loss %.4f acc %.3f | "
             "%.1f img/s | %.1f s", result.epoch, epochs, result.train_loss,
             result.train_accuracy, result.val_loss, result.val_accuracy,
             result.steady_images_per_s, result.epoch_time_s)
