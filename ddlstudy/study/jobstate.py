"""Where a submitted study's cells stand: each cell with its Slurm job (``JobCell``), and
what Slurm's controller says of the job (``scontrol show job``: pending, requeued,
running, or how it ended while Slurm remembers it) read together with its run's manifest
(how the run ended). A job Slurm ran again (``Restarts``: requeued, preempted, warned
before its time limit) is a ``requeued`` cell while it waits, its run going on from its
snapshot in the same folder."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlstudy.errors import UsageError
from ddlstudy.hosts.slurm import slurm_call
from ddlstudy.records.runfolder import MANIFEST, SNAPSHOT
from ddlstudy.strategies import get_strategy
from ddlstudy.strategies.processes import cuda_devices
from ddlstudy.study.matrix import Cell, run_status

ACTIVE = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "requeued",
          "REQUEUE_HOLD": "requeued", "REQUEUE_FED": "requeued", "RUNNING": "running",
          "COMPLETING": "running", "SUSPENDED": "running", "STOPPED": "running",
          "SIGNALING": "running", "STAGE_OUT": "running", "RESIZING": "running"}
"""Slurm's job states of a job not ended, as a cell's status."""
WAITING = ("submitted", "pending", "requeued", "running")


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


def jobs() -> dict[str, dict[str, str]]:
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


def settle(cell: JobCell, job: dict[str, str] | None, runs_dir: Path) -> None:
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
        restarts = int(job["Restarts"]) if job.get("Restarts", "").isdigit() else 0
        if restarts:  # Slurm runs it again: its run goes on in the same folder
            cell.status = "requeued" if cell.status == "pending" else cell.status
            again = "from its snapshot" if (runs_dir / cell.run / SNAPSHOT).is_file() \
                else "from the start (no snapshot yet)"
            cell.reason = "; ".join([f"requeued {restarts}x, its run goes on {again}",
                                     *([cell.reason] if cell.reason else [])])
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


def table(cells: list[JobCell]) -> str:
    """The cells as a plain table: label, use case, repeat, job, status, run or reason."""
    rows = [("cell", "use case", "repeat", "job", "status", "run or reason")] + [
        (c.label, Path(c.usecase).stem, str(c.repeat), c.job or "-", c.status,
         c.reason or c.run) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) +
                     "  " + r[5] for r in rows)
