"""The images of a run's split as tensors: decoded, resized, flipped and normalised per
item (torch and torchvision; ``data.folder`` scans and splits without them)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def make_transform(image_size: int, train: bool) -> transforms.Compose:
    """The paper's task: scale/crop to the use case's size, random flip, to tensor, normalise."""
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
