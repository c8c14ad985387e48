"""A model of one's own for ddlstudy (docs: your own model): a function that takes the
number of classes and returns an nn.Module. Train it with

    ddlstudy run --usecase tiny --model docs/examples/my_model.py:make
"""

from torch import nn


def make(num_classes: int) -> nn.Module:
    """A small convolutional network for 64 px images."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, num_classes),
    )
