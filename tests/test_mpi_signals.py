"""How an MPI run ends when it is stopped: a SIGTERM or SIGINT to `ddlstudy run --backend
mpi` reaches the ranks, which record the run interrupted; a killed rank fails it; either
way MPICH's /dev/shm segment and hydra's /tmp file of the run are removed, and nobody
else's. A refused --resume or rank count is said once, before any rank starts."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ddlstudy.records.runfolder import MANIFEST, SNAPSHOT

DEADLINE_S = 300.0
"""Generous: a busy 2-core host takes seconds to start ranks that import torch."""

RUN_FILES = ("/dev/shm/mpich_shm_", "/tmp/hydra_hwloc_xmlfile_")


def _run_files(root: int) -> set[str]:
    """MPICH's segments and hydra's topology files that ``root``'s process tree holds open,
    read from /proc here (not through ddlstudy's own watcher)."""
    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        return set()
    found = set()
    for proc in tree:
        try:
            fds = list(Path(f"/proc/{proc.pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(RUN_FILES):
                found.add(target)
    return found


def _start(runs: Path, datasets_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddlstudy", "run", "--usecase", "tiny",
                             "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
                             "--backend", "mpi", "--nodes", "2", "--epochs", "500",
                             "--no-snapshot", "--sample-hz", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _manifest(runs: Path) -> dict:
    return json.loads(next(runs.glob(f"*/{MANIFEST}")).read_text())


def _training(proc: subprocess.Popen, runs: Path) -> set[str]:
    """Wait until rank 0 has recorded an epoch of a running run and the run's shared
    segment and topology file are seen; returns those files."""
    held: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and proc.poll() is None:
        held |= _run_files(proc.pid)
        manifests = list(runs.glob(f"*/{MANIFEST}"))
        started = manifests and _manifest(runs)["status"] == "running" and \
            list(runs.glob("*/metrics.csv"))
        if started and {f for f in held if f.startswith(RUN_FILES[0])} and \
                {f for f in held if f.startswith(RUN_FILES[1])}:
            return held
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the run did not start training: {proc.communicate()[0][-3000:]}")


def _ended(pids: list[int]) -> bool:
    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    return all(gone(pid) for pid in pids)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, error", [
    (signal.SIGTERM, 143, "terminated by SIGTERM"),
    (signal.SIGINT, 130, "interrupted by SIGINT (Ctrl-C)"),
])
def test_a_signal_to_the_launcher_interrupts_the_ranks_and_leaves_nothing(
        tmp_path, datasets_dir, signum, code, error):
    runs = tmp_path / "runs"
    proc = _start(runs, datasets_dir)
    held = _training(proc, runs)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == code, out[-3000:]
    manifest = _manifest(runs)
    assert (manifest["status"], manifest["exit_code"], manifest["error"]) == \
        ("interrupted", code, error)
    assert 1 <= len(manifest["epochs"]) < 500
    assert _ended(manifest["backend"]["pids"])
    assert sorted(f for f in held if os.path.exists(f)) == []
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_a_killed_rank_0_fails_the_run_and_leaves_nothing(tmp_path, datasets_dir):
    """Rank 0 cannot record its own death: the launcher does, and removes the segment the
    other rank and it held (MPI_Finalize never ran)."""
    runs = tmp_path / "runs"
    proc = _start(runs, datasets_dir)
    held = _training(proc, runs)
    pids = _manifest(runs)["backend"]["pids"]
    os.kill(pids[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode not in (0, 2), out[-3000:]
    manifest = _manifest(runs)
    assert manifest["status"] == "failed" and manifest["exit_code"] == proc.returncode
    assert manifest["error"].startswith(f"MPI rank 0 (PID {pids[0]}) died")
    assert _ended(pids)
    assert sorted(f for f in held if os.path.exists(f)) == []


@pytest.mark.slow
def test_a_refused_resume_is_said_once_before_any_rank_starts(tmp_path, datasets_dir, capfd):
    """The run (a real MPI run to resume: mpiexec and its ranks) and the resumes go
    through ``ddlstudy``'s main in this process; capfd reads what this process and
    anything it started wrote to the terminal."""
    from ddlstudy.cli import main

    runs = tmp_path / "runs"
    code = main(["run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir",
                 str(runs), "--backend", "mpi", "--nodes", "2", "--epochs", "1", "--max-steps",
                 "2", "--sample-hz", "0"])
    assert code == 0, capfd.readouterr().err[-3000:]
    (folder,) = runs.iterdir()
    completed = (folder / MANIFEST).read_text()
    assert json.loads(completed)["status"] == "completed" and (folder / SNAPSHOT).is_file()

    def resume() -> str:
        capfd.readouterr()
        code = main(["run", "--resume", str(folder)])
        out = capfd.readouterr()
        assert code == 2, out.err[-3000:]
        assert "launching" not in out.err and "Traceback" not in out.err
        assert "launching" not in out.out
        return out.err

    err = resume()
    assert err.count(f"run {folder.name} completed all its epochs; nothing to resume") == 1
    assert (folder / MANIFEST).read_text() == completed
    failed = json.loads(completed) | {"status": "failed", "exit_code": 1}
    (folder / MANIFEST).write_text(json.dumps(failed))
    (folder / SNAPSHOT).write_bytes(b"not a snapshot")
    err = resume()
    assert err.count("is not a ddlstudy snapshot that can be loaded safely") == 1
    assert json.loads((folder / MANIFEST).read_text()) == failed


@pytest.mark.parametrize("argv", [["bench", "reduce", "--size", "1000", "--nodes", "513"],
                                  ["run", "--backend", "mpi", "--nodes", "513"]])
def test_more_ranks_than_512_are_refused_before_any_starts(tmp_path, monkeypatch, capsys,
                                                          argv):
    from ddlstudy.cli import main

    popen = subprocess.Popen

    def no_mpiexec(cmd, *args, **kwargs):  # subprocess.run goes through Popen too
        assert "mpiexec" not in str(cmd), f"started {cmd}"
        return popen(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", no_mpiexec)
    assert main([*argv, *(["--runs-dir", str(tmp_path)] if argv[0] == "run" else [])]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("ddlstudy: error: --nodes: 513 is above "
                                                     "the limit of 512")


def test_512_ranks_pass_the_check():
    from ddlstudy.backends.mpi.launch import check_ranks

    check_ranks(512)


_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("grace_s, signals_sent", [(1.0, 1), (600.0, 2)])
def test_a_launcher_that_does_not_end_is_killed_with_its_processes(grace_s, signals_sent):
    """After the grace, or at a second signal, the launcher and what it started are killed
    (a rank stuck in a collective cannot run its handler)."""
    from ddlstudy.signals import Forwarded

    before = signal.getsignal(signal.SIGTERM)
    with Forwarded(grace_s) as forwarded:
        proc = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        forwarded.attach(proc)
        grandchild = psutil.Process(int(proc.stdout.readline()))
        os.kill(os.getpid(), signal.SIGTERM)  # passed on: the launcher ignores it
        deadline = time.monotonic() + DEADLINE_S
        while forwarded.signum is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if signals_sent == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # no more waiting
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    assert forwarded.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
    grandchild.wait(timeout=DEADLINE_S)  # gone, not left running
    proc.stdout.close()


def test_only_the_files_the_run_holds_are_removed(tmp_path):
    """Files of MPICH's and hydra's names that the run's processes do not hold (another
    run's) stay, and so do the other files they hold; those they hold are removed once
    the processes are gone."""
    from ddlstudy.backends.mpi.leftovers import Leftovers

    tag = f"ddlstudy-test-{uuid.uuid4().hex[:8]}"
    ours = [Path(f"/dev/shm/mpich_{tag}"), Path(f"/tmp/hydra_{tag}")]
    theirs, data = Path(f"/dev/shm/mpich_{tag}_other"), tmp_path / "data"
    for path in [*ours, theirs, data]:
        path.write_bytes(b"x")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; "
                               "files = [open(p) for p in sys.argv[1:]]; print(flush=True); "
                               "time.sleep(600)", *map(str, ours), str(data)],
                              stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        left = Leftovers(holder.pid)
        left.start()
        deadline = time.monotonic() + DEADLINE_S
        while not {str(p) for p in ours} <= left.paths and time.monotonic() < deadline:
            time.sleep(0.1)
        holder.kill()
        holder.wait()
        assert left.remove() == sorted(str(p) for p in ours)
        assert not any(p.exists() for p in ours) and theirs.exists() and data.exists()
    finally:
        holder.kill()
        holder.stdout.close()
        for path in [*ours, theirs]:
            path.unlink(missing_ok=True)
