"""Runs in MLflow, through its client: ``ddlstudy export mlflow RUNS``, and what
``run --mlflow`` (and a study with the ``mlflow`` setting) logs when a run ends.

    ddlstudy export mlflow runs/demo                       # sqlite:///runs/demo/mlflow.db
    mlflow ui --backend-store-uri sqlite:///runs/demo/mlflow.db

One MLflow run per run folder (``store`` says where it goes and how it is found again):

- params: the configuration's key, as the report groups repeats (``report.runs.KEY``);
- tags: study, cell, repeat, status, noisy, host, launcher, git commit, ddlstudy version
  and the run's id (``ddlstudy_run_id``);
- metrics: every column of metrics.csv per epoch (step = the epoch); the run's figures
  against its folder (``SUMMARY``: speedup, time to target, ...); its memory in GiB
  (``tensorboard.MEMORY_METRICS``: ``memory/peak_gib_per_node``, ...); the resource samples
  under MLflow's system-metric names, ``system/<scope>-rank<r>/<name>`` (``SYSTEM``),
  at their time (step = milliseconds since the run started);
- artifacts: manifest.json (as ``run-manifest.json``: no reader of runs takes the copy
  for a run), metrics.csv, steps.csv, samples.parquet, error.log and any figures;
- its trained model (``runs:/<id>/model``, ``ddlstudy.exports.mlflow.model``), where it kept one.

A study folder (one with study.json) is an experiment of its name whose parent run holds
the report (tables, findings, figures) and study.json (as ``study-record.json``); its
runs nest under it. Everything is read first: bad input is refused in one line before
anything is written. Exporting again updates the same runs: metrics already there (same
name and step) are not logged twice.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ddlstudy.errors import UsageError
from ddlstudy.exports.mlflow import store
from ddlstudy.exports.mlflow.model import log_model
from ddlstudy.exports.tensorboard import every_run, find_runs, memory_metrics
from ddlstudy.machine.sampler import IDENTITY, read_samples
from ddlstudy.reading import CAPS, BadFile, check_regular, read_bytes, read_text
from ddlstudy.records.formats import Study, load
from ddlstudy.records.runfolder import MANIFEST, METRICS, SAMPLES, STEPS, load_manifest
from ddlstudy.redact import redact, shown
from ddlstudy.report import STUDY_FILE, Report, load_runs, runs_frame
from ddlstudy.report.runs import KEY

log = logging.getLogger("ddlstudy")

SYSTEM = {
    "sys_cpu_percent": ("cpu_utilization_percentage", 1.0, False),
    "sys_iowait_percent": ("cpu_iowait_percentage", 1.0, False),
    "sys_ram_used_bytes": ("system_memory_usage_megabytes", 1e-6, False),
    "sys_ram_percent": ("system_memory_usage_percentage", 1.0, False),
    "net_recv_bytes": ("network_receive_megabytes", 1e-6, True),
    "net_sent_bytes": ("network_transmit_megabytes", 1e-6, True),
    "lo_recv_bytes": ("loopback_receive_megabytes", 1e-6, True),
    "lo_sent_bytes": ("loopback_transmit_megabytes", 1e-6, True),
    "disk_read_bytes": ("disk_read_megabytes", 1e-6, True),
    "disk_write_bytes": ("disk_write_megabytes", 1e-6, True),
    "gpu_util_percent": ("gpu_utilization_percentage", 1.0, False),
    "gpu_mem_used_bytes": ("gpu_memory_usage_megabytes", 1e-6, False),
    "proc_cpu_percent": ("process_cpu_utilization_percentage", 1.0, False),
    "proc_rss_bytes": ("process_memory_rss_megabytes", 1e-6, False),
    "proc_threads": ("process_threads", 1.0, False),
}
"""A samples column: (its MLflow system-metric name, the scale to it, whether it counts
from the run's first sample, as MLflow's network figures do). The names are MLflow's own
where it has one (``cpu_utilization_percentage``, ...); GPUs are summed (memory) or
averaged (utilization) over a node's devices, as the samples hold them."""
MOST_SAMPLES = 2000
"""Points per system-metric series at most (a long run's samples are thinned evenly)."""
SUMMARY = {"median_images_per_s": "images_per_s", "speedup": "speedup",
           "efficiency": "efficiency", "time_to_target_s": "tta_s",
           "best_val_accuracy": "best_val_accuracy"}
"""A run's figures, by MLflow metric name: the report's runs table's column (step 0)."""
RECORDS = {MANIFEST: "run-manifest.json", STUDY_FILE: "study-record.json"}
"""Files uploaded under another name, so that no reader of runs takes a copy for a run."""
FILES = (MANIFEST, METRICS, STEPS, SAMPLES, "error.log")


@dataclass
class RunRead:
    """One run folder, read: what its MLflow run gets."""

    path: Path
    manifest: dict
    row: dict
    epochs: list = field(default_factory=list)  # (epoch, values, timestamp ms)
    samples: Any = None
    files: list[Path] = field(default_factory=list)


@dataclass
class StudyRead:
    """A study folder, read: its record and its report written into a temporary folder."""

    name: str
    record: dict
    files: list[tuple[Path, str]]  # (file, artifact folder)


def store_folder(runs: Path) -> Path:
    """Where the default store goes: the folder of runs (beside a single run folder)."""
    runs = Path(runs)
    return runs.parent if (runs / MANIFEST).exists() else runs


def export(runs: Path, uri: str | None = None, experiment: str | None = None,
           report: list[Path] | None = None) -> dict:
    """Every run at or under ``runs`` into the MLflow store ``uri`` (default:
    ``sqlite:///<runs>/mlflow.db``); returns what was exported (uri, runs, experiments).
    ``report``: the files of the report of ``runs`` just written (by its study), used
    as they are."""
    if not store.installed():
        raise UsageError(f"export mlflow needs MLflow, which is not installed: "
                         f"{store.INSTALL}")
    found = find_runs(runs)
    uri = store.resolved(store.DEFAULT if uri is None else uri, store_folder(runs),
                           "--tracking-uri")
    with tempfile.TemporaryDirectory(prefix="ddlstudy-mlflow-") as tmp:
        read = read_runs(Path(runs), found)
        studies = read_studies(Path(runs), Path(tmp), report)
        with store.in_turn(uri):  # two exports into one store: one, then the other
            mlflow = store.client(uri)  # the last check: a server that does not answer
            try:
                names = write(mlflow, uri, read, studies, experiment, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - MLflow's own kinds, said in one line
                text = redact(" ".join(str(exc).split()))[:300] or type(exc).__name__
                raise UsageError(f"MLflow ({shown(uri)}) stopped the export: {text}; what "
                                 "was logged stays, and exporting again completes it") from None
    return {"uri": shown(uri), "runs": len(read), "experiments": sorted(set(names))}


def read_runs(root: Path, found: list[Path]) -> list[RunRead]:
    """Each run folder's manifest (through the report's reader, which says what it skips),
    its row of the report's runs table, epochs, samples and files; a damaged run is
    skipped (refused, where it is the only one)."""
    if found == [root]:
        manifests = [load_manifest(root / MANIFEST) | {"path": str(root)}]
    else:
        try:
            manifests = load_runs(root)
        except UsageError:  # every one skipped, each named
            manifests = []
    rows = runs_frame(manifests).to_dict("records") if manifests else []
    return every_run(list(zip(manifests, rows, strict=True)),
                     lambda pair: _read_run(Path(pair[0]["path"]), *pair), found, root)


def _read_run(path: Path, manifest: dict, row: dict) -> RunRead:
    start = _ms(manifest.get("started_at")) or 0
    run = RunRead(path, manifest, row)
    if (path / METRICS).exists():
        text = read_text(path / METRICS, "metrics table", CAPS["record"])
        elapsed = 0.0
        for line, values in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
            try:
                epoch = int(values["epoch"])
                numbers = {k: float(v) for k, v in values.items()
                           if k not in ("epoch", None) and v not in (None, "")}
            except (KeyError, TypeError, ValueError):
                raise BadFile("metrics table", path / METRICS, f"line {line} is not a row of "
                              "numbers with an epoch; was it edited?") from None
            elapsed = numbers.get("elapsed_s", elapsed + numbers.get("epoch_time_s", 0.0))
            run.epochs.append((epoch, numbers, start + int(elapsed * 1000)))
    if (path / SAMPLES).exists():  # the one reader of samples: columns and kinds checked
        run.samples = read_samples(path / SAMPLES, (*IDENTITY, "t_s"))
    figures = [p for p in [*path.glob("*.png"), *path.glob("*.svg"), *path.glob("figures/*")]
               if p.is_file()]
    run.files = [path / f for f in FILES if (path / f).exists()] + sorted(figures)
    for file in run.files:  # a FIFO or a device would hang MLflow's copy
        check_regular(file, "run file")
    return run


def read_studies(root: Path, tmp: Path, report: list[Path] | None = None
                 ) -> dict[str, StudyRead]:
    """The study folders at or under ``root``, by name, each with its report written by
    the report's own code (tables, findings, figures) into ``tmp`` (``root``'s own:
    ``report``'s files, where given)."""
    studies = {}
    for record_file in sorted(root.rglob(STUDY_FILE)):
        try:
            record = load(record_file, Study, "study record")
        except UsageError as exc:  # its runs are still exported, without its report
            log.warning("export: left out the report of %s", exc)
            continue
        out = tmp / "report" / record["name"]
        try:
            if report is not None and record_file.parent == root:
                out, paths = root / "report", report
            else:
                paths = Report(record_file.parent).write(out)
        except UsageError as exc:  # a study none of whose runs can be read
            log.warning("export: no report of study %s: %s", record["name"], exc)
            paths = []
        copy = tmp / "records" / record["name"] / RECORDS[STUDY_FILE]
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(read_bytes(record_file, "study record", CAPS["record"]))
        studies[record["name"]] = StudyRead(record["name"], record, [
            (p, str(Path("report") / p.parent.relative_to(out))) for p in paths] +
            [(copy, "")])
    return studies


def write(mlflow, uri: str, runs: list[RunRead], studies: dict[str, StudyRead],
          experiment: str | None, tmp: Path) -> list[str]:
    """Log every run (and its study's parent run first); returns their experiments."""
    experiments: dict[str, str] = {}
    parents: dict[tuple[str, str], str] = {}
    names = []
    for run in runs:
        name = experiment or store.experiment_name(run.manifest, run.path)
        if name not in experiments:
            experiments[name] = store.experiment(mlflow, name, uri)
        exp = experiments[name]
        study = (run.manifest.get("study") or {}).get("name")
        if study and (exp, study) not in parents:
            parents[(exp, study)] = write_study(mlflow, exp, study, studies.get(study))
        write_run(mlflow, exp, run, parents.get((exp, study)), tmp)
        names.append(name)
    return names


def write_study(mlflow, exp: str, name: str, study: StudyRead | None) -> str:
    """A study's parent run: its report and record as artifacts (where its folder was
    exported); returns its id."""
    record = study.record if study else {}
    run = store.parent_run(mlflow, exp, name, _ms(record.get("started_at")))
    run_id = run.info.run_id
    tags = {"mlflow.note.content": record.get("description"), "plan": record.get("plan"),
            "repeat": record.get("repeat")}
    _tags(mlflow, run_id, {k: str(v) for k, v in tags.items() if v})
    for file, folder in study.files if study else []:
        mlflow.log_artifact(run_id, str(file), folder or None)
    if study and not any(c.get("status") == "pending" for c in record.get("cells", [])):
        mlflow.set_terminated(run_id, "FINISHED", _ms(record.get("updated_at")))
    return run_id


def run_name(row: dict) -> str:
    """A run's name in MLflow: its configuration's label, and its repeat in a study."""
    repeat = row.get("repeat") or 0
    return f"{row['config']} #{repeat}" if repeat else str(row["config"])


def params(row: dict) -> dict[str, str]:
    """A run's params: its configuration's key, as the report's runs table holds it."""
    return {k: str(row[k]) for k in KEY}


def write_run(mlflow, exp: str, run: RunRead, parent: str | None, tmp: Path) -> str:
    """One run folder's MLflow run, made or brought up to date; returns its id."""
    from mlflow.entities import Param

    m = run.manifest
    tags = store.run_tags(m) | {"mlflow.runName": run_name(run.row)}
    if parent:
        tags["mlflow.parentRunId"] = parent
    found, new = store.open_run(mlflow, exp, tags, run_name(run.row),
                                   _ms(m.get("started_at")))
    run_id = found.info.run_id
    if not new:
        _tags(mlflow, run_id, tags)
    have = found.data.params
    differ = [k for k, v in params(run.row).items() if k in have and have[k] != v]
    if differ:
        log.warning("export: %s: MLflow keeps a run's params as first logged; %s left as "
                    "%r", m["id"], differ[0], have[differ[0]])
    mlflow.log_batch(run_id, params=[Param(k, v) for k, v in params(run.row).items()
                                     if k not in have])
    store.log_batch(mlflow, run_id, _new(mlflow, found, new, _metrics(run)))
    _upload(mlflow, run_id, run, tmp)
    log_model(mlflow, exp, run_id, run.path, tmp)
    status = store.STATUS.get(m.get("status"), "RUNNING")
    if status != "RUNNING":
        mlflow.set_terminated(run_id, status, _ms(m.get("ended_at")))
    return run_id


def _metrics(run: RunRead) -> list:
    """Every metric of a run: per epoch, its figures (step 0, now) and its samples."""
    from mlflow.entities import Metric

    out = [metric for epoch, values, when in run.epochs
           for metric in store.epoch_metrics(values, epoch, when)]
    now = store.now_ms()
    out += [Metric(name, float(run.row[column]), now, 0) for name, column in SUMMARY.items()
            if _finite(run.row.get(column))]
    out += [Metric(name, value, now, 0) for name, value in memory_metrics(run.manifest).items()]
    return out + system_metrics(run.samples)


def _finite(value: Any) -> bool:
    try:
        return value is not None and not isinstance(value, bool) and math.isfinite(value)
    except TypeError:
        return False


def system_metrics(frame) -> list:
    """The resource samples as MLflow system metrics, one series per scope and rank
    (``system/node-rank0/cpu_utilization_percentage``), step = ms since the start."""
    from mlflow.entities import Metric

    if frame is None or not len(frame):
        return []
    out = []
    for (scope, rank), rows in frame.groupby(["scope", "rank"], sort=True):
        keep = rows.iloc[::max(1, math.ceil(len(rows) / MOST_SAMPLES))]
        for column, (name, scale, from_first) in SYSTEM.items():
            if column not in rows:
                continue
            values = rows[column].dropna()
            first = float(values.iloc[0]) if from_first and len(values) else 0.0
            out += [Metric(f"system/{scope}-rank{rank}/{name}", (float(v) - first) * scale,
                           int(float(when) * 1000), int(round(float(t_s) * 1000)))
                    for t_s, when, v in zip(keep.t_s, keep.time, keep[column], strict=True)
                    if _finite(v) and _finite(when) and _finite(t_s)]
    return out


def _new(mlflow, found, new: bool, metrics: list) -> list:
    """``metrics`` less what the run has already: a series' steps logged before (a
    run's figures: the same value)."""
    if new:
        return metrics
    latest = found.data.metrics
    steps = {key: {m.step for m in mlflow.get_metric_history(found.info.run_id, key)}
             for key in {m.key for m in metrics} if key in latest}
    return [m for m in metrics if m.step not in steps.get(m.key, ()) or
            (m.key in SUMMARY and latest.get(m.key) != m.value)]


def _upload(mlflow, run_id: str, run: RunRead, tmp: Path) -> None:
    for file in run.files:
        if file.name in RECORDS:
            copy = tmp / "records" / run.manifest["id"] / RECORDS[file.name]
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)
            file = copy
        folder = "figures" if file.parent == run.path / "figures" else None
        mlflow.log_artifact(run_id, str(file), folder)


def _tags(mlflow, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    mlflow.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def _ms(iso: str | None) -> int | None:
    try:
        return int(datetime.fromisoformat(iso).timestamp() * 1000) if iso else None
    except (TypeError, ValueError):
        return None


def after_run(folder: Path, uri: str) -> None:
    """``run --mlflow``, when the run has ended: its params, tags, samples and files (its
    epochs were logged as they ended); a failure is a warning, never the run's."""
    try:
        export(folder, uri)
        log.info("MLflow: run %s logged to %s", Path(folder).name, shown(uri))
    except Exception as exc:  # noqa: BLE001 - the run is recorded already
        log.warning("MLflow (%s): could not log run %s: %s", shown(uri), Path(folder).name,
                    redact(str(exc)))


def after_study(runs_dir: Path, uris: set[str], report: list[Path]) -> None:
    """A study with the ``mlflow`` setting, when it has ended: its report (the files it
    just wrote) in the parent run, and the rest of every run: params, figures against
    the study's baseline, samples, files."""
    for uri in sorted(uris):
        try:
            done = export(runs_dir, uri, report=report)
            log.info("MLflow: %d run(s) and the report logged to %s", done["runs"],
                     done["uri"])
        except Exception as exc:  # noqa: BLE001 - the study's report is written already
            log.warning("MLflow (%s): could not log the study: %s", shown(uri),
                        redact(str(exc)))
