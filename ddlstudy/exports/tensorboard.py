"""Runs as TensorBoard scalars, written with the tensorboard package's own event writer.

    ddlstudy export tensorboard runs/ --out tb/     # then: tensorboard --logdir tb/
    ddlstudy run ... --tensorboard                  # into <run>/tensorboard/ at its end

Each run is a TensorBoard run named after its id: ``epoch/<metric>`` per epoch (step = the
epoch) from metrics.csv, and ``resources/<scope>-rank<r>/<column>`` from samples.parquet
(step = milliseconds since the run started, wall time = when it was sampled), and
``memory/<figure>`` (step 0, GiB: ``MEMORY_METRICS``) from the manifest's memory record.

``write_hparams`` adds the HParams dashboard's view (``export tensorboard`` writes it from
the report's speedup table): ``hparams/`` holds the experiment (the configuration's key as
hyperparameters, with the values each takes, and the metrics), ``hparams/<nn>-<label>/``
one session per configuration, its key and its figures (medians over its repeats) as the
scalars ``hparams/<metric>``.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
import time
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.files import check_folder
from ddlstudy.machine.sampler import IDENTITY, read_samples
from ddlstudy.reading import CAPS, BadFile, read_text
from ddlstudy.records.memory import GIB, memory_of
from ddlstudy.records.runfolder import MANIFEST, METRICS, SAMPLES, STEPS, load_manifest

log = logging.getLogger("ddlstudy")

SAMPLED = ("proc_cpu_percent", "proc_rss_bytes", "proc_threads", "sys_cpu_percent",
           "sys_iowait_percent", "sys_ram_percent", "net_sent_bytes", "net_recv_bytes",
           "disk_read_bytes", "disk_write_bytes", "gpu_util_percent", "gpu_mem_used_bytes")
"""The resource columns written (the cumulative byte counters as they were sampled)."""
NEEDED = (*IDENTITY, "t_s")
"""The samples' columns the resource series are made of (beside SAMPLED's, where held)."""
SUBDIR = "tensorboard"
HPARAMS = "hparams"
HPARAM_METRICS = {"images_per_s": "images/s", "speedup": "speedup",
                  "time_to_target_s": "time to target (s)", "val_accuracy": "val accuracy"}
"""The columns of the speedup table the HParams dashboard compares, with their names."""
MEMORY_METRICS = {"peak_process_bytes": "memory/peak_rss_gib_per_process",
                  "peak_node_bytes": "memory/peak_gib_per_node",
                  "held_parameters_bytes": "memory/parameters_gib_rank0",
                  "held_gradients_bytes": "memory/gradients_gib_rank0",
                  "held_optimizer_state_bytes": "memory/optimizer_state_gib_rank0"}
"""A run's memory figures (``records.memory.memory_of``'s) as the metrics TensorBoard and
MLflow get, in GiB (step 0)."""


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

    def target(run: Path) -> Path:  # two runs of one name (in two studies): two folders
        return out / (run.name if names.count(run.name) == 1 else "-".join(
            run.relative_to(Path(runs)).parts))

    inside = next((target(r) for r in found if (target(r) / MANIFEST).exists()), None)
    if inside is not None:  # --out RUNS would write events into the run folders
        raise UsageError(f"--out: {inside} is a run folder; give a folder of its own, e.g. "
                         f"{Path(runs).parent / 'tensorboard'}")
    return every_run(found, lambda run: write_run(run, target(run)), found, runs)


def every_run(items: list, do, found: list[Path], runs: Path) -> list:
    """``do(item)`` for each of ``items`` (of the run folders ``found`` under ``runs``): a
    damaged run (BadFile) never stops the others, it is skipped with a warning, but
    refused where it is the only one; none done is refused."""
    done = []
    for item in items:
        try:
            done.append(do(item))
        except BadFile as exc:
            if len(found) == 1:
                raise
            log.warning("export: skipped %s", exc)
    if not done:
        raise UsageError(f"none of the {len(found)} run(s) under {runs} could be read (each "
                         "is named above); nothing written")
    return done


def write_run(run: Path, logdir: Path) -> Path:
    """One run's metrics, steps and samples as event files in ``logdir`` (replacing
    earlier ones). Everything is read first: a damaged file is refused (BadFile) before
    anything is written."""
    manifest = load_manifest(run / MANIFEST)
    points: list[tuple[str, float, int, float]] = []
    start = _epochs(run, manifest, points)
    _steps(run, points, start)
    _samples(run, points, start)
    points += [(tag, value, 0, start) for tag, value in memory_metrics(manifest).items()]
    _representable(run, points)
    for old in logdir.glob("events.out.tfevents.*"):
        old.unlink()
    return _write_events(logdir, [(_simple(tag, value), step, wall_time)
                                  for tag, value, step, wall_time in points])


FILES = {"epoch": ("metrics table", METRICS), "step": ("steps table", STEPS),
         "resources": ("samples", SAMPLES), "memory": ("manifest", MANIFEST)}
"""Which file each kind of scalar comes from (a refusal names it)."""


def memory_metrics(manifest: dict) -> dict[str, float]:
    """The ``MEMORY_METRICS`` a run recorded, in GiB (none for a run from before)."""
    return {MEMORY_METRICS[k]: v / GIB for k, v in memory_of(manifest).items()
            if v is not None}


def _representable(run: Path, points: list) -> None:
    """Every point's step fits an event's int64 and its time is a date: else BadFile
    naming the file, before anything is written."""
    for tag, _, step, wall_time in points:
        if not 0 <= step < 2**62 or not (math.isfinite(wall_time) and
                                         0 <= wall_time < 1e11):
            what, name = FILES[tag.split("/")[0]]
            raise BadFile(what, run / name, f"{tag} has step {step} at time {wall_time:g}, "
                          "which an event file cannot hold; was it edited?")


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
    frame = read_samples(run / SAMPLES, NEEDED)  # its columns and their kinds checked
    if frame.empty:
        return
    groups = list(frame.groupby(["scope", "rank"], sort=True))
    points += [(f"resources/{scope}-rank{rank}/{column}", float(value),
               int(round(float(t_s) * 1000)), float(wall) if wall == wall else start)
               for (scope, rank), rows in groups for column in SAMPLED if column in rows
               for t_s, wall, value in zip(rows["t_s"], rows["time"], rows[column],
                                           strict=True)
               if value == value and t_s == t_s]  # not NaN (no GPU, say)


def write_hparams(out: Path, table, key: list[str]) -> list[Path]:
    """Every configuration of ``table`` that has runs (a row of the report's speedup
    table, ``key`` the columns that name it) as an HParams session under
    ``out/hparams/``, replacing what an earlier export wrote there; returns the sessions'
    folders."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    rows = [r for r in table.to_dict("records") if r.get("runs")]
    values = [{k: _plain(r[k]) for k in key if _plain(r[k]) is not None} for r in rows]
    domains = {k: sorted({v[k] for v in values if k in v}) for k in key}
    experiment = hp.hparams_config_pb(
        hparams=[hp.HParam(k, hp.Discrete(d)) for k, d in domains.items() if d],
        metrics=[hp.Metric(f"{HPARAMS}/{m}", display_name=name)
                 for m, name in HPARAM_METRICS.items()])
    root = Path(out) / HPARAMS
    for old in root.rglob("events.out.tfevents.*"):
        old.unlink()
    now = time.time()
    _write_events(root, [(experiment, 0, now)])
    written = []
    for i, (row, hparams) in enumerate(zip(rows, values, strict=True), start=1):
        name = re.sub(r"[^A-Za-z0-9._]+", "-", f"{row['usecase']} {row['config']}")
        name = f"{i:02d}-{name.strip('-')}"[:120]
        events = [(hp.hparams_pb(hparams, trial_id=name, start_time_secs=now), 0, now)]
        events += [(_simple(f"{HPARAMS}/{m}", row[m]), 0, now) for m in HPARAM_METRICS
                   if _plain(row.get(m)) is not None]
        written.append(_write_events(root / name, events))
    return written


def _plain(value):
    """A table's value as the plain bool, int, float or str HParams takes (None: none)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _simple(tag: str, value: float):
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])


def _write_events(logdir: Path, events: list) -> Path:
    """(summary, step, wall time) events into a new event file in ``logdir``."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    try:
        logdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {logdir}: {exc.strerror}") from None
    writer = EventFileWriter(str(logdir))
    try:
        for summary, step, wall_time in events:
            writer.add_event(Event(summary=summary, step=step, wall_time=wall_time))
    finally:
        writer.close()
    return logdir
