"""A validation pass's metrics, all from sums that add up over workers: the confusion
matrix (true class x predicted class counts; its trace over its total is the accuracy) and,
where there are more than ``TOP_K`` classes, the images whose class is among the ``TOP_K``
highest logits.

Every rank adds its own images' counts (``Tally.add``, on the device, per batch); the
Trainer's ``reduce`` sums them over the ranks like every other count, and ``scores`` turns
the whole run's sums into the epoch's figures: per-class accuracy (recall), macro-F1 (the
unweighted mean of the classes' F1; a class neither present nor predicted scores 0, as in
scikit-learn) and top-k accuracy.
"""

from __future__ import annotations

import torch

TOP_K = 5
"""The k of top-k accuracy, recorded where the use case has more than k classes."""


def top_k(classes: int) -> int | None:
    """The k of top-k accuracy for ``classes`` classes (None: k would not be below it)."""
    return TOP_K if classes > TOP_K else None


class Tally:
    """One rank's running counts of a validation pass, kept on the model's device."""

    def __init__(self, classes: int, device: torch.device | None = None) -> None:
        self.classes = classes
        self.k = top_k(classes)
        self.confusion = torch.zeros(classes * classes, dtype=torch.int64, device=device)
        self.in_top_k = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Count a batch: its labels against the class of highest logit (and the top k)."""
        cells = labels * self.classes + logits.argmax(1)  # O(batch): no classes² temporary
        self.confusion.index_add_(0, cells, torch.ones_like(cells))
        if self.k is not None:
            top = logits.topk(self.k, dim=1).indices
            self.in_top_k += (top == labels[:, None]).any(1).sum()

    def sums(self) -> list[float]:
        """The counts as the floats a Link sums: the confusion matrix row by row (true
        class), then the top-k count where there is one."""
        out = self.confusion.tolist()
        return out + ([int(self.in_top_k)] if self.k is not None else [])


def unpack(classes: int, sums: list[float]) -> tuple[torch.Tensor, int | None]:
    """``Tally.sums`` summed over ranks -> (confusion matrix, images in the top k)."""
    n = classes * classes
    flat = torch.tensor(sums[:n], dtype=torch.float64).round().long()  # exact counts (the
    # tensor-parallel ranks' were divided by their copies)
    return flat.reshape(classes, classes), (
        round(sums[n]) if top_k(classes) is not None else None)


def scores(confusion: torch.Tensor | list[list[int]],
           in_top_k: int | None = None) -> dict[str, float | None]:
    """The figures of a confusion matrix (rows: true class, columns: predicted): the
    accuracy, macro-F1, each class's accuracy (``val_class_accuracy_<i>``, None for a class
    with no image), and the top-k accuracy (``val_top<k>_accuracy``) where counted."""
    m = torch.as_tensor(confusion, dtype=torch.float64).reshape(len(confusion), len(confusion))
    classes, total = len(m), int(m.sum())
    hits, present, predicted = m.diagonal().tolist(), m.sum(1).tolist(), m.sum(0).tolist()
    out: dict[str, float | None] = {"val_accuracy": sum(hits) / max(total, 1)}
    f1s = []
    for i, (hit, true, said) in enumerate(zip(hits, present, predicted, strict=True)):
        out[f"val_class_accuracy_{i}"] = hit / true if true else None
        f1s.append(2 * hit / (true + said) if true + said else 0.0)
    out["val_macro_f1"] = sum(f1s) / max(classes, 1)
    k = top_k(classes)
    if k is not None and in_top_k is not None:
        out[f"val_top{k}_accuracy"] = in_top_k / max(total, 1)
    return out
