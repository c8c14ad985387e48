"""Python's garbage collector through a process's start: fewer full passes, none over what
the start made once it is made.

A process that trains makes some 400,000 objects on its way to its first step that live as
long as it does (torch, its compiler front end, ddlstudy). At CPython's thresholds (700,
10, 10) the collector scanned them all six times before simple-big's first step: 0.44 s of
full passes and 0.11 s of younger ones, out of a 3.0 s start. ``starting`` raises the
youngest generation's threshold, so that no full pass runs before the first step (garbage
is still collected meanwhile, in larger batches); ``settled``, at the first step, puts
everything made so far out of the collector's reach (``gc.freeze``, as
``forkserver.adopt`` does for each rank: nothing it made is scanned again) and the
thresholds back. Only a process's own start calls ``starting`` (``ddlstudy run`` or
``replay``, a rank, the warm server as it imports torch): a process that calls runs (a test
session) keeps its collector as it is.
"""

from __future__ import annotations

import gc
import os
import threading
import time

START_THRESHOLDS = (20_000, 10, 10)
"""The youngest generation's threshold, at its default of 700, ran 6 full passes before
simple-big's first step; at 20,000, none (the start's collection 0.18 s, not 0.55)."""

_state: dict = {"defaults": None, "pid": None, "passes": [0, 0, 0], "s": 0.0, "at": None}
"""``pid``: the process whose start is counted (None: none ever was, here or in a parent)."""
_lock = threading.Lock()  # thread replicas each reach their first step


def starting() -> None:
    """At the start of a process that trains: fewer passes until ``settled``; each pass's
    generation and seconds counted (``figures``). A child forked in the middle of its
    parent's start (a DataLoader worker) inherits the raised thresholds: it counts its own
    passes from here."""
    if _state["defaults"] is not None and _state["pid"] == os.getpid():
        return
    _state.update(defaults=_state["defaults"] or gc.get_threshold(), pid=os.getpid(),
                  passes=[0, 0, 0], s=0.0, at=None)
    gc.set_threshold(*START_THRESHOLDS)
    if _counted not in gc.callbacks:
        gc.callbacks.append(_counted)


def _counted(phase: str, info: dict) -> None:
    if phase == "start":
        _state["at"] = time.perf_counter()
    elif _state["at"] is not None:
        _state["passes"][info["generation"]] += 1
        _state["s"] += time.perf_counter() - _state["at"]


def settled() -> None:
    """At the first step, or where the process hands the training to others (a launcher,
    a parent of ranks, Spark's driver, a DataLoader worker forked mid-start): what is alive
    frozen (left out of every later pass: the start's garbage cycles with it, kept for the
    process's life), the thresholds as they were; nothing where ``starting`` was not
    called, in this process or the one it was forked from."""
    with _lock:
        defaults, _state["defaults"] = _state["defaults"], None
        if defaults is None:
            return
        gc.freeze()
        gc.set_threshold(*defaults)
        if _counted in gc.callbacks:
            gc.callbacks.remove(_counted)


def figures() -> dict | None:
    """The collector's passes over this process's start (by generation, youngest first)
    and their seconds; None where ``starting`` never counted them."""
    if _state["pid"] is None:
        return None
    return {"passes": list(_state["passes"]), "s": round(_state["s"], 3)}
