"""Metrics besides accuracy (issue 49): per-class accuracy, macro-F1 and top-k, all from the
validation's confusion matrix (and top-k count), summed over the workers like the correct
count was; recorded per epoch in the manifest and metrics.csv; the last epoch's matrix in
the manifest and as a figure of the report; ``[train] target_metric`` picks what time to
target measures."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from test_bad_input import USECASE
from test_faults import _cli

from ddlstudy.cli import main
from ddlstudy.report.confusion import plot_confusion
from ddlstudy.runner.lifecycle import time_to_target
from ddlstudy.training.metrics import Tally, scores, unpack

HAND = [[3, 1, 0],
        [1, 2, 1],
        [0, 0, 0]]
"""Rows: true class, columns: predicted. Class 2 has no image but is predicted once."""


def test_the_scores_of_a_hand_built_confusion_matrix():
    got = scores(HAND)
    assert got["val_accuracy"] == pytest.approx(5 / 8)
    assert (got["val_class_accuracy_0"], got["val_class_accuracy_1"]) == (0.75, 0.5)
    assert got["val_class_accuracy_2"] is None  # no image of it: no accuracy
    # F1 = 2 TP / (true + predicted): class 0 6/8, class 1 4/7, class 2 0/1
    assert got["val_macro_f1"] == pytest.approx((6 / 8 + 4 / 7 + 0) / 3)
    assert not any(k.startswith("val_top") for k in got)  # 3 classes: no top-k


def test_the_top_5_is_counted_where_there_are_more_than_5_classes():
    tally = Tally(6)
    logits = torch.tensor([[1.0, 2, 3, 4, 5, 6],    # true 0: last of 6, predicted 5
                           [0.0, 9, 1, 2, 3, 4],    # true 1: first
                           [5.0, 4, 3, 2, 1, 0]])   # true 4: fifth of 6, predicted 0
    tally.add(logits, torch.tensor([0, 1, 4]))
    matrix, in_top_k = unpack(6, [float(v) for v in tally.sums()])
    confusion = matrix.tolist()
    assert (confusion[0][5], confusion[1][1], confusion[4][0], in_top_k) == (1, 1, 1, 2)
    got = scores(confusion, in_top_k)
    assert got["val_top5_accuracy"] == pytest.approx(2 / 3)
    assert got["val_accuracy"] == pytest.approx(1 / 3)
    assert Tally(5).k is None and Tally(5).sums() == [0] * 25
    assert scores(*unpack(0, []))["val_accuracy"] == 0  # a Trainer that validates nothing


def test_time_to_target_reads_the_target_metric():
    epochs = [{"epoch": 1, "val_accuracy": 0.9, "val_macro_f1": 0.4, "elapsed_s": 1.0},
              {"epoch": 2, "val_accuracy": 0.9, "val_macro_f1": 0.7, "elapsed_s": 2.0}]
    assert time_to_target(epochs, 0.6)["epoch"] == 1
    assert time_to_target(epochs, 0.6, "macro_f1") == {
        "target": 0.6, "metric": "macro_f1", "reached": True, "epoch": 2, "seconds": 2.0}
    assert time_to_target(epochs, 0.8, "macro_f1")["best"] == 0.7


def _run(runs: Path, datasets_dir: Path, *extra: str) -> dict:
    out = _cli("run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir",
               str(runs), "--sample-hz", "0", "--quiet", "--no-snapshot", "--lr", "1e-9",
               "--epochs", "2", "--max-steps", "2", *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    (manifest,) = runs.glob("*/manifest.json")
    return json.loads(manifest.read_text()) | {"path": str(manifest.parent)}


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, datasets_dir) -> dict:
    """A tiny run whose weights barely move (lr 1e-9): what another layout must match."""
    return _run(tmp_path_factory.mktemp("seq"), datasets_dir, "--target-metric", "macro_f1",
                "--target-accuracy", "0.9")


def test_a_tiny_runs_manifest_holds_the_metrics_of_its_confusion_matrix(sequential):
    m = sequential
    record = m["val_confusion"]
    counts, last = record["counts"], m["epochs"][-1]
    assert record["epoch"] == 2 and len(counts) == len(m["preprocessing"]["classes"]) == 3
    assert sum(map(sum, counts)) == m["data"]["val_images"]
    assert last["val_accuracy"] == sum(counts[i][i] for i in range(3)) / sum(map(sum, counts))
    recall = [counts[i][i] / sum(counts[i]) for i in range(3)]
    assert [last[f"val_class_accuracy_{i}"] for i in range(3)] == pytest.approx(recall)
    precision = [counts[i][i] / max(sum(row[i] for row in counts), 1) for i in range(3)]
    f1 = [2 * p * r / (p + r) if p + r else 0.0 for p, r in zip(precision, recall, strict=True)]
    assert last["val_macro_f1"] == pytest.approx(sum(f1) / 3)
    assert m["time_to_target"]["metric"] == "macro_f1"
    assert m["time_to_target"]["best"] == max(e["val_macro_f1"] for e in m["epochs"])
    with open(Path(m["path"]) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["val_macro_f1"]) == pytest.approx(last["val_macro_f1"])
    assert float(rows[-1]["val_class_accuracy_2"]) == pytest.approx(recall[2])
    fig = plot_confusion(m, "tiny")
    assert fig is not None and "accuracy" in fig.axes[0].get_title()


@pytest.mark.slow
def test_two_processes_sum_the_confusion_matrix_of_one(sequential, tmp_path, datasets_dir):
    """cpu-processes: each worker validates its slice; the sum is sequential's matrix for
    the same weights (lr 1e-9: the weights of both are the initial ones to float32)."""
    m = _run(tmp_path, datasets_dir, "--strategy", "cpu-processes", "--workers", "2")
    assert m["val_confusion"]["counts"] == sequential["val_confusion"]["counts"]
    assert m["epochs"][-1]["val_macro_f1"] == sequential["epochs"][-1]["val_macro_f1"]


@pytest.mark.parametrize("argv", [["--target-metric", "macro_f2"], ["--target-metric", "F1"],
                                  ["--usecase", "{tmp}/u.toml"]])
def test_an_unknown_target_metric_is_refused_in_one_line(argv, tmp_path, capsys):
    (tmp_path / "u.toml").write_text(USECASE + 'target_metric = "f1"\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main(["run", "--runs-dir", str(tmp_path / "runs"), "--datasets-dir",
                 str(tmp_path / "data"), *(["--usecase", "tiny"] if "--usecase" not in argv
                                           else []), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "target_metric" in err.replace("-", "_") and "accuracy, macro_f1" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
