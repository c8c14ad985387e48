"""The bounds of every count and size a user gives, in one table: a flag, a use-case key,
a study-plan key, ``bench``, ``predict`` and ``advise`` read their upper bound here, so
that the same count has the same limit wherever it is typed, and the limit and the reason
are said the same way.

Each bound is (most, why): ``why`` says what a larger value would do.
"""

from __future__ import annotations

import math
import re

from ddlstudy.errors import ConfigError

FORKS = " (every one is a process or a model copy: more would exhaust the machine)"

LIMITS: dict[str, tuple[float, str]] = {
    "processes": (512, FORKS),
    "nodes": (512, FORKS),
    "predicted_nodes": (1_000_000, " (a model of more nodes than any cluster has)"),
    "threads": (1024, " threads (more than any machine's cores)"),
    "images": (1_000_000, " images (a synthetic set larger than this would take hours and "
                          "tens of GB: use --data-dir)"),
    "pixels": (2048, " px (larger images exhaust memory)"),
    "batch": (65536, " images (a batch that large does not fit in memory)"),
    "epochs": (100_000, " epochs"),
    "steps": (10_000_000, " steps"),
    "repeats": (1000, " repeats (each one is a measurement: this would take days)"),
    "rounds": (100, " probe rounds"),
    "top": (1000, " recommendations"),
    "cells": (2000, " cells over all its use cases (each one a run, times its repeats: a "
                    "study this large would take weeks; split it)"),
    "cores": (4096, " cores"),
    "lr": (1e4, " (a learning rate this large overflows the weights on the first step)"),
    "bucket_mb": (65536, " MiB (more than a model's gradients)"),
    "seconds": (30 * 86400, " s (a budget of more than 30 days)"),
}


def most(name: str) -> float:
    """The largest value ``name`` may take."""
    return LIMITS[name][0]


def why(name: str) -> str:
    return LIMITS[name][1]


UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
         "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
         "tib": 2**40}
"""--memory's units: SI (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB), any case."""


def size_bytes(flag: str, text: str) -> int:
    """``text`` (1GiB, 512MiB, 2.5GB, 3000000) as bytes; ConfigError where it is not one."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    value = float(found[1]) * UNITS[found[2]] if found and found[2] in UNITS else math.nan
    if not math.isfinite(value) or value < 1 or value > 2**60:
        raise ConfigError(flag, f"{text!r}; give a size a node may use, e.g. 1GiB, 512MiB "
                          "or 2.5GB")
    return int(value)
