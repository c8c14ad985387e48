"""Watcher plugins are someone else's code inside every run (issue 64): one that hangs, exits,
raises an interrupt, meddles with the manifest, prints or takes a built-in's name cannot
break the run. In this process for what a hook does; through the real command line, with
a plugin installed as pip would (tests/plugin/unruly_watchers.py), for what needs a real
process (stdout under --format json, SIGTERM while a hook hangs)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from ddlstudy import watchers
from ddlstudy.exports.mlflow.live import WATCHER
from ddlstudy.records.runfolder import MANIFEST, RunFolder
from ddlstudy.watchers import MANIFEST_KEYS, WATCHERS, Watcher

PLUGIN = Path(__file__).parent / "plugin"
QUICK = ("--usecase", "tiny", "--epochs", "1", "--max-steps", "2", "--no-snapshot",
         "--sample-hz", "0")
RELEASE = threading.Event()
"""Set at the end of the test: the hung hook's thread ends (it is a daemon)."""


class Hanging(Watcher):
    name, summary = "hanging", "never returns from opened"
    calls = 0

    def opened(self, manifest, folder):
        Hanging.calls += 1
        RELEASE.wait()

    def epoch(self, manifest, record):
        Hanging.calls += 1


class Exiting(Watcher):
    name, summary = "exiting", "ends the process, or says Ctrl-C"

    def opened(self, manifest, folder):
        sys.exit(0)

    def epoch(self, manifest, record):
        raise KeyboardInterrupt

    def closed(self, manifest):
        raise SystemExit(3)


class Meddling(Watcher):
    name, summary = "meddling", "writes over the run's record"

    def opened(self, manifest, folder):
        manifest.update(status="completed", config={}, epochs=[{"epoch": 99}])
        manifest["meddling"] = {"ok": 1}

    def epoch(self, manifest, record):
        record["train_loss"] = -1.0
        manifest["meddling"] = {"a set": {1, 2}}  # not JSON

    def closed(self, manifest):
        loop: dict = {}
        loop["self"] = loop
        manifest["meddling"] = loop  # circular


class Printing(Watcher):
    name, summary = "printing", "prints"

    def epoch(self, manifest, record):
        print("epoch", record["epoch"], "seen")


def test_a_watcher_is_held_apart_from_the_run(tmp_path, monkeypatch, caplog, capsys):
    """Each hook in its own thread with a time limit (a hook that never returns is named
    and left out for the rest of the run); its exits and interrupts contained; what it
    notes taken back from its own key alone, JSON-checked; its prints in the log."""
    monkeypatch.setattr(watchers, "HOOK_LIMIT_S", 1.0)  # its hook never returns at all
    caplog.set_level(logging.INFO, logger="ddlstudy")
    for each in (Hanging(), Exiting(), Meddling(), Printing()):
        monkeypatch.setitem(WATCHERS, each.name, each)
    try:
        folder = RunFolder.create(tmp_path, "r1", {"config": {"lr": 0.1}})
        folder.record_epoch({"epoch": 1, "epoch_time_s": 1.5, "train_loss": 0.5})
        folder.finish("completed", 0)
    finally:
        RELEASE.set()
    written = json.loads((folder.path / MANIFEST).read_text())
    assert written["status"] == "completed" and written["config"] == {"lr": 0.1}
    assert [(e["epoch"], e["train_loss"]) for e in written["epochs"]] == [(1, 0.5)]
    assert written["meddling"] == {"ok": 1}  # its own key: kept, the rest not
    said = [r.getMessage() for r in caplog.records]
    assert Hanging.calls == 1 and any(
        "watcher hanging: its opened hook has not returned (it took longer than 1 s)" in s
        for s in said), said
    for hook, raised in (("opened", "SystemExit: 0"), ("epoch", "KeyboardInterrupt: "),
                         ("closed", "SystemExit: 3")):
        assert any(f"watcher exiting tried to end the process in its {hook} hook "
                   f"({raised}" in s for s in said), said
    assert any("watcher meddling: what it noted in the manifest is not JSON (TypeError" in s
               for s in said)
    assert any("is not JSON (ValueError: Circular reference" in s for s in said)
    assert "watcher printing printed: epoch 1 seen" in said
    assert capsys.readouterr().out == ""


Impostor = type("Impostor", (Watcher,), {"summary": "a plugin's watcher"})
MLFLOW, STATUS = Impostor(), Impostor()
MLFLOW.name, STATUS.name = "mlflow", "status"


@pytest.mark.parametrize(("name", "why"), [
    ("mlflow", "'mlflow' is the name of ddlstudy's own watcher"),
    ("status", "'status' is a key of the run's manifest, which a watcher cannot note under")])
def test_a_plugin_watcher_named_like_a_built_in_or_a_manifest_key_is_left_out(
        name, why, caplog):
    from ddlstudy.records.formats import Manifest

    assert {f.alias or n for n, f in Manifest.model_fields.items()} <= set(MANIFEST_KEYS)
    WATCHERS.loaded()
    WATCHERS._load(EntryPoint(name, f"test_watchers:{name.upper()}", "ddlstudy.watchers"))
    assert WATCHERS["mlflow"] is WATCHER and "status" not in WATCHERS
    assert any(why in r.getMessage() and "left out" in r.getMessage()
               for r in caplog.records), caplog.text


def _install(site: Path) -> Path:
    """tests/plugin/unruly_watchers.py installed into ``site`` as pip would leave it."""
    site.mkdir()
    (site / "unruly_watchers.py").write_text((PLUGIN / "unruly_watchers.py").read_text())
    info = site / "ddlstudy_unruly-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddlstudy-unruly\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text("[ddlstudy.watchers]\n"
                                           "unruly = unruly_watchers:UNRULY\n")
    return site


def _popen(site: Path, runs: Path, datasets_dir: Path, env: dict, *extra: str):
    return subprocess.Popen(
        [sys.executable, "-m", "ddlstudy", "run", *QUICK, "--datasets-dir", str(datasets_dir),
         "--runs-dir", str(runs), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=os.environ | env | {"PYTHONPATH": os.pathsep.join(
            [str(site), os.environ.get("PYTHONPATH", "")])})


def test_a_plugin_that_prints_keeps_json_and_one_that_hangs_still_stops_on_sigterm(
        tmp_path, datasets_dir):
    """`run --format json` prints JSON alone while a plugin watcher prints in every hook
    (its lines are in the log); a run whose watcher hangs in its epoch hook ends at once on
    SIGTERM, recorded as interrupted (the wait for the hook ended by the signal, not by the
    hook's time limit)."""
    site = _install(tmp_path / "site")
    with _popen(site, tmp_path / "runs", datasets_dir, {"UNRULY": "print"},
                "--format", "json") as run:
        out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-2000:]
    ended = json.loads(out)
    assert ended["status"] == "completed", out
    assert "watcher unruly printed: epoch 1" in err and "watcher unruly printed: closed" in err
    manifest = json.loads((Path(ended["run"]) / MANIFEST).read_text())
    assert manifest["unruly"] == {"told": "closed"}
    assert set(manifest) - {"unruly"} <= set(MANIFEST_KEYS)  # no watcher takes a run's key

    mark = tmp_path / "hanging"
    with _popen(site, tmp_path / "hung", datasets_dir,
                {"UNRULY": "hang-epoch", "UNRULY_MARK": str(mark)}) as run:
        deadline = time.monotonic() + 600
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), run.stderr.read()[-2000:]
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=600)
    assert run.returncode == 143, err[-2000:]
    assert "watcher unruly: its epoch hook has not returned (the run was stopped)" in err
    (manifest,) = (tmp_path / "hung").glob(f"*/{MANIFEST}")
    recorded = json.loads(manifest.read_text())
    assert (recorded["status"], recorded["error"]) == ("interrupted", "terminated by SIGTERM")
