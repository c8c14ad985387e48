"""A run's snapshot read back to resume it: through the reading gate (a FIFO or a device is
refused, never waited on), loaded with ``weights_only`` (nothing in it runs), and checked
whole before anything of the run is touched: its shape (the epoch and step, the position
and every rank's random states), and its weights against the use case's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlstudy.config import UseCase
from ddlstudy.errors import UsageError
from ddlstudy.reading import BadFile, check_regular
from ddlstudy.records.runfolder import SNAPSHOT

KEYS = ("epoch", "step", "model", "optimizer", "position", "rng")


def load_snapshot(path: Path, mmap: bool = False, usecase: UseCase | None = None) -> dict:
    """``path``'s snapshot, checked (``mmap``: a check that reads only what it needs;
    ``usecase``: its weights must fit that use case's model)."""
    import torch

    file = path / SNAPSHOT
    if not file.exists() and not file.is_symlink():
        raise UsageError(f"{path} has no {SNAPSHOT} to resume from: it stopped before its "
                         f"first snapshot (--snapshot-every N snapshots inside long epochs); "
                         f"start the run again")
    try:
        check_regular(file, "snapshot")
    except BadFile as exc:
        raise UsageError(f"{exc}; it is left as it is") from None
    try:
        snap = torch.load(file, weights_only=True, map_location="cpu", mmap=mmap)
    except Exception as exc:  # a damaged or foreign file: say so, change nothing
        # Not torch's own text: it suggests weights_only=False, which would run the file's
        # pickled code.
        reason = "damaged or truncated" if isinstance(exc, EOFError | RuntimeError) \
            else "holds more than tensors and plain values"
        raise UsageError(f"{file} is not a ddlstudy snapshot that can be loaded safely "
                         f"({reason}); it is left as it is") from None
    if not isinstance(snap, dict) or "position" not in snap or "rng" not in snap:
        raise UsageError(f"{file} was written by an older ddlstudy without the training "
                         f"position; it cannot be resumed exactly")
    problem = _shape(snap)
    if problem is None and usecase is not None:
        problem = _fits(snap["model"], usecase)
    if problem:
        raise UsageError(f"{file} cannot be resumed: {problem}; it is left as it is")
    return snap


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


def _shape(snap: dict) -> str | None:
    """What is wrong with the snapshot's shape (None: nothing)."""
    missing = [k for k in KEYS if k not in snap]
    if missing:
        return f"it holds no {missing[0]!r}"
    if not _count(snap["epoch"]) or not _count(snap["step"]):
        return f"its epoch and step must be counts, not {snap['epoch']!r} and {snap['step']!r}"
    position, rng = snap["position"], snap["rng"]
    if not isinstance(position, dict) or "generator" not in position or \
            not isinstance(position.get("sums"), list) or not isinstance(rng, list):
        return "its position in the epoch is not one ddlstudy wrote"
    if not rng or len(rng) != len(position["sums"]):
        return (f"it holds {len(rng)} rank(s)' random states and "
                f"{len(position['sums'])} ranks' positions")
    if not isinstance(snap["model"], dict) or not isinstance(snap["optimizer"], dict):
        return "its model or optimizer is not a state dict"
    schedule = snap.get("scheduler")
    if schedule is not None and not (isinstance(schedule, dict) and
                                     isinstance(schedule.get("last_epoch"), int)):
        return "its learning-rate schedule is not a state dict"
    return None


def _fits(state: dict, usecase: UseCase) -> str | None:
    """Whether the weights fit the use case's model (``models.trained.misfit``)."""
    from ddlstudy.models.trained import misfit  # torch, as load_snapshot

    problem = misfit(usecase.model, len(usecase.classes), state)
    return f"its weights do not fit {problem}" if problem else None
