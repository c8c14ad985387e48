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
