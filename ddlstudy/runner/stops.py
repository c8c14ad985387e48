"""How a run ends other than at its last epoch, in the cases the run itself cannot say: a
stop asked by a file (``signals.STOP_ENV``: a Slurm job warned before its time limit),
which the training heeds at a step, its snapshot written; and a process killed before it
could close its run folder (SIGKILL, the kernel's memory killer), which ``--resume`` finds
``running``."""

from __future__ import annotations

import datetime as dt
import logging
import os

from ddlstudy import signals
from ddlstudy.config import RunConfig
from ddlstudy.records.runfolder import MANIFEST, RunFolder
from ddlstudy.strategies import Strategy

log = logging.getLogger("ddlstudy")


def stop_file(strategy: Strategy) -> str | None:
    """The file whose appearance stops the run at a snapshot (``signals.STOP_ENV``: a Slurm
    job's warning before its time limit), where its strategy can be resumed exactly."""
    path = os.environ.get(signals.STOP_ENV)
    if path and not strategy.resumable:
        log.warning("%s cannot be resumed exactly: %s is not watched, and the run goes on "
                    "to its end", strategy.name, signals.STOP_ENV)
        return None
    return path or None


def stopped_early(stop_file: str | None, folder: RunFolder, cfg: RunConfig) -> str | None:
    """How the training that returned stopped at its stop file (None: it did not): the file
    appeared, and fewer epochs than asked are recorded (training returns early only so)."""
    if stop_file and os.path.exists(stop_file) and \
            len(folder.manifest["epochs"]) < cfg.usecase.train.epochs:
        return (f"stopped at a snapshot, as {signals.STOP_ENV} asked; `ddlstudy run --resume "
                f"{folder.path}` continues it")
    return None


def close_unsaid(folder: RunFolder) -> None:
    """Close a run whose process ended without saying how (SIGKILL, the kernel's memory
    killer, the machine's end) and that cannot be resumed: ``failed``, at its manifest's
    last write, rather than ``running`` for ever."""
    m, manifest = folder.manifest, folder.path / MANIFEST
    last = dt.datetime.fromtimestamp(manifest.stat().st_mtime, dt.UTC)
    m.update(status="failed", exit_code=1, ended_at=last.isoformat(timespec="milliseconds"),
             error=f"its process (PID {m['pid']}) ended without closing the run (killed), "
                   "before a snapshot it could be resumed from")
    folder.write_manifest()
