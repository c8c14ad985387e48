"""How `ddlstudy report` reads to a person: the runs of a busy host shown with their figures
(marked noisy) instead of an empty table, findings that say what they left out, and a
printed table that fits a terminal under plain headers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from test_findings import _manifest

from ddlstudy.cli import main
from ddlstudy.config import REPO_ROOT
from ddlstudy.report import Report
from ddlstudy.report.figures import plot_speedup
from ddlstudy.report.findings import findings
from ddlstudy.report.tables import SUMMARY_COLUMNS


def _noisy(manifest: dict, cores: float = 1.2) -> dict:
    return manifest | {"host_load": {"noisy": True, "others_cores": {"h": cores},
                                     "threshold_cores": 0.2}}


def _folder(path, manifests):
    for i, m in enumerate(manifests):  # one folder a run, though two share an id's rates
        (path / f"{i}-{m['id']}").mkdir(parents=True)
        (path / f"{i}-{m['id']}" / "manifest.json").write_text(json.dumps(m))
    return path


def _flat(text: str) -> str:
    """Text with its wrapped lines joined: prose is asserted on, not where it breaks."""
    return " ".join(text.split())


def _busy(path):
    """Every run of a busy host: the report a new user found empty."""
    return _folder(path, [_noisy(_manifest("sequential", [20.0, 21.0, 19.0])),
                          _noisy(_manifest("cpu-processes", [30.0, 31.0, 29.0], processes=2),
                                 cores=1.5)])


def test_a_busy_hosts_runs_show_their_figures_marked_noisy(tmp_path):
    report = Report(_busy(tmp_path))
    table = report.table.set_index("strategy")
    assert table.loc["sequential", "images_per_s"] == pytest.approx(20.0)
    assert table.loc["cpu-processes", "speedup"] == pytest.approx(1.5)
    assert table.loc["cpu-processes", "runs"] == 1
    assert table.loc["sequential", "status"] == "noisy (others 1.2 cores)"
    assert table.loc["cpu-processes", "status"] == "noisy (others 1.5 cores)"
    assert table.noisy.all()
    runs = report.runs.set_index("strategy")  # runs.csv: the speedup against the noisy base
    assert runs.loc["cpu-processes", "speedup"] == pytest.approx(1.5)
    text = report.text()
    assert "| cpu-processes (2 processes) | 1 noisy (others 1.5 cores) | 1.50 |" in text
    assert "| cpu-processes (2 processes) | 1.00 s, 1.50x (noisy) |" in text  # Table 1
    assert "noisy left out" not in report.terminal()  # the tables: nothing was left out
    assert "A configuration with no quiet run shows its noisy runs' figures, marked 'noisy " \
        "(others N cores)'; one with quiet runs leaves them out. `ddlstudy report " \
        "--include-noisy` counts them all." in _flat(text)
    labels = [t.get_text() for t in plot_speedup(report).axes[0].get_yticklabels()]
    assert labels == ["sequential (noisy)", "cpu-processes (2 processes) (noisy)"]


def test_quiet_runs_give_the_figures_where_a_configuration_has_them(tmp_path):
    folder = _folder(tmp_path, [
        _manifest("sequential", [20.0]), _noisy(_manifest("sequential", [5.0])),
        _manifest("cpu-intraop", [40.0], threads=2),
        _noisy(_manifest("cpu-intraop", [8.0], threads=2)),
        _noisy(_manifest("cpu-processes", [30.0], processes=2))])
    report = Report(folder)
    table = report.table.set_index("strategy")
    assert table.loc["sequential", "images_per_s"] == pytest.approx(20.0)
    assert table.loc["cpu-intraop", "speedup"] == pytest.approx(2.0)
    assert table.loc["cpu-intraop", "status"] == "ok, 1 noisy left out"
    assert not table.loc["cpu-intraop", "noisy"]
    assert table.loc["cpu-processes", "speedup"] == pytest.approx(1.5)  # against quiet 20
    assert table.loc["cpu-processes", "status"] == "noisy (others 1.2 cores)"
    text = report.text()
    assert "| cpu-intraop (2 threads) | 1 ok, 1 noisy left out | 2.00 |" in text
    assert "| cpu-processes (2 processes) | 1 noisy (others 1.2 cores) | 1.50 |" in text
    every = Report(folder, include_noisy=True).table.set_index("strategy")
    assert every.loc["cpu-intraop", "runs"] == 2 and every.loc["cpu-intraop", "status"] == "ok"
    assert every.loc["cpu-intraop", "speedup"] == pytest.approx(24.0 / 12.5)
    assert every.loc["cpu-processes", "status"] == "noisy (others 1.2 cores)"


def test_findings_leave_noisy_runs_out_and_say_how_to_count_them(tmp_path):
    report = Report(_busy(tmp_path / "busy"))
    found = {f.letter: f for f in findings(report)}
    assert found["a"].verdict == "not measured"
    assert found["a"].lines == ["u: no completed multi-process data-parallel run on a quiet "
                                "host: 1 ran, left out as noisy (other processes used up to "
                                "1.5 cores of their host while they ran); `ddlstudy report "
                                "--include-noisy` counts them"]
    assert found["d"].lines == ["u: no completed MPI run"]  # none at all: said as before
    text = _flat(report.findings_text())
    assert "2 run(s) marked noisy (other processes used their host while they ran) are left " \
        "out of these verdicts; `ddlstudy report --include-noisy` counts them." in text
    counted = Report(tmp_path / "busy", include_noisy=True)
    found = {f.letter: f for f in findings(counted)}
    assert found["a"].verdict == "confirmed" and "ratio 1.50" in found["a"].lines[0]
    assert "2 noisy run(s) counted (--include-noisy)" in _flat(counted.findings_text())
    # A quiet baseline against a noisy-only side: that side is the one said missing.
    half = Report(_folder(tmp_path / "half", [
        _manifest("sequential", [20.0, 21.0]),
        _noisy(_manifest("cpu-processes", [30.0, 31.0], processes=2))]))
    (a,) = [f for f in findings(half) if f.letter == "a"]
    assert a.lines == ["u: no completed multi-process data-parallel run on a quiet host: 1 "
                       "ran, left out as noisy (other processes used up to 1.2 cores of their "
                       "host while they ran); `ddlstudy report --include-noisy` counts them"]


def test_a_projection_says_its_runs_were_left_out_as_noisy_and_why(tmp_path):
    """The baseline and the cpu-intraop run exist, on a busy host: not "it needs them"."""
    report = Report(_folder(tmp_path / "busy", [
        _noisy(_manifest("sequential", [20.0, 21.0])),
        _noisy(_manifest("cpu-intraop", [30.0, 31.0], threads=2), cores=1.7),
        _manifest("cpu-processes", [30.0, 31.0], processes=2)]))
    projected = {f.letter: f.projected for f in findings(report)}
    assert projected["a"] == [
        "u: not projected: the sequential baseline and the cpu-intraop run ran, but were left "
        "out as noisy (other processes used up to 1.7 cores of their host while they ran); "
        "`ddlstudy report --include-noisy` counts them"]
    # One of them missing: said apart from the one left out.
    report = Report(_folder(tmp_path / "half", [
        _noisy(_manifest("sequential", [20.0, 21.0])),
        _manifest("cpu-processes", [30.0, 31.0], processes=2)]))
    (line,) = {f.letter: f.projected for f in findings(report)}["a"]
    assert line == ("u: not projected: the sequential baseline ran, but was left out as noisy "
                    "(other processes used up to 1.2 cores of their host while it ran); "
                    "`ddlstudy report --include-noisy` counts them; it needs the cpu-intraop "
                    "run (how a process's speed grows with its threads)")
    counted = Report(tmp_path / "busy", include_noisy=True)
    assert "noisy" not in findings(counted)[0].projected[0]  # counted: projected from them


def _long_labels(path):
    usecase = "my-own-pets-classifier"
    mpi = _manifest("sequential", [35.0, 36.0, 34.0], usecase=usecase,
                    backend={"name": "mpi", "nodes": 2, "reduce": "allreduce"})
    mpi["config"] |= {"precision": "bf16", "accumulate": 4, "bucket_mb": 25,
                      "balance": "measured", "lr_scaling": "linear",
                      "hosts": "node-a.cluster.example.org,node-b.cluster.example.org"}
    return _folder(path, [
        _manifest("sequential", [20.0, 21.0, 19.0], usecase=usecase),
        _manifest("cpu-processes", [30.0, 31.0, 29.0], processes=2, usecase=usecase),
        _noisy(_manifest("cpu-processes", [12.0, 11.0, 13.0], processes=2, usecase=usecase)),
        _noisy(_manifest("cpu-intraop", [33.0, 34.0, 31.0], threads=2, usecase=usecase)),
        mpi])


def test_the_printed_table_fits_a_terminal_under_plain_headers(tmp_path, capsys):
    folder = _long_labels(tmp_path / "runs")
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert "| configuration | runs | speedup | 95 % interval | accuracy | time to target |" \
        in lines
    # The use case heads its table, with its target by its metric's name.
    assert "*my-own-pets-classifier* (target: accuracy 0.60)" in lines
    for name in ("speedup_95", "val_accuracy", "time_to_target_s", "usecase"):
        assert name not in out
    summary, table_3 = [line for line in lines if line.startswith("| mpi 2 nodes, allreduc")]
    assert summary.endswith("[1] | 1 ok | 1.75 | 1.62-1.89 | 0.50 | 0/1 reached |")
    assert table_3.endswith("lr linear [1] | 1.00 s, 1.75x |")  # the same note
    assert "- [1] mpi 2 nodes, allreduce in 25 MiB buckets, balance measured, hosts " \
        "node-a.cluster.example.org,node-b.cluster.example.org: sequential bf16 accumulate " \
        "4 lr linear" in _flat(out)  # the label cut to fit, in full
    assert "| cpu-intraop (2 threads) | 1 noisy (others 1.2 cores) | 1.65 | 1.48-1.79 |" in out


def test_the_csv_and_the_written_tables_keep_every_column(tmp_path, capsys):
    folder = _long_labels(tmp_path / "runs")
    assert main(["report", str(folder), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(SUMMARY_COLUMNS)
    Report(folder).write_tables(tmp_path / "out")
    header = (tmp_path / "out" / "speedup.csv").read_text().splitlines()[0]
    assert ",speedup_95," in header and ",time_to_target_s," in header
    assert ",status,noisy," in header
    assert "accumulate 4 lr linear |" in (tmp_path / "out" / "table3.md").read_text()


def test_make_notebook_run_passes_include_noisy_to_the_notebook(tmp_path, monkeypatch):
    folder = _busy(tmp_path / "runs")
    if shutil.which("make"):
        dry = subprocess.run(["make", "-n", "notebook-run", "INCLUDE_NOISY=1",
                              f"RUNS={folder}"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60)
        assert "DDLSTUDY_INCLUDE_NOISY=1" in dry.stdout, dry.stderr
    nb = json.loads((REPO_ROOT / "analysis" / "study.ipynb").read_text())
    setup = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    monkeypatch.setenv("DDLSTUDY_RUNS", str(folder))
    for value, counted in (("1", True), ("", False), ("0", False)):
        monkeypatch.setenv("DDLSTUDY_INCLUDE_NOISY", value)
        scope: dict = {}
        exec(setup, scope)  # the notebook's first cell: where it reads the runs
        assert scope["report"].include_noisy is counted
        assert bool(scope["report"].runs.counted.any()) is counted
    assert os.environ["DDLSTUDY_INCLUDE_NOISY"] == "0"


# --- a bad study cell, manifest or samples file among good runs (probe 38) ----------------

def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _two(path):
    return _folder(path, [_manifest("sequential", [20.0, 21.0]),
                          _manifest("cpu-processes", [30.0, 31.0], processes=2)])


@pytest.mark.parametrize("change, said", [
    ({"label": None}, "cells[0].label: is required"),
    ({"cores": "many"}, "cells[0].cores: must be a valid integer (got 'many')"),
    ({"flags": {"model": 5}}, "cells[0].flags.model: must be a valid string (got 5)"),
    ({"nodes": "two"}, "cells[0].nodes: must be a valid integer (got 'two')")])
def test_a_bad_study_cell_leaves_its_study_out_named_and_the_runs_reported(tmp_path, capsys,
                                                                          change, said):
    """A study.json cell without the label the report shows, or whose cores, nodes or
    model is of another type: its study's cells are left out, named (as a damaged
    study.json is), the runs are reported, nothing is written."""
    cell = {"id": "c", "usecase": "u", "label": "cpu-threads (2 threads)",
            "strategy": "cpu-threads", "status": "skipped", "reason": "r", "run": ""}
    cell = {k: v for k, v in (cell | change).items() if v is not None}
    folder = _two(tmp_path / "runs")
    (folder / "study.json").write_text(json.dumps({"name": "s", "repeat": 1,
                                                   "cells": [cell]}))
    before = _tree(tmp_path)
    assert main(["report", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "| cpu-processes (2 processes) | 1 ok | 1.49 |" in out and "cpu-threads" not in out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"report: left out the cells of study record {folder / 'study.json'}: {said}" \
        in err, err
    assert _tree(tmp_path) == before


def test_runs_frame_leaves_out_a_planned_cell_of_another_shape(caplog):
    """``runs_frame`` given cells (not through ``load_planned``): a bad one is left out,
    named; a good one is a row."""
    from ddlstudy.report.runs import runs_frame

    good = {"id": "g", "usecase": "u", "label": "x", "strategy": "cpu-threads",
            "status": "skipped", "run": ""}
    frame = runs_frame([_manifest("sequential", [20.0])],
                       [good, good | {"id": "b", "flags": {"model": 5}}, "not a cell"])
    assert list(frame.config) == ["sequential", "x"]
    said = [r.getMessage() for r in caplog.records]
    assert any("study cell b: flags.model: must be a valid string (got 5)" in m
               for m in said), said
    assert any("study cell ?: is not a study cell" in m for m in said), said


def test_a_manifest_whose_usecase_is_null_is_skipped_named(tmp_path, capsys):
    """usecase null (the report grouped on NaN and died in only_main): skipped, named."""
    folder = _two(tmp_path / "runs")
    _folder(folder / "other", [_manifest("cpu-threads", [40.0], threads=2) |
                               {"usecase": None}])
    assert main(["report", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "| cpu-processes (2 processes) | 1 ok | 1.49 |" in out and "cpu-threads" not in out
    assert err.count("\n") == 1 and "report: skipped run manifest " in err, err
    assert "manifest.json: usecase: must be a valid string (got None)" in err, err


@pytest.mark.parametrize("row, said", [
    ({"rank": 0, "host": "a", "compute_s": 8.0, "exchange_s": 9.0},
     "backend.exchange.per_rank[0].steps: is required"),
    ({"rank": 0, "host": "a", "steps": 10, "compute_s": 8.0, "exchange_s": "slow"},
     "backend.exchange.per_rank[0].exchange_s: must be a valid number (got 'slow')")])
def test_an_mpi_run_whose_exchange_rows_are_not_ddlstudys_is_skipped_named(tmp_path, capsys,
                                                                          row, said):
    """The exchange figure and the findings read every rank's steps, compute and exchange
    seconds: a run whose rows lack one is skipped, named, and the report is written."""
    folder = _two(tmp_path / "runs")
    _folder(folder / "mpi", [_manifest("cpu-threads", [70.0], threads=2, exchange=[row],
                                       backend={"name": "mpi", "nodes": 2})])
    assert main(["report", str(folder), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"manifest.json: {said}" in err, err
    assert (tmp_path / "rep" / "findings.md").is_file()
    assert (tmp_path / "rep" / "figures" / "speedup.png").is_file()


def _samples(**change):
    import pandas as pd

    return pd.DataFrame([{"time": 1000.0 + t, "rank": 0, "host": "h", "scope": "node",
                          "proc_cpu_percent": 50.0, "proc_rss_bytes": 2**30,
                          "proc_threads": 4, "sys_cpu_percent": 60.0,
                          "sys_iowait_percent": 1.0, "sys_ram_percent": 30.0}
                         for t in range(10)]).assign(**change)


@pytest.mark.parametrize("bad, said", [
    (lambda: __import__("pandas").DataFrame({"a": [1, 2]}),
     "samples.parquet: has no time, rank, scope, host"),
    (lambda: _samples(proc_cpu_percent="busy"),
     "samples.parquet: column proc_cpu_percent must hold numbers, not str 'busy'"),
    (lambda: _samples(rank="zero"), "column rank must hold whole numbers, not str 'zero'"),
    (lambda: _samples(time=1e300), "column time must hold seconds since 1970")])
def test_a_run_whose_samples_are_not_ddlstudys_is_left_out_of_the_figures(tmp_path, capsys,
                                                                         bad, said):
    """samples.parquet of other columns, or of text where numbers belong: the run's
    resource figures are left out, naming the file and the column; the other run's are
    drawn, the report is written, and the samples file is kept as it was."""
    folder = _two(tmp_path / "runs")
    good, wrong = sorted(folder.iterdir())
    _samples().to_parquet(good / "samples.parquet", index=False)
    bad().to_parquet(wrong / "samples.parquet", index=False)
    kept = (wrong / "samples.parquet").read_bytes()
    assert main(["report", str(folder), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if "left out" in x]
    assert f"figures: left out the samples of run {wrong.name.split('-', 1)[1]}: samples " \
        f"{wrong / 'samples.parquet'}" in line and said in line, line
    figures = tmp_path / "rep" / "figures"
    assert (figures / "resources.png").is_file() and (figures / "speedup.png").is_file()
    assert (tmp_path / "rep" / "findings.md").is_file()
    assert (wrong / "samples.parquet").read_bytes() == kept


def test_finding_b_says_a_use_case_was_left_out_as_noisy(tmp_path):
    report = Report(_folder(tmp_path, [
        _manifest("sequential", [20.0, 21.0], usecase="simple-big"),
        _manifest("cpu-processes", [30.0, 31.0], processes=2, usecase="simple-big"),
        _noisy(_manifest("sequential", [5.0, 6.0], usecase="complex-small")),
        _noisy(_manifest("cpu-processes", [7.0, 8.0], processes=2, usecase="complex-small"),
               cores=1.4)]))
    (b,) = [f for f in findings(report) if f.letter == "b"]
    assert b.verdict == "not measured"
    assert b.lines[0].endswith(
        "missing: complex-small (this folder has: complex-small, simple-big); complex-small: "
        "no completed run on a quiet host: 2 ran, left out as noisy (other processes used up "
        "to 1.4 cores of their host while they ran); `ddlstudy report --include-noisy` counts "
        "them")
