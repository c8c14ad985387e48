"""Time to accuracy (the manifest, the report's columns) and the findings section that
checks the paper's conclusions (a)-(d) against a folder of runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from ddlstudy.cli import main
from ddlstudy.records.runfolder import RunFolder
from ddlstudy.report import Report, speedup_table
from ddlstudy.report.findings import findings, render_findings
from ddlstudy.runner.lifecycle import time_to_target


def test_every_epoch_carries_the_time_since_training_began(tmp_path):
    folder = RunFolder.create(tmp_path, "r", {})
    for i, t in enumerate([1.5, 2.0, 0.5], start=1):
        folder.record_epoch({"epoch": i, "epoch_time_s": t, "val_accuracy": 0.1 * i})
    assert [e["elapsed_s"] for e in folder.manifest["epochs"]] == [1.5, 3.5, 4.0]
    # A resumed run cuts its epochs to the snapshot's and goes on from the last one kept.
    folder.manifest["epochs"] = folder.manifest["epochs"][:1]
    folder.record_epoch({"epoch": 2, "epoch_time_s": 3.0, "val_accuracy": 0.2})
    assert folder.manifest["epochs"][-1]["elapsed_s"] == 4.5


def test_time_to_target_is_the_first_epoch_at_or_above_it():
    epochs = [{"epoch": 1, "val_accuracy": 0.4, "elapsed_s": 2.0},
              {"epoch": 2, "val_accuracy": 0.6, "elapsed_s": 4.0},
              {"epoch": 3, "val_accuracy": 0.7, "elapsed_s": 6.0}]
    assert time_to_target(epochs, 0.6) == {"target": 0.6, "reached": True, "epoch": 2,
                                           "seconds": 4.0}
    assert time_to_target(epochs, 0.9) == {"target": 0.9, "reached": False, "epochs": 3,
                                           "best": 0.7}
    assert time_to_target(epochs, None)["reached"] is None


def test_a_real_run_records_its_time_to_target_and_its_last_line_says_so(tmp_path,
                                                                           datasets_dir, capsys):
    """Beside a process that keeps a core busy: the run is marked noisy, and its last line
    says that its host was busy; its target is named by the metric the run chose."""
    # started through a process that ends at once: the busy loop is no child of this one,
    # whose whole tree an in-process run counts as its own
    busy = int(subprocess.check_output([sys.executable, "-c", (
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', "
        "'while True: pass'], stdout=subprocess.DEVNULL, start_new_session=True).pid)")],
        text=True))
    try:
        code = main(["run", "--epochs", "2", "--target-accuracy", "0.01", "--target-metric",
                     "macro_f1", "--datasets-dir", str(datasets_dir), "--runs-dir",
                     str(tmp_path / "runs")])
    finally:
        os.kill(busy, signal.SIGKILL)
    out, err = capsys.readouterr()
    assert code == 0, err
    m = json.loads(next((tmp_path / "runs").glob("*/manifest.json")).read_text())
    first = m["epochs"][0]
    assert first["elapsed_s"] == pytest.approx(first["epoch_time_s"])
    assert m["epochs"][1]["elapsed_s"] == pytest.approx(
        first["epoch_time_s"] + m["epochs"][1]["epoch_time_s"])
    assert m["time_to_target"] == {"target": 0.01, "metric": "macro_f1", "reached": True,
                                   "epoch": 1, "seconds": first["elapsed_s"]}
    assert m["config"]["usecase"]["train"]["target_accuracy"] == 0.01
    (last,) = out.splitlines()[-1:]
    assert f"target macro_f1 0.01 reached in {first['elapsed_s']:.1f} s (epoch 1)" in last
    others = max(m["host_load"]["others_cores"].values())
    assert m["host_load"]["noisy"] is True and others >= 0.5  # the busy loop's core, at least
    assert last.endswith(f"(the host was busy: other processes used {others:.1f} cores of it "
                         "while the run trained, so its speed says little; marked noisy, "
                         "reports leave it out of speedups)")


def memory_block(peaks: list[int], hosts: list[str] | None = None, held: int = 1000) -> dict:
    """``backend.memory`` as ``record_memory`` writes it: rank i's peak ``peaks[i]`` on
    ``hosts[i]`` (default: all on 'h'), each holding ``held`` bytes of each kind."""
    hosts = hosts or ["h"] * len(peaks)
    per_host: dict[str, int] = {}
    for host, peak in zip(hosts, peaks, strict=True):
        per_host[host] = per_host.get(host, 0) + peak
    return {"per_rank": [{"rank": i, "host": host, "peak_rss_bytes": peak,
                          "peak_method": "VmHWM (reset after set-up)",
                          "held_bytes": {"parameters": held, "gradients": held,
                                         "optimizer_state": 2 * held, "buffers": 0}}
                         for i, (host, peak) in enumerate(zip(hosts, peaks, strict=True))],
            "peak_rss_bytes": max(peaks), "per_host_bytes": per_host}


def _manifest(strategy, rates, *, usecase="u", threads=1, processes=1, tta=None,
              target=0.6, backend=None, exchange=None, hosts=None, memory=None):
    epochs = [{"epoch": i + 1, "train_loss": 1.0, "steady_images_per_s": r,
               "epoch_time_s": 1.0, "val_accuracy": 0.5} for i, r in enumerate(rates)]
    backend = {"name": "local"} | dict(backend or {})
    if exchange:
        backend["exchange"] = {"per_rank": exchange}
    if hosts:
        backend["hosts"] = hosts
    if memory:
        backend["memory"] = memory
    return {"usecase": usecase, "status": "completed", "started_at": "t", "backend": backend,
            "config": {"usecase": {"name": usecase}},
            "id": f"{usecase}-{strategy}-{backend.get('name', 'local')}-{rates[0]}",
            "host": {"hostname": "h", "usable_cores": 2},
            "strategy": {"name": strategy, "processes": processes,
                         "threads_per_process": threads},
            "time_to_target": {"target": target,
                               "reached": None if target is None else tta is not None,
                               **({"seconds": tta, "epoch": 1} if tta else {"best": 0.5})},
            "epochs": epochs}


def test_the_report_shows_time_to_target_and_its_speedup():
    """A configuration faster per image that needs more epochs is seen as such."""
    runs = [_manifest("sequential", [20.0], tta=40.0), _manifest("sequential", [20.0], tta=60.0),
            _manifest("cpu-intraop", [40.0], threads=2, tta=25.0),
            _manifest("cpu-intraop", [40.0], threads=2, tta=25.0),
            _manifest("cpu-threads", [60.0], threads=2, tta=100.0),  # 3x images/s, slower
            _manifest("cpu-processes", [30.0], processes=2, tta=20.0),
            _manifest("cpu-processes", [30.0], processes=2, tta=None)]  # one missed it
    table = speedup_table(runs).set_index("strategy")
    assert table.loc["sequential", "time_to_target_s"] == pytest.approx(50.0)
    assert table.loc["cpu-intraop", "tta_speedup"] == pytest.approx(2.0)
    assert table.loc["cpu-threads", "speedup"] == pytest.approx(3.0)
    assert table.loc["cpu-threads", "tta_speedup"] == pytest.approx(0.5)
    assert table.loc["cpu-processes", "reached"] == "1/2"
    # Not the median of the lucky run: no time, no speedup.
    assert pd.isna(table.loc["cpu-processes", "time_to_target_s"])
    assert pd.isna(table.loc["cpu-processes", "tta_speedup"])
    # Another target is another question: no speedup against the baseline's.
    other = speedup_table([_manifest("sequential", [20.0], tta=40.0),
                           _manifest("cpu-intraop", [40.0], threads=2, tta=5.0, target=0.3)])
    assert pd.isna(other.set_index("strategy").loc["cpu-intraop", "tta_speedup"])


def _report(tmp_path, manifests) -> Report:
    for m in manifests:
        folder = tmp_path / m["id"]
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps(m))
    return Report(tmp_path)


def _by_letter(report):
    return {f.letter: f for f in findings(report)}


def test_findings_confirm_refute_or_leave_open_each_conclusion(tmp_path):
    mpi = {"name": "mpi", "nodes": 2, "reduce": "allreduce"}
    spark = {"name": "spark", "nodes": 2, "sync": "gloo"}
    ranks = [{"rank": 0, "host": "h", "steps": 10, "compute_s": 3.0, "exchange_s": 1.0},
             {"rank": 1, "host": "h", "steps": 10, "compute_s": 2.0, "exchange_s": 2.0}]
    report = _report(tmp_path, [
        _manifest("sequential", [20.0, 21.0, 19.0]),
        _manifest("cpu-intraop", [40.0, 41.0, 39.0], threads=2),
        _manifest("cpu-processes", [30.0, 31.0, 29.0], processes=2),
        _manifest("sequential", [35.0, 36.0, 34.0], backend=mpi, exchange=ranks,
                  hosts=["h", "h"]),
        _manifest("sequential", [10.0, 11.0, 9.0], backend=spark),
    ])
    found = _by_letter(report)
    # (a) 30 img/s of processes against 40 of intra-op threads, every epoch apart: refuted.
    assert found["a"].verdict == "refuted"
    assert "cpu-processes (2 processes) 30.0 img/s" in found["a"].lines[0]
    assert "cpu-intraop (2 threads) 40.0 img/s, ratio 0.75" in found["a"].lines[0]
    assert "b" not in found  # the paper's two use cases are not in this folder
    assert found["c"].verdict == "confirmed"  # 40 local against 10 Spark
    assert "ratio 4.00" in found["c"].lines[0]
    # (d) MPI's 35 against intra-op's 40, with the measured reasons, said as what differs
    # from the paper: the exchange's share of each rank's step (25 %, 50 %) and the one
    # host its ranks shared.
    assert found["d"].verdict == "refuted"
    (why,) = found["d"].differs
    assert why.startswith("u: ")
    assert "25%-50% of each step in the gradient exchange (100-200 ms a step)" in why
    assert "2 ranks all ran on h, sharing its 2 cores" in why
    assert found["c"].differs == []  # confirmed, as the paper
    text = " ".join(report.text().split())
    assert "**Findings: the paper's conclusions on these runs**" in text
    assert "- (d) MPI gives the best speedup on CPU: **refuted**" in text
    assert "not the paper's verdict (it confirms this), measured here: u: " in text


def test_findings_are_inconclusive_when_the_interval_includes_one(tmp_path):
    report = _report(tmp_path, [
        _manifest("sequential", [20.0, 22.0, 18.0]),
        _manifest("cpu-processes", [21.0, 17.0, 23.0], processes=2)])
    found = _by_letter(report)
    assert found["a"].verdict == "inconclusive"
    assert found["c"].verdict == found["d"].verdict == "not measured"
    assert found["d"].lines == ["u: no completed MPI run"]


def test_a_finding_says_when_the_faster_side_learns_slower(tmp_path, capsys):
    """Images/s judge the claim (the paper's speedups are of images/s); time to accuracy
    is said beside it, so a win that does not learn is seen as such. Where a side reached
    the target, a configuration that did not never confirms (issue 48: a weak-scaled run
    that never reached it confirmed (a)): its side is the fastest that did, or loses."""
    found = _by_letter(_report(tmp_path, [
        _manifest("sequential", [20.0], tta=4.0),
        _manifest("cpu-intraop", [25.0], threads=2, tta=3.0),
        _manifest("cpu-processes", [30.0], processes=2, tta=None)]))
    assert found["a"].verdict == "refuted"
    assert found["a"].lines[0] == (
        "u: refuted on time to the 0.60 target: cpu-intraop (2 threads) reached it in 3.00 s "
        "(25.0 img/s); no multi-process data-parallel run reached it in every run (the "
        "fastest, cpu-processes (2 processes), 30.0 img/s, in 0/1 runs)")
    weak = _manifest("cpu-processes", [60.0], processes=2, tta=None)
    weak["config"]["scaling"], weak["effective"] = "weak", {"global_batch": 32}
    found = _by_letter(_report(tmp_path / "weak", [
        _manifest("sequential", [20.0], tta=4.0), weak,
        _manifest("cpu-processes", [30.0], processes=2, tta=2.5)]))
    assert found["a"].verdict == "confirmed"  # by the strong run, which reached the target
    assert found["a"].lines[0].startswith(
        "u: confirmed: cpu-processes (2 processes) 30.0 img/s against sequential 20.0 img/s")
    assert found["a"].lines[0].endswith(
        "; not judged on cpu-processes (2 processes) weak (batch 32), faster per image "
        "(60.0 img/s) but not reaching the target in every run (0/1)")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "weak"), "--project", "none"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "- (a) CPU multi-process data parallelism is faster than one process: " \
        "**confirmed**" in printed and "not judged on cpu-processes (2 processes) weak" in printed
    neither = _by_letter(_report(tmp_path / "neither", [
        _manifest("sequential", [20.0], tta=None),
        _manifest("cpu-processes", [30.0], processes=2, tta=None)]))["a"]
    assert neither.verdict == "confirmed"
    assert neither.lines[0].endswith("(neither side reached the target: this rests on "
                                     "images/s alone)")
    found = _by_letter(_report(tmp_path / "later", [
        _manifest("sequential", [20.0], tta=4.0),
        _manifest("cpu-intraop", [25.0], threads=2, tta=3.0),
        _manifest("cpu-processes", [30.0], processes=2, tta=4.5)]))
    assert "(2 processes) 4.50 s, cpu-intraop (2 threads) 3.00 s (cpu-processes (2 " \
        "processes) is faster per image but reaches the target 1.50x later)" in \
        found["a"].lines[0]
    quick = [_manifest("sequential", [20.0], tta=None),
             _manifest("cpu-processes", [30.0], processes=2, tta=None)]
    for m in quick:
        m["config"]["max_steps"] = 4  # cut short: not reaching the target says nothing
    assert "target" not in _by_letter(_report(tmp_path / "quick", quick))["a"].lines[0]
    found = _by_letter(_report(tmp_path / "none", [
        _manifest("sequential", [20.0], target=None),
        _manifest("cpu-processes", [30.0], processes=2, target=None)]))
    assert "target" not in found["a"].lines[0]


def test_finding_b_compares_the_two_paper_use_cases(tmp_path):
    report = _report(tmp_path, [
        _manifest("sequential", [20.0, 21.0], usecase="simple-big"),
        _manifest("cpu-intraop", [36.0, 38.0], usecase="simple-big", threads=2),
        _manifest("sequential", [2.0, 2.1], usecase="complex-small"),
        _manifest("cpu-intraop", [2.6, 2.7], usecase="complex-small", threads=2)])
    (b,) = [f for f in findings(report) if f.letter == "b"]
    # Two epochs a run: the interval of the ratio of speedups resamples all four sides.
    assert b.verdict == "confirmed"
    assert "1.80x" in b.lines[0] and "1.29x" in b.lines[0] and "ratio 1.40" in b.lines[0]
    low, high = (float(x) for x in b.lines[0].split("95 % interval ")[1][:9].split("-"))
    assert 1 < low < 1.40 < high  # 1.40 the ratio of medians, the ends of two-value spreads
    assert "(b) SimpleBig gains more" in render_findings([b])
    slower = _report(tmp_path / "slower", [
        _manifest("sequential", [20.0, 21.0], usecase="simple-big"),
        _manifest("cpu-intraop", [22.0, 23.0], usecase="simple-big", threads=2),
        _manifest("sequential", [2.0, 2.1], usecase="complex-small"),
        _manifest("cpu-intraop", [3.6, 3.7], usecase="complex-small", threads=2)])
    (b,) = [f for f in findings(slower) if f.letter == "b"]
    assert b.verdict == "refuted"
    # Not the paper's: the reason is how each use case's process speeds up with threads.
    assert b.differs[0].startswith("serial share of a process's step (Amdahl, from "
                                   "cpu-intraop): simple-big 0.8")


def test_finding_b_is_shown_only_for_the_paper_use_cases(tmp_path):
    """A user's own study gets (a), (c), (d) judged on its use case, and no '(b) ... not
    measured'; a folder with one of the paper's use cases gets (b), saying what it lacks."""
    own = _report(tmp_path / "own", [
        _manifest("sequential", [20.0, 21.0], usecase="pets"),
        _manifest("cpu-processes", [40.0, 41.0], usecase="pets", processes=2)])
    found = findings(own)
    assert [f.letter for f in found] == ["a", "c", "d"]
    assert found[0].lines[0].startswith("pets: confirmed: cpu-processes (2 processes)")
    text = own.findings_text()
    assert "(b)" not in text.replace("(b) compares the paper's own two", "")
    assert "Judged on this folder's use case(s): pets." in text
    paper = _report(tmp_path / "paper", [
        _manifest("sequential", [20.0, 21.0], usecase="simple-big"),
        _manifest("cpu-intraop", [36.0, 38.0], usecase="simple-big", threads=2)])
    found = {f.letter: f for f in findings(paper)}
    assert list(found) == ["a", "b", "c", "d"]
    assert found["b"].verdict == "not measured"
    assert "missing: complex-small (this folder has: simple-big)" in found["b"].lines[0]
    assert "Judged on this folder's" not in paper.findings_text()


def test_findings_of_a_mixed_folder_say_which_use_case_went_which_way(tmp_path):
    report = _report(tmp_path, [
        _manifest("sequential", [20.0, 21.0], usecase="x"),
        _manifest("cpu-processes", [40.0, 41.0], usecase="x", processes=2),
        _manifest("sequential", [20.0, 21.0], usecase="y"),
        _manifest("cpu-processes", [10.0, 11.0], usecase="y", processes=2)])
    (a,) = [f for f in findings(report) if f.letter == "a"]
    assert a.verdict == "mixed (x confirmed, y refuted)"
    assert isinstance(report.runs, pd.DataFrame)


RANKS = [{"rank": 0, "host": "h", "steps": 10, "compute_s": 8.0, "exchange_s": 1.0},
         {"rank": 1, "host": "h", "steps": 10, "compute_s": 8.0, "exchange_s": 2.0}]


def _laid_out(strategy, rate, *, usecase="u", processes=1, threads=1, workers=1, nodes=1,
              backend="local", reduce=None, hosts=None, exchange=None, **strategy_keys):
    """A manifest with what a projection reads: layout, batch 32, a 1 M-parameter model."""
    m = _manifest(strategy, [rate, rate], usecase=usecase, processes=processes,
                  threads=threads, backend={"name": backend, "nodes": nodes, "hosts": hosts},
                  exchange=exchange)
    m["id"] += f"-{nodes}-{reduce}"
    m["strategy"] |= strategy_keys
    m["effective"] = {"global_batch": 32, "data_parallel_workers": workers}
    m["model"] = {"parameters": 1_000_000}
    m["config"]["reduce"] = reduce
    return m


def test_a_run_is_projected_onto_nodes_of_many_cores():
    """A run's step less its exchange scales by Amdahl's law fitted to cpu-intraop; the
    exchange within a node stays; between nodes the link's replaces the measured one."""
    from ddlstudy.report.projection import Hardware, Speeds, project, serial_share

    assert serial_share(2, 1.8) == pytest.approx(1 / 9)
    assert serial_share(2, 2.5) == 0.0 and serial_share(1, 3.0) == 1.0
    speeds = Speeds(r1=20.0, serial=0.1)
    assert speeds.rate(16) == pytest.approx(128.0) and speeds.rate(0.5) == 10.0
    node = Hardware.parse("32@10gbit")
    assert str(node) == "nodes of 32 cores joined by 10gbit"
    # 2 processes of 1 thread on 2 cores at 30 img/s, 0.1 s a step of it their exchange:
    # 32 / 30 - 0.1 s of compute at 1 core each, 20 / 128 of it at 16.
    processes = _laid_out("cpu-processes", 30.0, processes=2, workers=2,
                          exchange=[{"steps": 10, "exchange_s": 1.0}])
    compute = (32 / 30 - 0.1) * 20 / 128
    assert project(processes, 30.0, speeds, node) == pytest.approx(32 / (compute + 0.1))
    # The baseline keeps its one thread: it stays itself.
    assert project(_laid_out("sequential", 20.0), 20.0, speeds, node) == pytest.approx(20.0)
    # 2 MPI nodes of 2 threads that shared 2 cores here (one core each), 1.0 s a step, the
    # ranks' exchange 0.15 s of it (median of 0.1 and 0.2). Projected: 32 cores a node
    # (20 / (0.1 + 0.9 / 32) = 156.1 img/s), and the longer of the measured exchange and
    # MPICH's allreduce of 4 MB between 2 nodes: 2 messages of 50 us and 4e6 bytes, at
    # 10 Gbit/s (0.0033 s: the measured 0.15 s stands) or at 100 Mbit/s (0.32 s).
    mpi = _laid_out("cpu-intraop", 32.0, threads=2, workers=2, nodes=2, backend="mpi",
                    reduce="allreduce", hosts=["h", "h"], exchange=RANKS)
    compute = 0.85 * 20 / (20 / (0.1 + 0.9 / 32))
    link = 2 * 50e-6 + 4e6 * 8 / 100e6
    assert project(mpi, 32.0, speeds, node) == pytest.approx(32 / (compute + 0.15))
    slow = Hardware.parse("32@100mbit")
    assert project(mpi, 32.0, speeds, slow) == pytest.approx(32 / (compute + link))
    # Emulated hosts name themselves but share the machine's 2 cores: the same projection.
    emulated = json.loads(json.dumps(mpi))
    emulated["backend"]["hosts"], emulated["config"]["hosts"] = ["e1", "e2"], "emulated:e"
    assert project(emulated, 32.0, speeds, slow) == pytest.approx(32 / (compute + link))
    emulated["config"]["hosts"] = None  # two real hosts: each node had 2 cores, 32 add less
    assert project(emulated, 32.0, speeds, slow) < 32 / (compute + link)
    # 4 processes of a hybrid on 2 cores had half a core each; on 32 cores they have 8.
    hybrid = _laid_out("hybrid", 8.0, processes=4, replicas=2, stages=2)
    assert project(hybrid, 8.0, speeds, node) == pytest.approx(8.0 * speeds.rate(8) / 10)
    assert project({"strategy": {}}, 10.0, speeds, node) is None  # too old to model


@pytest.mark.parametrize("text", ["32", "0@10gbit", "32@fast", "x@1gbit", "32@0gbit"])
def test_a_projection_spec_is_cores_at_a_link_rate(text):
    from ddlstudy.errors import ConfigError
    from ddlstudy.report.projection import Hardware

    with pytest.raises(ConfigError, match="--project"):
        Hardware.parse(text)


def test_every_finding_is_projected_and_says_it_is_a_model(tmp_path):
    """On 2 shared cores MPI loses to intra-op threads; on 32-core nodes it wins: the
    finding says both, the projection marked as one."""
    report = _report(tmp_path, [
        _laid_out("sequential", 20.0, threads=1),
        _laid_out("cpu-intraop", 36.0, threads=2),
        _laid_out("cpu-processes", 30.0, processes=2, workers=2),
        _laid_out("cpu-intraop", 32.0, threads=2, workers=2, nodes=2, backend="mpi",
                  reduce="allreduce", hosts=["h", "h"],
                  exchange=[r | {"exchange_s": r["exchange_s"] / 10} for r in RANKS]),
        _laid_out("sequential", 12.0, workers=2, nodes=2, backend="spark", hosts=["h", "h"])])
    found = _by_letter(report)
    assert found["d"].verdict == "refuted"
    (d,) = found["d"].projected
    assert d.startswith("u: confirmed: mpi 2 nodes") and "(serial share 0.11)" in d
    text = " ".join(report.findings_text().split())  # its lines wrapped to fit a terminal
    assert "projected to nodes of 32 cores joined by 10gbit (a model fitted to these runs, " \
        "not a measurement):" in text
    assert all(f.projected and not any(line.startswith(("u: not", "not")) for line in
                                       f.projected) for f in found.values())
    assert "- u: " in text.split("(a) CPU multi-process")[1]
    plain = Report(tmp_path, project=None)
    assert "projected" not in plain.findings_text()


def test_runs_at_another_learning_rate_are_not_repeats_and_have_their_own_baseline():
    """The learning rate (and its warm-up) changes what a run learns: runs at 0.01 are
    their own rows, each against the baseline at 0.01, never averaged with those at 0.003."""
    def at(strategy, rate, lr, warmup=0, **kw):
        m = _manifest(strategy, [rate], tta=10.0 if lr > 0.005 else 30.0, **kw)
        m["config"]["usecase"]["train"] = {"lr": lr, "lr_warmup_epochs": warmup}
        m["id"] += f"-{lr}-{warmup}"
        return m
    runs = [at("sequential", 20.0, 0.003), at("sequential", 20.0, 0.01),
            at("cpu-intraop", 40.0, 0.003, threads=2), at("cpu-intraop", 30.0, 0.01, threads=2),
            at("cpu-intraop", 30.0, 0.01, 1, threads=2)]
    table = speedup_table(runs)
    low, high = (f"? epochs, batch ?, lr {lr}, ? px, data ?, host h" for lr in ("0.003", "0.01"))
    warm = high.replace("0.01,", "0.01, lr warm-up 1 epochs,")
    assert sorted(table.setting) == [low, low, high, high, warm]
    rows = table.set_index(["setting", "strategy"])
    assert rows.loc[(low, "cpu-intraop"), "speedup"] == pytest.approx(2.0)
    assert rows.loc[(high, "cpu-intraop"), "speedup"] == pytest.approx(1.5)
    assert (table.runs == 1).all()
