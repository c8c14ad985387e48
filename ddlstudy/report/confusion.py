"""The confusion matrix of a run's last validation, drawn from its manifest: one row per
true class, one column per predicted class, each cell the share of the row's images (its
colour) and their count; the diagonal is each class's accuracy.

The counts are the record ``val_confusion`` (``runfolder.CONFUSION``: summed over every
worker, the epoch it is of), the class names ``preprocessing.classes``. Beyond ``MAX_LABELS``
classes the cells carry no numbers and the axes no names (the colours still show where the
errors go).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ddlstudy.records.runfolder import CONFUSION

MAX_LABELS = 20
"""The most classes whose cells are numbered and axes named."""


def confusion_of(manifest: dict[str, Any]) -> tuple[np.ndarray, list[str], int] | None:
    """(counts, class names, epoch) of a run's last validation; None where it has none (a
    run recorded before it, or none finished an epoch) or the record is not a square of
    counts."""
    record = manifest.get(CONFUSION) or {}
    try:
        counts = np.asarray(record.get("counts") or [], dtype=np.int64)
    except (TypeError, ValueError):
        return None
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or not counts.size:
        return None
    names = list((manifest.get("preprocessing") or {}).get("classes") or [])
    if len(names) != len(counts):
        names = [str(i) for i in range(len(counts))]
    return counts, [str(n) for n in names], int(record.get("epoch") or 0)


def plot_confusion(manifest: dict[str, Any], title: str) -> Figure | None:
    """The run's confusion matrix as a heat map (None where it has none)."""
    found = confusion_of(manifest)
    if found is None:
        return None
    counts, names, epoch = found
    n = len(names)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    side = min(3 + 0.45 * n, 14)
    fig = Figure(figsize=(side + 1.5, side), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="share of the true class's images")
    if n <= MAX_LABELS:
        ax.set_xticks(range(n), names, rotation=45, ha="right")
        ax.set_yticks(range(n), names)
        for i, j in np.ndindex(n, n):
            ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if shares[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    total = int(counts.sum())
    ax.set_title(f"{title}\nepoch {epoch}: {int(np.trace(counts))}/{total} right "
                 f"(accuracy {np.trace(counts) / max(total, 1):.3f})")
    ax.grid(False)
    return fig
