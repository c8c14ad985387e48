"""The Strategy interface (how one node trains) and the registry the CLI reads names from."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.data import DataPlan
from ddlstudy.environment import usable_cores
from ddlstudy.errors import ConfigError
from ddlstudy.runfolder import RunFolder
from ddlstudy.training import EpochResult, log_epoch

log = logging.getLogger("ddlstudy")


@dataclass
class Job:
    """What a strategy is handed: the config, the data it trains on, where results go."""

    cfg: RunConfig
    data: DataPlan
    folder: RunFolder | None = None
    show_progress: bool = True

    def end_epoch(self, result: EpochResult, model: nn.Module,
                  optimizer: torch.optim.Optimizer) -> None:
        """Log the epoch, append it to the run folder and snapshot the training state."""
        log_epoch(result, self.cfg.usecase.train.epochs)
        if self.folder is None:
            return
        self.folder.record_epoch(result.as_dict())
        if self.cfg.snapshot:
            self.folder.save_snapshot({
                "epoch": result.epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
            })


class Strategy(ABC):
    """How one node trains. Subclasses set ``name`` and ``summary`` and implement ``fit``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line: what it does and why one would pick it."""
    flags: ClassVar[str] = ""

    def check(self, cfg: RunConfig) -> None:
        """Refuse flags that do not fit, before anything starts (raise ConfigError)."""
        return None

    def workers(self, cfg: RunConfig) -> int:
        """Replicas, processes or threads: --workers, or one per usable core."""
        return cfg.workers or usable_cores()

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        """Processes, threads and devices it will use; recorded in the manifest."""
        return {}

    @abstractmethod
    def fit(self, job: Job) -> None:
        """Train for the configured epochs, calling ``job.end_epoch`` after each."""


def require_batch_per_worker(cfg: RunConfig, workers: int, noun: str) -> None:
    """Each data-parallel worker needs at least one image of every global batch."""
    batch = cfg.usecase.train.batch_size
    if batch < workers:
        raise ConfigError("--batch-size", f"{batch} is smaller than the {workers} {noun}; "
                          f"each needs at least one image of every batch")


def warn_if_oversubscribed(processes: int) -> None:
    """More single-threaded processes than cores still runs, but they compete for the cores."""
    if processes > usable_cores():
        log.warning("%d processes on %d usable cores: they will compete for the cores",
                    processes, usable_cores())


REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    REGISTRY[cls.name] = cls
    return cls


def get_strategy(name: str) -> Strategy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ConfigError("--strategy", f"unknown strategy {name!r}; choose one of: "
                          f"{', '.join(REGISTRY)}") from None
