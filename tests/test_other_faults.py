"""Issue 64's other classes, through the real command line: two runs given one run id at
once, a study cell whose model factory never returns, and a full disk under `report
--out`, `run --mlflow` and `dataset make` (refused in one line or cleaned up: nothing
half-written stays)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_safety import _fill, cli, small_disk  # noqa: F401 - a fixture (a 1 MiB tmpfs)

from ddlstudy.cli import main
from ddlstudy.records.runfolder import MANIFEST

QUICK = ("--usecase", "tiny", "--epochs", "1", "--max-steps", "2", "--no-snapshot",
         "--sample-hz", "0", "--quiet")


def _start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddlstudy", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=os.environ | (env or {}))


@pytest.mark.slow
def test_two_launches_given_one_run_id_at_once_one_runs_the_other_is_refused(
        tmp_path, datasets_dir):
    """Two `--backend mpi --nodes 2` runs started together with one DDLSTUDY_RUN_ID: the
    launcher claims the run folder for its ranks, so the second is refused in one line
    before its ranks start (before: its rank 0 was refused while rank 1 waited for ever,
    and its launcher would have closed the other run's folder as failed); the first
    completes, its folder whole."""
    runs = tmp_path / "runs"
    flags = ("run", *QUICK, "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
             "--backend", "mpi", "--nodes", "2")
    started = [_start(*flags, env={"DDLSTUDY_RUN_ID": "same"}) for _ in range(2)]
    ended = [(p.communicate(timeout=600)[1], p.returncode) for p in started]
    assert sorted(code for _, code in ended) == [0, 2], ended
    refused = next(err for err, code in ended if code == 2)
    lines = [line for line in refused.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in refused, refused
    assert f"{runs / 'same'} already exists; a new run needs a run id of its own" in lines[0]
    manifest = json.loads((runs / "same" / MANIFEST).read_text())
    assert manifest["status"] == "completed" and manifest["backend"]["nodes"] == 2
    assert not [p.name for p in (runs / "same").iterdir() if p.name.startswith(".")]


MODELS = Path(__file__).parent / "models" / "own_net.py"


@pytest.fixture
def hold(tmp_path, monkeypatch):
    """While the file exists, own_net's swallows_every_exception does not return (its
    threads end when the test does)."""
    held = tmp_path / "hold"
    held.touch()
    monkeypatch.setenv("HOLD_FILE", str(held))
    yield held
    held.unlink()


def test_a_model_that_never_returns_and_swallows_every_exception_is_given_up(
        hold, tmp_path, capsys, monkeypatch):
    """A factory that swallows the set-up limit's exception (before: a study waited for it
    for ever, silently) is built in a thread of its own, and the wait for it ends: a
    study's cell fails with the limit's reason, naming the cell, before any cell runs;
    its run, under a study's limit or alone (``BUILD_LIMIT_S``), is refused in one line."""
    from ddlstudy.models import sources
    from ddlstudy.records.plan import load_plan
    from ddlstudy.signals import SETUP_TIMEOUT_ENV
    from ddlstudy.study.matrix import expand

    plan = tmp_path / "plan.toml"
    plan.write_text(f"[study]\nusecases = ['tiny']\nrepeat = 1\nsetup_timeout_s = 2\n"
                    f"[[cells]]\nstrategy = 'sequential'\n"
                    f"model = '{MODELS}:swallows_every_exception'\n")
    cells = expand(load_plan(plan, runs_dir=tmp_path / "runs"), {})
    (hung,) = [c for c in cells if "swallows" in c.flags.get("model", "")]
    assert hung.status == "failed" and hung.reason == (
        "the set-up of sequential on tiny took longer than 2 s (the set-up time limit); "
        "setup_timeout_s in the plan's [study] sets the limit")
    model = ["run", "--usecase", "tiny", "--runs-dir", str(tmp_path / "runs"),
             "--model", f"{MODELS}:swallows_every_exception"]
    monkeypatch.setenv(SETUP_TIMEOUT_ENV, "2")  # a study's cell's run
    assert main(model) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the run's set-up took longer than 2 s" in err, err
    monkeypatch.delenv(SETUP_TIMEOUT_ENV)
    monkeypatch.setattr(sources, "BUILD_LIMIT_S", 1.0)  # a run alone
    assert main(model) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "swallows_every_exception(num_classes=3) has not " \
        "returned after 1 s" in err, err
    assert not (tmp_path / "runs").exists()


def _invariant_run_folders(runs: Path) -> list[str]:
    """What a full disk left of the run folders under ``runs`` that no run may leave: a
    temporary or empty file, a manifest that is not whole, or one that says the run is
    still running without an epoch recorded (a folder that records nothing)."""
    wrong = [str(p) for p in runs.rglob("*") if ".tmp-" in p.name or
             (p.is_file() and p.stat().st_size == 0)]
    for folder in (p for p in runs.glob("*/") if p.is_dir()):
        try:
            m = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            wrong.append(f"{folder.name}: no whole manifest")
            continue
        if m["status"] == "running" and not m["epochs"]:
            wrong.append(f"{folder.name}: running, no epoch")
    return wrong


@pytest.mark.parametrize("room", [60_000, 150_000])
def test_a_run_that_fills_the_disk_leaves_a_whole_record_or_none(room, request, datasets_dir):
    """`run --mlflow` on a disk with a little room (its store, the manifest, one epoch):
    the run ends in one line naming the full disk, and its folder is either gone (it had
    recorded nothing: before, a folder recorded as running, no epoch, its metrics.csv
    holding one) or whole: its manifest with its epochs, never a temporary file."""
    disk = request.getfixturevalue("small_disk")
    _fill(disk, leave=room)
    runs = disk / "runs"
    ended = cli("run", *QUICK, "--datasets-dir", str(datasets_dir), "--mlflow", "--runs-dir",
                str(runs))  # a process of its own: MLflow's store stays open in its client
    code, last = ended.returncode, ended.stderr.strip().splitlines()[-1]
    assert code in (1, 2) and "No space left on device" in last, ended.stderr[-2000:]
    assert _invariant_run_folders(runs) == []
    if code == 2:
        assert "free some space, then run it again" in last and "Traceback" not in last


def test_a_data_set_that_fills_the_disk_is_said_in_one_line_and_left_out(request, capsys):
    """`dataset make` onto a disk with room for part of the set: one line naming the set,
    the disk and how far it got; nothing of it stays (its images were made in a hidden
    folder beside it)."""
    disk = request.getfixturevalue("small_disk")
    _fill(disk, leave=400_000)
    assert main(["dataset", "make", "--usecase", "tiny", "--out",
                 str(disk / "sets" / "tiny")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{disk / 'sets' / 'tiny'}: the disk is full (No space left on device) " \
        "after " in err and " of 300 images; nothing of the set is left there" in err, err
    assert [p.name for p in disk.iterdir()] == ["filler"]
