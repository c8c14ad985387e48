"""The images of a run's split as tensors: decoded and resized one by one, or read from
the decoded cache (``data.cache``), then flipped, cropped and normalised a batch at a time
as tensor operations (``Preprocess``), to the same values either way (torch and
torchvision; ``data.folder`` scans and splits without them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ddlstudy.config.recipe import MEAN, STD
from ddlstudy.data.cache import Decoded, resized


@dataclass(frozen=True)
class Preprocess:
    """What a batch of decoded images goes through: the training images' random flip and
    resized crop (``data.flip``, ``data.crop_scale``), then every image's normalisation
    (``mean``, ``std``: None for none). Its ``as_dict`` is what a model needs to see new
    images as it saw these: the manifest's and the exported model's ``preprocessing``."""

    size: int
    mean: tuple[float, ...] | None = MEAN
    std: tuple[float, ...] | None = STD
    flip: bool = True
    crop_scale: float = 1.0

    def as_dict(self) -> dict:
        return {"size": self.size, "resize": "the shorter side to size, then the centre "
                "size x size crop", "scale": "RGB values / 255",
                "mean": None if self.mean is None else list(self.mean),
                "std": None if self.std is None else list(self.std),
                "training": {"flip": self.flip, "crop_scale": self.crop_scale}}

    def __call__(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        """``images`` (n, h, w, 3) uint8, a copy this may change, as the network's float
        (n, 3, h, w). The flips draw ``torch.rand(1)`` once per item in order, as
        torchvision's ``RandomHorizontalFlip`` does, and the values are ``ToTensor`` and
        ``Normalize``'s bit for bit."""
        if train and self.flip:
            flip = torch.tensor([bool(torch.rand(1) < 0.5) for _ in range(len(images))])
            images[flip] = images[flip].flip(2)
        images = images.permute(0, 3, 1, 2).contiguous().float().div_(255)
        if train and self.crop_scale < 1:
            images = resized_crops(images, self.crop_scale)
        if self.mean is not None:
            images.sub_(torch.tensor(self.mean).view(1, 3, 1, 1))
            images.div_(torch.tensor(self.std).view(1, 3, 1, 1))
        return images


def resized_crops(images: torch.Tensor, scale: float) -> torch.Tensor:
    """Each image's random box of a share in [scale, 1] of its area and an aspect ratio in
    [3/4, 4/3] (torchvision's RandomResizedCrop, drawn from torch's generator), scaled
    back to the image's size (bilinear)."""
    n, _, h, w = images.shape
    out = torch.empty_like(images)
    draws = torch.rand(n, 4)
    for i, (a, r, y, x) in enumerate(draws.tolist()):
        area = h * w * (scale + (1 - scale) * a)
        ratio = math.exp(math.log(3 / 4) + r * math.log(16 / 9))
        bw = min(w, max(1, round(math.sqrt(area * ratio))))
        bh = min(h, max(1, round(math.sqrt(area / ratio))))
        top, left = int(y * (h - bh + 1)), int(x * (w - bw + 1))
        box = images[i:i + 1, :, top:top + bh, left:left + bw]
        out[i] = F.interpolate(box, size=(h, w), mode="bilinear", align_corners=False)[0]
    return out


class ImageListDataset(Dataset):
    """Decodes the images one by one (Resize and CenterCrop as the decoded cache holds
    them), then ``Preprocess`` on the batch (``__getitems__``): the same tensors and random
    draws as ``CachedImages``; safe to use from DataLoader workers. Give the DataLoader
    ``collate_fn=as_batch``."""

    def __init__(self, root: Path, items: list[tuple[str, int]], train: bool,
                 preprocess: Preprocess) -> None:
        self.root, self.items, self.train, self.preprocess = Path(root), items, train, preprocess

    def __len__(self) -> int:
        return len(self.items)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.preprocess.size
        images = torch.from_numpy(np.stack([resized(self.root / self.items[i][0], size)
                                            for i in indices]))
        labels = torch.tensor([self.items[i][1] for i in indices], dtype=torch.int64)
        return self.preprocess(images, self.train), labels

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0], int(labels[0])


class CachedImages(Dataset):
    """The items of ``ImageListDataset`` from the decoded cache, a batch at a time
    (``__getitems__``): one index into the mapped file, then ``Preprocess`` on the whole
    batch, to the same values and random draws. Give the DataLoader
    ``collate_fn=as_batch``: the batch is already collated."""

    def __init__(self, cache: Decoded, items: list[tuple[str, int]], train: bool,
                 preprocess: Preprocess) -> None:
        self.cache, self.train, self.preprocess = cache, train, preprocess
        self.rows = np.array([cache.rows[rel] for rel, _ in items], dtype=np.int64)
        self.labels = torch.tensor([label for _, label in items], dtype=torch.int64)
        self._array: np.ndarray | None = None  # mapped in each process that reads

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_array": None}  # a spawned process maps the file itself

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self._array is None:
            self._array = self.cache.array()
        images = torch.from_numpy(self._array[self.rows[indices]])  # (n, h, w, 3), a copy
        return self.preprocess(images, self.train), self.labels[indices]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0], int(labels[0])


def as_batch(batch):
    """The DataLoader's collate for ``CachedImages``, whose batches come collated."""
    return batch
