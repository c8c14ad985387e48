"""`ddlstudy run` and `ddlstudy replay`: train one configuration into runs/<id>/."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from pathlib import Path

from ddlstudy import signals
from ddlstudy.config.options import add_run_options, path_arg
from ddlstudy.errors import ConfigError
from ddlstudy.machine.sparkjvm import start_early
from ddlstudy.progress import on_terminal
from ddlstudy.records.runfolder import CHILD_ENV
from ddlstudy.strategies.processes import warm_early

log = logging.getLogger("ddlstudy")
PREPARING_NOTICE_S = 1.0
"""A run not started (nor refused) this long after the command says it is preparing."""


def register(sub) -> None:
    p = sub.add_parser("run", help="train one use case with one strategy into runs/<id>/",
                       epilog=f"exit codes: 0 completed; 1 failed (the manifest's error says "
                       f"why); 2 refused before anything was written; {signals.STOPPED_CODE} "
                       f"stopped at a snapshot because the file {signals.STOP_ENV} names "
                       f"appeared (a Slurm job warned before its time limit): --resume goes "
                       f"on; 130 or 143 interrupted (SIGINT, SIGTERM): --resume goes on from "
                       f"the last snapshot")
    add_run_options(p)
    faults = p.add_argument_group("faults")
    faults.add_argument("--resume", type=path_arg, metavar="RUN", help="continue runs/<id> from "
                        "its last snapshot, with its recorded configuration (default: a new "
                        "run)")
    faults.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="when a worker dies, restart from the last snapshot up to N "
                        "times (default 0)")
    p.add_argument("--format", default="text", choices=["text", "json"], help="how the run's "
                   "end is printed: a line, or for scripts one JSON object on stdout (run "
                   "folder, status, accuracy, images/s, time to target; a failed run's too)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("replay", help="run a manifest again: same config, seeds and data")
    p.add_argument("manifest", type=path_arg, help="runs/<id>/manifest.json or runs/<id>")
    p.add_argument("--runs-dir", type=path_arg, help="where the new run goes (default: the "
                   "original's runs folder)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")
    p.set_defaults(func=cmd_replay)


def cmd_run(args: argparse.Namespace) -> int:
    if args.max_restarts < 0:
        raise ConfigError("--max-restarts", f"must be 0 or more, got {args.max_restarts}")
    if args.resume is not None:
        from ddlstudy.config.options import given_options
        from ddlstudy.records.manifests import resume_config

        given = given_options(args)
        if given:
            raise ConfigError("--resume", f"continues a run with its recorded configuration, "
                              f"so {given[0]} would be ignored; leave it out (or start a new "
                              f"run, or `ddlstudy replay` one)")

        return train(resume_config(args.resume), args.argv, args.resume, args.max_restarts,
                     args.format)
    from ddlstudy.config.options import config_from_args

    return train(config_from_args(args), args.argv, max_restarts=args.max_restarts,
                 fmt=args.format)


def train(cfg, argv: list[str], resume: Path | None = None, max_restarts: int = 0,
          fmt: str = "text") -> int:
    """Run ``cfg`` (launching mpiexec for --backend mpi) and print where it went (``fmt``:
    a line, or a JSON object); with ``max_restarts``, a run that failed after a snapshot
    continues from it."""

    # The imports below take seconds: on a terminal, say what is going on, unless a
    # refusal came first (a refusal stays one line; logs and pipes get no notice at all).
    notice = threading.Timer(PREPARING_NOTICE_S, log.info, args=(
        "preparing %s on %s (importing torch, checking the data) ...", cfg.strategy,
        cfg.usecase.name))
    notice.daemon = True
    if CHILD_ENV not in os.environ and on_terminal():
        notice.start()
    if resume is None:  # a Spark run's JVM and context start beside those imports
        start_early(cfg)
    warm_early(cfg)  # and the server its processes are forked from
    try:
        return _train(cfg, argv, resume, max_restarts, fmt)
    finally:
        notice.cancel()


def _train(cfg, argv: list[str], resume: Path | None, max_restarts: int, fmt: str) -> int:
    from ddlstudy.records.runfolder import SNAPSHOT, RunFolder
    from ddlstudy.runner import RunFailed, start

    restarts = 0
    while True:
        try:
            folder = start(cfg, argv, resume)
            break
        except RunFailed as exc:
            restartable = (exc.folder is not None and exc.exit_code not in
                           (2, 130, 143, signals.STOPPED_CODE)  # stopped, not failed
                           and (exc.folder.path / SNAPSHOT).is_file())
            if restarts >= max_restarts or not restartable:
                print(f"ddlstudy: {exc}", file=sys.stderr)
                _to_mlflow(cfg, exc.folder)
                if fmt == "json" and exc.folder is not None:
                    print(json.dumps(ended(exc.folder)))
                return exc.exit_code
            restarts += 1
            resume = exc.folder.path
            argv = ["run", "--resume", str(resume), *(["--quiet"] if "--quiet" in argv else [])]
            log.warning("%s; restarting from its last snapshot (restart %d of %d)", exc,
                        restarts, max_restarts)
    if not isinstance(folder, RunFolder) or os.environ.get(CHILD_ENV):
        return 0  # other MPI ranks stay quiet; under our own launcher, the launcher reports
    _to_mlflow(cfg, folder)
    if fmt == "json":
        print(json.dumps(ended(folder)))
        return 0
    summary = folder.manifest.get("summary", {})
    print(f"{folder.path}  val accuracy {summary.get('final_val_accuracy', float('nan')):.3f}  "
          f"{summary.get('median_images_per_s', float('nan')):.1f} img/s"
          f"{_reached(folder.manifest.get('time_to_target') or {})}"
          f"{_busy(folder.manifest.get('host_load') or {})}")
    return 0


def _to_mlflow(cfg, folder) -> None:
    """--mlflow, once the run has ended (in the process that reports it): the rest of
    what `export mlflow` logs (its epochs were logged as they ended); a study's cell
    leaves it to the study's end, which logs every run against the study's baseline."""
    if cfg.mlflow and folder is not None and not os.environ.get(CHILD_ENV) and \
            not folder.manifest.get("study"):
        from ddlstudy.exports.mlflow.runs import after_run

        after_run(folder.path, cfg.mlflow)


def ended(folder) -> dict:
    """``run --format json``: what a script needs of a run that ended."""
    m = folder.manifest
    summary = m.get("summary") or {}
    return {"run": str(folder.path), "id": m.get("id"), "status": m.get("status"),
            "exit_code": m.get("exit_code"), "error": m.get("error"),
            "epochs": summary.get("epochs_done", len(m.get("epochs", []))),
            "val_accuracy": summary.get("final_val_accuracy"),
            "best_val_accuracy": summary.get("best_val_accuracy"),
            "images_per_s": summary.get("median_images_per_s"),
            "time_to_target": m.get("time_to_target")}


def _reached(tta: dict) -> str:
    """The run's time to target, as its last line says it (the target by its metric)."""
    if not isinstance(tta.get("target"), int | float):
        return ""  # no target (--target-accuracy none): nothing to reach
    target = f"target {tta.get('metric') or 'accuracy'} {tta['target']:.2f}"
    if tta.get("reached") is True:
        return f"  {target} reached in {tta['seconds']:.1f} s (epoch {tta['epoch']})"
    if tta.get("reached") is False:
        return f"  {target} not reached"
    return ""


def _busy(load: dict) -> str:
    """For a run marked noisy, that its host was busy: its images/s say little."""
    if load.get("noisy") is not True:
        return ""
    others = [v for v in (load.get("others_cores") or {}).values() if isinstance(v, int | float)]
    used = f" {max(others):.1f} cores of" if others else ""
    return (f"  (the host was busy: other processes used{used} it while the run trained, so "
            f"its speed says little; marked noisy, reports leave it out of speedups)")


def cmd_replay(args: argparse.Namespace) -> int:
    from ddlstudy.records.manifests import config_from_manifest, differences, read_manifest

    manifest = read_manifest(args.manifest)
    runs_dir = args.runs_dir or Path(manifest["path"]).parent
    cfg = config_from_manifest(manifest, runs_dir)
    data = cfg.usecase.data
    if data.synthetic and not (Path(cfg.datasets_dir) / data.name).is_dir():
        # A path recorded on another machine (or since deleted): the set is made again,
        # from its seed, where this user keeps data sets, never at that path.
        import dataclasses

        from ddlstudy.config import DEFAULT_DATASETS_DIR

        log.warning("replay: %s holds no %s; it is made under %s", cfg.datasets_dir,
                    data.name, DEFAULT_DATASETS_DIR)
        cfg = dataclasses.replace(cfg, datasets_dir=DEFAULT_DATASETS_DIR)
    for line in differences(manifest):
        log.warning("replay of %s differs: %s", manifest.get("id"), line)
    return train(cfg, args.argv)
