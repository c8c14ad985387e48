"""The images of a run's split as tensors: decoded, resized, flipped and normalised per
item, or read a batch at a time from the decoded cache (``data.cache``) and flipped and
normalised as tensor operations, to the same values (torch and torchvision; ``data.folder``
scans and splits without them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ddlstudy.data.cache import Decoded

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def make_transform(image_size: int, train: bool):
    """The paper's task: scale/crop to the use case's size, random flip, to tensor, normalise
    (torchvision.transforms.Compose; torchvision is imported here, where it is used, as it
    takes 2 s to import)."""
    from torchvision import transforms

    steps = [transforms.Resize(image_size), transforms.CenterCrop(image_size)]
    if train:
        steps.append(transforms.RandomHorizontalFlip())
    steps += [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    return transforms.Compose(steps)


class ImageListDataset(Dataset):
    """Decodes and transforms one image per item; safe to use from DataLoader workers."""

    def __init__(self, root: Path, items: list[tuple[str, int]], transform) -> None:
        self.root = Path(root)
        self.items = items
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rel, label = self.items[index]
        with Image.open(self.root / rel) as img:
            return self.transform(img.convert("RGB")), label


class CachedImages(Dataset):
    """The items of ``ImageListDataset`` from the decoded cache, a batch at a time
    (``__getitems__``): one index into the mapped file, then the flip, ``ToTensor``'s
    scaling and ``Normalize`` on the whole batch. The values are those of
    ``make_transform`` bit for bit, and the flips draw ``torch.rand(1)`` once per item in
    order, as ``RandomHorizontalFlip`` does, so the random stream is the same too. Give
    the DataLoader ``collate_fn=as_batch``: the batch is already collated."""

    def __init__(self, cache: Decoded, items: list[tuple[str, int]], train: bool) -> None:
        self.cache, self.train = cache, train
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
        if self.train:
            flip = torch.tensor([bool(torch.rand(1) < 0.5) for _ in indices])
            images[flip] = images[flip].flip(2)
        images = images.permute(0, 3, 1, 2).contiguous().float().div_(255)
        images.sub_(_MEAN).div_(_STD)
        return images, self.labels[indices]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return images[0], int(labels[0])


_MEAN = torch.tensor(MEAN).view(1, 3, 1, 1)
_STD = torch.tensor(STD).view(1, 3, 1, 1)


def as_batch(batch):
    """The DataLoader's collate for ``CachedImages``, whose batches come collated."""
    return batch
