"""ddlstudy as its users install and start it: a wheel on its own, the help, the launchers
of other tools (srun), a hostfile, flags that would be ignored."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from ddlstudy.cli import build_parser, main
from ddlstudy.config import REPO_ROOT, RunConfig
from ddlstudy.config.mpi import read_hostfile
from ddlstudy.errors import ConfigError
from ddlstudy.runner import preflight


@pytest.mark.slow
def test_the_wheel_works_on_its_own(tmp_path):
    """Built, installed into a fresh venv outside the checkout (torch and the others are
    borrowed from this venv's site-packages, where the checkout's editable hook is not
    run), it finds its use cases in the package and writes runs/ and datasets/ under the
    working directory."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(REPO_ROOT)], check=True, capture_output=True)
    wheel, = dist.glob("ddlstudy-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDLSTUDY_HOME")}
    where = subprocess.run([str(python), "-c", "import ddlstudy; print(ddlstudy.__file__)"],
                           cwd=work, env=env, check=True, capture_output=True, text=True)
    assert where.stdout.startswith(site)  # the wheel's copy, not the checkout
    out = subprocess.run([str(venv / "bin" / "ddlstudy"), "run", "--usecase", "tiny",
                          "--epochs", "1", "--sample-hz", "0", "--quiet"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    manifest, = (work / "runs").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["status"] == "completed"
    assert (work / "datasets" / "synthetic-tiny").is_dir()
    listed = subprocess.run([str(venv / "bin" / "ddlstudy"), "study", "demo", "--help"],
                            cwd=work, env=env, capture_output=True, text=True)
    assert listed.returncode == 0


def _actions(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield " ".join(path), action


def test_every_option_says_its_choices_or_its_default():
    missing = []
    for command, a in _actions(build_parser()):
        help = a.help or ""
        shown = (a.nargs == 0 or not a.option_strings or a.required or a.choices
                 or "{" in str(a.metavar or "") or "default" in help)
        if not help or not shown:
            missing.append(f"{command} {a.option_strings or a.dest}")
    assert missing == []


def test_strategies_answers_without_importing_torch():
    # nor does ddlstudy.machine.sparkjvm: the CLI starts a Spark run's JVM from it before torch
    code = ("import sys; import ddlstudy.machine.sparkjvm; from ddlstudy.cli import main; "
            "main(['strategies']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("sequential")
    assert len([line for line in out.stdout.splitlines() if not line.startswith(" ")]) == 10
    print(f"ddlstudy strategies: {time.perf_counter() - start:.2f} s")


@pytest.mark.parametrize(("flags", "message"), [
    (["--workers", "2"], "--workers: sets the replicas, processes or threads: sequential has "
                         "none; it applies to --strategy cpu-intraop or cpu-threads or "
                         "cpu-processes"),
    (["--strategy", "pipeline", "--workers", "2"], "--workers: "),
    (["--strategy", "cpu-processes", "--stages", "2"], "--stages: sets the pipeline stages"),
    (["--strategy", "pipeline", "--replicas", "3"], "--replicas: sets the pipelines of a "
                                                    "hybrid: pipeline has none"),
    (["--strategy", "cpu-threads", "--devices", "1"], "--devices: "),
])
def test_a_layout_flag_the_strategy_does_not_read_is_refused(flags, message, tmp_path, capsys):
    assert main(["run", "--runs-dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_resume_with_other_flags_is_refused(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path), "--epochs", "3"]) == 2
    assert "--resume: continues a run with its recorded configuration, so --epochs would " \
           "be ignored" in capsys.readouterr().err


def test_srun_tasks_outside_mpi_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert main(["run", "--runs-dir", str(tmp_path), "--epochs", "1"]) == 2
    assert "started by srun as task 1 of 2 with --backend local: that would be 2 unrelated " \
           "runs" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    # With --backend mpi but no PMI (srun without --mpi=pmi2): no MPI world to join.
    assert main(["run", "--runs-dir", str(tmp_path), "--backend", "mpi"]) == 2
    assert "srun --mpi=pmi2" in capsys.readouterr().err


def test_srun_with_pmi2_joins_as_an_mpi_world(monkeypatch):
    from ddlstudy.backends.mpi import launch

    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert not launch.under_mpiexec() and launch.launcher_world() == 1
    monkeypatch.setenv("PMI_FD", "5")  # what srun --mpi=pmi2 gives each task
    assert launch.under_mpiexec() and launch.launcher_world() == 4


def test_nodes_that_disagree_with_your_own_mpiexec_are_refused(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    cfg = RunConfig(usecase=tiny, backend="mpi", nodes=3, runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="--nodes: 3 nodes asked, but the mpiexec this runs "
                                          "under started 2 ranks"):
        preflight(cfg)


def test_a_hostfile_in_either_mpiexec_format(tmp_path, tiny):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the cluster\nnode-a:2\nnode-b slots=3   # big one\n\nnode-c\n")
    assert read_hostfile(hosts) == [("node-a", 2), ("node-b", 3), ("node-c", 1)]
    cfg = RunConfig(usecase=tiny, backend="mpi", hostfile=hosts)
    assert cfg.nodes == 6  # the slots, unless --nodes says otherwise
    from ddlstudy.backends.mpi.launch import placement

    assert placement(None, 6, cfg.hostfile) == (["-hosts", "node-a:2,node-b:3,node-c:1"], {})
    for text, why in [("node-a:x\n", "line 1"), ("", "lists no host"),
                      ("bad;name\n", "is not host")]:
        hosts.write_text(text)
        with pytest.raises(ConfigError, match=why):
            RunConfig(usecase=tiny, backend="mpi", hostfile=hosts)
    with pytest.raises(ConfigError, match="--hostfile: host file .* does not exist"):
        RunConfig(usecase=tiny, backend="mpi", hostfile=tmp_path / "missing")
    with pytest.raises(ConfigError, match="needs --backend mpi"):
        RunConfig(usecase=tiny, hostfile=hosts)


def test_hosts_with_characters_no_host_name_has_are_refused(tiny):
    with pytest.raises(ConfigError, match="--hosts"):
        RunConfig(usecase=tiny, backend="mpi", nodes=2, hosts="a,b;rm -rf")


def test_export_tensorboard_is_read_back_by_tensorboard(quick_config, tmp_path, capsys):
    """Per-epoch metrics and resource samples, read back with TensorBoard's own reader;
    --tensorboard writes the same beside the run when it ends."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ddlstudy.runner import run

    folder = run(quick_config(epochs=2, max_steps=3, sample_hz=20, tensorboard=True),
                 show_progress=False)
    metrics = folder.path / "metrics.csv"
    losses = [float(line.split(",")[1]) for line in metrics.read_text().splitlines()[1:]]
    out = tmp_path / "tb"
    assert main(["export", "tensorboard", str(folder.path.parent), "--out", str(out)]) == 0
    assert "1 run(s) written" in capsys.readouterr().out
    for logdir in (out / folder.path.name, folder.path / "tensorboard"):
        events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        loss = events.Scalars("epoch/train_loss")
        assert [e.step for e in loss] == [1, 2]
        assert [e.value for e in loss] == pytest.approx(losses, rel=1e-6)
        cpu = events.Scalars("resources/node-rank0/proc_cpu_percent")
        assert len(cpu) >= 2 and all(e.value >= 0 for e in cpu)
        assert [e.step for e in cpu] == sorted(e.step for e in cpu)
        assert "resources/node-rank0/gpu_util_percent" not in tags  # no GPU: no NaN series
        # Per step too (step = the global step): 3 steps in each of the 2 epochs.
        steps = events.Scalars("step/train_loss")
        assert [e.step for e in steps] == [1, 2, 3, 4, 5, 6]
        rates = events.Scalars("step/images_per_s_rank0")
        assert len(rates) == 6 and all(e.value > 0 for e in rates)
    rows = (folder.path / "steps.csv").read_text().splitlines()
    assert rows[0] == "global_step,epoch,step,train_loss,images,seconds,images_per_s"
    assert [r.split(",")[1:3] for r in rows[1:]] == [["1", "1"], ["1", "2"], ["1", "3"],
                                                     ["2", "1"], ["2", "2"], ["2", "3"]]
    # The epoch's loss is the mean of its steps' (each step's mean over 16 images).
    first = [float(r.split(",")[3]) for r in rows[1:4]]
    assert sum(first) / 3 == pytest.approx(losses[0], rel=1e-6)
    assert main(["export", "tensorboard", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "is not a run folder or a folder of runs" in capsys.readouterr().err


def test_export_tensorboard_refuses_what_an_event_file_cannot_hold(quick_config, tmp_path,
                                                                    capsys):
    """A step or a time an event file cannot hold (an edited metrics.csv's epoch 10**20)
    is refused naming the file before any event is written; --out the runs folder itself
    would write into the run folders, and is refused too."""
    import shutil

    from ddlstudy.runner import run

    folder = run(quick_config(max_steps=2), show_progress=False)
    runs = tmp_path / "copied"
    shutil.copytree(folder.path, runs / folder.path.name)
    metrics = runs / folder.path.name / "metrics.csv"
    lines = metrics.read_text().splitlines()
    lines[1] = "100000000000000000000," + lines[1].split(",", 1)[1]
    metrics.write_text("\n".join(lines) + "\n")
    out = tmp_path / "tb"
    assert main(["export", "tensorboard", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{metrics}: epoch/" in err and "which an event file cannot hold" in err, err
    assert not any(out.rglob("events.out.tfevents.*"))
    shutil.copy(folder.path / "metrics.csv", metrics)
    assert main(["export", "tensorboard", str(runs), "--out", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"{runs / folder.path.name} is a run folder" in err, err
    assert not any(runs.rglob("events.out.tfevents.*"))


def test_steps_are_appended_and_cut_back_with_the_epochs_on_resume(tmp_path):
    """steps.csv grows by each epoch's rows (a long run does not rewrite its past), and a
    resume that cuts the epochs back cuts their steps and numbers on from there."""
    from ddlstudy.records.runfolder import RunFolder

    folder = RunFolder.create(tmp_path, "r1", {})
    folder.record_steps([(1, 1, 0.9, 16, 0.1), (1, 2, 0.8, 16, 0.1)])
    size = (folder.path / "steps.csv").stat().st_size
    folder.record_steps([(2, 1, 0.7, 16, 0.2)])
    text = (folder.path / "steps.csv").read_text()
    assert len(text.encode()) > size and text.count("global_step") == 1
    assert [r.split(",")[:3] for r in text.splitlines()[1:]] == [
        ["1", "1", "1"], ["2", "1", "2"], ["3", "2", "1"]]
    again = RunFolder(folder.path, dict(folder.manifest))  # a resume cuts epoch 2, reruns it
    again.manifest["epochs"] = [{"epoch": 1}]
    again.rewrite_epochs()
    again.record_steps([(2, 1, 0.6, 16, 0.2)])
    rows = (folder.path / "steps.csv").read_text().splitlines()[1:]
    assert [r.split(",")[:3] for r in rows] == [["1", "1", "1"], ["2", "1", "2"],
                                                ["3", "2", "1"]]
    assert rows[-1].split(",")[3] == "0.6"


def test_the_run_folder_tells_every_watcher_and_one_that_fails_does_not_fail_the_run(
        tmp_path, monkeypatch, caplog):
    """ddlstudy's MLflow watcher is found through its own entry point (the run folder never
    imports it); a plugin's watcher is told opened / each epoch / closed with the manifest,
    what it notes is written, and one that raises is named in a warning, nothing lost."""
    from ddlstudy.exports.mlflow.live import WATCHER
    from ddlstudy.records.runfolder import RunFolder
    from ddlstudy.watchers import WATCHERS, Watcher

    assert WATCHERS.loaded()["mlflow"] is WATCHER
    heard = []

    class Noting(Watcher):
        name, summary = "noting", "notes what it is told"

        def opened(self, manifest, folder):
            heard.append(("opened", folder.name))
            manifest["noting"] = {"seen": True}

        def epoch(self, manifest, record):
            heard.append(("epoch", record["epoch"], record["elapsed_s"]))

        def closed(self, manifest):
            heard.append(("closed", manifest["status"]))

    class Failing(Watcher):
        name, summary = "failing", "fails at every turn"

        def epoch(self, manifest, record):
            raise RuntimeError("its server is down")

    monkeypatch.setitem(WATCHERS, "noting", Noting())
    monkeypatch.setitem(WATCHERS, "failing", Failing())
    folder = RunFolder.create(tmp_path, "r1", {"config": {}})
    for epoch in (1, 2):
        folder.record_epoch({"epoch": epoch, "epoch_time_s": 1.5, "train_loss": 0.5})
    folder.finish("completed", 0)
    assert heard == [("opened", "r1"), ("epoch", 1, 1.5), ("epoch", 2, 3.0),
                     ("closed", "completed")]
    written = json.loads((folder.path / "manifest.json").read_text())
    assert written["noting"] == {"seen": True} and written["status"] == "completed"
    assert [e["epoch"] for e in written["epochs"]] == [1, 2] and "mlflow" not in written
    failed = [r.getMessage() for r in caplog.records if "watcher failing" in r.getMessage()]
    assert len(failed) == 2 and "its server is down" in failed[0], failed
    monkeypatch.delitem(WATCHERS, "mlflow")  # a process whose metadata lacks ddlstudy's own
    asked = RunFolder.create(tmp_path, "r2", {"config": {"mlflow": "sqlite:///x.db"}})
    asked.record_epoch({"epoch": 1, "epoch_time_s": 1.0})
    assert "mlflow watcher is not registered" in asked.manifest["mlflow"]["error"]
    assert sum("asked for mlflow" in r.getMessage() for r in caplog.records) == 1  # once


@pytest.mark.slow
def test_a_hostfile_places_real_mpi_ranks(tmp_path, datasets_dir):
    """mpiexec started by ddlstudy with the hostfile's hosts and slots (localhost:2 forks
    both ranks here); --nodes came from the slots."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2\n")
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "run", "--usecase", "tiny",
                          "--backend", "mpi", "--hostfile", str(hosts), "--epochs", "1",
                          "--max-steps", "2", "--sample-hz", "0", "--no-snapshot",
                          "--datasets-dir", str(datasets_dir), "--runs-dir",
                          str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "-hosts localhost:2 -n 2" in out.stderr
    manifest = json.loads(next((tmp_path / "runs").glob("*/manifest.json")).read_text())
    assert manifest["status"] == "completed" and manifest["backend"]["nodes"] == 2
    assert len(manifest["backend"]["pids"]) == 2
