"""The Strategy interface (how one node trains) and the registry the CLI reads names from."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ddlstudy.config import RunConfig
from ddlstudy.environment import usable_cores
from ddlstudy.errors import ConfigError
from ddlstudy.training.job import Job

log = logging.getLogger("ddlstudy")


class Strategy(ABC):
    """How one node trains. Subclasses set ``name`` and ``summary`` and implement ``fit``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line: what it does and why one would pick it."""
    flags: ClassVar[str] = ""
    resumable: ClassVar[bool] = False
    """Whether --resume and --snapshot-every continue it bit for bit."""
    accumulates: ClassVar[bool] = False
    """Whether it trains with the shared step (training.accumulate_grads): --accumulate K
    micro-batches per step, and fp16's gradient scaler."""

    def check(self, cfg: RunConfig) -> None:
        """Refuse flags that do not fit, before anything starts (raise ConfigError)."""
        return None

    def workers(self, cfg: RunConfig) -> int:
        """Replicas, processes or threads: --workers, or one per usable core."""
        return cfg.workers or usable_cores()

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        """Processes, threads and devices it will use; recorded in the manifest."""
        return {}

    def data_parallel(self, cfg: RunConfig) -> int:
        """Workers on one node that each take a slice of every batch."""
        return 1

    @abstractmethod
    def fit(self, job: Job) -> None:
        """Train for the configured epochs (``train_epochs`` runs the loop)."""


def require_batch_per_worker(cfg: RunConfig, workers: int, noun: str) -> None:
    """Each data-parallel worker needs at least one image of every global batch."""
    batch = cfg.global_batch
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
