"""A run stopped and continued, through the command line: a sharded run killed twice and
resumed twice, a run killed before its first snapshot, and a stop file (what a Slurm job's
batch shell creates when Slurm warns it before its time limit) that stops every rank at
one step with a snapshot. The faults are real: SIGKILL, a file that appears."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_faults import EPOCHS, _args, _identical, _manifest, ddlstudy, run_and_kill

from ddlstudy.records.runfolder import MANIFEST, SNAPSHOT
from ddlstudy.signals import STOP_ENV, STOPPED_CODE

SHARDED = ("--strategy", "sharded", "--workers", "2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, datasets_dir):
    """The sharded run of ``_args`` uninterrupted, once: its run folder."""
    runs = tmp_path_factory.mktemp("uninterrupted")
    assert ddlstudy(*_args(runs, datasets_dir, *SHARDED)) == 0
    (folder,) = runs.glob("*/")
    return folder


def _as_uninterrupted(folder, uninterrupted, resumes: int) -> list[dict]:
    """The run in ``folder`` resumed ``resumes`` times, ended bit for bit as the
    uninterrupted one: its resume records."""
    manifest = _manifest(folder)
    assert manifest["status"] == "completed" and len(manifest["resumed"]) == resumes
    assert [e["epoch"] for e in manifest["epochs"]] == list(range(1, EPOCHS + 1))
    assert _identical(folder, uninterrupted)
    assert [e["train_loss"] for e in manifest["epochs"]] == \
        [e["train_loss"] for e in _manifest(uninterrupted)["epochs"]]
    return manifest["resumed"]


@pytest.mark.slow
def test_a_sharded_run_killed_twice_resumes_from_its_snapshots(tmp_path, datasets_dir,
                                                               uninterrupted):
    """FSDP2's shards gathered into each snapshot: SIGKILL of the run after 2 epochs, of its
    resume after 4, and the second resume ends as the uninterrupted run."""
    runs = tmp_path / "runs"
    code, _, folder = run_and_kill(_args(runs, datasets_dir, *SHARDED), runs, "run")
    assert code == -signal.SIGKILL and len(_manifest(folder)["epochs"]) < 4
    code, _, again = run_and_kill(["run", "--resume", str(folder), "--quiet"], runs, "run",
                                  after_epochs=4)
    assert code == -signal.SIGKILL and again == folder
    assert _manifest(folder)["status"] == "running"  # killed: it could not say otherwise
    assert ddlstudy("run", "--resume", str(folder), "--quiet") == 0
    first, second = _as_uninterrupted(folder, uninterrupted, resumes=2)
    assert first["after"]["status"] == second["after"]["status"] == "running"
    assert 1 <= first["from_epoch"] < second["from_epoch"] < EPOCHS


def test_a_run_killed_before_its_first_snapshot_is_closed_when_resumed(tmp_path,
                                                                       datasets_dir, capsys):
    """Killed with an epoch on record and no snapshot (--no-snapshot; a kill between an
    epoch's record and its first snapshot leaves the same): --resume refuses in one line,
    and the run, whose process is gone, is failed from then on, not running for ever."""
    runs = tmp_path / "runs"
    args = ["run", "--usecase", "tiny", "--epochs", str(EPOCHS), "--max-steps", "5",
            "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs), "--sample-hz",
            "0", "--quiet", "--no-snapshot"]
    code, _, folder = run_and_kill(args, runs, "run", after_epochs=1)
    killed = _manifest(folder)
    assert code == -signal.SIGKILL and killed["status"] == "running" and killed["epochs"]
    for _ in range(2):  # the second time, it is failed already
        assert ddlstudy("run", "--resume", str(folder), "--quiet") == 2
        assert capsys.readouterr().err == (
            f"ddlstudy: error: {folder} has no snapshot.pt to resume from: it stopped before "
            "its first snapshot (--snapshot-every N snapshots inside long epochs); start the "
            "run again\n")
        closed = _manifest(folder)
        assert (closed["status"], closed["exit_code"]) == ("failed", 1)
        assert closed["error"] == f"its process (PID {killed['pid']}) ended without closing " \
            "the run (killed), before a snapshot it could be resumed from"
        assert closed["ended_at"] >= killed["started_at"] and \
            closed["epochs"] == killed["epochs"]


@pytest.mark.slow
def test_a_stop_file_stops_every_rank_at_one_step_with_its_snapshot(tmp_path, datasets_dir):
    """The file appears in the second epoch of a sharded run: every rank stops at the same
    step, the snapshot there written (a collective: both ranks' states), exit 75, the run
    interrupted. (A resume from it ends as an uninterrupted run: the warned cell of
    test_slurm, and a sharded snapshot above.)"""
    runs, stop = tmp_path / "runs", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "ddlstudy",
                             *_args(runs, datasets_dir, *SHARDED)],
                            env=os.environ | {STOP_ENV: str(stop)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while proc.poll() is None and not stop.exists():
        try:
            if len(json.loads(next(runs.glob(f"*/{MANIFEST}")).read_text())["epochs"]) >= 1:
                stop.touch()
        except (StopIteration, OSError, ValueError):
            pass
        assert time.monotonic() < deadline
        time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    (folder,) = runs.glob("*/")
    assert proc.returncode == STOPPED_CODE, err
    manifest = _manifest(folder)
    assert (manifest["status"], manifest["exit_code"]) == ("interrupted", STOPPED_CODE)
    assert manifest["error"] == f"stopped at a snapshot, as {STOP_ENV} asked; `ddlstudy run " \
        f"--resume {folder}` continues it"
    snap = torch.load(folder / SNAPSHOT, weights_only=True)
    assert snap["epoch"] == len(manifest["epochs"]) >= 1 and snap["step"] >= 1
    assert len(snap["rng"]) == 2  # both ranks' states, taken at that step
    assert [s["steps"] for s in snap["position"]["sums"]] == [snap["step"]] * 2
