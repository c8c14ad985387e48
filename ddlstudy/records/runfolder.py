"""runs/<id>/: manifest.json, metrics.csv, samples.parquet and snapshot.pt of one run.

The manifest is written before training starts (status ``running``) and rewritten after
every epoch and at the end (``completed``, ``failed`` or ``interrupted``), always through
a temporary file in the same folder, fsync and ``os.replace``: a reader, or a crash, never
sees half a file.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from ddlstudy.errors import UsageError
from ddlstudy.files import WriteFailed, atomic_write, atomic_write_json, atomic_write_text, turn
from ddlstudy.machine.sampler import TREE_ROOT_ENV, read_samples, samples_frame, write_rows
from ddlstudy.reading import read_json, read_text
from ddlstudy.records.runid import CHILD_ENV as CHILD_ENV  # where others read them
from ddlstudy.records.runid import CLAIM, claimed_for_this, refuse_taken
from ddlstudy.records.runid import RUN_ID_ENV as RUN_ID_ENV
from ddlstudy.records.runid import checked_run_id as checked_run_id
from ddlstudy.records.runid import new_run_id as new_run_id
from ddlstudy.watchers import tell

log = logging.getLogger("ddlstudy")

MANIFEST = "manifest.json"
METRICS = "metrics.csv"
CONFUSION = "val_confusion"
"""The manifest's key of the last epoch's validation confusion matrix: {epoch, counts}
(counts[true class][predicted class], the classes in ``preprocessing.classes``' order)."""
STEPS = "steps.csv"
STEP_COLUMNS = ("global_step", "epoch", "step", "train_loss", "images", "seconds",
                "images_per_s")
SAMPLES = "samples.parquet"
SNAPSHOT = "snapshot.pt"
SCHEMA_VERSION = 1


def run_env(run_id: str, **extra: str) -> dict[str, str]:
    """The environment of a ``ddlstudy run`` another command starts (a study's cell, an
    advise probe) into folder ``run_id``: this one's, without the marks of an MPI rank, so
    that a command run under mpiexec still launches its own runs."""
    import os

    env = os.environ | {RUN_ID_ENV: run_id} | extra
    for var in (CHILD_ENV, TREE_ROOT_ENV, "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        env.pop(var, None)
    return env


def load_manifest(file: Path) -> dict[str, Any]:
    """A run's manifest.json through the gate and its schema (``ddlstudy.records.formats``):
    valid, or a BadFile naming the file and the field."""
    return settled(_load(file))


def _load(file: Path) -> dict[str, Any]:
    from ddlstudy.records.formats import Manifest, load  # pydantic: only for readers

    return load(file, Manifest, "run manifest")


def settled(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` as it is: a run recorded as running whose process is gone from the
    host it ran on (killed before it could say) reads as interrupted."""
    pid, host = manifest.get("pid"), (manifest.get("host") or {}).get("hostname")
    if manifest.get("status") != "running" or not pid or host != socket.gethostname() \
            or _alive(pid, manifest):
        return manifest
    return manifest | {"status": "interrupted", "error": manifest.get("error") or (
        f"its process (PID {pid} on {host}) ended without recording how (killed, or the "
        f"machine stopped)")}


def _alive(pid: int, manifest: dict[str, Any]) -> bool:
    """Whether ``pid`` is still the run's process (not a later one given its number)."""
    began = max([manifest.get("started_at") or ""] +
                [r.get("at") or "" for r in manifest.get("resumed") or []])
    try:
        created = psutil.Process(pid).create_time()
        return created <= dt.datetime.fromisoformat(began).timestamp() + 1
    except (psutil.Error, ValueError):
        return False


def _closed(manifest: Path) -> bool:
    """Whether the run whose ``manifest`` this is has ended as written (not running)."""
    try:
        return read_json(manifest, "run manifest").get("status") != "running"
    except (UsageError, AttributeError):
        return False


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class RunFolder:
    """One run's folder; ``manifest`` is the dict written to manifest.json."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @classmethod
    def create(cls, runs_dir: Path, run_id: str, manifest: dict[str, Any]) -> RunFolder:
        path = Path(runs_dir) / checked_run_id(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()  # the claim: of two runs given one id, the second is refused here
        except FileExistsError:
            if not claimed_for_this(path):  # not claimed by our launcher for us
                refuse_taken(path)
            (path / f"{CLAIM}{os.environ[TREE_ROOT_ENV]}").unlink()
        folder = cls(path, {"schema": SCHEMA_VERSION, "id": run_id, "status": "running",
                            "started_at": now_iso(), "ended_at": None, "exit_code": None,
                            "error": None, **manifest, "epochs": []})
        try:  # written first: a run killed while a watcher opens is still a run
            folder.write_manifest()
        except BaseException:  # a full disk: no folder without its manifest is left
            path.rmdir()
            raise
        tell(folder.manifest, "opened", path)  # --mlflow's run
        folder.write_manifest()  # with what the watchers noted
        return folder

    @classmethod
    def open(cls, path: Path) -> RunFolder:
        return cls(Path(path), _load(Path(path) / MANIFEST))  # as written: it writes it

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy of the folder in another process (a Spark task's, a spawned rank's): a
        worker's, which writes epochs while the run trains (``write_manifest``)."""
        self.__dict__.update(state, worker=True)

    @contextmanager
    def _writing(self) -> Iterator[bool]:
        """In the folder's turn: whether this process may write the run's records. A
        worker's copy may not once the run's own process has closed the run (its status on
        disk no longer running): a Spark task still training after a Ctrl-C (its Python
        worker ends some time after the driver) wrote its next epoch over the interrupted
        manifest, and the run read as running for good. What it would have written (an
        epoch, its steps, a snapshot) is left out whole: a resume goes on from the last
        snapshot the run closed with."""
        if not self.path.is_dir():  # gone: the write itself says so
            yield True
            return
        with turn(self.path):
            closed = self.__dict__.get("worker", False) and _closed(self.path / MANIFEST)
            if closed:
                log.info("%s: closed by its run's process; this worker writes no more",
                         self.path.name)
            yield not closed

    def write_manifest(self) -> None:
        with self._writing() as allowed:
            if allowed:
                atomic_write_json(self.path / MANIFEST, self.manifest, allow_nan=True,
                                  default=str)

    def record_epoch(self, result: dict[str, Any], confusion: list | None = None) -> None:
        """Append an epoch's record, with ``elapsed_s``: the training and validation time
        of every epoch so far (start-up, snapshots and the restarts of a resumed run left
        out), the clock time to accuracy is read on. ``confusion``: its validation's
        confusion matrix, kept as the run's ``val_confusion`` (the last epoch's)."""
        done = self.manifest["epochs"]
        if confusion:
            self.manifest[CONFUSION] = {"epoch": result["epoch"], "counts": confusion}
        before = done[-1].get("elapsed_s", 0.0) if done else 0.0
        done.append(result | {"elapsed_s": before + result["epoch_time_s"]})
        with self._writing() as allowed:
            if not allowed:
                return
            self._write_metrics()
            self.write_manifest()
        tell(self.manifest, "epoch", done[-1])  # --mlflow: logged

    def record_steps(self, steps: list[tuple[int, int, float, int, float]]) -> None:
        """Append rank 0's steps of an epoch to steps.csv: (epoch, step, mean loss, images,
        seconds) each, numbered on from the last step recorded (``global_step``)."""
        with self._writing() as allowed:
            if steps and allowed:
                self._append_steps(steps)

    def _append_steps(self, steps: list[tuple[int, int, float, int, float]]) -> None:
        if getattr(self, "_last_step", None) is None:  # read once (a resumed run's file)
            kept = self._steps()
            self._last_step = int(kept[-1]["global_step"]) if kept else 0
            self._write_steps(kept)  # whole, as read: a torn last line is dropped
        first = self._last_step + 1
        rows = [dict(zip(STEP_COLUMNS, (first + i, epoch, step, loss, n, seconds,
                                        n / seconds if seconds > 0 else 0.0), strict=True))
                for i, (epoch, step, loss, n, seconds) in enumerate(steps)]
        buf = io.StringIO()  # appended, so a long run does not rewrite its past each epoch
        csv.DictWriter(buf, fieldnames=list(STEP_COLUMNS)).writerows(rows)
        with open(self.path / STEPS, "a", encoding="utf-8") as f:
            f.write(buf.getvalue())
        self._last_step += len(rows)

    def _steps(self, through_epoch: int | None = None) -> list[dict[str, str]]:
        """steps.csv's rows (of epochs up to ``through_epoch``); none if it is unreadable."""
        try:
            text = read_text(self.path / STEPS, "steps table", 512 << 20)
            rows = list(csv.DictReader(io.StringIO(text)))
            return [r for r in rows if through_epoch is None or
                    int(r["epoch"]) <= through_epoch]
        except (UsageError, KeyError, TypeError, ValueError):
            return []

    def _write_steps(self, rows: list[dict]) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(STEP_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path / STEPS, buf.getvalue())

    def rewrite_epochs(self) -> None:
        """The manifest, metrics.csv and steps.csv after ``manifest['epochs']`` was cut
        (resume)."""
        confusion = self.manifest.get(CONFUSION) or {}
        if confusion.get("epoch", 0) > len(self.manifest["epochs"]):
            del self.manifest[CONFUSION]  # an epoch cut off
        if self.manifest["epochs"]:
            self._write_metrics()
        else:
            (self.path / METRICS).unlink(missing_ok=True)
        if (self.path / STEPS).is_file():
            self._write_steps(self._steps(through_epoch=len(self.manifest["epochs"])))
        self._last_step = None  # read again at the next epoch's steps
        self.write_manifest()

    def merge_leftover_samples(self) -> None:
        """Fold the worker samples an interrupted attempt left into samples.parquet, so the
        next attempt's workers start afresh and nothing sampled is lost."""
        if any(self.path.glob(".samples-rank*.parquet")):
            self.write_samples([])

    def _write_metrics(self) -> None:
        rows = self.manifest["epochs"]
        buf = io.StringIO()  # every row's columns (a resumed run's older epochs had fewer)
        writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.path / METRICS, buf.getvalue())

    def write_worker_samples(self, rank: int, rows: list[dict[str, Any]]) -> None:
        """A worker's own samples, merged into samples.parquet when the run ends."""
        write_rows(self.path / f".samples-rank{rank}.parquet", rows)

    def write_samples(self, rows: list[dict[str, Any]]):
        """This process's samples and every worker's, in one file sorted by time (returned
        as a DataFrame)."""
        import pandas as pd

        parts = sorted(self.path.glob(".samples-rank*.parquet"))
        # samples.parquet exists already only when an earlier attempt of a resumed run wrote it
        earlier = [self.path / SAMPLES] if (self.path / SAMPLES).exists() else []
        frames = [samples_frame(rows), *(self._samples_of(p) for p in [*earlier, *parts])]
        frame = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
        frame = frame.sort_values("time", kind="stable", ignore_index=True)
        atomic_write(self.path / SAMPLES, lambda f: frame.to_parquet(f, index=False))
        for p in parts:
            p.unlink()
        self.manifest["samples"] = {"file": SAMPLES, "rows": len(frame),
                                    "workers_sampled": len(parts)}
        return frame

    def _samples_of(self, path: Path):
        """A samples file's frame, read by the one reader of samples (its columns' kinds
        checked); a damaged one (unreadable, a column of the wrong kind, or without the
        time its rows are merged by) is kept aside as ``<name>.damaged`` (never lost, never
        read again) and counts as none, said in a warning."""
        import pandas as pd

        try:
            return read_samples(path, ("time",))
        except UsageError as exc:
            aside = path.with_name(path.name + ".damaged")
            path.rename(aside)
            log.warning("%s; kept as %s, its samples left out", exc, aside.name)
            return pd.DataFrame()

    def save_snapshot(self, state: dict[str, Any]) -> None:
        import torch

        with self._writing() as allowed:
            if allowed:
                atomic_write(self.path / SNAPSHOT, lambda f: torch.save(state, f))

    def reload_epochs(self) -> None:
        """Take the epochs (and the time to the first step, the gradients' transport, what
        it measured of the exchange) a worker process (rank 0 of a multi-process strategy)
        wrote."""
        try:
            written = read_json(self.path / MANIFEST, "run manifest")
            self.manifest["epochs"] = written["epochs"]
        except (UsageError, KeyError, TypeError):
            return
        for key in ("first_step_s", "startup", "transport"):
            if key in written:
                self.manifest.setdefault(key, written[key])
        if CONFUSION in written:  # the last epoch's, this attempt's where it trained one
            self.manifest[CONFUSION] = written[CONFUSION]
        mine = self.manifest.setdefault("backend", {})
        for key, value in (written.get("backend") or {}).items():
            mine.setdefault(key, value)

    def unrecorded(self, exc: WriteFailed) -> UsageError:
        """What to say of a run whose end a full disk kept from being written (``exc``).
        Its folder is removed where it holds nothing (no epoch in the manifest written,
        no snapshot): a run recorded as running with no epoch is no record; else it is
        kept as last written, which reads as interrupted and resumes from its snapshot."""
        try:
            kept = bool(read_json(self.path / MANIFEST, "run manifest").get("epochs"))
        except (UsageError, AttributeError):
            kept = False
        if not kept and not (self.path / SNAPSHOT).is_file():
            shutil.rmtree(self.path, ignore_errors=True)
            return UsageError(f"{exc}; run {self.path.name} had recorded nothing, and its "
                              "folder is removed")
        then = f"`ddlstudy run --resume {self.path}`" if (self.path / SNAPSHOT).is_file() \
            else "its epochs so far are kept (it reads as interrupted)"
        return UsageError(f"{exc}; run {self.path.name}: {then}")

    def finish(self, status: str, exit_code: int, error: str | None = None,
               **extra: Any) -> None:
        self.manifest.update(status=status, exit_code=exit_code, error=error,
                             ended_at=now_iso(), **extra)
        tell(self.manifest, "closed")  # --mlflow: its status there
        self.write_manifest()
