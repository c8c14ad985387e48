"""`ddlstudy study plan.toml`: the use case x configuration x repeat matrix in one command.

A plan (see usecases/demo.toml and usecases/paper.toml)::

    [study]
    name = "demo"
    usecases = ["tiny"]
    repeat = 1
    runs_dir = "runs/demo"        # default: runs/<name>; relative to the plan's repository

    [settings]                    # `ddlstudy run` flags for every cell (dashes as _)
    epochs = 5

    [[cells]]
    strategy = "cpu-processes"
    workers = 2

Each cell x use case x repeat is one `ddlstudy run` in its own process, so a crash, a
thread setting or an MPI launch of one cell cannot touch the next; its output goes to
``<runs_dir>/logs/<run id>.log``. Every cell is validated before the first starts (a bad
plan is refused whole, exit 2); a cell this machine cannot run (no GPU, no backend) is
recorded as skipped with the reason; a failed cell is recorded and the study goes on.
``study.json`` in the runs folder is rewritten after every cell. The baseline
(``sequential``) is added to every use case that lacks it. With ``--resume``, a cell whose
completed run has the same resolved configuration is reused instead of run again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlstudy.backends import get_backend
from ddlstudy.config import DataSpec, RunConfig, TrainSpec
from ddlstudy.config.run import jsonable
from ddlstudy.errors import NotHere, Unavailable, UsageError
from ddlstudy.exports.mlflow import store
from ddlstudy.files import atomic_write_json, folder_lock
from ddlstudy.machine import forkserver
from ddlstudy.machine.environment import usable_cores
from ddlstudy.machine.sampler import check_load
from ddlstudy.records.formats import Study as StudyRecord
from ddlstudy.records.formats import load
from ddlstudy.records.plan import Plan, configs, load_plan, run_flags
from ddlstudy.records.runfolder import (
    MANIFEST,
    RUN_ID_ENV,
    load_manifest,
    new_run_id,
    now_iso,
    run_env,
)
from ddlstudy.report import STUDY_FILE, Report, config_label, cores_used
from ddlstudy.runner import preflight, resolve
from ddlstudy.signals import SETUP_TIMEOUT_ENV, TimedOut, time_limit
from ddlstudy.strategies import get_strategy

log = logging.getLogger("ddlstudy")


@dataclass
class Cell:
    """One run to do: a use case (None: the flags' --data-dir alone), its flags, which
    repeat."""

    usecase: str | None
    flags: dict[str, Any]
    repeat: int
    cfg: RunConfig | None = None
    id: str = ""
    label: str = ""
    cores: int = 0
    status: str = "pending"
    reason: str = ""
    run: str = ""
    seconds: float = 0.0

    def argv(self, runs_dir: Path) -> list[str]:
        return ["run", "--quiet", *run_flags(self.usecase, self.flags, runs_dir)]

    @property
    def name(self) -> str:
        """Its use case's name (of a --data-dir alone: the folder's use case's)."""
        return self.usecase or (self.cfg.usecase.name if self.cfg else "--data-dir")

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "usecase": self.name, "label": self.label,
                "strategy": self.flags.get("strategy", "sequential"),
                "backend": self.flags.get("backend", "local"),
                "nodes": self.flags.get("nodes", 1), "cores": self.cores, "flags": self.flags,
                "repeat": self.repeat, "status": self.status, "reason": self.reason,
                "run": self.run, "seconds": round(self.seconds, 2)}


def config_key(config: dict[str, Any]) -> str:
    """Hash of what defines a run, from its config as a manifest records it: the use case
    and every setting that differs from its default (not where the folder goes). Settings
    that a later version adds with a default leave the key of older runs unchanged."""
    key = _not_default(config, RunConfig)
    key.pop("runs_dir", None)
    key["usecase"] = {k: v for k, v in config["usecase"].items() if k != "source"}
    for table, spec, only in (("train", TrainSpec, None),  # lr_warmup_epochs came later
                              ("data", DataSpec, AUGMENTATION)):
        if isinstance(key["usecase"].get(table), dict):
            key["usecase"][table] = _not_default(key["usecase"][table], spec, only)
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


AUGMENTATION = ("flip", "crop_scale", "normalize")
"""The [data] keys that came after the others (left at their defaults, out of the key)."""


def _not_default(values: dict[str, Any], spec: type,
                 only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """``values`` less those equal to the default of ``spec``'s field of the same name
    (of the fields ``only`` names, where given)."""
    defaults = {f.name: jsonable(f.default) for f in dataclasses.fields(spec)
                if f.default is not dataclasses.MISSING and (only is None or f.name in only)}
    return {k: v for k, v in values.items() if not (k in defaults and defaults[k] == v)}


def expand(plan: Plan, overrides: dict[str, Any], elsewhere: bool = False) -> list[Cell]:
    """Every cell of the plan, validated: repeats outermost so slow drift spreads over
    all configurations; the baseline first in each use case. ``elsewhere`` (the cells run
    on a cluster's nodes): a cell this machine lacks the hardware for stays pending."""
    checked = configs(plan, overrides)
    out: list[Cell] = []
    timed_out: dict[str, str] = {}  # a cell whose set-up ran out is not waited on again
    for repeat in range(1, plan.repeat + 1):
        for uc, flags, cfg in checked:
            cell = Cell(usecase=uc, flags=flags, repeat=repeat)
            cell.cfg = resolve(cfg)
            cell.id = config_key(cell.cfg.to_dict())
            cell.label, cell.cores = _label(cell.cfg)
            try:
                if cell.id in timed_out:
                    raise TimedOut(timed_out[cell.id])
                with time_limit(plan.setup_timeout_s, f"the set-up of {cell.label} on {uc}"):
                    cell.cfg = preflight(cell.cfg)
            except NotHere as exc:
                if not elsewhere:
                    cell.status, cell.reason = "skipped", str(exc)
            except Unavailable as exc:
                cell.status, cell.reason = "skipped", str(exc)
            except UsageError as exc:
                raise UsageError(f"{plan.path}, use case {uc}, cell {flags}: {exc}") from None
            except TimedOut as exc:
                cell.status, cell.reason = "failed", f"{exc}; setup_timeout_s in the " \
                    f"plan's [study] sets the limit"
                timed_out[cell.id] = str(exc)
            out.append(cell)
    return out


def _label(cfg: RunConfig) -> tuple[str, int]:
    """The label the report will give the run (from the layout the strategy will record),
    and the cores it will use."""
    strategy = get_strategy(cfg.strategy)
    try:
        layout = strategy.layout(cfg).as_dict()
    except Exception:  # a layout that needs hardware this machine lacks
        layout = {}
    manifest = {"strategy": {"name": cfg.strategy, **layout},
                "backend": get_backend(cfg.backend).describe(cfg),
                "config": {"precision": cfg.precision, "accumulate": cfg.accumulate,
                           "scaling": cfg.scaling, "lr_scaling": cfg.lr_scaling,
                           "compress": cfg.compress, "balance": cfg.balance,
                           "bucket_mb": cfg.bucket_mb, "transport": cfg.transport,
                           "hosts": cfg.hosts},
                "effective": cfg.effective.as_dict(),
                "host": {"usable_cores": usable_cores()}}
    return config_label(manifest), cores_used(manifest)


def _study_runs(runs_dir: Path, study: str) -> list[dict[str, Any]]:
    """The manifests of ``study``'s runs in ``runs_dir``."""
    runs = []
    for path in sorted(Path(runs_dir).glob(f"*/{MANIFEST}")):
        try:
            m = load_manifest(path)
        except UsageError as exc:
            log.warning("left out %s", exc)
            continue
        if (m.get("study") or {}).get("name") == study:
            runs.append(m)
    return runs


def run_status(manifest: Path) -> str | None:
    """The status a cell's run recorded (None: no manifest, or one that cannot be read)."""
    try:
        return load_manifest(manifest)["status"] if manifest.is_file() else None
    except UsageError as exc:
        log.warning("%s", exc)
        return None


def _keep_damaged(record: Path) -> None:
    """A study.json that is not one (edited, truncated) is kept aside, not overwritten: the
    study's record is made again from its runs' manifests, which are the truth."""
    if not record.exists() and not record.is_symlink():
        return
    try:
        load(record, StudyRecord, "study record")
    except UsageError as exc:
        aside = record.with_name(record.name + ".damaged")
        record.rename(aside)
        log.warning("%s; kept as %s, the record made again from the runs", exc, aside.name)


def _finished(runs: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(cell id, repeat) -> run id of the completed ones among ``runs``."""
    return {(config_key(m["config"]), m["study"].get("repeat")): m["id"] for m in runs
            if m.get("status") == "completed" and "config" in m}


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Study:
    submit = ""
    """Where its cells went as jobs ("slurm"), recorded in study.json; "": run here."""

    def __init__(self, plan: Plan, cells: list[Cell], wait_quiet: bool = False) -> None:
        self.plan = plan
        self.cells = cells
        self.wait_quiet = wait_quiet
        self.started = now_iso()

    def save(self) -> None:
        record = {"name": self.plan.name, "plan": str(self.plan.path),
                  "description": self.plan.description, "repeat": self.plan.repeat,
                  "started_at": self.started, "updated_at": now_iso(),
                  "cells": [c.record() for c in self.cells],
                  **({"submit": self.submit} if self.submit else {})}
        atomic_write_json(self.plan.runs_dir / STUDY_FILE, record)

    def open(self, resume: bool) -> list[dict[str, Any]]:
        """The manifests of the study's earlier runs in its runs folder (refused there
        unless ``resume``), the folder made and a damaged study.json kept aside."""
        runs_dir = self.plan.runs_dir
        earlier = _study_runs(runs_dir, self.plan.name)
        if not resume and earlier:
            raise UsageError(f"{runs_dir} already holds runs of study {self.plan.name!r}; "
                             f"add --resume to reuse the finished ones, or give another "
                             f"--runs-dir")
        runs_dir.mkdir(parents=True, exist_ok=True)
        _keep_damaged(runs_dir / STUDY_FILE)
        return earlier

    def run(self, resume: bool) -> int:
        """Run every pending cell; 0 when none failed, 1 otherwise (130/143 interrupted)."""
        runs_dir = self.plan.runs_dir
        earlier = self.open(resume)
        if resume:
            done = _finished(earlier)
            for c in self.cells:
                if c.status == "pending" and (c.id, c.repeat) in done:
                    c.status, c.run = "reused", done[(c.id, c.repeat)]
        todo = [c for c in self.cells if c.status == "pending"]
        log.info("study %s: %d cells (%d to run, %d reused, %d skipped) into %s",
                 self.plan.name, len(self.cells), len(todo),
                 sum(c.status == "reused" for c in self.cells),
                 sum(c.status == "skipped" for c in self.cells), runs_dir)
        for c in self.cells:
            if c.status == "skipped":
                log.warning("skipped %s on %s: %s", c.label, c.name, c.reason)
            if c.status == "failed":  # its set-up ran out before any run started
                log.error("%s on %s failed: %s", c.label, c.name, c.reason)
        self.save()
        start = time.monotonic()
        code = int(any(c.status == "failed" for c in self.cells))
        for i, cell in enumerate(todo, 1):
            if i == 1 or self.wait_quiet:
                check_load(self.wait_quiet)
            code = max(code, self._run_cell(cell))
            self.save()
            elapsed = time.monotonic() - start
            left = time_left(todo[:i], todo[i:])
            log.info("[%d/%d] %s on %s, repeat %d: %s in %.1f s | elapsed %s, about %s left",
                     i, len(todo), cell.label, cell.name, cell.repeat, cell.status,
                     cell.seconds, _clock(elapsed), _clock(left))
            if cell.status == "interrupted":
                return 130
        return code

    def cell_vars(self, cell: Cell) -> dict[str, str]:
        """The variables that make a cell's ``ddlstudy run`` one of this study's: its run
        id (the folder it writes), the study and cell it records, the set-up's limit."""
        return {RUN_ID_ENV: cell.run, SETUP_TIMEOUT_ENV: str(self.plan.setup_timeout_s),
                "DDLSTUDY_STUDY": json.dumps({"name": self.plan.name, "cell": cell.id,
                                              "repeat": cell.repeat})}

    def _run_cell(self, cell: Cell) -> int:
        runs_dir = self.plan.runs_dir
        cell.run = new_run_id(cell.cfg.usecase.name, cell.cfg.strategy, cell.cfg.backend)
        logs = runs_dir / "logs"
        logs.mkdir(exist_ok=True)
        env = run_env(cell.run, **self.cell_vars(cell))
        start = time.monotonic()
        with open(logs / f"{cell.run}.log", "w") as out:
            try:  # `python -m ddlstudy run` forked warm: no seconds of imports a cell
                code = forkserver.command(cell.argv(runs_dir), env, out.fileno(), out.fileno())
            except KeyboardInterrupt:
                code = 130
        cell.seconds = time.monotonic() - start
        manifest = runs_dir / cell.run / MANIFEST
        status = run_status(manifest)
        if code == 0 and status == "completed":
            cell.status = "completed"
            return 0
        if code in (130, 143) or status == "interrupted":
            cell.status, cell.reason = "interrupted", f"exit code {code}"
            return code
        log_file = logs / f"{cell.run}.log"
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        cell.status, cell.reason = "failed", f"exit code {code}: {tail[0]}"
        if not manifest.is_file():
            cell.run = ""  # no folder: the report shows the cell from study.json
        log.error("%s on %s failed (%s); log: %s", cell.label, cell.name, cell.reason,
                  log_file)
        return 1


def study(plan: Plan | Path, *, repeat: int | None = None, resume: bool = False,
          runs_dir: Path | None = None, overrides: dict[str, Any] | None = None,
          fmt: str = "markdown", wait_quiet: bool = False, include_noisy: bool = False) -> int:
    """Run a plan (a Plan, or a plan file to load), write its report (tables and figures)
    and print the tables; for a plan made from an advise.json, check the advice too
    (``include_noisy``: the report and the check count the runs marked noisy)."""
    if not isinstance(plan, Plan):
        plan = load_plan(plan, repeat, runs_dir)
    cells = expand(plan, overrides or {})
    with folder_lock(plan.runs_dir, "study"):  # one study at a time writes into it
        code = Study(plan, cells, wait_quiet).run(resume)
        write_report(plan, cells, fmt, include_noisy)
        return code


def write_report(plan: Plan, cells: list[Cell], fmt: str, include_noisy: bool = False) -> None:
    """The study's report (tables, figures) into <runs_dir>/report, its tables printed; the
    advice checked first where the plan asks (the report opens with it), and the MLflow
    parent run."""
    from ddlstudy.tools.advise import check_study

    checked = check_study(plan.path, plan.runs_dir, include_noisy) \
        if plan.path.suffix == ".json" else None
    report = Report(plan.runs_dir, include_noisy=include_noisy)
    paths = report.write(plan.runs_dir / "report", fmt)
    print(report.text(fmt))
    log.info("report: %d files in %s", len(paths), plan.runs_dir / "report")
    uris = {uri for c in cells if (uri := tracking_of(c, plan.runs_dir))}
    if uris:  # the mlflow setting: the report in the study's parent run
        from ddlstudy.exports.mlflow.runs import after_study

        after_study(plan.runs_dir, uris, paths)
    if checked is not None:
        print()
        print(checked)


def tracking_of(cell: Cell, runs_dir: Path) -> str | None:
    """The MLflow store a cell's run logs to: its configuration's, else (a cell read back
    from study.json, whose job ran it elsewhere) its recorded mlflow flag's."""
    if cell.cfg is not None:
        return cell.cfg.mlflow
    value = cell.flags.get("mlflow")
    return None if not value else \
        store.resolved(store.DEFAULT if value is True else str(value), runs_dir)


def time_left(done: list[Cell], rest: list[Cell]) -> float:
    """Seconds the cells of ``rest`` should take: each what its earlier repeat took, else
    the mean of its use case's cells done (a VGG16 cell takes minutes where an AlexNet
    one takes seconds), else the mean of all done."""
    took = {c.id: c.seconds for c in done}
    per_usecase: dict[str, list[float]] = {}
    for c in done:
        per_usecase.setdefault(c.usecase, []).append(c.seconds)
    everyone = [c.seconds for c in done] or [0.0]
    return sum(took.get(c.id) or statistics.fmean(per_usecase.get(c.usecase) or everyone)
               for c in rest)
