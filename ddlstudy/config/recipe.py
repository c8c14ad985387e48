"""The recipe's values as the use case and the flags give them, before torch sees them:
the tables of keyword arguments of the optimizer and the learning-rate schedule (what
their names and arguments mean to torch is ``ddlstudy.training.recipe``'s to check), and
ImageNet's normalisation."""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

from ddlstudy.errors import ConfigError
from ddlstudy.reading import depth

DEPTH = 2
"""How deeply an argument's value nests: a list (betas, milestones) at most; none of
torch's optimizers or schedules takes a list of lists or a table."""


def table(text: str) -> dict[str, Any]:
    """--optimizer-args's and --lr-schedule-args's value: a JSON object, the TOML table's
    keys and values (``{"weight_decay": 0.05, "betas": [0.9, 0.95]}``). One nested deeper
    than an argument can be is refused here, as it is read (a parser would recurse until
    Python's stack gives out)."""
    try:
        value = json.loads(text)
    except RecursionError:
        value = RecursionError
    except ValueError:
        value = None
    if value is RecursionError or isinstance(value, dict) and depth(value) > DEPTH + 1:
        raise argparse.ArgumentTypeError(f"{text!r:.40} nests its values more than {DEPTH} "
                                         "levels deep; an argument is a number, a text, "
                                         "true, false or a list of them")
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


OURS = {"lr": "train.lr (--lr, scaled by --lr-scaling)", "params": "ddlstudy's",
        "optimizer": "ddlstudy's",
        "last_epoch": "ddlstudy's (where a resumed run's schedule stands)"}
"""Arguments of torch's classes that ddlstudy gives, and what gives them."""


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
        if key in OURS:
            raise ConfigError(f"{name}.{key}", f"is {OURS[key]}: leave it out of the table")
        _plain(f"{name}.{key}", value[key])


def _plain(name: str, value: Any) -> None:
    """An argument's value as a table holds it: a finite number, a text, true, false,
    null, or a list of them (``DEPTH``); checked without recursion, however deep."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict) or isinstance(item, list | tuple) and level >= DEPTH:
            what = "is a table" if isinstance(item, dict) else "nests lists in lists"
            raise ConfigError(name, f"{what}; an argument is a number, a text, true, false "
                              "or a list of them")
        if isinstance(item, list | tuple):
            stack.extend((v, level + 1) for v in item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(name, f"must be a finite number, got {item!r} (it would "
                              f"train to NaN)")
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise ConfigError(name, f"must be a number, a text, true, false or a list of "
                              f"them, got {type(item).__name__}")
