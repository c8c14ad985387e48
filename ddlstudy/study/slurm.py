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
Before anything is written, the controller is asked whether it takes the jobs' options
(``sbatch --test-only``) and every script is rendered (``jobscript``: a value no line of a
script can hold is refused). A job Slurm runs again (``scontrol requeue``, preemption, a
warning before its time limit with ``--warn-before``) continues its run from its snapshot.

``--resume`` reads each waiting cell's job in ``scontrol show job`` (pending, requeued,
running, or how it ended while Slurm remembers it) and its run's manifest (how the run
ended: ``jobstate``), prints a table of the cells, submits failed cells again with
``--resubmit``, and writes the report once no cell waits. A job cancelled, out of time or
lost is a failed cell with Slurm's state and reason; nothing waits on a job.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_text, folder_lock
from ddlstudy.hosts.slurm import require_client, slurm_call
from ddlstudy.machine.environment import python_module
from ddlstudy.records.formats import Study as StudyRecord
from ddlstudy.records.formats import load
from ddlstudy.records.plan import Plan, run_flags
from ddlstudy.records.runfolder import new_run_id, run_env
from ddlstudy.redact import shown
from ddlstudy.report import STUDY_FILE
from ddlstudy.study.jobscript import (
    Sbatch,
    Script,
    continued,
    job_options,
    output_path,
    warned,
)
from ddlstudy.study.jobstate import WAITING, JobCell, jobs, settle, table
from ddlstudy.study.matrix import Study, expand, write_report

log = logging.getLogger("ddlstudy")

SUBMITTERS = ("slurm",)
SRUN_DECIDES = ("nodes", "hosts", "hostfile")
"""An MPI cell's flags that srun's world replaces (its nodes are the job's)."""


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
        ``srun --mpi=pmi2 ddlstudy run`` (an MPI cell) or ``ddlstudy run``; requeued, the
        same run continued (``jobscript``)."""
        runs_dir = self.plan.runs_dir
        flags = {k: v for k, v in cell.flags.items() if not (cell.mpi and k in SRUN_DECIDES)}
        script = Script(f"ddlstudy study {self.plan.name}: {cell.label} on {cell.usecase}, "
                        f"repeat {cell.repeat} (cell {cell.id}); written by ddlstudy study "
                        "--submit slurm")
        script.sbatch(f"--job-name={cell.run}", *self.size(cell))
        script.sbatch(f"--output={output_path(runs_dir)}/logs/{cell.run}.log")
        script.sbatch(*job_options(sbatch), what="a job option")
        for name, value in self.cell_vars(cell).items():
            script.export(name, value)
        script.command("set", "--", "run", "--quiet", *run_flags(cell.usecase, flags, runs_dir))
        continued(script, runs_dir / cell.run, runs_dir / "slurm" / cell.run)
        launch = ["srun", "--mpi=pmi2"] if cell.mpi else []
        python = python_module("ddlstudy")
        if sbatch.warn_before:
            warned(script, [*launch, *python], runs_dir / "slurm" / f"{cell.run}.stop")
        else:
            script.launch(*(launch or ["exec"]), *python)
        return script.text()

    def array_script(self, cells: list[JobCell], paths: list[Path], sbatch: Sbatch) -> str:
        """One job array for ``cells`` of one size: task i runs the i-th cell's script
        (``paths``), its output into that cell's log."""
        logs = self.plan.runs_dir / "logs"
        script = Script(f"ddlstudy study {self.plan.name}: {len(cells)} cells of one size as "
                        "one job array: task i runs the i-th script; written by ddlstudy "
                        "study --submit slurm")
        script.sbatch(f"--job-name={self.plan.name}", what="the study's name")
        script.sbatch(f"--array=0-{len(cells) - 1}", *self.size(cells[0]))
        script.sbatch(f"--output={output_path(logs.parent)}/logs/{paths[0].stem}_%a.array.log")
        script.sbatch(*job_options(sbatch), what="a job option")
        script.line("scripts=({})".format(" ".join("{}" for _ in paths)), *paths)
        script.line('script=${{scripts[$SLURM_ARRAY_TASK_ID]}}')
        script.line('exec bash "$script" >> {}/"$(basename "$script" .sbatch).log" 2>&1', logs)
        return script.text()

    def scripts(self, cells: list[JobCell], sbatch: Sbatch) -> list[tuple[Path, str]]:
        """The scripts of ``cells`` (of one size), each under a new run id: each cell's,
        then, where there are several, the job array's over them (the one to submit comes
        last). Nothing is written: a value a script cannot hold is refused here."""
        slurm = self.plan.runs_dir / "slurm"
        for cell in cells:
            cfg = cell.cfg
            cell.run = new_run_id(cfg.usecase.name, cfg.strategy, cfg.backend)
            cell.job, cell.reason, cell.seconds = "", "", 0.0
        paths = [slurm / f"{c.run}.sbatch" for c in cells]
        made = [(p, self.script(c, sbatch)) for p, c in zip(paths, cells, strict=True)]
        if len(cells) > 1:
            made.append((paths[0].with_name(f"array-{paths[0].name}"),
                         self.array_script(cells, paths, sbatch)))
        return made

    def batches(self, cells: list[JobCell]) -> list[list[JobCell]]:
        """The pending ones of ``cells``, those of one size together (one job, or one job
        array)."""
        sizes: dict[tuple[str, ...], list[JobCell]] = {}
        for cell in cells:
            if cell.status == "pending":
                sizes.setdefault(self.size(cell), []).append(cell)
        return list(sizes.values())

    def submit_jobs(self, cells: list[JobCell], sbatch: Sbatch) -> None:
        """Write the scripts of ``cells`` (of one size) and submit them, as one job, or as
        one job array: each ``submitted`` with its job id, or ``failed`` with what sbatch
        said."""
        made = self.scripts(cells, sbatch)
        for sub in ("slurm", "logs"):
            (self.plan.runs_dir / sub).mkdir(exist_ok=True)
        for file, text in made:
            atomic_write_text(file, text)
        path = made[-1][0]
        out = slurm_call("sbatch", "--parsable", str(path),
                         env=run_env(cells[0].run) if len(cells) == 1 else None, check=False)
        job = out.stdout.strip().split(";")[0]
        for i, (cell, (script, _)) in enumerate(zip(cells, made, strict=False)):
            if out.returncode == 0 and job.isdigit():
                cell.status, cell.job = "submitted", job if len(cells) == 1 else f"{job}_{i}"
                print(f"{cell.label} on {cell.usecase}, repeat {cell.repeat}: job {cell.job} "
                      f"({script.name})")
                continue
            said = (out.stderr.strip().splitlines() or ["no output"])[-1]
            cell.status, cell.reason, cell.run = "failed", f"sbatch refused it: {said}", ""
            log.error("%s on %s: %s (%s)", cell.label, cell.usecase, cell.reason, path)


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
                overrides: dict[str, Any], fmt: str, include_noisy: bool = False) -> int:
    """Submit a plan's cells as jobs (0: every cell submitted or skipped), or, ``resume``,
    read where a submitted study's jobs stand (``_resume``). Whatever is refused is
    refused before anything is written: a folder of jobs submitted again, --resubmit of a
    folder never submitted, a value no script can hold (the caller asked the controller
    whether it takes the jobs' options first: ``jobscript.ask_controller``)."""
    require_client()
    if not resume and submitted(plan.runs_dir):
        raise UsageError(f"{plan.runs_dir} already holds the jobs of study {plan.name!r}; "
                         "--resume shows where they stand, --resume --resubmit submits its "
                         "failed cells again")
    if resubmit and not submitted(plan.runs_dir):
        raise UsageError(f"--resubmit: {plan.runs_dir} holds no study submitted to Slurm; "
                         "submit it with --submit slurm")
    cells = [JobCell.of(c) for c in expand(plan, overrides, elsewhere=True)] \
        if not resume or resubmit else []
    if cells:
        checked = SlurmStudy(plan, cells)
        for alike in checked.batches(cells):  # every script rendered, none written
            checked.scripts(alike, sbatch)
    with folder_lock(plan.runs_dir, "study"):
        if resume:
            return _resume(plan, cells, sbatch, fmt, include_noisy)
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
    for alike in study.batches(cells):
        study.submit_jobs(alike, sbatch)
        study.save()


def _resume(plan: Plan, planned: list[JobCell], sbatch: Sbatch, fmt: str,
            include_noisy: bool = False) -> int:
    """Each waiting cell settled from Slurm and its run; with ``planned`` (--resubmit), its
    failed cells and the plan's cells it lacks submitted again; the table printed, and the
    report written once no cell waits (0: none failed)."""
    record = load(plan.runs_dir / STUDY_FILE, StudyRecord, "study record")
    study = SlurmStudy(plan, [JobCell.recorded(r) for r in record["cells"]])
    study.started = record.get("started_at") or study.started
    waiting = [c for c in study.cells if c.status in WAITING]
    if waiting:
        known = jobs()
        for cell in waiting:
            settle(cell, known.get(cell.job), plan.runs_dir)
    study.save()
    if planned:
        _submit_pending(study, _merge(study, planned), sbatch)
    print(table(study.cells))
    left = sum(c.status in WAITING for c in study.cells)
    if left:
        print(f"\n{left} of {len(study.cells)} cells queued or running; `ddlstudy study "
              f"{plan.path} --resume` again writes the report once every cell is done")
        return 0
    write_report(plan, study.cells, fmt, include_noisy)
    return int(any(c.status == "failed" for c in study.cells))


def _merge(study: SlurmStudy, planned: list[JobCell]) -> list[JobCell]:
    """The study's cells with its failed ones and those it lacks replaced by the plan's
    (pending, to submit); returns those."""
    have = {(c.id, c.repeat): c for c in study.cells}
    fresh = {(c.id, c.repeat): c for c in planned if (c.id, c.repeat) not in have
             or have[(c.id, c.repeat)].status == "failed"}
    study.cells = [fresh.pop((c.id, c.repeat), c) for c in study.cells] + list(fresh.values())
    return [c for c in study.cells if c.status == "pending"]
