"""One `ddlstudy run`: check, prepare the data, open the run folder, train, close it.

Everything a user can get wrong is checked before the run folder exists, so a refused run
leaves nothing behind. Once it exists, the manifest always ends in a final status:
``completed``, ``failed`` (with the error) or ``interrupted`` (SIGINT: exit 130, SIGTERM:
exit 143), and the samples gathered so far are written whatever happened.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import traceback
from dataclasses import dataclass
from pathlib import Path

from ddlstudy import environment, mpi, signals
from ddlstudy.config import RunConfig
from ddlstudy.data import prepare_data
from ddlstudy.errors import UsageError
from ddlstudy.runfolder import MANIFEST, RunFolder, new_run_id
from ddlstudy.sampler import ResourceSampler
from ddlstudy.strategies import Job, get_strategy

log = logging.getLogger("ddlstudy")


class RunFailed(Exception):
    def __init__(self, folder: RunFolder, exit_code: int, message: str) -> None:
        self.folder = folder
        self.exit_code = exit_code
        super().__init__(message)


@dataclass(frozen=True)
class Outcome:
    status: str
    exit_code: int
    error: str | None = None


def _summary(epochs: list[dict]) -> dict:
    if not epochs:
        return {}
    rates = [e["steady_images_per_s"] for e in epochs]
    return {
        "epochs_done": len(epochs),
        "final_val_accuracy": epochs[-1]["val_accuracy"],
        "best_val_accuracy": max(e["val_accuracy"] for e in epochs),
        "median_images_per_s": statistics.median(rates),
        "median_epoch_time_s": statistics.median(e["epoch_time_s"] for e in epochs),
        "train_time_s": sum(e["train_time_s"] for e in epochs),
    }


def _prepare(cfg: RunConfig, comm):
    """Rank 0 generates, scans and splits the data; the other MPI ranks receive the list."""
    if comm is None:
        return prepare_data(cfg)
    data: object = None
    if comm.Get_rank() == 0:
        try:
            data = prepare_data(cfg)
        except UsageError as exc:  # every rank must hear of it, or they would wait forever
            data = exc
    data = comm.bcast(data, root=0)
    if isinstance(data, UsageError):
        raise data
    return data


def _backend(cfg: RunConfig, comm) -> dict:
    if comm is None:
        return {"name": "local", "nodes": 1}
    return {"name": "mpi", "nodes": comm.Get_size(), "reduce": cfg.reduce,
            "hosts": comm.allgather(socket.gethostname()), "pids": comm.allgather(os.getpid())}


def run(cfg: RunConfig, show_progress: bool = True) -> RunFolder | None:
    """Train ``cfg`` and return its run folder; raises RunFailed when training did not end.

    Under the MPI backend every rank calls this; rank 0 gets the folder, the others None.
    """
    strategy = get_strategy(cfg.strategy)
    strategy.check(cfg)
    comm = None
    if cfg.backend == "mpi":
        mpi.check(cfg.strategy)
        comm = mpi.world()
    rank = comm.Get_rank() if comm else 0
    data = _prepare(cfg, comm)
    uc = cfg.usecase
    backend = _backend(cfg, comm)
    folder = None
    if rank == 0:
        run_id = os.environ.get(mpi.RUN_ID_ENV) or new_run_id(uc.name, strategy.name)
        folder = RunFolder.create(cfg.runs_dir, run_id, {
            "command": environment.command_line(),
            "usecase": uc.name,
            "strategy": {"name": strategy.name, **strategy.layout(cfg)},
            "backend": backend,
            "config": cfg.to_dict(),
            "seeds": {"train": uc.train.seed, "data": uc.data.seed},
            "data": data.describe(),
            "git": environment.git_state(),
            "versions": environment.versions(),
            "host": environment.host(),
            "sampler": {"hz": cfg.sample_hz},
        })
        log.info("run %s: %s on %s (%s backend, %d node(s)), %d train / %d validation images",
                 folder.path.name, strategy.name, uc.name, backend["name"], backend["nodes"],
                 len(data.train), len(data.val))
    sampler = ResourceSampler(cfg.sample_hz, rank=rank).start()
    outcome = Outcome("completed", 0)
    rows_by_rank = None
    try:
        with signals.handled():
            job = Job(cfg=cfg, data=data, folder=folder, show_progress=show_progress)
            if comm is None:
                strategy.fit(job)
            else:
                mpi.fit(job, comm)
                rows_by_rank = comm.gather(sampler.stop(), root=0)
    except KeyboardInterrupt:
        outcome = Outcome("interrupted", 130, "interrupted by SIGINT (Ctrl-C)")
    except signals.Terminated:
        outcome = Outcome("interrupted", 143, "terminated by SIGTERM")
    except Exception as exc:  # recorded in the manifest, then reported by the CLI
        if folder is not None:
            (folder.path / "error.log").write_text(traceback.format_exc())
        where = f" on MPI rank {rank}" if comm else ""
        outcome = Outcome("failed", 1, f"{type(exc).__name__}{where}: {exc}")
        log.error("%s", outcome.error)
    finally:
        own_rows = sampler.stop()
        if folder is not None:
            folder.reload_epochs()
            rows = [r for rank_rows in rows_by_rank for r in rank_rows] if rows_by_rank \
                else own_rows
            folder.write_samples(rows)
            folder.finish(outcome.status, outcome.exit_code, outcome.error,
                          summary=_summary(folder.manifest["epochs"]))
        if comm is not None and outcome.exit_code:
            comm.Abort(outcome.exit_code)  # the other ranks would wait in a collective
    if outcome.exit_code:
        raise RunFailed(folder, outcome.exit_code, f"run {folder.path.name} {outcome.status}: "
                        f"{outcome.error} (details in {folder.path})")
    return folder


def launch_mpi(cfg: RunConfig, argv: list[str]) -> RunFolder:
    """``--backend mpi --nodes N`` from a plain shell: start mpiexec and wait for it."""
    get_strategy(cfg.strategy).check(cfg)
    mpi.check(cfg.strategy)
    run_id = new_run_id(cfg.usecase.name, cfg.strategy)
    code, dead_pid = mpi.launch(argv, cfg.nodes or 1, run_id)
    path = Path(cfg.runs_dir) / run_id
    if not (path / MANIFEST).is_file():
        if code:
            raise UsageError(f"mpiexec exited with code {code} before the run started")
        raise UsageError("mpiexec ended without writing a run folder")
    folder = RunFolder.open(path)
    if folder.manifest["status"] == "running":  # rank 0 was killed before it could say
        pids = folder.manifest["backend"].get("pids", [])
        who = f"MPI rank {pids.index(dead_pid)} (PID {dead_pid})" if dead_pid in pids \
            else "an MPI rank"
        folder.finish("failed", code or 1, f"{who} died; mpiexec exit code {code}")
    if folder.manifest["exit_code"]:
        raise RunFailed(folder, folder.manifest["exit_code"],
                        f"run {run_id} {folder.manifest['status']}: {folder.manifest['error']}")
    return folder
