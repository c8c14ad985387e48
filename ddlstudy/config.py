"""Use cases (TOML files in usecases/) and the resolved configuration of one run.

Every config is a frozen, keyword-only dataclass that validates itself in ``__post_init__``
and names the offending field in its error, so a bad TOML key or CLI flag is refused before
anything starts. ``to_dict`` gives the whole config for the manifest.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlstudy.errors import ConfigError, UsageError

REPO_ROOT = Path(__file__).resolve().parent.parent
USECASES_DIR = REPO_ROOT / "usecases"
DEFAULT_DATASETS_DIR = REPO_ROOT / "datasets"
DEFAULT_RUNS_DIR = REPO_ROOT / "runs"

# The smallest input each architecture still reduces to a 1x1 map before its classifier.
MIN_IMAGE_SIZE = {"alexnet": 63, "vgg16": 32}


class Arch(enum.StrEnum):
    ALEXNET = "alexnet"
    VGG16 = "vgg16"


BACKENDS = ("local", "mpi", "spark")
SPARK_SYNCS = ("gloo", "allgather")
PRECISIONS = ("fp32", "bf16", "fp16")
_SPARK_MASTER = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[(\d+),(\d+),(\d+)\]"
                           r"|spark://[\w.\-]+(:\d+)?(,[\w.\-]+(:\d+)?)*)$")


def spark_slots(master: str) -> int | None:
    """Task slots a Spark master offers (None: a cluster, known only once it runs)."""
    found = _SPARK_MASTER.match(master)
    if not found:
        raise ConfigError("--spark-master", f"{master!r} is not a Spark master; use local[N], "
                          f"local-cluster[N,cores,MiB] or spark://host:port")
    if master == "local":
        return 1
    if master.startswith("local["):
        return None if found.group(3) == "*" else int(found.group(3))
    if master.startswith("local-cluster"):
        return int(found.group(5)) * int(found.group(6))
    return None


class BadImagePolicy(enum.StrEnum):
    FAIL = "fail"
    SKIP = "skip"


def _choices(enum_cls: type[enum.StrEnum]) -> str:
    return ", ".join(m.value for m in enum_cls)


def _positive(name: str, value: Any, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, kind | int) or value <= 0:
        raise ConfigError(name, f"must be a positive {kind.__name__}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which network to train."""

    arch: Arch
    """alexnet or vgg16, as in torchvision."""
    width: float = 1.0
    """Channel and hidden-unit multiplier; 1.0 is torchvision's own model."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "arch", Arch(self.arch))
        except ValueError:
            raise ConfigError("model.arch", f"unknown architecture {self.arch!r}; "
                              f"choose one of: {_choices(Arch)}") from None
        if not isinstance(self.width, int | float) or not 0 < self.width <= 1:
            raise ConfigError("model.width", f"must be in (0, 1], got {self.width!r}")


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """The synthetic data set a use case trains on when no --data-dir is given."""

    name: str
    """Folder under datasets/ that holds the generated ImageFolder tree."""
    images: int
    """Total number of images, split as evenly as possible between the classes."""
    source_size: int
    """Side in pixels of the generated images."""
    seed: int = 0
    difficulty: float = 0.5
    """0 (large, opaque flames and plumes, few look-alikes) to 1 (small, faint, many)."""
    label_noise: float = 0.0
    """Fraction of images drawn as another class than the folder they are filed under."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError("data.name", f"must be a plain folder name, got {self.name!r}")
        _positive("data.images", self.images)
        _positive("data.source_size", self.source_size)
        if self.source_size < 16:
            raise ConfigError("data.source_size", f"must be at least 16, got {self.source_size}")
        if not 0 <= self.difficulty <= 1:
            raise ConfigError("data.difficulty", f"must be in [0, 1], got {self.difficulty!r}")
        if not 0 <= self.label_noise < 1:
            raise ConfigError("data.label_noise", f"must be in [0, 1), got {self.label_noise!r}")


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """The training task: the paper's SGD with momentum on cross-entropy."""

    image_size: int = 224
    batch_size: int = 32
    epochs: int = 10
    lr: float = 0.001
    momentum: float = 0.9
    seed: int = 0
    val_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in ("image_size", "batch_size", "epochs"):
            _positive(f"train.{name}", getattr(self, name))
        _positive("train.lr", self.lr, float)
        if not 0 <= self.momentum < 1:
            raise ConfigError("train.momentum", f"must be in [0, 1), got {self.momentum!r}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError("train.val_fraction",
                              f"must be in (0, 1), got {self.val_fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("train.seed", f"must be a non-negative integer, got {self.seed!r}")


@dataclass(frozen=True, kw_only=True)
class UseCase:
    """A model and a data set: one row of the paper's tables."""

    name: str
    description: str = ""
    classes: tuple[str, ...] = ("fire", "smoke", "nofire")
    model: ModelSpec
    data: DataSpec
    train: TrainSpec = field(default_factory=TrainSpec)
    source: str = ""
    """Where the use case was read from."""

    def __post_init__(self) -> None:
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if len(classes) < 2 or len(set(classes)) != len(classes):
            raise ConfigError("classes", f"need at least two distinct names, got {list(classes)}")
        if self.data.images < len(classes) * 2:
            raise ConfigError("data.images", f"need at least 2 images per class "
                              f"({2 * len(classes)}), got {self.data.images}")
        min_size = MIN_IMAGE_SIZE[self.model.arch]
        if self.train.image_size < min_size:
            raise ConfigError("train.image_size", f"{self.train.image_size} px is too small for "
                              f"{self.model.arch}; use at least {min_size}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one `ddlstudy run` needs, resolved from the use case and the flags."""

    usecase: UseCase
    strategy: str = "sequential"
    workers: int | None = None
    """Replicas or processes for the parallel strategies (default: one per core)."""
    stages: int | None = None
    """Pipeline stages (default: one per core)."""
    micro_batches: int = 4
    """GPipe micro-batches each global batch is split into."""
    stage_starts: tuple[int, ...] | None = None
    """The layer each pipeline stage starts at (default: cut where the measured forward
    times balance; a replay cuts where the run it replays did)."""
    replicas: int = 2
    """Data-parallel replicas of the pipeline (hybrid)."""
    devices: int | None = None
    """GPUs for gpu-data (default: all visible)."""
    backend: str = "local"
    """local (one node) or mpi (each MPI rank a node)."""
    nodes: int | None = None
    """MPI ranks ddlstudy starts with mpiexec on this machine (backend mpi)."""
    hosts: str | None = None
    """Where ddlstudy's mpiexec places the ranks: host1,host2,... (ssh) or emulated[:PREFIX]
    (the network namespaces of ``ddlstudy hosts up``); default: this machine."""
    reduce: str = "allreduce"
    """How nodes average gradients: allreduce, parameter-server, ring-reduce,
    ring-allreduce, step-wise."""
    compress: str = "none"
    bucket_mb: float | None = None
    """Overlap the allreduce with the backward pass: gradients reduced in buckets of this
    many MiB, each as soon as backward has filled it (MPI, --reduce allreduce)."""
    balance: str = "equal"
    """equal: every node an equal slice of each global batch; throughput: slices in
    proportion to each node's measured images/s (MPI nodes of unequal speed)."""
    """Gradient compression between MPI nodes: none, fp16 or topk:<ratio>."""
    scaling: str = "strong"
    """strong: --batch-size is the global batch, split over the data-parallel workers;
    weak: it is each worker's batch, so the global batch grows with them."""
    lr_scaling: str = "none"
    """none, or linear: the learning rate times global batch / the use case's batch."""
    accumulate: int = 1
    """Each step runs its batch as this many micro-batches (gradient accumulation: the
    memory of a micro-batch, the update of the whole batch; one sync per step)."""
    precision: str = "fp32"
    """fp32, bf16 or fp16: forward and backward under torch.autocast (weights stay fp32);
    fp16 with a gradient scaler (sequential, cpu-intraop, cpu-processes, gpu-data, MPI
    nodes of the first two, Spark gloo)."""
    spark_master: str | None = None
    """local[N], local-cluster[N,cores,MiB] or spark://host:port (default: local[nodes])."""
    spark_sync: str = "gloo"
    """gloo: gradients all-reduced every step over torch.distributed between the Spark
    tasks; allgather: weights averaged through Spark's barrier allGather every sync_every
    steps (SparkNet)."""
    sync_every: int = 10
    """Steps between two weight averages with spark_sync allgather."""
    spark_ui: bool = False
    """Start Spark's web UI."""
    data_dir: Path | None = None
    """A real ImageFolder tree to train on instead of the synthetic set."""
    datasets_dir: Path = DEFAULT_DATASETS_DIR
    runs_dir: Path = DEFAULT_RUNS_DIR
    on_bad_image: BadImagePolicy = BadImagePolicy.FAIL
    loader_workers: int = 0
    """DataLoader worker processes that decode and augment (0: in the training process)."""
    sample_hz: float = 10.0
    """Resource sampling rate; 0 turns the sampler off."""
    max_steps: int | None = None
    """Stop each epoch after this many optimizer steps (quick measurements)."""
    snapshot: bool = True
    """Write runs/<id>/snapshot.pt at the end of every epoch."""
    snapshot_every: int | None = None
    """Also snapshot every this many steps inside an epoch."""
    expect_fingerprint: str | None = None
    """Refuse to train unless the data set has this fingerprint (replay)."""
    replay_of: str | None = None
    """The run id this run replays."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "on_bad_image", BadImagePolicy(self.on_bad_image))
        except ValueError:
            raise ConfigError("--on-bad-image", f"unknown policy {self.on_bad_image!r}; "
                              f"choose one of: {_choices(BadImagePolicy)}") from None
        if self.workers is not None:
            _positive("--workers", self.workers)
        if self.stages is not None:
            _positive("--stages", self.stages)
        _positive("--micro-batches", self.micro_batches)
        if self.stage_starts is not None:
            object.__setattr__(self, "stage_starts", tuple(self.stage_starts))
            if self.strategy not in ("pipeline", "hybrid"):
                raise ConfigError("--stage-starts", "cuts a pipeline into stages: it needs "
                                  "--strategy pipeline or hybrid")
            starts = self.stage_starts
            if not starts or starts[0] != 0 or list(starts) != sorted(set(starts)):
                raise ConfigError("--stage-starts", f"{','.join(map(str, starts))}: give the "
                                  "first layer of each stage, starting at 0 and increasing, "
                                  "e.g. 0,9")
            if self.stages is not None and self.stages != len(starts):
                raise ConfigError("--stage-starts", f"{len(starts)} stages start there but "
                                  f"--stages is {self.stages}")
        _positive("--replicas", self.replicas)
        if self.devices is not None:
            _positive("--devices", self.devices)
        if self.backend not in BACKENDS:
            raise ConfigError("--backend", f"unknown backend {self.backend!r}; choose one of: "
                              f"{', '.join(BACKENDS)}")
        if self.nodes is not None:
            _positive("--nodes", self.nodes)
            if self.backend == "local" and self.nodes > 1:
                raise ConfigError("--nodes", "more than one node needs --backend mpi or spark")
        if self.hosts is not None:
            if self.backend != "mpi":
                raise ConfigError("--hosts", "places MPI ranks: it needs --backend mpi (for "
                                  "Spark, give --spark-master spark://host:port)")
            names = self.hosts.split(",")
            if not all(names) or any(" " in n for n in names):
                raise ConfigError("--hosts", f"{self.hosts!r}; give host names separated by "
                                  "commas, or emulated[:PREFIX]")
        if self.bucket_mb is not None:
            if not self.bucket_mb > 0:
                raise ConfigError("--bucket-mb", f"must be a positive size in MiB, got "
                                  f"{self.bucket_mb}")
            if self.backend != "mpi" or self.reduce != "allreduce" or \
                    self.compress != "none":
                raise ConfigError("--bucket-mb", "buckets MPI's own Iallreduce: it needs "
                                  "--backend mpi with --reduce allreduce and no --compress")
            if self.strategy == "cpu-threads":
                raise ConfigError("--bucket-mb", "a bucket is sent when backward fills it, "
                                  "but cpu-threads sums its replicas' gradients after "
                                  "backward; use sequential or cpu-intraop nodes")
        if self.balance not in ("equal", "throughput"):
            raise ConfigError("--balance", f"unknown policy {self.balance!r}; choose one of: "
                              "equal, throughput")
        if self.balance == "throughput" and self.backend != "mpi":
            raise ConfigError("--balance", "throughput shares each global batch between MPI "
                              "nodes of unequal speed: it needs --backend mpi")
        _positive("--accumulate", self.accumulate)
        from ddlstudy.compress import parse

        if parse(self.compress) is not None:
            if self.backend != "mpi":
                raise ConfigError("--compress", "compresses the gradients sent between "
                                  "nodes: it needs --backend mpi")
            if self.reduce != "allreduce":
                raise ConfigError("--compress", f"exchanges the compressed gradients itself "
                                  f"(an allgather); leave --reduce at allreduce, not "
                                  f"{self.reduce}")
        if self.scaling not in ("strong", "weak"):
            raise ConfigError("--scaling", f"unknown scaling {self.scaling!r}; choose one of: "
                              "strong, weak")
        if self.lr_scaling not in ("none", "linear"):
            raise ConfigError("--lr-scaling", f"unknown rule {self.lr_scaling!r}; choose one "
                              "of: none, linear")
        if self.precision not in PRECISIONS:
            raise ConfigError("--precision", f"unknown precision {self.precision!r}; choose "
                              f"one of: {', '.join(PRECISIONS)}")
        if self.spark_sync not in SPARK_SYNCS:
            raise ConfigError("--spark-sync", f"unknown mode {self.spark_sync!r}; choose one "
                              f"of: {', '.join(SPARK_SYNCS)}")
        _positive("--sync-every", self.sync_every)
        if self.backend != "spark" and (self.spark_master or self.spark_sync != "gloo"):
            raise ConfigError("--spark-master" if self.spark_master else "--spark-sync",
                              "needs --backend spark")
        if self.spark_master is not None:
            slots = spark_slots(self.spark_master)
            if self.nodes and slots is not None and slots < self.nodes:
                raise ConfigError("--spark-master", f"{self.spark_master} has {slots} task "
                                  f"slot(s) but --nodes {self.nodes} barrier tasks must run "
                                  f"at once; give it at least {self.nodes}")
        from ddlstudy.reducers import get_reducer

        get_reducer(self.reduce)
        if self.max_steps is not None:
            _positive("--max-steps", self.max_steps)
        if self.snapshot_every is not None:
            _positive("--snapshot-every", self.snapshot_every)
            if not self.snapshot:
                raise ConfigError("--snapshot-every", "cannot be used with --no-snapshot")
        if isinstance(self.loader_workers, bool) or self.loader_workers < 0:
            raise ConfigError("--loader-workers", f"must be 0 or more, got {self.loader_workers}")
        if not 0 <= self.sample_hz <= 100:
            raise ConfigError("--sample-hz", f"must be between 0 (off) and 100, "
                              f"got {self.sample_hz}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ConfigError("--data-dir", f"{self.data_dir} is not a folder; give the root "
                              "of an ImageFolder tree (root/<class>/<image>)")

    def data_parallel(self) -> int:
        """Workers that each take a slice of every global batch, over all nodes."""
        from ddlstudy.strategies import get_strategy

        if self.backend == "local":
            nodes = 1
        elif self.backend == "spark":
            from ddlstudy import spark

            nodes = spark.nodes(self)  # --nodes, or the master's task slots
        else:  # under someone else's mpiexec, the world size it set
            nodes = self.nodes or int(os.environ.get("PMI_SIZE") or
                                      os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
        return get_strategy(self.strategy).data_parallel(self) * nodes

    @property
    def global_batch(self) -> int:
        """Images per optimizer step over all workers (see ``scaling``)."""
        batch = self.usecase.train.batch_size
        return batch * self.data_parallel() if self.scaling == "weak" else batch

    @property
    def lr(self) -> float:
        """The learning rate the optimizer uses (see ``lr_scaling``)."""
        base = self.usecase.train.lr
        if self.lr_scaling == "linear":
            return base * self.global_batch / self.usecase.train.batch_size
        return base

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


# --- reading use cases -------------------------------------------------------------------

_SECTIONS = {"model": ModelSpec, "data": DataSpec, "train": TrainSpec}


def available_usecases() -> list[str]:
    return sorted(p.stem for p in USECASES_DIR.glob("*.toml") if _is_usecase_file(p))


def _is_usecase_file(path: Path) -> bool:
    try:
        return "model" in tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False


def resolve_usecase_path(name_or_path: str) -> Path:
    """A name from usecases/ or a path to a TOML file."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or "/" in name_or_path:
        if not path.is_file():
            raise UsageError(f"use-case file {name_or_path} does not exist")
        return path
    candidate = USECASES_DIR / f"{name_or_path}.toml"
    if candidate.is_file() and not _is_usecase_file(candidate):
        raise UsageError(f"{candidate} is a study plan, not a use case; run it with "
                         f"`ddlstudy study {candidate}`")
    if not candidate.is_file():
        raise UsageError(f"unknown use case {name_or_path!r}; choose one of: "
                         f"{', '.join(available_usecases())}, or give a path to a TOML file")
    return candidate


def load_usecase(name_or_path: str) -> UseCase:
    path = resolve_usecase_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    return usecase_from_dict(raw, source=str(path))


def usecase_from_dict(raw: dict[str, Any], source: str = "") -> UseCase:
    top = {"name", "description", "classes", *_SECTIONS}
    _no_unknown_keys(raw, top, "use case")
    kwargs: dict[str, Any] = {k: raw[k] for k in ("name", "description", "classes") if k in raw}
    if "name" not in kwargs:
        raise ConfigError("name", "every use case needs a name")
    for section, cls in _SECTIONS.items():
        if section not in raw:
            if section == "train":
                continue
            raise ConfigError(section, f"the [{section}] table is missing")
        values = raw[section]
        if not isinstance(values, dict):
            raise ConfigError(section, f"must be a TOML table [{section}]")
        allowed = {f.name for f in dataclasses.fields(cls)}
        _no_unknown_keys(values, allowed, f"[{section}]")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in values and f.default is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"{section}.{missing[0]}", "is required")
        kwargs[section] = cls(**values)
    return UseCase(**kwargs, source=source)


def _no_unknown_keys(values: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(unknown[0], f"unknown key in {where}; allowed keys: "
                          f"{', '.join(sorted(allowed))}")


def with_overrides(usecase: UseCase, **train_overrides: Any) -> UseCase:
    """Apply CLI flags such as --epochs to the use case's [train] table (None: keep)."""
    changes = {k: v for k, v in train_overrides.items() if v is not None}
    if not changes:
        return usecase
    return dataclasses.replace(usecase, train=dataclasses.replace(usecase.train, **changes))
