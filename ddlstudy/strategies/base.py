"""The Strategy interface (how one node trains) and the registry the CLI reads names from.

A strategy says what it is (the catalog's text, the report's table and label, the layouts
``advise`` probes), checks its flags, lays a node out (processes, threads, devices) and
gives the work of one of the node's processes (``worker``). Backends start those processes
(here, as MPI ranks and the processes they lead, as Spark tasks) and hand each worker its
``Link`` to the others; no backend trains in a strategy's place.

A strategy module is imported to list and check strategies, by the command line before it
imports torch: it keeps torch out of its top level, and its worker imports the training
code it runs (``ddlstudy.training``). A plugin's strategy may import torch at the top: it
only makes `ddlstudy strategies` slower.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ddlstudy.config import RunConfig
from ddlstudy.errors import ConfigError
from ddlstudy.machine.environment import usable_cores
from ddlstudy.registry import Registry

if TYPE_CHECKING:  # torch: the workers' types only
    import torch

    from ddlstudy.training.job import Job, Link

log = logging.getLogger("ddlstudy")


@dataclass(frozen=True)
class Probe:
    """A layout ``advise`` times: its label, its run flags, the cores (or, with ``gpus``,
    the GPUs) it keeps busy and the model replicas it holds in memory."""

    label: str
    flags: dict[str, Any]
    cores: int
    replicas: int = 1
    gpus: bool = False


@dataclass(frozen=True)
class Footprint:
    """What one node of a strategy holds at its peak, in the sequential baseline's units:
    ``advise --memory`` predicts a node's peak from the baseline's probe with it."""

    processes: int = 1
    """Processes: each holds its own interpreter, torch, data and loaders."""
    models: float = 1.0
    """Copies of the parameters and gradients over the node (sharded over k: 1)."""
    states: float = 1.0
    """Copies of the optimizer state over the node (ZeRO's, sharded: 1)."""
    activations: float = 1.0
    """Activations held at once, in units of those of the node's batch in one model
    (k processes that each compute the whole batch: k)."""
    tensor: int = 1
    """The processes each pair of consecutive Linear layers is split over (tensor
    parallel): those layers' weights count ``models / tensor`` times."""
    shared_bytes: int = 0
    """Bytes the node holds once in shared memory beyond its copies (sharded's arena of
    gathered and reduced buffers)."""
    gathers: tuple[float, float] = (0.0, 0.0)
    """Whole copies of (the parameters, the optimizer state) its snapshot's writer (rank
    0) gathers beside its own shards as it writes snapshot.pt after an epoch: FSDP2's and
    tensor parallel's full state dict (1, 1), ZeRO-1's other ranks' shards of the
    optimizer state (0, (k - 1) / k). On tiny-full (AlexNet, 57 M weights, AdamW),
    tensor's rank 0 peaked at 1,609 MiB in a run that wrote snapshots, 1,077 MiB in its
    probe, which writes none."""


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
    tensor: int | None = None
    """The processes each Linear pair is split over (tensor parallelism)."""

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if "collectives" in out:  # its name in the manifests
            out["backend"] = out.pop("collectives")
        return out

    @property
    def device_type(self) -> str:
        """Where its processes train: cuda or cpu."""
        return self.device or ("cuda" if self.collectives == "nccl" else "cpu")

    @property
    def torch_threads(self) -> int:
        """The intra-op threads each of the node's processes sets."""
        return self.intraop_threads or self.threads_per_process


class Strategy(ABC):
    """How one node trains. Subclasses set ``name`` and ``summary`` and implement
    ``worker``; the rest has defaults for a one-process, one-model strategy."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for `ddlstudy strategies`: what it does and why one would pick it."""
    flags: ClassVar[str] = ""
    """The flags that lay it out, with their defaults."""
    shards: ClassVar[str] = ""
    """What of the model it splits over its processes, for `ddlstudy strategies` (none:
    each process holds a whole replica)."""
    table: ClassVar[int] = 1
    """The report's table of a one-node run: 1 data parallelism, 2 model and hybrid
    parallelism (runs of several nodes go in table 3 whatever their strategy)."""
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
    checkpoints: ClassVar[bool] = True
    """Whether --checkpoint-activations checkpoints its blocks (the model each process
    builds, ``worker.new_model``). Not yet: a pipeline's stages, traced from the model
    (torch.fx cannot trace through a checkpoint), and cpu-threads' replicas (a
    recomputation resets the random generator their threads share)."""

    not_composed: ClassVar[dict[str, str]] = {}
    """Layout options another strategy reads that torch could compose with this one but
    ddlstudy does not yet: each refused with its reason rather than as not this one's."""

    def check(self, cfg: RunConfig) -> None:
        """Refuse flags that do not fit, before anything starts (raise ConfigError)."""
        return None

    def check_options(self, cfg: RunConfig) -> None:
        """Refuse a layout option this strategy does not read (``--workers`` with
        sequential would be recorded and mean nothing)."""
        if cfg.checkpoint_activations and not self.checkpoints:
            can = [n for n, c in REGISTRY.loaded().items() if c.checkpoints]
            raise ConfigError("--checkpoint-activations", f"{self.name} cannot checkpoint "
                              f"activations yet; strategies that can: {', '.join(can)}")
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        for name, what in LAYOUT_OPTIONS.items():
            if name not in self.options and getattr(cfg, name) != defaults[name]:
                flag = ("--no-" if defaults[name] is True else "--") + name.replace("_", "-")
                if name in self.not_composed:
                    raise ConfigError(flag, self.not_composed[name])
                users = [n for n, c in REGISTRY.loaded().items() if name in c.options]
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

    def footprint(self, cfg: RunConfig) -> Footprint:
        """What a node holds (advise's memory prediction): by default, a whole replica
        and its optimizer state in each process (or each replica of one), the batch's
        activations once."""
        layout = self.layout(cfg)
        copies = max(layout.processes, layout.replicas or 1)
        return Footprint(layout.processes, copies, copies)

    def label(self, layout: dict[str, Any]) -> str:
        """The report's short name of a run of it, from its manifest's layout (``Layout``
        as recorded: processes, threads_per_process, replicas, stages, ...)."""
        return self.name

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        """The layouts ``advise`` times on a machine of ``cores`` usable cores and ``gpus``
        GPUs (none: advise leaves it out)."""
        return []

    def prepare(self, job: Job) -> Any:
        """Once, on node 0, before any worker starts: what every worker of every node needs
        (plain JSON values, as ``job.plan``), e.g. where a pipeline is cut. It may record
        in ``job.folder``'s manifest."""
        return None

    @abstractmethod
    def worker(self, job: Job, link: Link, device: torch.device) -> None:
        """The work of one of the node's processes (``layout(cfg).processes`` of them; in
        a process group of that size on the node when there are several): train for the
        configured epochs, exchanging with every other worker of the run through
        ``link`` (``training.worker.train_worker`` runs the epochs)."""


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
                  "schedule": "orders a pipeline's micro-batches",
                  "replicas": "sets the pipelines of a hybrid",
                  "devices": "sets the GPUs",
                  "reshard_after_forward": "keeps or frees gathered parameters after forward",
                  "shared_buffers": "holds FSDP's buffers in shared memory or allocates them",
                  "tensor": "splits Linear pairs over processes inside a mesh"}
"""RunConfig fields that lay a strategy out, and what each does."""

REGISTRY: Registry[type[Strategy]] = Registry("--strategy", "strategy",
                                              group="ddlstudy.strategies", base=Strategy)
"""The strategies by name: ddlstudy's own (registered as their modules are imported) and
those of installed plugins (entry points of the group ``ddlstudy.strategies``)."""
register = REGISTRY.register


def get_strategy(name: str) -> Strategy:
    return REGISTRY.named(name)()
