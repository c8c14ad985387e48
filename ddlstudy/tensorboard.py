"""Runs as TensorBoard scalars, written with the tensorboard package's own event writer.

    ddlstudy export tensorboard runs/ --out tb/     # then: tensorboard --logdir tb/
    ddlstudy run ... --tensorboard                  # into <run>/tensorboard/ at its end

Each run is a TensorBoard run named after its id: ``epoch/<metric>`` per epoch (step = the
epoch) from metrics.csv, and ``resources/<scope>-rank<r>/<column>`` from samples.parquet
(step = milliseconds since the run started, wall time = when it was sampled).
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.files import check_folder
from ddlstudy.reading import CAPS, BadFile, read_parquet, read_text
from ddlstudy.runfolder import MANIFEST, METRICS, SAMPLES, STEPS, load_manifest

log = logging.getLogger("ddlstudy")

SAMPLED = ("proc_cpu_percent", "proc_rss_bytes", "proc_threads", "sys_cpu_percent",
           "sys_iowait_percent", "sys_ram_percent", "net_sent_bytes", "net_recv_bytes",
           "disk_read_bytes", "disk_write_bytes", "gpu_util_percent", "gpu_mem_used_bytes")
"""The resource columns written (the cumulative byte counters as they were sampled)."""
SUBDIR = "tensorboard"


def find_runs(root: Path) -> list[Path]:
    """The run folders at or under ``root`` (each holds a manifest.json)."""
    root = Path(root)
    if (root / MANIFEST).exists():
        return [root]
    if not root.is_dir():
        raise UsageError(f"{root} is not a run folder or a folder of runs")
    runs = sorted(p.parent for p in root.rglob(MANIFEST) if SUBDIR not in p.parts)
    if not runs:
        raise UsageError(f"{root} holds no run (no manifest.json under it)")
    return runs


def export(runs: Path, out: Path) -> list[Path]:
    """Write every run at or under ``runs`` into ``out/<run id>/``; returns those folders."""
    out = Path(out)
    check_folder("--out", out)
    found = find_runs(runs)
    names = [r.name for r in found]
    written = []
    for run in found:  # two runs of one name (in two studies) get two folders, not one
        name = run.name if names.count(run.name) == 1 else "-".join(
            run.relative_to(Path(runs)).parts)
        try:
            written.append(write_run(run, out / name))
        except BadFile as exc:  # one damaged run never stops the others
            if len(found) == 1:
                raise
            log.warning("export: skipped %s", exc)
    if not written:
        raise UsageError(f"none of the {len(found)} run(s) under {runs} could be read (each "
                         "is named above); nothing written")
    return written


def write_run(run: Path, logdir: Path) -> Path:
    """One run's metrics, steps and samples as event files in ``logdir`` (replacing
    earlier ones). Everything is read first: a damaged file is refused (BadFile) before
    anything is written."""
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    manifest = load_manifest(run / MANIFEST)
    points: list[tuple[str, float, int, float]] = []
    start = _epochs(run, manifest, points)
    _steps(run, points, start)
    _samples(run, points, start)
    try:
        logdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {logdir}: {exc.strerror}") from None
    for old in logdir.glob("events.out.tfevents.*"):
        old.unlink()
    writer = EventFileWriter(str(logdir))
    try:
        for point in points:
            _event(writer, *point)
    finally:
        writer.close()
    return logdir


def _event(writer, tag: str, value: float, step: int, wall_time: float) -> None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
    writer.add_event(Event(summary=summary, step=step, wall_time=wall_time))


def _scalar(points: list, tag: str, value: float, step: int, wall_time: float) -> None:
    points.append((tag, value, step, wall_time))


def _epochs(run: Path, manifest: dict, points: list) -> float:
    """Per-epoch scalars; returns the run's start (epoch wall times count from it)."""
    from datetime import datetime

    started = manifest.get("started_at")
    try:
        start = datetime.fromisoformat(started).timestamp() if started else 0.0
    except (TypeError, ValueError):
        start = 0.0
    if not (run / METRICS).exists():
        return start
    elapsed = 0.0
    text = read_text(run / METRICS, "metrics table", CAPS["record"])
    for line, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        try:
            epoch = int(row["epoch"])
            elapsed += float(row.get("epoch_time_s") or 0.0)
            values = {name: float(text) for name, text in row.items()
                      if name not in ("epoch", None) and text not in (None, "")}
        except (KeyError, TypeError, ValueError):
            raise BadFile("metrics table", run / METRICS, f"line {line} is not a row of "
                          "numbers with an epoch; was it edited?") from None
        for name, value in values.items():
            if math.isfinite(value):
                _scalar(points, f"epoch/{name}", value, epoch, start + elapsed)
    return start


def _steps(run: Path, points: list, start: float) -> None:
    """Per-step scalars (step = the run's global step): rank 0's training loss and
    images/s, from steps.csv."""
    if not (run / STEPS).exists():
        return
    text = read_text(run / STEPS, "steps table", 512 << 20)
    elapsed = 0.0
    for line, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        try:
            step, loss = int(row["global_step"]), float(row["train_loss"])
            rate, elapsed = float(row["images_per_s"]), elapsed + float(row["seconds"])
        except (KeyError, TypeError, ValueError):
            raise BadFile("steps table", run / STEPS, f"line {line} is not a step's row of "
                          "numbers; was it edited?") from None
        for tag, value in (("step/train_loss", loss), ("step/images_per_s_rank0", rate)):
            if math.isfinite(value):
                _scalar(points, tag, value, step, start + elapsed)


def _samples(run: Path, points: list, start: float) -> None:
    if not (run / SAMPLES).exists():
        return
    frame = read_parquet(run / SAMPLES, "samples")
    try:
        groups = list(frame.groupby(["scope", "rank"], sort=True))
        points += [(f"resources/{scope}-rank{rank}/{column}", float(value),
                   int(round(float(t_s) * 1000)), float(wall) if wall == wall else start)
                  for (scope, rank), rows in groups for column in SAMPLED if column in rows
                  for t_s, wall, value in zip(rows["t_s"], rows["time"], rows[column],
                                              strict=True)
                  if value == value]  # not NaN (no GPU, say)
    except (KeyError, TypeError, ValueError, OverflowError):
        raise BadFile("samples", run / SAMPLES, "does not hold ddlstudy's sample columns "
                      "(scope, rank, t_s, time and numbers); was it edited?") from None
