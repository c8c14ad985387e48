"""One `ddlstudy run`: check, prepare the data, open the run folder, train, close it.

Everything a user can get wrong is checked before the run folder exists, so a refused run
leaves nothing behind. Once it exists, the manifest always ends in a final status:
``completed``, ``failed`` (with the error) or ``interrupted`` (SIGINT: exit 130, SIGTERM:
exit 143), and the samples gathered so far are written whatever happened.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import socket
import statistics
import traceback
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddlstudy import models, signals, wire
from ddlstudy.backends import Backend, Environment, get_backend
from ddlstudy.config import TARGET_METRICS, RunConfig, UseCase
from ddlstudy.data import DataPlan, prepare_data
from ddlstudy.errors import UsageError
from ddlstudy.files import WriteFailed, atomic_write_text, sweep_temporaries, turn
from ddlstudy.machine import collector, environment
from ddlstudy.machine.sampler import NOISY_CORES, OthersLoad, ResourceSampler, others_cores
from ddlstudy.models.sources import sha256_of
from ddlstudy.records.runfolder import RunFolder, now_iso
from ddlstudy.records.runid import RUN_ID_ENV, checked_run_id, claim, new_run_id, release
from ddlstudy.runner.checks import preflight
from ddlstudy.runner.launched import RunFailed, launched_run, refuse_foreign_launcher
from ddlstudy.runner.snapshots import load_snapshot
from ddlstudy.runner.stops import close_unsaid, stop_file, stopped_early
from ddlstudy.strategies import Strategy, get_strategy

log = logging.getLogger("ddlstudy")

STUDY_ENV = "DDLSTUDY_STUDY"
"""JSON a study puts in its runs' environment: which study, cell and repeat a run is."""


@dataclass(frozen=True)
class Outcome:
    status: str
    exit_code: int
    error: str | None = None


def time_to_target(epochs: list[dict], target: float | None, metric: str = "accuracy") -> dict:
    """When the run first reached its target of validation ``metric`` (MLPerf's time to
    train): the epoch and its ``elapsed_s``; or that it did not, with its best."""
    if target is None:
        return {"target": None, "reached": None, "why": "the use case sets no target_accuracy"}
    key, named = TARGET_METRICS[metric], {} if metric == "accuracy" else {"metric": metric}
    for e in epochs:
        if e.get(key, -1) >= target:
            return {"target": target, **named, "reached": True, "epoch": e["epoch"],
                    "seconds": e.get("elapsed_s")}
    best = max((e[key] for e in epochs if key in e), default=None)
    return {"target": target, **named, "reached": False, "epochs": len(epochs), "best": best}


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


def _prepare(cfg: RunConfig, env: Environment, resume: Path | None):
    """Node 0 generates, scans and splits the data; the other nodes receive the list. A
    new run's id (DDLSTUDY_RUN_ID) is checked first: a run of that name there is refused
    before anything is prepared."""
    def make() -> dict:
        if resume is None and os.environ.get(RUN_ID_ENV):
            checked_run_id(os.environ[RUN_ID_ENV], cfg.runs_dir)
        return prepare_data(cfg).to_message()

    return DataPlan.from_message(env.share(make, wire.to_json, wire.from_json))


def _study_tag() -> dict:
    try:
        return {"study": json.loads(os.environ[STUDY_ENV])}
    except (KeyError, ValueError, RecursionError):  # set by ddlstudy's study; else ignored
        return {}


def _reopen(path: Path, backend: dict | None,
            usecase: UseCase | None = None) -> tuple[RunFolder, dict]:
    """Check ``path`` can be resumed, load its snapshot (checked against ``usecase``'s
    model where given); given ``backend``, mark it running."""
    folder = RunFolder.open(path)
    m = folder.manifest
    if m["status"] == "completed":
        raise UsageError(f"run {path.name} completed all its epochs; nothing to resume")
    here = m.get("host", {}).get("hostname") == socket.gethostname() and m.get("pid")
    if m["status"] == "running" and here and psutil.pid_exists(m["pid"]) and \
            m["pid"] != os.getpid():
        raise UsageError(f"run {path.name} is still running (PID {m['pid']}); stop it first")
    try:
        snap = load_snapshot(folder.path, mmap=backend is None, usecase=usecase)
    except UsageError:
        if m["status"] == "running" and here:  # its process is gone: the run ended
            close_unsaid(folder)
        raise
    if backend is None:
        return folder, snap
    sweep_temporaries(folder.path)
    folder.merge_leftover_samples()
    m["epochs"] = m["epochs"][:snap["epoch"]]
    m.setdefault("resumed", []).append({"at": now_iso(), "from_epoch": snap["epoch"],
                                        "from_step": snap["step"],
                                        "after": {"status": m["status"], "error": m["error"]}})
    m.update(status="running", ended_at=None, exit_code=None, error=None, pid=os.getpid(),
             backend=backend)
    folder.rewrite_epochs()
    log.info("run %s: resuming after epoch %d, step %d", path.name, snap["epoch"], snap["step"])
    return folder, snap


def _open_folder(env: Environment, resume: Path | None, backend: dict, usecase: UseCase):
    """Node 0 reopens the run to resume; every node gets its snapshot (or the UsageError)."""
    if resume is None:
        return None, None
    folder = None

    def reopen() -> dict:
        nonlocal folder
        folder, snapshot = _reopen(Path(resume), backend, usecase)
        return snapshot

    snapshot = env.share(reopen, wire.to_tensors, wire.from_tensors)
    return folder, snapshot


def _created(env: Environment, *args) -> RunFolder | None:
    """Node 0's new run folder (``_create``; None on the others), a refusal there (its id
    taken meanwhile) raised on every node, which would otherwise wait for node 0."""
    made = []
    env.share(lambda: made.append(_create(*args)) or {}, wire.to_json, wire.from_json)
    return made[0] if made else None


def _create(cfg: RunConfig, strategy: Strategy, backend: Backend, described: dict,
            data) -> RunFolder:
    """Node 0's new run folder, its manifest written before training starts."""
    from ddlstudy.training.loaders import preprocessing

    uc = cfg.usecase
    for old in Path(cfg.runs_dir).glob("*/"):
        sweep_temporaries(old)
    run_id = os.environ.get(RUN_ID_ENV) or new_run_id(uc.name, strategy.name, cfg.backend)
    folder = RunFolder.create(cfg.runs_dir, run_id, {
        "command": environment.command_line(),
        "usecase": uc.name,
        "model": models.describe(uc.model, len(uc.classes)) | (
            {"init_weights": {"file": str(cfg.init_weights),
                              "sha256": sha256_of(cfg.init_weights)}}
            if cfg.init_weights else {}),
        "strategy": {"name": strategy.name, **strategy.layout(cfg).as_dict()},
        "backend": described,
        "config": cfg.to_dict(),
        "seeds": {"train": uc.train.seed, "data": uc.data.seed},
        "effective": cfg.effective.as_dict(),
        "data": data.describe(),
        "preprocessing": preprocessing(cfg, data).as_dict() | {"classes": list(uc.classes)},
        "git": environment.git_state(),
        "versions": environment.versions(),
        "host": environment.host(),
        "launch": environment.launch(described["nodes"], backend.launched()),
        "sampler": {"hz": cfg.sample_hz},
        "pid": os.getpid(),
        **_study_tag(),
    })
    log.info("run %s: %s on %s (%s backend, %d node(s)), %d train / %d validation images",
             folder.path.name, strategy.name, uc.name, backend.name, described["nodes"],
             len(data.train), len(data.val))
    return folder


def run(cfg: RunConfig, show_progress: bool = True,
        resume: Path | None = None) -> RunFolder | None:
    """Train ``cfg`` in this process and return its run folder; raises RunFailed when
    training did not end.

    With ``resume`` (a run folder), continue that run from its snapshot. Where the backend
    has several nodes (MPI ranks) every node calls this; node 0 gets the folder, the
    others None.
    """
    return _run(preflight(cfg, resuming=resume is not None), show_progress, resume)


def _run(cfg: RunConfig, show_progress: bool, resume: Path | None) -> RunFolder | None:
    from ddlstudy.training import Job  # torch: only a process that trains comes here

    strategy, backend = get_strategy(cfg.strategy), get_backend(cfg.backend)
    env = backend.environment(cfg)
    data = _prepare(cfg, env, resume)
    environment.mark_phase("data")
    described = backend.describe(cfg) | env.placement()
    folder, snapshot = _open_folder(env, resume, described, cfg.usecase)
    if resume is None:
        folder = _created(env, cfg, strategy, backend, described, data)
        environment.mark_phase("folder")
    load = OthersLoad()  # the host's load over the run where no samples say it
    sampler = ResourceSampler(cfg.sample_hz, rank=env.rank).start()
    outcome = Outcome("completed", 0)
    rows_by_node = None
    watched = stop_file(strategy)
    try:
        with signals.handled():
            job = Job(cfg=cfg, data=data, folder=folder, show_progress=show_progress,
                      resume=snapshot, stop_file=watched)
            # What the strategy prepares once, on node 0, for every node's workers.
            job.plan = env.share(lambda: strategy.prepare(job), wire.to_json, wire.from_json)
            others = backend.fit(job, env)  # the samples of the node's other processes
            rows_by_node = env.gather(sampler.stop() + others, wire.to_json, wire.from_json)
    except KeyboardInterrupt:
        outcome = Outcome("interrupted", 130, "interrupted by SIGINT (Ctrl-C)")
    except signals.Terminated:
        outcome = Outcome("interrupted", 143, "terminated by SIGTERM")
    except Exception as exc:  # recorded in the manifest, then reported by the CLI
        if folder is not None:
            with contextlib.suppress(OSError, WriteFailed):  # a full disk: the failure stays
                atomic_write_text(folder.path / "error.log", traceback.format_exc())
        error, cause = f"{type(exc).__name__}{env.where}: {exc}", env.cause(exc)
        outcome = Outcome("failed", 1, f"{cause}; then {error}" if cause else error)
        log.error("%s", env.failed(outcome.error))
    finally:
        own_rows, unrecorded = sampler.stop(), None
        if folder is not None:
            rows = [r for node_rows in rows_by_node for r in node_rows] if rows_by_node \
                else own_rows
            try:
                outcome = _close(cfg, backend, folder, outcome, rows, load, watched)
            except WriteFailed as exc:  # a full disk: the run's end cannot be written
                unrecorded, outcome = folder.unrecorded(exc), Outcome("failed", 2)
        if outcome.exit_code not in (0, signals.STOPPED_CODE):
            env.abort(outcome.exit_code)  # the other nodes would wait in a collective
        if unrecorded is not None:
            raise unrecorded
    if outcome.exit_code:
        raise RunFailed(folder, outcome.exit_code, f"run {folder.path.name} {outcome.status}: "
                        f"{outcome.error} (details in {folder.path})")
    return folder


def _close(cfg: RunConfig, backend: Backend, folder: RunFolder, outcome: Outcome,
           rows: list[dict], load: OthersLoad, watched: str | None = None) -> Outcome:
    """Node 0's run folder at the end: the samples of every node, the host's load, the
    final status and what it measured; TensorBoard's scalars where asked. Samples a full
    disk cannot take fail the run, recorded in its (far smaller) manifest. A training that
    returned early at its stop file (``watched``) is ``interrupted``, exit code 75. In
    the folder's turn throughout: a worker still training (a Spark task after a Ctrl-C)
    writes its next epoch before the epochs are read or not at all
    (``RunFolder._writing``)."""
    with turn(folder.path):
        return _ending(cfg, backend, folder, outcome, rows, load, watched)


def _ending(cfg: RunConfig, backend: Backend, folder: RunFolder, outcome: Outcome,
            rows: list[dict], load: OthersLoad, watched: str | None) -> Outcome:
    folder.reload_epochs()
    stopped = stopped_early(watched, folder, cfg)
    if outcome.exit_code == 0 and stopped:
        outcome = Outcome("interrupted", signals.STOPPED_CODE, stopped)
    try:
        frame = folder.write_samples(rows)
    except WriteFailed as exc:
        frame = None
        outcome = outcome if outcome.exit_code else Outcome("failed", 2, str(exc))
    folder.manifest["host_load"] = _host_load(cfg, backend, frame, load)
    epochs, train = folder.manifest["epochs"], cfg.usecase.train
    folder.finish(outcome.status, outcome.exit_code, outcome.error, summary=_summary(epochs),
                  time_to_target=time_to_target(epochs, train.target_accuracy,
                                                train.target_metric))
    if cfg.tensorboard:
        _tensorboard(folder)
    return outcome


def _host_load(cfg: RunConfig, backend: Backend, frame, load: OthersLoad) -> dict:
    """Whether other processes used the run's hosts (``noisy``): from its samples, else
    (no samples, or a backend whose processes they miss) from this host's CPU over the
    run less the run's process tree's (``load``), where that tree holds the run."""
    others = None if backend.unsampled or frame is None else others_cores(
        frame, psutil.cpu_count() or 1, one_machine=str(cfg.hosts or "").startswith("emulated"))
    if others is None:
        outside = backend.outside_tree(cfg)
        if outside:
            return {"noisy": None, "why": f"not measured: {outside}"}
        others = {socket.gethostname(): round(load.cores(), 3)}
    noisy = max(others.values()) > NOISY_CORES
    if noisy:
        log.warning("other processes used %s core(s) of this run's host(s) while it ran "
                    "(above %.2f): it is marked noisy, and reports leave it out of speedups",
                    max(others.values()), NOISY_CORES)
    return {"noisy": noisy, "others_cores": others, "threshold_cores": NOISY_CORES}


def _tensorboard(folder: RunFolder) -> None:
    """--tensorboard: the finished run's scalars beside it (a failure here costs the run
    nothing: it is recorded already)."""
    from ddlstudy.exports import tensorboard

    try:
        logdir = tensorboard.write_run(folder.path, folder.path / tensorboard.SUBDIR)
        log.info("TensorBoard scalars in %s (tensorboard --logdir %s)", logdir, logdir)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not write TensorBoard scalars: %s", exc)


def start(cfg: RunConfig, argv: list[str], resume: Path | None = None) -> RunFolder | None:
    """``ddlstudy run``: train here, or, where the backend starts the run's processes
    itself (``--backend mpi --nodes N`` from a plain shell), launch them and wait. Only a
    process that trains imports torch: a launcher starts its ranks without (2 s sooner)."""
    backend = get_backend(cfg.backend)
    refuse_foreign_launcher(dict(os.environ), backend)
    if not backend.launches(cfg):
        importlib.import_module("ddlstudy.training.job")  # torch: in the start's imports
    else:
        collector.settled()  # a launcher: its ranks train
    environment.mark_phase("imports")
    limit = os.environ.get(signals.SETUP_TIMEOUT_ENV)  # a study's cell
    try:
        with signals.time_limit(float(limit) if limit else None, "the run's set-up"):
            cfg = preflight(cfg, resuming=resume is not None)
    except signals.TimedOut as exc:
        raise UsageError(f"{exc}; a study's setup_timeout_s sets the limit") from None
    environment.mark_phase("checks")
    if resume is not None:  # refused here, before a launcher starts ranks that would each say
        _reopen(Path(resume), None, cfg.usecase)
    run_id = checked_run_id(Path(resume).name if resume else os.environ.get(RUN_ID_ENV)
                            or new_run_id(cfg.usecase.name, cfg.strategy, cfg.backend))
    claimed = claim(cfg.runs_dir, run_id) if resume is None and backend.launches(cfg) else []
    try:  # the folder of the ranks it launches, claimed for them (of two launches given one
        ended = backend.launch(cfg, argv, run_id)  # id, the second is refused here)
    finally:
        if claimed:
            release(claimed)  # unless a rank took it up: then it is the run folder
    if ended is None:
        return _run(cfg, True, resume)
    return launched_run(ended, Path(cfg.runs_dir) / run_id)
