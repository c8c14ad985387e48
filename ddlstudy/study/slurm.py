"""`ddlstudy study PLAN --submit slurm`: a study's cells as Slurm jobs, and `--resume`
reading where they stand.

Each cell x repeat becomes one batch script, ``<runs_dir>/slurm/<run id>.sbatch`` (kept),
sized by the cell: ``--nodes`` (its MPI nodes, else 1), one task a node (an MPI node under
``srun --mpi=pmi2``), ``--cpus-per-task`` (the cores a node of it keeps busy),
``--gpus-per-node`` (a GPU strategy's devices), ``--mem`` (the plan's ``[study]
mem_per_node``), its log in ``<runs_dir>/logs``. The run id is fixed in the script
(DDLSTUDY_RUN_ID): the job writes the cell's run folder itself on the shared runs folder,
as a local study's cell does. ``sbatch --parsable`` submits it; study.json records each
cell's job and ``status: submitted``, and the command returns. Cells of one size go as one
job array (``<runs_dir>/slurm/array-<first run id>.sbatch``: its task i runs the i-th
cell's script, into that cell's log); such a cell's job is Slurm's ``<array job>_<task>``.

``--resume`` reads each waiting cell's job in ``scontrol show job`` (pending, running, or
how it ended while Slurm remembers it) and its run's manifest (how the run ended), prints
a table of the cells, submits failed cells again with ``--resubmit``, and writes the
report once no cell waits. A job cancelled, out of time or lost is a failed cell with
Slurm's state and reason; nothing waits on a job.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_text, folder_lock
from ddlstudy.hosts.slurm import Sbatch, require_client, slurm_call
from ddlstudy.machine.environment import python_module
from ddlstudy.records.formats import Study as StudyRecord
from ddlstudy.records.formats import load
from ddlstudy.records.plan import Plan, run_flags
from ddlstudy.records.runfolder import MANIFEST, new_run_id, run_env
from ddlstudy.redact import shown
from ddlstudy.report import STUDY_FILE
from ddlstudy.strategies import get_strategy
from ddlstudy.strategies.processes import cuda_devices
from ddlstudy.study.matrix import Cell, Study, expand, run_status, write_report

log = logging.getLogger("ddlstudy")

SUBMITTERS = ("slurm",)
ACTIVE = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending",
          "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "RUNNING": "running",
          "COMPLETING": "running", "SUSPENDED": "running", "STOPPED": "running",
          "SIGNALING": "running", "STAGE_OUT": "running", "RESIZING": "running"}
"""Slurm's job states of a job not ended, as a cell's status."""
WAITING = ("submitted", "pending", "running")
SRUN_DECIDES = ("nodes", "hosts", "hostfile")
"""An MPI cell's flags that srun's world replaces (its nodes are the job's)."""


@dataclass
class JobCell(Cell):
    """A cell of a submitted study: with its Slurm job and the GPUs a node asks for."""

    job: str = ""
    """Its Slurm job: ``12``, or ``12_3`` (task 3 of job array 12)."""
    gpus: int = 0

    def record(self) -> dict[str, Any]:
        return super().record() | {"job": self.job, "gpus": self.gpus}

    @classmethod
    def of(cls, cell: Cell) -> JobCell:
        values = {f.name: getattr(cell, f.name) for f in dataclasses.fields(Cell)}
        return cls(**values, gpus=_gpus(cell))

    @classmethod
    def recorded(cls, r: dict[str, Any]) -> JobCell:
        return cls(usecase=r["usecase"], flags=r.get("flags") or {}, repeat=r.get("repeat", 0),
                   id=r["id"], label=r["label"], cores=r.get("cores", 0), status=r["status"],
                   reason=r.get("reason", ""), run=r.get("run") or "",
                   seconds=r.get("seconds") or 0.0, job=str(r.get("job") or ""),
                   gpus=r.get("gpus") or 0)

    @property
    def mpi(self) -> bool:
        return self.flags.get("backend") == "mpi"

    @property
    def nodes(self) -> int:
        return int(self.flags.get("nodes", 1)) if self.mpi else 1


def _gpus(cell: Cell) -> int:
    """GPUs each node of a cell trains on: its layout's CUDA devices (0 on CPU)."""
    if cell.cfg is None or cell.status == "skipped":
        return 0
    strategy = get_strategy(cell.cfg.strategy)
    if "devices" in strategy.options and not cell.cfg.devices and not cuda_devices():
        raise UsageError(f"{cell.label} on {cell.usecase}: this machine has no GPU to count "
                         "the cell's by; give the cell devices = N in the plan (the GPUs a "
                         "node of its job asks Slurm for)")
    layout = strategy.layout(cell.cfg)
    return (layout.devices or layout.processes) if layout.device_type == "cuda" else 0


class SlurmStudy(Study):
    submit = "slurm"

    def size(self, cell: JobCell) -> tuple[str, ...]:
        """What the cell's job asks of Slurm: its nodes, a task a node, the cores and GPUs
        a node keeps busy, the plan's memory a node."""
        mem = self.plan.mem_per_node
        return (f"--nodes={cell.nodes}", "--ntasks-per-node=1",
                f"--cpus-per-task={max(1, math.ceil(cell.cores / cell.nodes))}",
                *([f"--gpus-per-node={cell.gpus}"] if cell.gpus else []),
                *([f"--mem={math.ceil(mem / 2**20)}M"] if mem else []))

    def script(self, cell: JobCell, sbatch: Sbatch) -> str:
        """The cell's batch script: its size in #SBATCH lines, its run's variables, and
        ``srun --mpi=pmi2 ddlstudy run`` (an MPI cell) or ``ddlstudy run``."""
        runs_dir = self.plan.runs_dir
        flags = {k: v for k, v in cell.flags.items() if not (cell.mpi and k in SRUN_DECIDES)}
        argv = python_module("ddlstudy", "run", "--quiet",
                             *run_flags(cell.usecase, flags, runs_dir))
        size = [f"--job-name={cell.run}", *self.size(cell),
                f"--output={runs_dir / 'logs' / cell.run}.log", *sbatch.lines()]
        launch = ["srun", "--mpi=pmi2"] if cell.mpi else ["exec"]
        return _batch(f"{cell.label} on {cell.usecase}, repeat {cell.repeat} (cell "
                      f"{cell.id})", self.plan.name, size,
                      *(f"export {k}={shlex.quote(v)}" for k, v in self.cell_vars(cell).items()),
                      shlex.join([*launch, *argv]))

    def array_script(self, cells: list[JobCell], paths: list[Path], sbatch: Sbatch) -> str:
        """One job array for ``cells`` of one size: task i runs the i-th cell's script
        (``paths``), its output into that cell's log."""
        logs = self.plan.runs_dir / "logs"
        size = [f"--job-name={self.plan.name}", f"--array=0-{len(cells) - 1}",
                *self.size(cells[0]), f"--output={logs / paths[0].stem}_%a.array.log",
                *sbatch.lines()]
        script = 'script=${scripts[$SLURM_ARRAY_TASK_ID]}'
        return _batch(f"{len(cells)} cells of one size as one job array: task i runs "
                      "the i-th script", self.plan.name, size,
                      f"scripts=({shlex.join(str(p) for p in paths)})", script,
                      f'exec bash "$script" >> {shlex.quote(str(logs))}'
                      '/"$(basename "$script" .sbatch).log" 2>&1')

    def written(self, cell: JobCell, sbatch: Sbatch) -> Path:
        """The cell's script, written under a new run id."""
        cfg = cell.cfg
        cell.run = new_run_id(cfg.usecase.name, cfg.strategy, cfg.backend)
        cell.job, cell.reason, cell.seconds = "", "", 0.0
        for sub in ("slurm", "logs"):
            (self.plan.runs_dir / sub).mkdir(exist_ok=True)
        path = self.plan.runs_dir / "slurm" / f"{cell.run}.sbatch"
        atomic_write_text(path, self.script(cell, sbatch))
        return path

    def submit_jobs(self, cells: list[JobCell], sbatch: Sbatch) -> None:
        """Write the scripts of ``cells`` (of one size) and submit them, as one job, or as
        one job array: each ``submitted`` with its job id, or ``failed`` with what sbatch
        said."""
        paths = [self.written(c, sbatch) for c in cells]
        path = paths[0]
        if len(cells) > 1:
            path = path.with_name(f"array-{path.name}")
            atomic_write_text(path, self.array_script(cells, paths, sbatch))
        out = slurm_call("sbatch", "--parsable", str(path),
                         env=run_env(cells[0].run) if len(cells) == 1 else None, check=False)
        job = out.stdout.strip().split(";")[0]
        for i, (cell, script) in enumerate(zip(cells, paths, strict=True)):
            if out.returncode == 0 and job.isdigit():
                cell.status, cell.job = "submitted", job if len(cells) == 1 else f"{job}_{i}"
                print(f"{cell.label} on {cell.usecase}, repeat {cell.repeat}: job {cell.job} "
                      f"({script.name})")
                continue
            said = (out.stderr.strip().splitlines() or ["no output"])[-1]
            cell.status, cell.reason, cell.run = "failed", f"sbatch refused it: {said}", ""
            log.error("%s on %s: %s (%s)", cell.label, cell.usecase, cell.reason, path)


def _batch(what: str, study: str, sbatch: list[str], *body: str) -> str:
    """A batch script: what it runs of ``study`` in a comment, ``sbatch`` as #SBATCH lines,
    then ``body``."""
    return "\n".join(["#!/bin/bash",
                      f"# ddlstudy study {study}: {what}; written by ddlstudy study --submit "
                      "slurm", *(f"#SBATCH {shlex.quote(line)}" for line in sbatch), "",
                      *body, ""])


def _jobs() -> dict[str, dict[str, str]]:
    """Every job Slurm's controller remembers, by id (``12``; ``12_3`` for task 3 of job
    array 12, the tasks still pending being one line of a range): its fields (JobState,
    Reason, ...)."""
    jobs = {}
    for line in slurm_call("scontrol", "show", "job", "-o").stdout.splitlines():
        keys = dict(re.findall(r"(\w+)=(\S*)", line))
        if not keys.get("JobId", "").isdigit():
            continue
        array, tasks = keys.get("ArrayJobId", ""), keys.get("ArrayTaskId", "")
        if not (array.isdigit() and tasks):
            jobs[keys["JobId"]] = keys
        for task in _task_ids(tasks.split("%")[0]):  # 0-3%2: at most 2 at once
            jobs[f"{array}_{task}"] = keys
    return jobs


def _task_ids(spec: str) -> list[int]:
    """Slurm's array task list (``0-3,5``, ``1-7:2``) as its ids."""
    ids = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if found:
            first, last, step = found.groups()
            ids += range(int(first), int(last or first) + 1, int(step or 1))
    return ids


def _seconds(clock: str) -> float:
    """Slurm's RunTime ([days-]hh:mm:ss) in seconds."""
    days, _, rest = clock.rpartition("-")
    parts = [int(p) for p in rest.split(":") if p.isdigit()]
    return (int(days or 0) * 86400) + sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def _settle(cell: JobCell, job: dict[str, str] | None, runs_dir: Path) -> None:
    """A waiting cell's status from its run's manifest (how the run ended) and its job
    (None: Slurm no longer knows it)."""
    status = run_status(runs_dir / cell.run / MANIFEST) if cell.run else None
    state = (job or {}).get("JobState", "")
    if job:
        cell.seconds = float(_seconds(job.get("RunTime", "")))
    if status == "completed":
        cell.status, cell.reason = "completed", ""
        return
    if state in ACTIVE:
        reason = job.get("Reason", "None")
        cell.status, cell.reason = ACTIVE[state], "" if reason == "None" else reason
        return
    said = f"Slurm job {cell.job} {state}" if state else \
        f"Slurm job {cell.job} is no longer known to Slurm"
    if job and job.get("Reason", "None") != "None":
        said += f" (reason: {job['Reason']})"
    if job and job.get("ExitCode", "0:0") != "0:0":
        said += f", exit code {job['ExitCode']}"
    log_file = runs_dir / "logs" / f"{cell.run}.log"
    tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] \
        if log_file.is_file() else []
    cell.status = "failed"
    cell.reason = "; ".join([said, *([f"its run {status}"] if status else []),
                             *([f"{log_file.name}: {tail[0]}"] if tail else [])])
    if status is None:
        cell.run = ""  # no folder: the report shows the cell from study.json


def no_secret(checked: list[tuple[str, dict[str, Any], Any]]) -> None:
    """Refuse a plan whose cells (``plan.configs``) would log to MLflow through a URI with
    anything in its user info, query or fragment, however typed (``redact.shown``): a
    batch script, kept on disk, would hold it."""
    for usecase, _, cfg in checked:
        if (uri := cfg.mlflow) and shown(uri) != uri:
            raise UsageError(f"--submit slurm: the mlflow URI {shown(uri)!r} of a cell on "
                             f"{Path(usecase).stem} holds a secret, which its batch script "
                             "would keep on disk; give the URI without it, and the "
                             "credentials as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_"
                             "PASSWORD in the environment you submit from (sbatch passes it "
                             "to the jobs)")


def submitted(runs_dir: Path) -> bool:
    """Whether the study in ``runs_dir`` went to Slurm as jobs."""
    record = Path(runs_dir) / STUDY_FILE
    try:
        return record.is_file() and \
            load(record, StudyRecord, "study record").get("submit") == "slurm"
    except UsageError:  # a damaged one: the local study keeps it aside
        return False


def slurm_study(plan: Plan, *, resume: bool, resubmit: bool, sbatch: Sbatch,
                overrides: dict[str, Any], fmt: str) -> int:
    """Submit a plan's cells as jobs (0: every cell submitted or skipped), or, ``resume``,
    read where a submitted study's jobs stand (``_resume``)."""
    require_client()
    if not resume and submitted(plan.runs_dir):
        raise UsageError(f"{plan.runs_dir} already holds the jobs of study {plan.name!r}; "
                         "--resume shows where they stand, --resume --resubmit submits its "
                         "failed cells again")
    cells = [JobCell.of(c) for c in expand(plan, overrides, elsewhere=True)] \
        if not resume or resubmit else []
    with folder_lock(plan.runs_dir, "study"):
        if resume:
            return _resume(plan, cells, sbatch, fmt)
        study = SlurmStudy(plan, cells)
        study.open(resume=False)
        _submit_pending(study, study.cells, sbatch)
        return int(any(c.status == "failed" for c in cells))


def _submit_pending(study: SlurmStudy, cells: list[JobCell], sbatch: Sbatch) -> None:
    """Submit the pending ones of ``cells``, study.json saved after each."""
    for c in study.cells:
        if c.status == "skipped":
            log.warning("skipped %s on %s: %s", c.label, c.usecase, c.reason)
    study.save()
    sizes: dict[tuple[str, ...], list[JobCell]] = {}
    for cell in cells:
        if cell.status == "pending":
            sizes.setdefault(study.size(cell), []).append(cell)
    for alike in sizes.values():
        study.submit_jobs(alike, sbatch)
        study.save()


def _resume(plan: Plan, planned: list[JobCell], sbatch: Sbatch, fmt: str) -> int:
    """Each waiting cell settled from Slurm and its run; with ``planned`` (--resubmit), its
    failed cells and the plan's cells it lacks submitted again; the table printed, and the
    report written once no cell waits (0: none failed)."""
    if not submitted(plan.runs_dir):
        raise UsageError(f"--resubmit: {plan.runs_dir} holds no study submitted to Slurm; "
                         "submit it with --submit slurm")
    record = load(plan.runs_dir / STUDY_FILE, StudyRecord, "study record")
    study = SlurmStudy(plan, [JobCell.recorded(r) for r in record["cells"]])
    study.started = record.get("started_at") or study.started
    waiting = [c for c in study.cells if c.status in WAITING]
    if waiting:
        jobs = _jobs()
        for cell in waiting:
            _settle(cell, jobs.get(cell.job), plan.runs_dir)
    study.save()
    if planned:
        _submit_pending(study, _merge(study, planned), sbatch)
    print(table(study.cells))
    left = sum(c.status in WAITING for c in study.cells)
    if left:
        print(f"\n{left} of {len(study.cells)} cells queued or running; `ddlstudy study "
              f"{plan.path} --resume` again writes the report once every cell is done")
        return 0
    write_report(plan, study.cells, fmt)
    return int(any(c.status == "failed" for c in study.cells))


def _merge(study: SlurmStudy, planned: list[JobCell]) -> list[JobCell]:
    """The study's cells with its failed ones and those it lacks replaced by the plan's
    (pending, to submit); returns those."""
    have = {(c.id, c.repeat): c for c in study.cells}
    fresh = {(c.id, c.repeat): c for c in planned if (c.id, c.repeat) not in have
             or have[(c.id, c.repeat)].status == "failed"}
    study.cells = [fresh.pop((c.id, c.repeat), c) for c in study.cells] + list(fresh.values())
    return [c for c in study.cells if c.status == "pending"]


def table(cells: list[JobCell]) -> str:
    """The cells as a plain table: label, use case, repeat, job, status, run or reason."""
    rows = [("cell", "use case", "repeat", "job", "status", "run or reason")] + [
        (c.label, Path(c.usecase).stem, str(c.repeat), c.job or "-", c.status,
         c.reason or c.run) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) +
                     "  " + r[5] for r in rows)
