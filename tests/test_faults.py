"""Faults injected for real: SIGKILL of the run or of one rank, exact resume, restarts,
a full disk, leftover temporary files, damaged snapshots."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import torch
from listening import LOOPBACK, addresses, listening_while_running

from ddlstudy.cli import main
from ddlstudy.records.runfolder import MANIFEST, SNAPSHOT

EPOCHS = 6
STEPS = 5
"""Steps an epoch (of tiny's 15): a snapshot inside every epoch (--snapshot-every 4) and at
its end; what a fault test needs is epochs and snapshots, not images."""


def _args(runs: Path, datasets_dir: Path, *extra: str) -> list[str]:
    return ["run", "--usecase", "tiny", "--epochs", str(EPOCHS), "--max-steps", str(STEPS),
            "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs), "--sample-hz", "0",
            "--quiet", "--snapshot-every", "4", *extra]


def _cli(*args: str, preexec=None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlstudy", *args], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec)


def ddlstudy(*args: str) -> int:
    """``ddlstudy`` through its command line in this process, where nothing is killed: no
    second start of Python and torch (seconds on a busy host) for a run that only has to
    end. Its exit code."""
    return main(list(args))


def _victims(proc: psutil.Process, which: str) -> list[psutil.Process]:
    """The processes ``which`` names below ``proc``: ranks forked from the warm server are
    known by their names (``ddlstudy-rank1``); their environment in /proc is their
    server's, which MPI rank 1 started where the rank is its node's."""
    if which == "run":
        return [proc]
    mpi_ranks, workers, node_workers = [], [], []
    for child in proc.children(recursive=True):
        try:
            env, cmd, name = child.environ(), " ".join(child.cmdline()), child.name()
        except psutil.Error:
            continue
        if name == "ddlstudy-rank1":  # rank 1 of the run, or of MPI rank 1's node
            (node_workers if env.get("PMI_RANK") == "1" else workers).append(child)
        elif env.get("PMI_RANK") == "1" and "ddlstudy" in cmd and "forkserver" not in cmd:
            mpi_ranks.append(child)  # not its server, nor what that forked (its command)
    return {"mpi-rank-1": mpi_ranks, "node-1-worker": node_workers,
            "worker-1": workers}[which]


def run_and_kill(args: list[str], runs: Path, which: str, after_epochs: int = 2,
                 killed: list[int] | None = None, output: Path | None = None,
                 end_within: float = 120):
    """Start ``ddlstudy`` with ``args``, SIGKILL ``which`` once ``after_epochs`` epochs are
    recorded, wait at most ``end_within`` seconds for its end, and return (exit code,
    seconds from the kill to the end, run folder); the PIDs killed are added to
    ``killed``, and what the run wrote (stdout and stderr) goes to ``output``, where
    given."""
    with open(output or os.devnull, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ddlstudy", *args], stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    folder = None
    while time.time() < deadline and proc.poll() is None:
        folders = list(runs.glob("*/")) if runs.exists() else []
        if folders:
            folder = folders[0]
            try:
                epochs = json.loads((folder / MANIFEST).read_text())["epochs"]
            except (OSError, ValueError):
                epochs = []
            victims = _victims(psutil.Process(proc.pid), which) \
                if len(epochs) >= after_epochs else []
            if victims:
                for v in victims:
                    v.send_signal(signal.SIGKILL)
                if killed is not None:
                    killed.extend(v.pid for v in victims)
                break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the fault could be injected"
    killed_at = time.time()
    code = proc.wait(timeout=end_within)
    return code, time.time() - killed_at, folder


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / SNAPSHOT, weights_only=True)["model"]


def _identical(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, datasets_dir):
    """The uninterrupted run of ``_args`` with ``extra`` flags, run once for every test
    that holds a killed run to it: its run folder."""
    made: dict[tuple[str, ...], Path] = {}

    def get(*extra: str) -> Path:
        if extra not in made:
            runs = tmp_path_factory.mktemp("reference")
            code = ddlstudy(*_args(runs, datasets_dir, *extra))
            errors = [p.read_text()[-3000:] for p in runs.glob("*/error.log")]
            assert code == 0, errors  # CI once failed it
            (made[extra],) = runs.glob("*/")
        return made[extra]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("extra, victim", [
    # A warm-up of 4 of the 6 epochs: killed in it, or after it, the resumed LinearLR
    # must give the rates the uninterrupted run had.
    (("--lr-warmup-epochs", "4"), "run"),
    # (cpu-processes, killed and resumed: test_max_restarts_recovers_from_a_dead_worker_by_
    # itself, whose restart is this --resume in the same process)
    (("--backend", "mpi", "--nodes", "2"), "mpi-rank-1"),
    (("--backend", "mpi", "--nodes", "2", "--strategy", "cpu-processes", "--workers", "2"),
     "node-1-worker"),
], ids=["sequential-warmup", "mpi", "mpi-nodes-of-processes"])
def test_killed_then_resumed_ends_bit_identical(tmp_path, datasets_dir, reference, extra,
                                                 victim):
    runs, killed = tmp_path / "runs", []
    code, seconds, folder = run_and_kill(_args(runs, datasets_dir, *extra), runs, victim,
                                         killed=killed, output=tmp_path / "output")
    assert code != 0 and seconds < 30  # the whole job ends, quickly, when one part dies
    manifest = _manifest(folder)
    assert 1 <= len(manifest["epochs"]) < EPOCHS
    if victim != "run":  # the job lived to say which rank died
        assert manifest["status"] == "failed" and manifest["exit_code"] == code
        assert {"mpi-rank-1": f"MPI rank 1 (PID {killed[0]}) died",
                "node-1-worker": "WorkerDied on MPI rank 1: worker 1 of node 1"}[victim] \
            in manifest["error"]
    if victim == "mpi-rank-1":  # mpiexec ended the job at once; the launcher named the rank
        assert len(killed) == 1
        assert manifest["error"].startswith(f"MPI rank 1 (PID {killed[0]}) died")
        assert f"MPI rank 1 (PID {killed[0]}) died" in (tmp_path / "output").read_text()
    assert torch.load(folder / SNAPSHOT, weights_only=True)["epoch"] < EPOCHS
    assert ddlstudy("run", "--resume", str(folder), "--quiet") == 0
    _resumed_once_as_uninterrupted(folder, reference(*extra))


def _resumed_once_as_uninterrupted(folder: Path, uninterrupted: Path) -> dict:
    """A run resumed once that ended as the uninterrupted one did: its resume record."""
    manifest = _manifest(folder)
    assert manifest["status"] == "completed" and len(manifest["epochs"]) == EPOCHS
    assert [e["epoch"] for e in manifest["epochs"]] == list(range(1, EPOCHS + 1))
    (resumed,) = manifest["resumed"]
    assert not list(folder.glob(".*.tmp-*"))  # a write cut by the kill was swept
    assert _identical(folder, uninterrupted)
    ref_losses = [e["train_loss"] for e in _manifest(uninterrupted)["epochs"]]
    assert [e["train_loss"] for e in manifest["epochs"]] == ref_losses
    return resumed


@pytest.mark.slow
def test_max_restarts_recovers_from_a_dead_worker_by_itself(tmp_path, datasets_dir, reference):
    """cpu-processes, a worker killed: the run fails at once, naming it, and restarts from
    its last snapshot in the same process (what `run --resume` does), to end bit for bit
    as the uninterrupted run."""
    runs = tmp_path / "runs"
    extra = ("--strategy", "cpu-processes", "--workers", "2")  # the uninterrupted run's flags
    # The restart starts its workers again (each imports torch) and trains the epochs
    # left: minutes on a busy 2-core host
    code, seconds, folder = run_and_kill(_args(runs, datasets_dir, *extra, "--max-restarts",
                                               "1"), runs, "worker-1", end_within=600)
    killed_at = time.time() - seconds
    assert code == 0
    restart = _resumed_once_as_uninterrupted(folder, reference(*extra))
    assert restart["after"]["status"] == "failed" and "worker rank 1" in \
        restart["after"]["error"]
    assert restart["from_epoch"] < EPOCHS
    # the whole job ended, quickly, when one worker died: restarted within 30 s of the kill
    assert datetime.fromisoformat(restart["at"]).timestamp() - killed_at < 30


def _full_disk():
    """In the child: files may not grow past 1 MiB (a snapshot is 28 MB), and writing past
    the limit fails with EFBIG instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_full_disk_keeps_the_previous_snapshot(tmp_path, datasets_dir):
    runs = tmp_path / "runs"
    code, _, folder = run_and_kill(_args(runs, datasets_dir), runs, "run", after_epochs=1)
    before = torch.load(folder / SNAPSHOT, weights_only=True)
    out = _cli("run", "--resume", str(folder), "--quiet", preexec=_full_disk)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "could not write" in out.stderr and "File too large" in out.stderr
    manifest = _manifest(folder)
    assert manifest["status"] == "failed" and "could not write" in manifest["error"]
    after = torch.load(folder / SNAPSHOT, weights_only=True)  # still there and loadable
    assert (after["epoch"], after["step"]) == (before["epoch"], before["step"])
    assert not list(folder.glob(".*.tmp-*"))


def test_snapshots_load_without_pickle_and_hold_the_whole_state(quick_config):
    from ddlstudy.runner import run

    folder = run(quick_config(epochs=2, max_steps=5, snapshot_every=2), show_progress=False)
    snap = torch.load(folder.path / SNAPSHOT, weights_only=True)
    assert (snap["epoch"], snap["step"], snap["format"]) == (2, 0, 1)
    assert set(snap) == {"format", "epoch", "step", "model", "optimizer", "scheduler",
                         "position", "rng"}
    assert snap["scheduler"] is None  # no --lr-warmup-epochs: no learning-rate schedule
    assert set(snap["rng"][0]) == {"torch", "numpy", "python"}
    assert snap["position"]["generator"].dtype == torch.uint8
    assert all(v["momentum_buffer"].shape for v in snap["optimizer"]["state"].values())


def test_leftover_temporary_files_of_dead_processes_are_swept(quick_config, tmp_path):
    from ddlstudy.runner import run

    old = tmp_path / "runs" / "old-run"
    old.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = old / f".snapshot.pt.tmp-{dead.pid}"
    stale.write_bytes(b"half a snapshot")
    live = old / f".snapshot.pt.tmp-{os.getppid()}"  # a writer still alive: not touched
    live.write_bytes(b"being written")
    run(quick_config(max_steps=2), show_progress=False)
    assert not stale.exists() and live.exists()


class Exploit:
    def __reduce__(self):
        return (print, ("this would have run",))


def test_resume_refuses_what_it_cannot_continue(quick_config, tmp_path, capsys):
    from ddlstudy.runner import run

    done = run(quick_config(max_steps=2), show_progress=False).path
    assert main(["run", "--resume", str(done)]) == 2
    assert "completed all its epochs; nothing to resume" in capsys.readouterr().err

    manifest = _manifest(done)
    manifest["status"] = "failed"
    (done / MANIFEST).write_text(json.dumps(manifest))
    (done / SNAPSHOT).write_bytes(b"PK\x03\x04 not a snapshot")
    assert main(["run", "--resume", str(done)]) == 2
    assert "is not a ddlstudy snapshot that can be loaded safely" in capsys.readouterr().err
    assert (done / SNAPSHOT).read_bytes() == b"PK\x03\x04 not a snapshot"  # left as it was

    import torch  # a snapshot that would run code when unpickled: refused, and no advice
    torch.save({"position": Exploit(), "rng": {}}, done / SNAPSHOT)  # to load it unsafely
    assert main(["run", "--resume", str(done)]) == 2
    err = capsys.readouterr().err
    assert "holds more than tensors and plain values" in err and "weights_only" not in err

    (done / SNAPSHOT).unlink()
    assert main(["run", "--resume", str(done)]) == 2
    assert "has no snapshot.pt to resume from" in capsys.readouterr().err

    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "neither a run folder nor a manifest.json" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--strategy", "pipeline", "--stages", "2", "--snapshot-every", "2"],
     "pipeline cannot yet be resumed exactly"),
    (["--snapshot-every", "0"], "--snapshot-every: must be a positive"),
    (["--snapshot-every", "3", "--no-snapshot"], "cannot be used with --no-snapshot"),
    (["--max-restarts", "-1"], "--max-restarts: must be 0 or more"),
])
def test_bad_fault_flags(tmp_path, capsys, args, message):
    assert main(["run", "--runs-dir", str(tmp_path / "runs"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_leaves_a_loadable_snapshot(tmp_path, datasets_dir):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it. And no port of
    the single-host multi-process run, from its start to its end, is reachable from
    another machine."""
    runs = tmp_path / "runs"
    args = _args(runs, datasets_dir, "--strategy", "cpu-processes", "--workers", "2")
    proc = subprocess.Popen([sys.executable, "-m", "ddlstudy", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    listening: set = set()
    poll = threading.Thread(target=lambda: listening.update(listening_while_running(
        proc, every_s=0.02)))  # until the run ends
    poll.start()
    deadline, workers = time.time() + 180, []
    while time.time() < deadline and proc.poll() is None and not workers:
        manifests = list(runs.glob(f"*/{MANIFEST}"))
        try:
            started = manifests and json.loads(manifests[0].read_text())["epochs"]
        except (OSError, ValueError):
            started = False
        if started:
            workers = psutil.Process(proc.pid).children(recursive=True)
            os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.01)
    assert workers, "the run ended before Ctrl-C"
    _, err = proc.communicate(timeout=120)
    poll.join(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert len(listening) >= 2  # the rendezvous store and gloo's own sockets
    assert addresses(listening) <= LOOPBACK, listening
    (folder,) = runs.glob("*/")
    manifest = _manifest(folder)
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 130
    torch.load(folder / SNAPSHOT, weights_only=True)  # the last good snapshot loads
    assert not list(folder.glob(".*.tmp-*"))
    time.sleep(1)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("args, message", [
    (["--accumulate", "0"], "--accumulate: must be a positive"),
    (["--accumulate", "17"], "17 micro-batches but each worker gets only 16 image(s)"),
    (["--strategy", "cpu-threads", "--accumulate", "2"],
     "cpu-threads does not accumulate gradients yet"),
])
def test_bad_accumulate_flags(tmp_path, capsys, args, message):
    assert main(["run", "--runs-dir", str(tmp_path / "runs"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def _finish_then_crash_at_teardown(index: int, marker: str) -> None:
    """A rank whose work is done but whose interpreter teardown would crash (as gloo's
    threads once made one: SIGABRT after its last epoch)."""
    import atexit

    Path(marker).with_suffix(f".{index}").write_text("done")
    atexit.register(os.abort)


def test_a_finished_rank_ends_before_the_interpreter_teardown(tmp_path):
    from ddlstudy.training.distributed import spawn

    context = spawn(_finish_then_crash_at_teardown, 2, (str(tmp_path / "rank"),))
    while not context.join(timeout=60):
        pass
    assert [p.exitcode for p in context.processes] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank.0", "rank.1"]


def test_rank_0_stops_waiting_once_a_process_of_its_group_ends_before_joining():
    """An MPI node's leader waits for its spawned process at the store: killed before it got
    there (the kernel, for its host's memory), it ends the wait at once with its exit, not
    after the collectives' 120 s."""
    import multiprocessing

    from ddlstudy.training.distributed import COLLECTIVE_TIMEOUT, free_port, rendezvous

    peer = multiprocessing.get_context("fork").Process(target=os._exit, args=(9,))
    peer.start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"\(PID {peer.pid}\) ended before it joined "
                                           r"\(exit code 9\)"):
        rendezvous("127.0.0.1", free_port(), 0, 2, peers=[peer])
    assert time.monotonic() - start < COLLECTIVE_TIMEOUT.total_seconds() / 2
