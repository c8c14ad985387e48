"""The Strategy interface (how one node trains) and the registry the CLI reads names from."""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from ddlstudy.config import RunConfig
from ddlstudy.environment import usable_cores
from ddlstudy.errors import ConfigError
from ddlstudy.registry import Registry
from ddlstudy.training.job import Job

log = logging.getLogger("ddlstudy")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How one node of a strategy is laid out: its processes, threads and devices. The
    manifest records it (``as_dict``, unset fields left out) and backends read it to
    start a node."""

    processes: int = 1
    threads_per_process: int = 1
    intraop_threads: int | None = None
    """torch's intra-op threads of each replica, where replicas share a process."""
    replicas: int | None = None
    """Model replicas: threads of one process (cpu-threads) or pipelines (hybrid)."""
    stages: int | None = None
    micro_batches: int | None = None
    devices: int | None = None
    device: str | None = None
    loader_workers: int | None = None
    collectives: str | None = None
    """The torch.distributed backend between the node's processes: gloo or nccl."""
    schedule: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if "collectives" in out:  # its name in the manifests
            out["backend"] = out.pop("collectives")
        return out

    @property
    def torch_threads(self) -> int:
        """The intra-op threads each of the node's processes sets."""
        return self.intraop_threads or self.threads_per_process


class Strategy(ABC):
    """How one node trains. Subclasses set ``name`` (described in
    ``config.catalog.STRATEGIES``) and implement ``fit``."""

    name: ClassVar[str]
    resumable: ClassVar[bool] = False
    """Whether --resume and --snapshot-every continue it bit for bit."""
    options: ClassVar[tuple[str, ...]] = ()
    """The layout options (``LAYOUT_OPTIONS``) it reads; any other set to a value of its
    own is refused, not silently ignored."""
    grads_in_backward: ClassVar[bool] = True
    """Whether backward leaves the node's final gradient in place (--bucket-mb can send
    each part as backward fills it)."""
    accumulates: ClassVar[bool] = False
    """Whether it trains with the shared step (training.accumulate_grads): --accumulate K
    micro-batches per step, and fp16's gradient scaler."""

    def check(self, cfg: RunConfig) -> None:
        """Refuse flags that do not fit, before anything starts (raise ConfigError)."""
        return None

    def check_options(self, cfg: RunConfig) -> None:
        """Refuse a layout option this strategy does not read (``--workers`` with
        sequential would be recorded and mean nothing)."""
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        for name, what in LAYOUT_OPTIONS.items():
            if name not in self.options and getattr(cfg, name) != defaults[name]:
                users = [n for n, c in REGISTRY.items() if name in c.options]
                flag = "--" + name.replace("_", "-")
                raise ConfigError(flag, f"{what}: {self.name} has none; it applies to "
                                  f"--strategy {' or '.join(users)}")

    def workers(self, cfg: RunConfig) -> int:
        """Replicas, processes or threads: --workers, or one per usable core."""
        return cfg.workers or usable_cores()

    def layout(self, cfg: RunConfig) -> Layout:
        """Processes, threads and devices it will use; recorded in the manifest."""
        return Layout()

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


LAYOUT_OPTIONS = {"workers": "sets the replicas, processes or threads",
                  "stages": "sets the pipeline stages",
                  "stage_starts": "cuts a pipeline into stages",
                  "micro_batches": "splits each batch for a pipeline",
                  "replicas": "sets the pipelines of a hybrid",
                  "devices": "sets the GPUs"}
"""RunConfig fields that lay a strategy out, and what each does."""

REGISTRY: Registry[type[Strategy]] = Registry("--strategy", "strategy")
register = REGISTRY.register


def get_strategy(name: str) -> Strategy:
    return REGISTRY.named(name)()
