"""Memory beside speed in the report: the peaks per process and per node of each
configuration (printed, in the CSV and speedup.md), the figure of images/s against memory
with its front, `compare`, and the TensorBoard and MLflow metrics; runs from before
memory was recorded still read."""

from __future__ import annotations

import csv
import io
import json

import pytest
from test_findings import _manifest, memory_block
from test_report_reading import _folder

from ddlstudy.cli import main
from ddlstudy.report import Report
from ddlstudy.report.figures import front, plot_memory

GIB = 2**30


def _runs(path):
    """u: the baseline (two repeats that peaked apart), cpu-processes of 2 processes on
    one host, and a run from before memory was recorded."""
    return _folder(path, [
        _manifest("sequential", [20.0, 21.0], memory=memory_block([GIB], held=4096)),
        _manifest("sequential", [19.0, 20.0], memory=memory_block([3 * GIB // 2])),
        _manifest("cpu-processes", [30.0, 31.0], processes=2,
                  memory=memory_block([GIB // 2, 3 * GIB // 4])),
        _manifest("cpu-intraop", [25.0, 26.0], threads=2)])


def test_the_table_and_csv_give_the_manifests_peaks_in_gib(tmp_path, capsys):
    folder = _runs(tmp_path / "runs")
    table = Report(folder).table.set_index("strategy")
    base, procs = table.loc["sequential"], table.loc["cpu-processes"]
    assert (base.peak_process_gib, base.peak_process_gib_min, base.peak_process_gib_max) \
        == pytest.approx((1.25, 1.0, 1.5))
    assert base.peak_node_gib == pytest.approx(1.25)  # one process: its node's peak
    assert procs.peak_process_gib == pytest.approx(0.75)  # the larger process
    assert procs.peak_node_gib == pytest.approx(1.25)  # both processes of the node
    assert table.loc["cpu-intraop"][["peak_process_gib", "peak_node_gib"]].isna().all()
    assert main(["report", str(folder), "--format", "csv"]) == 0
    rows = {r["config"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert float(rows["sequential"]["peak_node_gib_max"]) == pytest.approx(1.5)
    assert float(rows["cpu-processes (2 processes)"]["peak_process_gib_min"]) == 0.75
    assert rows["cpu-intraop (2 threads)"]["peak_node_gib"] == ""  # not recorded
    Report(folder).write_tables(tmp_path / "out")
    speedup = (tmp_path / "out" / "speedup.csv").read_text()  # every column
    assert ",peak_process_gib,peak_process_gib_min,peak_process_gib_max,peak_node_gib," \
        "peak_node_gib_min,peak_node_gib_max" in speedup.splitlines()[0]
    runs = (tmp_path / "out" / "runs.csv").read_text().splitlines()[0]
    assert "peak_process_bytes,peak_node_bytes,held_parameters_bytes" in runs


def test_the_printed_table_shows_both_peaks_within_100_columns(tmp_path, capsys):
    assert main(["report", str(_runs(tmp_path / "runs"))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert lines[4].endswith("| time to target | peak GiB proc/node |")
    rows: dict[str, str] = {}  # the summary's rows (the paper's tables come after)
    for line in lines:
        rows.setdefault(line.split(" | ")[0], line)
    assert rows["| sequential"].endswith("| 1.00-1.50/1.00-1.50 |")  # least-most
    assert rows["| cpu-processes (2 processes)"].endswith("| 0.75/1.25 |")
    assert rows["| cpu-intraop (2 threads)"].endswith("| -/- |")


def test_runs_from_before_memory_was_recorded_still_report(tmp_path, capsys):
    folder = _folder(tmp_path / "runs", [_manifest("sequential", [20.0]),
                                         _manifest("cpu-intraop", [40.0], threads=2)])
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| sequential | 1 ok | 1.00 |" in out
    assert "GiB" not in out  # no column of dashes only
    assert plot_memory(Report(folder)) is None
    assert main(["report", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "figures" / "memory.png").exists()
    assert (tmp_path / "out" / "figures" / "speedup.png").exists()


def test_the_front_holds_the_configurations_none_beats_on_both(tmp_path):
    assert front([(30.0, 2.0), (20.0, 3.0), (25.0, 1.0)]) == [True, False, True]
    assert front([(10.0, 1.0), (10.0, 1.0)]) == [True, True]  # equals beat neither
    folder = _folder(tmp_path / "runs", [  # the baseline is beaten by cpu-processes
        _manifest("sequential", [20.0, 21.0], memory=memory_block([2 * GIB])),
        _manifest("cpu-processes", [30.0, 31.0], processes=2,
                  memory=memory_block([GIB // 2, GIB // 2])),
        _manifest("cpu-intraop", [40.0, 41.0], threads=2, memory=memory_block([3 * GIB]))])
    report = Report(folder)
    fig = plot_memory(report)
    (ax,) = fig.axes
    (line,) = [line for line in ax.lines if line.get_label().startswith("front")]
    assert list(line.get_xdata()) == pytest.approx([1.0, 3.0])  # cpu-processes, intraop
    assert list(line.get_ydata()) == pytest.approx([30.5, 40.5])
    points = {(round(float(c.lines[0].get_xdata()[0]), 6),
               round(float(c.lines[0].get_ydata()[0]), 6)) for c in ax.containers}
    table = report.table
    assert points == {(round(g, 6), round(s, 6)) for g, s in
                      zip(table.peak_node_gib, table.images_per_s, strict=True)}


def test_compare_shows_both_runs_memory(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, m in ((a, _manifest("sequential", [20.0], memory=memory_block([GIB]))),
                      (b, _manifest("cpu-processes", [30.0], processes=2,
                                    memory=memory_block([GIB, GIB // 2])))):
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "  peak memory per process (GiB): 1 -> 1 (x1.000)" in out
    assert "  peak memory per node (GiB): 1 -> 1.5 (x1.500)" in out
    (b / "manifest.json").write_text(json.dumps(_manifest("sequential", [30.0])))
    assert main(["compare", str(a), str(b)]) == 0  # one from before memory was recorded
    assert "  peak memory per node (GiB): 1.0 -> None" in capsys.readouterr().out


EXPECTED = {"memory/peak_rss_gib_per_process": 0.75, "memory/peak_gib_per_node": 1.25,
            "memory/parameters_gib_rank0": 1000 / GIB, "memory/gradients_gib_rank0": 1000 / GIB,
            "memory/optimizer_state_gib_rank0": 2000 / GIB}
"""The metrics of the cpu-processes run of ``_runs``."""


def _one(path):
    return _folder(path, [_manifest("cpu-processes", [30.0, 31.0], processes=2,
                                    memory=memory_block([GIB // 2, 3 * GIB // 4]))])


def test_tensorboard_gets_the_memory_metrics(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["export", "tensorboard", str(_one(tmp_path / "runs")), "--out",
                 str(tmp_path / "tb")]) == 0
    (logdir,) = [p for p in (tmp_path / "tb").iterdir() if p.name != "hparams"]
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    memory = {t: events.Scalars(t) for t in events.Tags()["scalars"] if t.startswith("memory")}
    assert {t: [(s.step, pytest.approx(s.value)) for s in v] for t, v in memory.items()} \
        == {t: [(0, pytest.approx(v))] for t, v in EXPECTED.items()}


def test_mlflow_gets_the_memory_metrics(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    runs = _one(tmp_path / "runs")
    assert main(["export", "mlflow", str(runs), "--tracking-uri", uri]) == 0
    assert main(["export", "mlflow", str(runs), "--tracking-uri", uri]) == 0  # adds nothing
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    memory = {k: v for k, v in run.data.metrics.items() if k.startswith("memory/")}
    assert memory == pytest.approx(EXPECTED)
    assert [m.step for m in client.get_metric_history(run.info.run_id,
                                                      "memory/peak_gib_per_node")] == [0]
