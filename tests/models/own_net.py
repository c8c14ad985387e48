"""A network of one's own, as a researcher brings it: ``--model tests/models/own_net.py:
small_resnet``. A small residual network with BatchNorm (running statistics: buffers); and
factories that go wrong, each refused by name."""

import os
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn(self.conv(x)))  # the skip: no cut inside a block


def small_resnet(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        Block(16), nn.Conv2d(16, 32, 3, stride=2, padding=1), Block(32), Block(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


def wide(num_classes: int) -> nn.Module:
    """A layer of 12.6 M weights (48 MiB, above glibc's largest mmap threshold, 32 MiB):
    its gradient is made afresh every step (``--heap``)."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(16), nn.Flatten(), nn.Linear(768, WIDE),
                         nn.ReLU(), nn.Linear(WIDE, num_classes))


WIDE = 16384


def raises(num_classes: int) -> nn.Module:
    raise ValueError("this factory is broken")


def not_a_module(num_classes: int):
    return [num_classes]


def wrong_outputs(num_classes: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, num_classes + 7))


def needs_big_images(num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 9), nn.MaxPool2d(8), nn.Conv2d(4, 4, 9),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))


def lazy(num_classes: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LazyLinear(num_classes))


def frozen(num_classes: int) -> nn.Module:
    return small_resnet(num_classes).requires_grad_(False)


class _Counts(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.mean((2, 3))).long()


def int_out(num_classes: int) -> nn.Module:
    return _Counts(num_classes)


def exits(num_classes: int) -> nn.Module:
    raise SystemExit(0)


def _on_meta() -> bool:
    """Whether this factory is called on the meta device (shapes only, nothing allocated)."""
    return torch.empty(0).device.type == "meta"


def fails_when_real(num_classes: int) -> nn.Module:
    """As a model too big for memory: its shapes build, its weights do not (issue 52)."""
    if not _on_meta():
        raise MemoryError("cannot allocate 54 GB")
    return small_resnet(num_classes)


def list_when_real(num_classes: int):
    return small_resnet(num_classes) if _on_meta() else [num_classes]


def four_terabytes(num_classes: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10**6),
                         nn.Linear(10**6, 10**6), nn.Linear(10**6, num_classes))


def moves_away(num_classes: int) -> nn.Module:
    """Changes the working directory (to the folder ``MOVE_TO`` names) when called."""
    os.chdir(os.environ["MOVE_TO"])
    return small_resnet(num_classes)


def never_returns(num_classes: int) -> nn.Module:
    while True:
        time.sleep(3600)


def swallows_every_exception(num_classes: int) -> nn.Module:
    """Does not return while the file ``HOLD_FILE`` names exists, and swallows whatever is
    raised in it meanwhile (a time limit's exception too)."""
    while os.path.exists(os.environ.get("HOLD_FILE", "")):
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001, S110 - what a careless factory does
            pass
    return small_resnet(num_classes)
