"""The seeded sequence of global batches every strategy walks, and each rank's slice of it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler

from ddlstudy.config import RunConfig
from ddlstudy.config.recipe import MEAN, STD
from ddlstudy.data import DataPlan
from ddlstudy.data.cache import Decoded, decoded
from ddlstudy.data.images import CachedImages, ImageListDataset, Preprocess, as_batch
from ddlstudy.machine import forkserver

log = logging.getLogger("ddlstudy")


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


_caches: dict[tuple[str, int], Decoded | None] = {}


def _cache(cfg: RunConfig, data: DataPlan) -> Decoded | None:
    """This host's decoded cache of the run's data set (built by the first process that
    asks), once per process; None with --no-data-cache or where it cannot be written."""
    if not cfg.data_cache:
        return None
    size = cfg.usecase.train.image_size
    key = (data.images.fingerprint, size)
    if key not in _caches:
        found, why = decoded(data.images.root, [rel for rel, _ in data.images.items],
                             data.images.fingerprint, size)
        if found is None:
            log.warning("decoding every image in the loop: no decoded cache (%s)", why)
        _caches[key] = found
    return _caches[key]


def preprocessing(cfg: RunConfig, data: DataPlan) -> Preprocess:
    """What the run's batches go through (``data.flip``, ``crop_scale``, ``normalize``):
    the manifest's and the exported model's ``preprocessing``."""
    spec = cfg.usecase.data
    mean, std = {"imagenet": (MEAN, STD), "none": (None, None)}.get(
        spec.normalize, (tuple((data.stats or {}).get("mean", ())),
                         tuple((data.stats or {}).get("std", ()))))
    return Preprocess(size=cfg.usecase.train.image_size, mean=mean, std=std, flip=spec.flip,
                      crop_scale=spec.crop_scale)


def image_dataset(cfg: RunConfig, data: DataPlan, items: list[tuple[str, int]],
                  train: bool) -> Dataset:
    """``items`` as tensors: from the decoded cache where there is one, else decoded one
    by one; then flipped, cropped and normalised (``preprocessing``): the same values and
    the same random draws either way."""
    cache, preprocess = _cache(cfg, data), preprocessing(cfg, data)
    if cache is not None:
        return CachedImages(cache, items, train, preprocess)
    return ImageListDataset(data.images.root, items, train, preprocess)


def _worker_args(workers: int) -> dict:
    return {"num_workers": workers,
            **({"persistent_workers": True, "prefetch_factor": 4,
                "worker_init_fn": forkserver.loader_worker} if workers else {})}


def _collate(dataset: Dataset):
    """Our image datasets' batches come collated (``__getitems__``); others' (a pipeline's
    later stages read labels alone) are collated by torch."""
    return as_batch if isinstance(dataset, CachedImages | ImageListDataset) else None


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
    return DataLoader(dataset, batch_sampler=batches, generator=gen, collate_fn=_collate(dataset),
                      **_worker_args(workers))


def val_loader(cfg: RunConfig, data: DataPlan, shard: tuple[int, int] | None = None,
               loader_workers: int | None = None) -> DataLoader:
    """The validation images in order (``shard``: this rank's share of them; with
    --max-val-steps, that many batches of them spread evenly over the whole: the images
    are in class order, and the first batches alone would hold one class)."""
    items = data.val
    if shard is not None:
        items = [items[i] for i in np.array_split(np.arange(len(items)), shard[1])[shard[0]]]
    kept = (cfg.max_val_steps or 0) * cfg.usecase.train.batch_size
    if 0 < kept < len(items):
        items = [items[i] for i in np.linspace(0, len(items) - 1, kept).round().astype(int)]
    workers = cfg.loader_workers if loader_workers is None else loader_workers
    dataset = image_dataset(cfg, data, items, False)
    return DataLoader(dataset, batch_size=cfg.usecase.train.batch_size,
                      collate_fn=_collate(dataset), **_worker_args(workers))


def make_loaders(cfg: RunConfig, data: DataPlan, loader_workers: int | None = None,
                 shard: tuple[int, int] | None = None,
                 drop_last: bool = False) -> tuple[DataLoader, DataLoader]:
    """Training loader (seeded, ``shard``: this rank's slice) and the validation loader
    (``shard``: this rank's share of the validation images)."""
    train = train_loader(image_dataset(cfg, data, data.train, True), cfg, shard=shard,
                         drop_last=drop_last, loader_workers=loader_workers)
    return train, val_loader(cfg, data, shard, loader_workers)
