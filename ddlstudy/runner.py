"""One `ddlstudy run`: check, prepare the data, open the run folder, train, close it.

Everything a user can get wrong is checked before the run folder exists, so a refused run
leaves nothing behind. Once it exists, the manifest always ends in a final status:
``completed``, ``failed`` (with the error) or ``interrupted`` (SIGINT: exit 130, SIGTERM:
exit 143), and the samples gathered so far are written whatever happened.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

from ddlstudy import environment
from ddlstudy.config import RunConfig
from ddlstudy.data import prepare_data
from ddlstudy.runfolder import RunFolder, new_run_id
from ddlstudy.sampler import ResourceSampler
from ddlstudy.strategies import Job, get_strategy

log = logging.getLogger("ddlstudy")


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt is for SIGINT."""


class RunFailed(Exception):
    def __init__(self, folder: RunFolder, exit_code: int, message: str) -> None:
        self.folder = folder
        self.exit_code = exit_code
        super().__init__(message)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def run(cfg: RunConfig, show_progress: bool = True) -> RunFolder:
    """Train ``cfg`` and return its run folder; raises RunFailed when training did not end."""
    strategy = get_strategy(cfg.strategy)
    strategy.check(cfg)
    data = prepare_data(cfg)
    uc = cfg.usecase
    folder = RunFolder.create(cfg.runs_dir, new_run_id(uc.name, strategy.name), {
        "command": environment.command_line(),
        "usecase": uc.name,
        "strategy": {"name": strategy.name, **strategy.layout(cfg)},
        "config": cfg.to_dict(),
        "seeds": {"train": uc.train.seed, "data": uc.data.seed},
        "data": data.describe(),
        "git": environment.git_state(),
        "versions": environment.versions(),
        "host": environment.host(),
        "sampler": {"hz": cfg.sample_hz},
    })
    log.info("run %s: %s on %s, %d train / %d validation images", folder.path.name,
             strategy.name, uc.name, len(data.train), len(data.val))
    sampler = ResourceSampler(cfg.sample_hz).start()
    outcome = Outcome("completed", 0)
    try:
        with sigterm_raises():
            strategy.fit(Job(cfg=cfg, data=data, folder=folder, show_progress=show_progress))
    except KeyboardInterrupt:
        outcome = Outcome("interrupted", 130, "interrupted by SIGINT (Ctrl-C)")
    except Terminated:
        outcome = Outcome("interrupted", 143, "terminated by SIGTERM")
    except Exception as exc:  # recorded in the manifest, then reported by the CLI
        (folder.path / "error.log").write_text(traceback.format_exc())
        outcome = Outcome("failed", 1, f"{type(exc).__name__}: {exc}")
    finally:
        folder.reload_epochs()
        folder.write_samples(sampler.stop())
        folder.finish(outcome.status, outcome.exit_code, outcome.error,
                      summary=_summary(folder.manifest["epochs"]))
    if outcome.exit_code:
        raise RunFailed(folder, outcome.exit_code, f"run {folder.path.name} {outcome.status}: "
                        f"{outcome.error} (details in {folder.path})")
    return folder
