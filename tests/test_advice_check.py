"""Every prediction checked (issue 60): the advice against the runs that measure it, with
each error and what they add up to; one figure of a node's memory; probes time-boxed and
every layout probed within the budget, or the budget that would named."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from ddlstudy.config import load_usecase
from ddlstudy.records.advised import spread
from ddlstudy.records.memory import memory_of, node_bytes
from ddlstudy.records.plan import baseline, cell_config
from ddlstudy.tools import advise
from ddlstudy.tools.advise.checking import spearman
from ddlstudy.tools.advise.history import last_check, last_check_line, remember
from ddlstudy.tools.advise.schedule import Pace, _box, _out_of_budget, settled
from ddlstudy.training.loop import MIN_PACED, Trainer

MIB = 2**20


def _manifest(run: str, flags: dict, speed: float, node_mib: int, process_mib: int,
              noisy: bool = False, usecase: str = "u") -> dict:
    """A completed run of ``flags`` as its manifest records it: ``speed`` images/s, one
    process peaking at ``process_mib`` of which ``process_mib - node_mib`` are files'
    pages (the node's figure: ``node_mib``)."""
    config = {"backend": "local"} | flags
    return {"id": run, "status": "completed", "usecase": usecase, "config": config,
            "host_load": {"noisy": noisy},
            "backend": {"name": config["backend"], "nodes": config.get("nodes", 1),
                        "memory": {"peak_rss_bytes": process_mib * MIB, "per_rank": [
                            {"rank": 0, "host": "h", "peak_rss_bytes": process_mib * MIB,
                             "setup_file_bytes": (process_mib - node_mib) * MIB,
                             "peak_method": "VmHWM",
                             "held_bytes": {}}]}},
            "epochs": [{"steady_images_per_s": speed}]}


def _advice(*rows: tuple[str, dict, float, int, int]) -> dict:
    """An advise.json of ranked rows: (label, flags, images/s, node MiB, process MiB)."""
    return {"usecase": "u", "ranking": [
        {"rank": i, "label": label, "nodes": 1, "basis": "probed", "flags": flags,
         "images_per_s": speed, "predicted_need_node_bytes": node * MIB,
         "predicted_peak_process_bytes": process * MIB}
        for i, (label, flags, speed, node, process) in enumerate(rows, 1)]}


SEQ, INTRA = {"strategy": "sequential"}, {"strategy": "cpu-intraop", "workers": 2}
PROCS = {"strategy": "cpu-processes", "workers": 2}


def test_the_check_gives_each_error_and_what_they_add_up_to():
    """Three configurations, predicted 110, 100 and 50 images/s, measured 100, 125 and
    40: errors +10 %, -20 % and +25 % (mean absolute 18.3 %); the ranks 1, 2, 3 measured
    2, 1, 3 (Spearman 0.5); the first choice measured 80 % of the best (rank 2): not
    confirmed, measured rank 2. Memory: a node predicted 500 MiB measured 400 (+25 %)."""
    advice = _advice(("s", SEQ, 110.0, 400, 800), ("p", PROCS, 100.0, 500, 820),
                     ("i", INTRA, 50.0, 400, 800))
    runs = [_manifest("r1", SEQ, 100.0, 400, 800), _manifest("r2", PROCS, 125.0, 400, 800),
            _manifest("r3", INTRA, 40.0, 400, 800)]
    result = advise.check(advice, runs)
    by = {r["label"]: r for r in result["rows"]}
    assert by["s"]["error"] == pytest.approx(0.10)
    assert by["p"]["error"] == pytest.approx(-0.20)
    assert by["i"]["error"] == pytest.approx(0.25)
    assert by["p"]["node_error"] == pytest.approx(0.25)
    assert by["p"]["process_error"] == pytest.approx(20 / 800)
    assert by["s"]["node_error"] == 0 and by["s"]["measured_node_bytes"] == 400 * MIB
    s = result["summary"]
    assert s["mape"] == pytest.approx((0.10 + 0.20 + 0.25) / 3)
    assert s["spearman"] == pytest.approx(0.5)
    assert s["first_measured_rank"] == 2 and s["best_rank"] == 2
    assert s["first_over_best"] == pytest.approx(0.8) and s["confirmed"] is False
    assert s["node_memory_worst"] == pytest.approx(0.25)
    assert s["node_memory_mape"] == pytest.approx(0.25 / 3)
    text = advise.check_text(result)
    assert "| 2 | p | 100.0 | 125.0 | -20% |" in text
    assert "off by 18% on average" in text and "rank correlation 0.50" in text
    assert "not confirmed: the first choice measured 80% of the best measured (rank 2), " \
           "measured rank 2 of 3" in text


def test_a_deliberately_wrong_prediction_shows_as_a_large_error():
    """The same runs, the second row's images/s predicted three times too high: its error
    is +200 % and the mean absolute error follows; the ranking's order is unchanged."""
    good = _advice(("s", SEQ, 100.0, 400, 800), ("p", PROCS, 90.0, 400, 800))
    runs = [_manifest("r1", SEQ, 100.0, 400, 800), _manifest("r2", PROCS, 90.0, 400, 800)]
    assert advise.check(good, runs)["summary"]["mape"] == pytest.approx(0.0)
    wrong = json.loads(json.dumps(good))
    wrong["ranking"][1]["images_per_s"] = 270.0
    result = advise.check(wrong, runs)
    assert result["rows"][1]["error"] == pytest.approx(2.0)
    assert result["summary"]["mape"] == pytest.approx(1.0)
    assert "+200%" in advise.check_text(result)


def test_the_advices_refault_note_is_repeated_for_runs_whose_heap_was_returned_only():
    """advise's note on a VM that takes freed memory back is of runs that return their
    heap (the default): a check of runs made with --heap keep does not repeat it."""
    advice = _advice(("s", SEQ, 100.0, 400, 800)) | {
        "refaults": {"largest_bytes": 144 * MIB, "order": 9}}
    for heap, said in (("return", True), ("keep", False)):
        result = advise.check(advice, [_manifest("r1", SEQ | {"heap": heap}, 90.0, 400, 800)],
                              cells=[{"run": "r1", "flags": SEQ}])
        assert (result["refaults"] is not None) is said, heap
        assert ("(as the advice said: this host hands freed memory back" in
                advise.check_text(result)) is said, heap


def test_noisy_runs_are_left_out_and_counted_or_counted_marked_when_asked():
    """A run on a busy host is left out and counted; with include_noisy it is the row's
    figure, marked busy; with every run noisy the check names the flag."""
    advice = _advice(("s", SEQ, 100.0, 400, 800), ("i", INTRA, 90.0, 400, 800))
    runs = [_manifest("r1", SEQ, 50.0, 400, 800, noisy=True),
            _manifest("r2", INTRA, 45.0, 400, 800, noisy=True)]
    result = advise.check(advice, runs)
    assert result["rows"] == [] and result["noisy_left_out"] == 2
    assert "`--include-noisy` counts them" in advise.check_text(result)
    counted = advise.check(advice, runs, include_noisy=True)
    assert [r["busy"] for r in counted["rows"]] == [True, True]
    assert counted["rows"][0]["error"] == pytest.approx(1.0)
    assert "measured while other processes kept the host busy" in \
        advise.check_text(counted)


def test_a_run_is_matched_by_its_study_cell_or_by_its_recorded_configuration():
    """With a study's cells, by their flags (how long a cell trained is not the
    configuration); without, by the whole configuration the manifest records: a local row
    is not an MPI run of the same strategy, GPipe's row not a 1F1B run (its row has no
    schedule flag), and advise's own probes (paced) are no runs of the advice."""
    gpipe = {"strategy": "pipeline", "stages": 2}
    advice = _advice(("s", SEQ, 100.0, 400, 800), ("i", INTRA, 90.0, 400, 800),
                     ("g", gpipe, 80.0, 400, 800))
    runs = [_manifest("r1", SEQ, 100.0, 400, 800),
            _manifest("r2", INTRA | {"backend": "mpi", "nodes": 2}, 80.0, 400, 800),
            _manifest("r3", INTRA, 80.0, 400, 800, usecase="other"),
            _manifest("r4", gpipe | {"schedule": "1f1b"}, 70.0, 400, 800),
            _manifest("r5", INTRA | {"steady_seconds": 3.0}, 95.0, 400, 800)]
    assert [r["label"] for r in advise.check(advice, runs)["rows"]] == ["s"]
    cells = [{"run": "r1", "flags": SEQ | {"epochs": 2, "max_steps": 6}}]
    assert [r["runs"] for r in advise.check(advice, runs, cells)["rows"]] == [1]


def test_spearman_and_the_rows_a_check_spreads_over_a_ranking():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None  # two rows say nothing
    assert spearman([1, 2, 3], [5, 5, 5]) is None
    assert spread(list(range(1, 21)), 6) == [1, 2, 7, 11, 16, 20]
    assert spread(list(range(1, 5)), 3) == [1, 2, 4]
    assert spread([1, 2], 5) == [1, 2]


def test_a_node_s_memory_is_one_figure():
    """The cgroup's charge where the host had one; else the processes' peaks less the
    files' pages each maps (the most it had, set up or at the end), shared memory once;
    MPI nodes sharing a host divide it."""
    rank = {"rank": 0, "host": "h", "peak_rss_bytes": 900 * MIB, "setup_file_bytes": 300 * MIB,
            "shmem_bytes": 40 * MIB, "shmem_pss_bytes": 20 * MIB, "held_bytes": {}}
    memory = {"per_rank": [rank, rank | {"rank": 1}], "per_host_bytes": {"h": 1800 * MIB}}
    assert node_bytes(memory) == 2 * (900 - 40 + 20 - 300) * MIB
    assert node_bytes(memory, nodes=2) == (900 - 40 + 20 - 300) * MIB
    charged = memory | {"hosts": {"h": {"limit_bytes": 3 << 30,
                                        "peak_charged_bytes": 1000 * MIB}}}
    assert node_bytes(charged) == 1000 * MIB
    uneven = {"per_rank": [rank | {"rank": i, "host": h} for i, h in enumerate("aba")]}
    assert node_bytes(uneven, nodes=3) == (900 - 40 + 20 - 300) * MIB  # 2 on a, 1 on b
    older = {"per_rank": [{"rank": 0, "host": "h", "peak_rss_bytes": 900 * MIB,
                           "held_bytes": {}}], "per_host_bytes": {"h": 900 * MIB}}
    assert node_bytes(older) == 900 * MIB  # recorded before the files' pages were
    manifest = {"backend": {"nodes": 2, "memory": memory}}
    assert memory_of(manifest)["peak_node_bytes"] == (900 - 40 + 20 - 300) * MIB
    # forked from a warm server, a process maps its libraries as it first runs them: 32
    # MiB of files' pages once set up, 106 at the end, all of them the node's once
    forked = {"per_rank": [rank | {"setup_file_bytes": 32 * MIB, "end_file_bytes": 106 * MIB}]}
    assert node_bytes(forked) == (900 - 40 + 20 - 106) * MIB


def test_a_study_s_added_baseline_is_local_and_sequential():
    """A memory plan's settings (MPI nodes on emulated hosts) stay with its cells: the
    baseline the study adds runs here, one process, as long as the cells."""
    settings = {"backend": "mpi", "nodes": 2, "hosts": "emulated:mem", "reduce": "ring",
                "workers": 2, "epochs": 1, "max_steps": 4, "no_snapshot": True,
                "precision": "bf16", "model": "resnet18", "no_reshard_after_forward": True,
                "no_shared_buffers": True}
    assert baseline(settings) == {"epochs": 1, "max_steps": 4, "no_snapshot": True,
                                  "precision": "bf16", "model": "resnet18",
                                  "strategy": "sequential"}


def test_a_paced_epoch_ends_once_its_steady_steps_fill_the_box():
    """--steady-seconds 1 after a warm-up step of 0.25 s: 4 more steps; of 2 s: MIN_PACED;
    the ranks' mean decides, so that every rank ends at the same step."""
    trainer = Trainer.__new__(Trainer)
    trainer.steady_seconds, trainer.reduce = 1.0, lambda *values: list(values)
    assert trainer.paced(2, 0.25) == 6
    assert trainer.paced(2, 2.0) == 2 + MIN_PACED
    trainer.reduce = lambda step, one: [step + 0.5, one * 2]  # another rank took 0.5 s
    assert trainer.paced(2, 0.0) == 2 + 4
    trainer.steady_seconds = None
    assert math.isinf(trainer.paced(2, 0.25))


def _cand(label: str, cores: int, seconds: float, trained: float, speed: float | None = None
          ) -> advise.Candidate:
    c = advise.Candidate(label, {"strategy": label}, cores)
    c.seconds, c.trained_s = [seconds], [trained]
    if speed is not None:
        c.speeds = [speed]
    return c


def test_a_probe_is_time_boxed_and_a_short_budget_shrinks_the_boxes_or_names_a_budget():
    """tiny's epoch of 15 steps at the baseline's 20 ms a step: 3 s of steady steps take
    3 epochs; VGG16-like steps of 2 s: one epoch, one warm-up step. A budget that leaves
    every remaining layout less than its full box shrinks the boxes; one that cannot
    probe the next says which budget would."""
    pace = Pace(load_usecase("tiny"), box=3.0)
    assert pace.settings(3.0)["epochs"] == 1  # the baseline's own probe: one epoch
    base = _cand("sequential", 1, 6.0, 1.0, 800.0)
    base.step_s = [0.02]
    pace.learn(base)
    settings = pace.settings(3.0)
    assert (settings["epochs"], settings["warmup_steps"], settings["max_steps"]) == (3, 2, 15)
    assert settings["steady_seconds"] == 1.0 and settings["max_val_steps"] == 1
    assert advise.probe_settings(load_usecase("tiny"), 0.5, 1)["warmup_steps"] == 1
    one = advise.probe_settings(load_usecase("tiny"), 3.0, per_epoch=1)  # no warm-up to skip
    assert "warmup_steps" not in one and one["max_steps"] == 1
    slow = Pace(load_usecase("tiny"), box=3.0, base_step=2.0)
    assert (slow.epochs(3.0), slow.warmup) == (1, 1)
    # start-up: learnt a process count at a time (the baseline's 5 s; 2 processes: twice)
    two = advise.Candidate("cpu-processes", {"strategy": "cpu-processes"}, 2)
    assert pace.startup(two, [base]) == 10.0
    done = _cand("zero", 2, 12.0, 3.0, 100.0)
    assert pace.startup(two, [base, done]) == 9.0
    # 22 s left for 2 layouts of 2 processes, each 9 s of start-up: boxes shrink to 1.9 s
    deadline = time.monotonic() + 22.0
    box = _box(two, [two, advise.Candidate("x", {}, 2)], [base, done, two], pace, deadline)
    assert box == pytest.approx(1.9, abs=0.05)
    assert _box(two, [two], [base, done, two], pace, time.monotonic() + 5.0) is None
    state = {"every_layout": True}
    _out_of_budget([base, done, two], pace, state, 0)
    assert state["every_layout"] is False and state["budget_needed_s"] % 10 == 0
    assert f"--budget {state['budget_needed_s']}s" in two.skip


def test_a_contender_s_figure_settles_once_two_probes_agree():
    c = _cand("a", 1, 5.0, 1.0, 100.0)
    assert not settled(c)
    c.speeds.append(96.0)
    assert settled(c)
    c.speeds = [100.0, 80.0]
    assert not settled(c)


def test_advise_says_how_its_last_check_on_this_host_did(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLSTUDY_ADVICE_CHECKS", str(tmp_path / "checks.jsonl"))
    assert last_check("u") is None
    assert "no advice check yet" in last_check_line("u")
    result = advise.check(_advice(("s", SEQ, 110.0, 400, 800), ("p", PROCS, 100.0, 500, 820),
                                  ("i", INTRA, 50.0, 400, 800)),
                          [_manifest("r1", SEQ, 100.0, 400, 800),
                           _manifest("r2", PROCS, 125.0, 400, 800),
                           _manifest("r3", INTRA, 40.0, 400, 800)])
    remember(result, {"usecase": "u"}, Path("a/advise.json"))
    line = last_check_line("u")
    assert "3 configuration(s), images/s off by 18% on average" in line
    assert "rank correlation 0.50" in line and "its first choice measured rank 2" in line
    assert "(of u)" in last_check_line("another")  # another use case's, said so


def test_ranked_by_time_to_target_the_check_compares_seconds_to_the_target():
    """An advice ranked by time to target (earlier runs gave convergence): each row's
    predicted seconds against the seconds its run took to reach the target; a run that
    never reached it has no error, and the first choice's place is not judged on it."""
    advice = _advice(("s", SEQ, 100.0, 400, 800), ("i", INTRA, 90.0, 400, 800)) | {
        "convergence": {"factor": {"baseline": 1.0}}}
    advice["ranking"][0]["time_to_target_s"] = 30.0
    advice["ranking"][1]["time_to_target_s"] = 40.0
    reached = _manifest("r1", SEQ, 100.0, 400, 800) | {
        "time_to_target": {"reached": True, "seconds": 24.0}}
    never = _manifest("r2", INTRA, 90.0, 400, 800) | {"time_to_target": {"reached": False}}
    result = advise.check(advice, [reached, never])
    assert result["criterion"] == "time to target (s)"
    by = {r["label"]: r for r in result["rows"]}
    assert by["s"]["error"] == pytest.approx(0.25) and by["s"]["measured"] == 24.0
    assert by["i"]["measured"] is None and by["i"]["error"] is None
    assert result["summary"]["mape"] == pytest.approx(0.25)
    assert result["summary"]["first_measured_rank"] == 1


def test_report_checks_any_folder_of_runs_against_an_advice(tmp_path, capsys, monkeypatch):
    """`report RUNS --advice advise.json --out DIR`: the runs of the folder that are rows of
    the advice (by their recorded configuration, not a study's cells) checked, written
    before the page, which opens with it."""
    from ddlstudy.cli import main

    monkeypatch.setenv("DDLSTUDY_ADVICE_CHECKS", str(tmp_path / "checks.jsonl"))
    runs = tmp_path / "runs"
    for run, flags, speed in (("r1", SEQ, 100.0), ("r2", INTRA, 150.0)):
        config = cell_config("tiny", flags | {"epochs": 3}, runs).to_dict()  # as run records
        m = _manifest(run, flags, speed, 400, 800, usecase="tiny") | {
            "started_at": run, "config": json.loads(json.dumps(config, default=str)),
            "strategy": {"name": flags["strategy"], "processes": 1, "threads_per_process": 1},
            "host": {"hostname": "h", "usable_cores": 2}}
        m["epochs"][0] |= {"epoch": 1, "train_loss": 1.0, "val_accuracy": 0.5,
                           "epoch_time_s": 1.0}
        (runs / run).mkdir(parents=True)
        (runs / run / "manifest.json").write_text(json.dumps(m))
    advice = tmp_path / "advise.json"
    advice.write_text(json.dumps(_advice(("i", INTRA, 120.0, 400, 800),
                                         ("s", SEQ, 100.0, 500, 800)) | {"usecase": "tiny"}))
    out = tmp_path / "report"
    assert main(["report", str(runs), "--advice", str(advice), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    check = json.loads((out / "advice-check.json").read_text())
    assert {r["label"]: round(r["error"], 3) for r in check["rows"]} == {"i": -0.2, "s": 0.0}
    assert check["summary"]["first_measured_rank"] == 1 and check["summary"]["confirmed"]
    assert "confirmed: the first choice measured 100% of the best" in printed
    assert (out / "advice-check.svg").is_file()
    assert "2 configuration(s)" in last_check_line("tiny")
