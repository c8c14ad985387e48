"""Bad input: exit code 2, one clear sentence, no traceback, nothing written to runs/."""

import os
import subprocess
import sys

import pytest

from ddlstudy.report import config_label, speedup_table


@pytest.mark.parametrize("args, message", [
    (["run", "--strategy", "magic"], "unknown strategy 'magic'; choose one of: sequential"),
    (["run", "--usecase", "nope"], "unknown use case 'nope'; choose one of:"),
    (["run", "--usecase", "missing/file.toml"], "use-case file missing/file.toml does not"),
    (["run", "--epochs", "0"], "--epochs: must be a positive int"),
    (["run", "--batch-size", "-4"], "--batch-size: must be a positive int"),
    (["run", "--image-size", "32"], "train.image_size: 32 px is too small for alexnet; use "
                                    "at least 63"),
    (["run", "--lr", "0"], "--lr: must be a positive float"),
    (["run", "--workers", "0"], "--workers: must be a positive"),
    (["run", "--on-bad-image", "ignore"], "unknown policy 'ignore'; choose one of: fail, skip"),
    (["run", "--sample-hz", "-1"], "--sample-hz: must be between 0"),
    (["run", "--max-steps", "0"], "--max-steps: must be a positive"),
    (["run", "--warmup-steps", "0"], "--warmup-steps: must be a positive"),
    (["report", "--project", "32cores"], "--project: '32cores'; give CORES@LINK"),
    (["run", "--data-dir", "/no/such/dir"], "--data-dir: /no/such/dir is not a folder"),
    (["dataset", "make", "--usecase", "nope"], "unknown use case 'nope'"),
    (["run", "--strategy", "cpu-processes", "--workers", "4", "--batch-size", "2"],
     "--batch-size: 2 is smaller than the 4 processes"),
    (["run", "--strategy", "cpu-threads", "--workers", "3", "--batch-size", "2"],
     "--batch-size: 2 is smaller than the 3 replicas"),
    (["run", "--strategy", "pipeline", "--stages", "40"],
     "--stages: 40 stages but alexnet has only 22 layers"),
    (["run", "--strategy", "pipeline", "--stages", "1"], "a pipeline needs at least 2 stages"),
    (["run", "--strategy", "pipeline", "--micro-batches", "5"],
     "--micro-batches: the batch of 16 does not split into 1 replica(s) x 5"),
    (["run", "--strategy", "hybrid", "--replicas", "0"], "--replicas: must be a positive"),
    (["run", "--backend", "spark", "--strategy", "pipeline", "--stages", "2"],
     "a Spark barrier task is one process"),
    (["run", "--backend", "slurm"], "--backend: unknown backend 'slurm'; choose one of: local"),
    (["run", "--nodes", "2"], "--nodes: more than one node needs --backend mpi"),
    (["run", "--backend", "mpi", "--reduce", "gossip"], "unknown reducer 'gossip'"),
    (["run", "--backend", "mpi", "--nodes", "3", "--strategy", "pipeline", "--stages", "2"],
     "the batch of 16 does not split into 3 nodes x 1 replica(s) x 4 equal micro-batches"),
    (["run", "--stage-starts", "0,9"], "--stage-starts: cuts a pipeline into stages: "
     "sequential has none; it applies to --strategy pipeline or hybrid"),
    (["run", "--strategy", "pipeline", "--stage-starts", "0,x"],
     "--stage-starts: '0,x': give layer numbers separated by commas"),
    (["run", "--strategy", "pipeline", "--stage-starts", "3,9"],
     "--stage-starts: 3,9: give the first layer of each stage, starting at 0 and increasing"),
    (["run", "--strategy", "pipeline", "--stage-starts", "0,99"],
     "--stage-starts: the last stage starts at layer 99 but alexnet has layers 0 to 21"),
    (["run", "--strategy", "pipeline", "--stages", "3", "--stage-starts", "0,9"],
     "--stage-starts: 2 stages start there but --stages is 3"),
])
def test_bad_flags(cli, args, message):
    code, err, runs = cli(*args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and err.startswith("ddlstudy: error: ")
    assert not runs.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_gpu_strategy_without_gpu(cli):
    code, err, runs = cli("run", "--strategy", "gpu-data")
    assert code == 2 and "gpu-data needs CUDA GPUs and this machine has none" in err
    assert not runs.exists()


def test_malformed_toml(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[model\narch = 'alexnet'\n")
    code, err, runs = cli("run", "--usecase", str(bad))
    assert code == 2 and "is not valid TOML" in err and not runs.exists()


def test_bad_data_dir_is_refused_before_the_run_folder(cli, imagefolder):
    (imagefolder / "fire").rename(imagefolder / "Fire")
    code, err, runs = cli("run", "--usecase", "tiny", "--data-dir", str(imagefolder))
    assert code == 2 and "found 'Fire' instead" in err and not runs.exists()


def test_data_dir_trains_on_a_real_tree_and_skips_bad_images(cli, imagefolder):
    (imagefolder / "nofire" / "broken.jpg").write_bytes(b"")
    code, err, runs = cli("run", "--usecase", "tiny", "--data-dir", str(imagefolder),
                          "--epochs", "1", "--on-bad-image", "skip", "--sample-hz", "0")
    assert code == 0, err
    import json
    manifest = json.loads(next(runs.glob("*/manifest.json")).read_text())
    assert manifest["data"]["source"] == "imagefolder"
    assert manifest["data"]["skipped"] == [{"file": "nofire/broken.jpg", "reason": "empty file"}]
    assert manifest["data"]["images"] == 300


def test_errors_from_a_real_process_have_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "run", "--strategy", "nope",
                          "--runs-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "unknown strategy 'nope'" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_report_speedup_against_the_baseline():
    def manifest(strategy, rate, threads=1, status="completed", epoch_s=10.0, nodes=0):
        backend = {"name": "mpi", "nodes": nodes, "reduce": "allreduce"} if nodes else {}
        return {"usecase": "u", "status": status, "started_at": "t", "backend": backend,
                "strategy": {"name": strategy, "processes": 1, "threads_per_process": threads},
                "epochs": [{"steady_images_per_s": rate, "epoch_time_s": epoch_s,
                            "val_accuracy": 0.8}]}

    table = speedup_table([manifest("sequential", 20.0), manifest("sequential", 30.0),
                           manifest("cpu-intraop", 50.0, threads=2),
                           manifest("cpu-intraop", 0, threads=2, status="failed"),
                           manifest("sequential", 40.0, nodes=2)])  # not the baseline
    assert set(table.scaling) == {"strong"}  # the tables say how the batch was scaled
    mpi = table[table.backend == "mpi"].iloc[0]
    assert mpi["speedup"] == pytest.approx(1.6) and mpi["cores"] == 2
    assert mpi["config"] == "mpi 2 nodes, allreduce: sequential"
    theirs = manifest("sequential", 40.0, nodes=2) | {"launch": {"launcher": "your mpiexec"}}
    assert config_label(theirs) == "mpi 2 nodes, allreduce, under your mpiexec: sequential"
    rows = table[table.backend == "local"].set_index("strategy")
    assert rows.loc["sequential", "speedup"] == pytest.approx(1.0)
    assert rows.loc["sequential", "images_per_s"] == pytest.approx(25.0)  # median of 20, 30
    assert rows.loc["cpu-intraop", "speedup"] == pytest.approx(2.0)
    assert rows.loc["cpu-intraop", "efficiency"] == pytest.approx(1.0)
    assert rows.loc["cpu-intraop", "status"] == "1 failed"


def test_mpi_backend_without_mpiexec(cli, monkeypatch):
    from ddlstudy.backends.mpi import launch as mpi

    monkeypatch.setattr(mpi, "find_mpiexec", lambda: None)  # as on a machine without MPI
    code, err, runs = cli("run", "--backend", "mpi", "--nodes", "2")
    assert code == 2 and "mpi needs mpiexec, which was not found; pip install mpich" in err
    assert not runs.exists()


def test_report_keeps_runs_of_other_settings_apart():
    """A 1-epoch and a 2-epoch run beside 5-epoch ones (as a user's trials inside
    runs/demo were): not repeats of the 5-epoch cells, not divided by their baseline."""
    from ddlstudy.report.tables import left_apart, only_main, paper_tables

    def manifest(strategy, rate, epochs=5, threads=1, host="a"):
        return {"usecase": "u", "status": "completed", "started_at": "t", "backend": {},
                "host": {"hostname": host}, "data": {"fingerprint": "f" * 64},
                "config": {"usecase": {"train": {"epochs": epochs, "batch_size": 16,
                                                 "image_size": 64}}},
                "strategy": {"name": strategy, "processes": 1, "threads_per_process": threads},
                "epochs": [{"steady_images_per_s": rate, "epoch_time_s": 1.0,
                            "val_accuracy": 0.5}]}

    table = speedup_table([manifest("sequential", 20.0), manifest("sequential", 20.0),
                           manifest("cpu-intraop", 40.0, threads=2),
                           manifest("cpu-intraop", 30.0, threads=2),
                           manifest("cpu-intraop", 1000.0, epochs=1, threads=2),
                           manifest("sequential", 10.0, epochs=2),
                           manifest("cpu-intraop", 25.0, epochs=2, threads=2),
                           manifest("sequential", 5.0, host="b")])
    assert len(table) == 6  # 2 rows of the main setting, 2 of 2 epochs, 1 of 1, 1 on b
    main = only_main(table).set_index("strategy")
    assert main.loc["sequential", "runs"] == 2 and main.loc["cpu-intraop", "runs"] == 2
    assert main.loc["cpu-intraop", "speedup"] == pytest.approx(1.75)  # 35 / 20, not 1000
    two = table[table.setting.str.startswith("2 epochs")].set_index("strategy")
    assert two.loc["cpu-intraop", "speedup"] == pytest.approx(2.5)  # its own baseline: 10
    one = table[table.setting.str.startswith("1 epochs")].iloc[0]
    assert one.speedup != one.speedup  # NaN: no 1-epoch baseline to divide by
    notes = left_apart(table)
    assert len(notes) == 3 and all(n.startswith("u: ") for n in notes)
    assert sum("no sequential baseline of its own" in n for n in notes) == 1
    assert any("host b" in n for n in notes)
    (paper,) = paper_tables(table).values()
    assert list(paper.configuration) == ["sequential", "cpu-intraop (2 threads)"]


def test_a_noisy_run_is_left_out_of_speedups_unless_asked():
    def manifest(strategy, rate, threads=1, noisy=False):
        return {"usecase": "u", "status": "completed", "started_at": "t", "backend": {},
                "host_load": {"noisy": noisy},
                "strategy": {"name": strategy, "processes": 1, "threads_per_process": threads},
                "epochs": [{"steady_images_per_s": rate, "epoch_time_s": 1.0,
                            "val_accuracy": 0.5}]}

    runs = [manifest("sequential", 20.0), manifest("sequential", 5.0, noisy=True),
            manifest("cpu-intraop", 40.0, threads=2),
            manifest("cpu-intraop", 8.0, threads=2, noisy=True)]
    table = speedup_table(runs).set_index("strategy")
    assert table.loc["sequential", "images_per_s"] == pytest.approx(20.0)
    assert table.loc["cpu-intraop", "speedup"] == pytest.approx(2.0)
    assert table.loc["cpu-intraop", "runs"] == 1
    assert table.loc["cpu-intraop", "status"] == "ok, 1 noisy left out"
    every = speedup_table(runs, include_noisy=True).set_index("strategy")
    assert every.loc["sequential", "images_per_s"] == pytest.approx(12.5)
    assert every.loc["cpu-intraop", "runs"] == 2 and every.loc["cpu-intraop", "status"] == "ok"


def test_speedups_carry_a_95_percent_interval():
    """Over repeats (or, with one repeat, over its epochs); an interval that includes 1.0
    says so: the configuration cannot be told from the baseline."""
    from ddlstudy.report.tables import interval

    def manifest(strategy, rates, threads=1):
        return {"usecase": "u", "status": "completed", "started_at": "t", "backend": {},
                "strategy": {"name": strategy, "processes": 1, "threads_per_process": threads},
                "epochs": [{"steady_images_per_s": r, "epoch_time_s": 1.0, "val_accuracy": 0.5}
                           for r in rates]}

    runs = [*(manifest("sequential", [r]) for r in (19.0, 20.0, 21.0, 20.0)),
            *(manifest("cpu-intraop", [r], threads=2) for r in (39.0, 40.0, 41.0)),
            *(manifest("cpu-threads", [r], threads=2) for r in (18.0, 21.0, 20.5)),
            manifest("cpu-processes", [60.0, 62.0, 58.0], threads=1)]
    table = speedup_table(runs).set_index("strategy")
    low, high = (float(x) for x in table.loc["cpu-intraop", "speedup_95"].split("-"))
    assert 1.8 <= low < 2.0 < high <= 2.2
    assert table.loc["cpu-threads", "speedup_95"].endswith("(includes 1)")
    assert table.loc["sequential", "speedup_95"].endswith("(includes 1)")
    low, high = (float(x) for x in table.loc["cpu-processes", "speedup_95"].split("-"))
    assert 2.7 <= low < 3.0 < high <= 3.3  # one run: its three epochs
    assert interval([5.0]) is None and interval([5.0, 6.0], [1.0]) is None
    assert interval([2.0, 2.0, 2.0], [1.0, 1.0]) == (2.0, 2.0)


def test_compare_never_calls_runs_with_other_losses_identical_without_a_reason():
    from ddlstudy.records.manifests import compare

    def manifest(loss, threads="1"):
        return {"id": "x", "status": "completed", "config": {"lr": 0.01},
                "launch": {"launcher": "plain", "env": {"OMP_NUM_THREADS": threads}},
                "epochs": [{"train_loss": loss, "val_loss": 1.0, "val_accuracy": 0.5}]}

    text = compare(manifest(1.0), manifest(1.5, threads="2"))
    assert "config: identical" in text and "launch: 1 differ" in text
    assert "the losses differ, and so do: launch (env.OMP_NUM_THREADS)" in text
    text = compare(manifest(1.0), manifest(1.5))
    assert "nothing recorded differs, so the run itself is not bit-reproducible" in text
    assert "the losses differ" not in compare(manifest(1.0), manifest(1.0))


def test_log_lines_go_to_stderr_as_it_is_now(capsys, monkeypatch):
    """Logging set up while a test captured stderr keeps working once that capture has
    closed (CI printed "I/O operation on closed file" for every later run's lines)."""
    import io

    from ddlstudy.logs import log, setup_logging

    swapped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", swapped)
    setup_logging()
    log.info("while swapped")
    swapped.close()
    monkeypatch.undo()
    log.info("after it closed")
    err = capsys.readouterr().err
    assert "after it closed" in err and "Logging error" not in err


def test_progress_lines_of_a_slow_loop_say_seconds_per_step_and_time_left(monkeypatch,
                                                                         caplog):
    """A VGG16 batch takes 23 s on 2 cores: the line says so, not '0.0 batch/s'; a resumed
    loop's rate counts only the steps it took."""
    import itertools
    import logging

    from ddlstudy import progress as p

    clock = itertools.count(0.0, 23.0)  # every perf_counter call is 23 s later
    monkeypatch.setattr(p.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(p, "on_terminal", lambda: False)
    with caplog.at_level(logging.INFO, logger="ddlstudy"):
        assert list(p.progress(range(20), total=20, desc="epoch 1", unit="batch")) == list(
            range(20))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "epoch 1: 2/20 batch (23.0 s/batch, 6.9 min left)"
    assert p.pace(50, 4.0, 50, "batch") == "12.5 batch/s, 4 s left"
    assert p.pace(0, 0.0, 20, "batch") == "starting"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ddlstudy"):
        list(p.progress(range(10), total=20, desc="epoch 2", unit="batch", initial=10))
    assert caplog.records[0].getMessage().startswith("epoch 2: 12/20 batch (23.0 s/batch")


def test_every_command_sets_torchs_huge_pages_and_the_manifest_records_it(monkeypatch, capsys):
    """Set by the command before torch's first allocation (inherited by every process a run
    starts, so every strategy and the baseline alike); a value of the user's is kept."""
    from ddlstudy.cli import main
    from ddlstudy.machine.environment import HUGE_PAGES, launch

    monkeypatch.delenv(HUGE_PAGES, raising=False)
    assert main(["strategies"]) == 0
    assert os.environ[HUGE_PAGES] == "1"
    monkeypatch.setenv(HUGE_PAGES, "0")
    assert main(["strategies"]) == 0
    assert os.environ[HUGE_PAGES] == "0"
    assert launch(1, {"launcher": "plain"})["env"][HUGE_PAGES] == "0"
