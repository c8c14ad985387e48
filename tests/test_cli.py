"""Bad input: exit code 2, one clear sentence, no traceback, nothing written to runs/."""

import subprocess
import sys

import pytest

from ddlstudy.cli import main
from ddlstudy.report import speedup_table


@pytest.fixture
def cli(tmp_path, datasets_dir, capsys):
    runs = tmp_path / "runs"

    def call(*args, runs_dir=True):
        extra = ["--datasets-dir", str(datasets_dir)] + (["--runs-dir", str(runs)] if runs_dir
                                                          else [])
        argv = list(args) + (extra if args[0] == "run" else [])
        code = main(argv)
        err = capsys.readouterr().err
        return code, err, runs

    return call


@pytest.mark.parametrize("args, message", [
    (["run", "--strategy", "magic"], "unknown strategy 'magic'; choose one of: sequential"),
    (["run", "--usecase", "nope"], "unknown use case 'nope'; choose one of:"),
    (["run", "--usecase", "missing/file.toml"], "use-case file missing/file.toml does not"),
    (["run", "--epochs", "0"], "--epochs: must be a positive int"),
    (["run", "--batch-size", "-4"], "--batch-size: must be a positive int"),
    (["run", "--image-size", "32"], "--image-size: 32 px is too small for alexnet"),
    (["run", "--lr", "0"], "--lr: must be a positive float"),
    (["run", "--workers", "0"], "--workers: must be a positive"),
    (["run", "--on-bad-image", "ignore"], "unknown policy 'ignore'; choose one of: fail, skip"),
    (["run", "--sample-hz", "-1"], "--sample-hz: must be between 0"),
    (["run", "--max-steps", "0"], "--max-steps: must be a positive"),
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
    (["run", "--backend", "spark", "--strategy", "cpu-threads"], "cannot yet run inside Spark"),
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
    code, err, runs = cli("run", "--data-dir", str(imagefolder))
    assert code == 2 and "found 'Fire' instead" in err and not runs.exists()


def test_data_dir_trains_on_a_real_tree_and_skips_bad_images(cli, imagefolder):
    (imagefolder / "nofire" / "broken.jpg").write_bytes(b"")
    code, err, runs = cli("run", "--data-dir", str(imagefolder), "--epochs", "1",
                          "--on-bad-image", "skip", "--sample-hz", "0")
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
