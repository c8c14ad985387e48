"""Cheap starts that keep spawn's isolation: a run's processes are forked from a warm server
(``ddlstudy.machine.forkserver``) that imported torch once, yet each starts with one thread,
no CUDA, its parent's environment as it was when it was started, SIGTERM's default action,
and ends when its parent does, however that ended. A study's cells and advise's probes are
``python -m ddlstudy`` forked the same way."""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddlstudy.machine import forkserver
from ddlstudy.training.distributed import spawn

DEADLINE_S = 120.0
"""How long a process may take to end on a busy host (never a measure of speed)."""


def _describe(index: int, out: str) -> None:
    """What a rank sees of itself as it starts."""
    import torch

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gc.collect()  # a full pass: what the rank inherited is not written to
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    Path(f"{out}.{index}").write_text(json.dumps({
        "frozen": gc.get_freeze_count(), "collect_faults": faults,
        "threads": len(os.listdir("/proc/self/task")),
        "cuda": torch.cuda.is_initialized(),
        "torch_imported_before": "torch.nn" in sys.modules,
        "set_after": os.environ.get("DDLSTUDY_TEST_AFTER"),
        "removed": os.environ.get("DDLSTUDY_TEST_REMOVED"),
        "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "parent": psutil.Process().ppid()}))
    print(f"rank {index} says so on its stderr", file=sys.stderr, flush=True)


def test_a_rank_starts_as_a_spawned_one_would(tmp_path, monkeypatch, capfd):
    """The server imported torch before the rank started, and the rank still begins with
    one thread and no CUDA, with the environment its parent had when it started the rank
    (set and removed after the server started), its parent's standard error as it is now
    (here the test's capture), and SIGTERM's default action (the server ignores it); its
    parent is the server, a child of this process."""
    forkserver.warm()
    monkeypatch.setenv("DDLSTUDY_TEST_AFTER", "yes")
    monkeypatch.delenv("DDLSTUDY_TEST_REMOVED", raising=False)
    context = spawn(_describe, 2, (str(tmp_path / "rank"),))
    while not context.join(timeout=DEADLINE_S):
        pass
    seen = [json.loads((tmp_path / f"rank.{i}").read_text()) for i in range(2)]
    server = {row["parent"] for row in seen}
    assert len(server) == 1 and psutil.Process(server.pop()).ppid() == os.getpid()
    for row in seen:
        assert row["threads"] == 1 and not row["cuda"] and row["torch_imported_before"]
        assert row["set_after"] == "yes" and row["removed"] is None and row["sigterm"]
        # the server's objects are out of the collector's passes (torch's alone are over
        # 100,000); scanned, a full pass copied 22,000 of the server's pages
        assert row["frozen"] > 100_000 and row["collect_faults"] < 2_000, row
    err = capfd.readouterr().err
    assert "rank 0 says so on its stderr" in err and "rank 1 says so on its stderr" in err


def _sleep(index: int, out: str) -> None:
    Path(f"{out}.{index}").write_text(str(os.getpid()))
    time.sleep(600)


def parent_of_sleepers(out: str) -> None:
    """A process that starts two ranks that never end, then waits (killed by the test)."""
    spawn(_sleep, 2, (out,))
    time.sleep(600)


def test_ranks_and_the_server_end_when_their_parent_is_killed(tmp_path):
    """SIGKILL to the process that started the ranks: the server sees its end, ends, and
    the kernel ends the ranks (PR_SET_PDEATHSIG); nothing is left waiting."""
    out = tmp_path / "rank"
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import test_starts; test_starts.parent_of_sleepers({str(out)!r})")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not all(
            Path(f"{out}.{i}").is_file() and Path(f"{out}.{i}").read_text() for i in range(2)):
        assert parent.poll() is None
        time.sleep(0.05)
    ranks = [psutil.Process(int(Path(f"{out}.{i}").read_text())) for i in range(2)]
    server = psutil.Process(ranks[0].ppid())
    assert server.ppid() == parent.pid and ranks[1].ppid() == server.pid
    parent.kill()
    parent.wait()
    gone, alive = psutil.wait_procs([server, *ranks], timeout=DEADLINE_S)
    assert not alive and len(gone) == 3


def test_a_warm_command_is_the_command(tmp_path, monkeypatch):
    """``forkserver.command`` runs ``python -m ddlstudy`` as a process of its own: its
    exit code and output, in the environment and the working directory it was given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.toml").write_text("name = [")
    done = forkserver.captured(["run", "--usecase", "broken.toml"], dict(os.environ))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "ddlstudy: error: use case broken.toml: is not valid TOML: " \
        "Invalid value (at end of document)"
    env = dict(os.environ, DDLSTUDY_RUN_ID="../bad")
    done = forkserver.captured(["run", "--runs-dir", "runs", "--epochs", "1"], env)
    assert done.returncode == 2 and "run id '../bad' is not a plain folder name" in done.stderr
    assert "DDLSTUDY_RUN_ID" not in os.environ and not (tmp_path / "runs").exists()
    assert forkserver.captured(["--version"], env).stdout.startswith("ddlstudy ")


_PREFLIGHT = """
import json, sys
from ddlstudy.config import RunConfig, load_usecase
from ddlstudy.models import describe
from ddlstudy.runner import preflight
cfg = preflight(RunConfig(usecase=load_usecase("simple-big")))
print(json.dumps({"imported": sorted(m for m in ("torchvision", "torch._dynamo")
                                     if m in sys.modules),
                  "model": describe(cfg.usecase.model, len(cfg.usecase.classes))}))
"""


def test_a_run_checked_before_is_checked_without_building_its_model(tmp_path):
    """The checks of simple-big (its AlexNet built on the meta device, its optimizer made
    once) import torch's compiler front end (every optimizer's step does), and not
    torchvision (the paper's networks are built without it); a command that checks the
    same run again on this machine (the parent of a run's processes, MPI's launcher)
    imports neither, and describes the model as the first did."""
    env = dict(os.environ, DDLSTUDY_CACHE=str(tmp_path / "cache"))
    seen = [json.loads(subprocess.run([sys.executable, "-c", _PREFLIGHT], env=env, check=True,
                                      capture_output=True, text=True).stdout)
            for _ in range(2)]
    assert seen[0]["imported"] == ["torch._dynamo"] and seen[1]["imported"] == []
    assert seen[0]["model"] == seen[1]["model"] and seen[1]["model"]["parameters"] == 57_016_131
