"""The bounds of every count and size a user gives, in one table: a flag, a use-case key,
a study-plan key, ``bench``, ``predict`` and ``advise`` read their upper bound here, so
that the same count has the same limit wherever it is typed, and the limit and the reason
are said the same way.

Each bound is (most, why): ``why`` says what a larger value would do.
"""

from __future__ import annotations

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
