"""The recipe's values as the use case and the flags give them, before torch sees them:
the tables of keyword arguments of the optimizer and the learning-rate schedule (what
their names and arguments mean to torch is ``ddlstudy.training.recipe``'s to check), and
ImageNet's normalisation."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from ddlstudy.errors import ConfigError


def table(text: str) -> dict[str, Any]:
    """--optimizer-args's and --lr-schedule-args's value: a JSON object, the TOML table's
    keys and values (``{"weight_decay": 0.05, "betas": [0.9, 0.95]}``)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r:.80} is not a JSON object; give the "
                                         'arguments as {"NAME": VALUE, ...}')
    return value


ARGUMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
"""An optimizer's or schedule's name, and a keyword argument's (a Python identifier)."""
SGD = "SGD"
"""The paper's optimizer (with ``train.momentum``)."""
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
"""ImageNet's mean and std per RGB channel, as torchvision's pretrained models expect
(``data.normalize = "imagenet"``)."""
SELF_WARMING = ("onecycle", "OneCycleLR", "CyclicLR")
"""Schedules that raise the learning rate from low themselves (no warm-up before them)."""
NONE = "none"
TARGET_METRICS = {"accuracy": "val_accuracy", "macro_f1": "val_macro_f1"}
"""The metrics ``[train] target_metric`` may name, with their epoch record's key."""


def accuracy(text: str) -> float | str:
    """--target-accuracy's value: a number, or ``none`` (no time to target measured)."""
    return NONE if text.strip().lower() == NONE else float(text)


def metric(name: str, value: Any) -> None:
    """``value`` is a metric time to target can measure (``TARGET_METRICS``)."""
    if value not in TARGET_METRICS:
        raise ConfigError(name, f"unknown metric {value!r:.60}; give one of "
                          f"{', '.join(TARGET_METRICS)}")


def arguments(name: str, value: Any) -> None:
    """A table of keyword arguments: Python names as keys (the learning rate is ``lr``'s,
    the parameters or the optimizer ddlstudy's)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ConfigError(name, f"must be a table of keyword arguments, got {value!r:.60}")
    for key in value:
        if not isinstance(key, str) or not ARGUMENT.fullmatch(key):
            raise ConfigError(name, f"{key!r:.60} is not an argument's name")
        if key in ("lr", "params", "optimizer"):
            what = "train.lr (--lr, scaled by --lr-scaling)" if key == "lr" else "ddlstudy's"
            raise ConfigError(f"{name}.{key}", f"is {what}: leave it out of the table")
