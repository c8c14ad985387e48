"""The resolved configuration of one run, and its effective parallelism.

Every run option is declared once, as a ``RunConfig`` field made by ``option``
(``config.fields``): its default, its ``--help`` text, its group, the names it takes, its
bounds, the backend that owns it. The MPI and Spark backends' own flags are declared, with
the checks between them, in ``config.mpi`` and ``config.spark``, which ``RunConfig``
inherits. The ``ddlstudy run`` flags, the study plans' cell keys and the manifest's
``config`` block are all read from these fields (``ddlstudy.config.options``), so they
cannot drift apart.

How many workers a run really has (and so its global batch and learning rate) depends on
the strategy and the backend, which live above this layer: ``Effective`` holds the
answer, computed once at preflight (``ddlstudy.runner.preflight``) and carried in the
config from then on. It is the manifest's ``effective`` block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlstudy.config.fields import (
    DATA,
    FORKS,
    MAX_PROCESSES,
    NODES,
    OUTPUT,
    TASK,
    WHAT,
    check_declared,
    declared,
    option,
)
from ddlstudy.config.folders import with_classes
from ddlstudy.config.limits import most, why
from ddlstudy.config.mpi import MpiOptions
from ddlstudy.config.paths import DEFAULT_DATASETS_DIR, DEFAULT_RUNS_DIR
from ddlstudy.config.spark import SparkOptions
from ddlstudy.config.usecase import BadImagePolicy, ModelSpec, UseCase
from ddlstudy.errors import ConfigError
from ddlstudy.files import check_folder
from ddlstudy.watchers import ALONE, watcher

PRECISIONS = ("fp32", "bf16", "fp16")
SCALINGS = ("strong", "weak")
LR_SCALINGS = ("none", "linear")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
HEAPS = ("return", "keep")


def stages_a_process(schedule: str) -> int:
    """Pipeline stages each process holds under ``schedule``: 2 interleaved, else 1."""
    return 2 if schedule == "interleaved-1f1b" else 1
TRANSPORTS = ("auto", "gloo")
SHARED_MEMORY = ("cpu-processes", "sharded", "zero", "tensor")
"""The one-node strategies whose processes talk through this host's shared memory (or
gloo, with --transport gloo)."""
MAX_LOADER_WORKERS = 64


WARMUP_STEPS = 2
"""Steps at the start of each epoch left out of its steady images/s by default (allocator
and cache warm-up): ``--warmup-steps``."""
PROBE_SECONDS = 3.0
"""advise's time box: a probe's steady steps (after its warm-up) last about this long,
whatever a step costs (on tiny an epoch's 13 steady steps take 0.3 s, on VGG16 one step
takes seconds): a probe is its start-up, its warm-up and this (``advise --probe-seconds``)."""
REFAULT_PROBE_SECONDS = 8.0
"""The time box where a host's balloon takes freed memory back and the model's steps map
and free blocks over 32 MiB (``tools.advise.memory.refaults``): one step in every 2 s
reporting period runs up to twice as long, so a 3 s box holds one such step or none. Over
the 90 steps of tiny-full's checked runs (sequential, cpu-threads, cpu-intraop), windows of
3 s put images/s up to 8, 15 and 26 % off the run's own figure (10th and 90th
percentiles), of 6 s up to 7, 6 and 22 %, of 10 s up to 4, 6 and 14 % (cpu-intraop's run
sped up over its epochs)."""
MIN_PROBE_SECONDS = 0.5
"""The shortest time box: a short budget shrinks the boxes to it, and no shorter one is
taken (it would time nothing but the warm-up's pace)."""


@dataclass(frozen=True)
class Effective:
    """What a run really does, once its strategy and backend are known: the data-parallel
    workers over all nodes, the global batch and the learning rate (the manifest's
    ``effective`` block)."""

    scaling: str
    global_batch: int
    lr: float
    data_parallel_workers: int

    @classmethod
    def of(cls, cfg: RunConfig, workers: int) -> Effective:
        """``cfg`` trained by ``workers`` data-parallel workers (see ``scaling``)."""
        train = cfg.usecase.train
        batch = train.batch_size * workers if cfg.scaling == "weak" else train.batch_size
        lr = train.lr * batch / train.batch_size if cfg.lr_scaling == "linear" else train.lr
        return cls(scaling=cfg.scaling, global_batch=batch, lr=lr,
                   data_parallel_workers=workers)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class RunConfig(MpiOptions, SparkOptions):
    """Everything one `ddlstudy run` needs, resolved from the use case and the flags."""

    usecase: UseCase
    model: str | None = option(None, "the network, instead of the use case's: resnet18 or "
                               "any torchvision classification model, alexnet or vgg16, "
                               "path/to/file.py:FUNCTION or package.module:FUNCTION of your "
                               "own (FUNCTION(num_classes=N) returns an nn.Module), "
                               "timm:NAME; `ddlstudy models` lists them", group=WHAT,
                               metavar="NAME")
    init_weights: Path | None = option(None, "start from these weights (a state dict saved "
                                       "with torch.save, or a run's snapshot.pt) instead "
                                       "of fresh ones: fine-tuning; never a download",
                                       group=WHAT, type=Path, metavar="FILE")
    strategy: str = option("sequential", "local parallelism strategy; `ddlstudy strategies` "
                           "says what each does", group=WHAT, metavar="NAME")
    workers: int | None = option(None, "replicas, processes or threads of the strategy "
                                 "(default: one per usable core)", group=WHAT, type=int,
                                 most=MAX_PROCESSES, why=FORKS)
    stages: int | None = option(None, "pipeline stages (default: one per core)", group=WHAT,
                                type=int, most=MAX_PROCESSES, why=FORKS)
    micro_batches: int = option(4, "pipeline micro-batches each global batch is split into",
                                group=WHAT, type=int, most=4096)
    schedule: str = option("gpipe", "a pipeline's schedule: gpipe (every micro-batch "
                           "forward, then every one backward), 1f1b (one forward, one "
                           "backward: fewer activations held), interleaved-1f1b (two "
                           "stages a process, a smaller bubble)", group=WHAT,
                           choices=SCHEDULES, noun="schedule")
    stage_starts: tuple[int, ...] | None = option(
        None, "the layer each pipeline stage starts at, e.g. 0,9 (default: cut where the "
        "measured cost of a step balances; a replay cuts where the run it replays did)",
        group=WHAT, metavar="L0,L1,...", parse="layers")
    reshard_after_forward: bool = option(True, "sharded: keep each block's gathered "
                                         "parameters from its forward to its backward "
                                         "(ZeRO-2: more memory, one all-gather a step "
                                         "fewer) instead of freeing them (ZeRO-3)",
                                         group=WHAT, type=bool, negate=True)
    shared_buffers: bool = option(True, "sharded: allocate FSDP's all-gather and "
                                  "reduce-scatter buffers at each use (its own, freed "
                                  "after) instead of holding them in this host's shared "
                                  "memory for the whole run (there each all-gather is a "
                                  "barrier and each reduce-scatter a sum, but (k + 1) x "
                                  "the largest block stays resident); zero: broadcast each "
                                  "process's updated weights instead of holding the "
                                  "weights once in shared memory",
                                  group=WHAT, type=bool, negate=True)
    tensor: int | None = option(None, "sharded: split each pair of consecutive Linear "
                                "layers over this many of the node's processes (a 2-D "
                                "mesh: tensor parallel inside, FSDP2 across)", group=WHAT,
                                type=int, most=MAX_PROCESSES, why=FORKS, metavar="T")
    replicas: int = option(2, "data-parallel replicas of the pipeline, for hybrid",
                           group=WHAT, type=int, most=MAX_PROCESSES, why=FORKS)
    devices: int | None = option(None, "GPUs for gpu-data (default: all visible)", group=WHAT,
                                 type=int, most=MAX_PROCESSES)
    backend: str = option("local", "how nodes start and talk: local (one node), mpi (each "
                          "MPI rank a node), spark (each barrier task a node) or a plugin's; "
                          "`ddlstudy backends` says what each does", group=NODES,
                          metavar="NAME")
    nodes: int | None = option(None, "with --backend mpi: start this many MPI ranks on this "
                               "machine (leave out under your own mpiexec); with spark: "
                               "barrier tasks", group=NODES, type=int, most=MAX_PROCESSES,
                               why=FORKS)
    transport: str = option("auto", "how a node's processes talk: DDP's (cpu-processes, "
                            "Spark's gloo mode) average gradients, a pipeline's stages "
                            "send activations and gradients, hybrid's replicas average "
                            "them; auto: through this host's shared memory when every "
                            "process runs on it, else gloo; gloo: gloo's TCP always, as "
                            "plain DDP and torch's pipelining do", group=NODES,
                            choices=TRANSPORTS, noun="transport")
    scaling: str = option("strong", "strong: --batch-size is the global batch, split over "
                          "the workers; weak: each worker's batch, so the global batch grows "
                          "with the workers", group=TASK, choices=SCALINGS, noun="scaling")
    lr_scaling: str = option("none", "none, or linear: the learning rate times global batch "
                             "/ the use case's batch", group=TASK, choices=LR_SCALINGS,
                             noun="rule")
    accumulate: int = option(1, "run each batch as K micro-batches, one optimizer step and "
                             "one gradient exchange per batch; --batch-size 64 --accumulate "
                             "4 trains batches of 64 in the memory of 16", group=TASK,
                             type=int, metavar="K", most=4096)
    checkpoint_activations: bool = option(False, "keep only each block's input from the "
                                          "forward to the backward and compute the rest "
                                          "again there (torch.utils.checkpoint): less "
                                          "memory, about one more forward's time a step",
                                          group=TASK, type=bool)
    precision: str = option("fp32", "fp32, bf16 or fp16: forward and backward under "
                            "torch.autocast (weights stay fp32); fp16 with a gradient scaler "
                            "(sequential, cpu-intraop, cpu-processes, gpu-data, and their "
                            "MPI nodes and Spark tasks)", group=TASK, choices=PRECISIONS,
                            noun="precision")
    heap: str = option("return", "return: glibc's own rule, blocks over 32 MiB mapped "
                       "afresh and returned when freed (the least memory held); keep: "
                       "every block from the heap, freed ones kept for the next step (no "
                       "page faulted in anew: faster where a step frees and makes large "
                       "tensors, higher peaks where the heap fragments)", group=TASK,
                       choices=HEAPS, noun="heap")
    data_dir: Path | None = option(None, "a real ImageFolder tree (root/<class>/<img>) "
                                   "instead of the use case's synthetic set", group=DATA,
                                   type=Path)
    datasets_dir: Path = option(DEFAULT_DATASETS_DIR, "where synthetic sets live",
                                group=DATA, type=Path)
    on_bad_image: BadImagePolicy = option(BadImagePolicy.FAIL, "fail: stop naming the file; "
                                          "skip: train without it and list it in the "
                                          "manifest", group=DATA,
                                          choices=tuple(p.value for p in BadImagePolicy),
                                          noun="policy")
    loader_workers: int = option(0, "DataLoader processes that decode and augment (0: in "
                                 "the training process)", group=DATA, type=int)
    data_cache: bool = option(True, "decode every image in the loop instead of once into "
                              "this host's cache ($DDLSTUDY_CACHE, default "
                              "~/.cache/ddlstudy), as torchvision's ImageFolder does (the "
                              "same tensors and flips either way)", group=DATA, type=bool,
                              negate=True)
    runs_dir: Path = option(DEFAULT_RUNS_DIR, "where run folders go", group=OUTPUT, type=Path)
    sample_hz: float = option(10.0, "resource sampling rate, 0 to turn it off", group=OUTPUT,
                              type=float)
    max_steps: int | None = option(None, "stop each epoch after this many optimizer steps "
                                   "(quick measurements)", group=OUTPUT, type=int,
                                   most=most("steps"), why=why("steps"))
    max_val_steps: int | None = option(None, "validate on at most this many batches each "
                                       "epoch, spread over the validation set (quick "
                                       "measurements: advise's probes)",
                                       group=OUTPUT, type=int, metavar="N",
                                       most=most("steps"), why=why("steps"))
    warmup_steps: int = option(WARMUP_STEPS, "steps at the start of each epoch left out of "
                               "its steady images/s (allocator and cache warm-up; 1 where a "
                               "step takes seconds, as VGG16's on a CPU)", group=OUTPUT, type=int,
                               metavar="N", most=most("steps"), why=why("steps"))
    steady_seconds: float | None = option(
        None, "end each epoch once its steady steps (after the warm-up) have taken about "
        "this many seconds, at the pace of its last warm-up step (the ranks' mean): as "
        "many steps as a figure needs whatever a step costs (advise's probes; --max-steps "
        "still bounds it)", group=OUTPUT, type=float, metavar="S",
        most=most("seconds"), why=why("seconds"))
    snapshot: bool = option(True, "do not write snapshot.pt after each epoch", group=OUTPUT,
                            type=bool, negate=True)
    tensorboard: bool = option(False, "also write the metrics and resource samples as "
                               "TensorBoard scalars into <run>/tensorboard/ when the run "
                               "ends", group=OUTPUT, type=bool)
    mlflow: str | None = option(None, "also log the run to MLflow: each epoch as it ends "
                                "(from rank 0), then the configuration's key as params, its "
                                "tags, resource samples and files, as `ddlstudy export "
                                "mlflow` does; URI: a tracking server or store (left out, "
                                "or true in a plan: sqlite:///<runs-dir>/mlflow.db); a "
                                "study's runs nest under its parent run", group=OUTPUT,
                                metavar="URI", const=ALONE)
    snapshot_every: int | None = option(None, "also snapshot every N steps inside an epoch",
                                        group=OUTPUT, type=int, metavar="N",
                                        most=most("steps"), why=why("steps"))
    expect_fingerprint: str | None = None
    """Refuse to train unless the data set has this fingerprint (replay)."""
    replay_of: str | None = None
    """The run id this run replays."""
    effective: Effective | None = field(default=None, compare=False)
    """Set by preflight (``ddlstudy.runner.resolve``); not part of the recorded config."""

    def __post_init__(self) -> None:
        check_declared(self)
        for name in PATHS:  # absolute before any code of one's own runs (it may chdir)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)).absolute())
        object.__setattr__(self, "on_bad_image", BadImagePolicy(self.on_bad_image))
        if self.model is not None:
            self._use_model()
        folder = self.data_dir or self.usecase.data.dir
        if folder is not None:  # a folder's classes are its class folders
            object.__setattr__(self, "usecase", with_classes(self.usecase, Path(folder)))
        self._check_layout()
        self.check_mpi()
        self.check_spark()
        ddp = (self.backend == "local" and self.strategy in SHARED_MEMORY) or \
            (self.backend, self.spark_sync) == ("spark", "gloo") or \
            self.strategy in ("pipeline", "hybrid")
        if self.transport != "auto" and not ddp:
            raise ConfigError("--transport", "chooses how a node's processes talk: it needs "
                              f"--strategy {', '.join(SHARED_MEMORY)} (one node), pipeline or "
                              "hybrid, or --backend spark with --spark-sync gloo")
        self._check_output()

    def _use_model(self) -> None:
        """--model in place of the use case's model (the same name keeps its width); a
        file of one's own is taken from the working directory, and recorded absolute."""
        try:
            spec = ModelSpec(arch=self.model).anchored(Path.cwd())
        except ConfigError as exc:  # the flag the user typed, not the use case's key
            raise ConfigError("--model", str(exc).split(": ", 1)[1]) from None
        if spec.arch == self.usecase.model.arch:
            spec = self.usecase.model
        object.__setattr__(self, "model", str(spec.arch))
        object.__setattr__(self, "usecase", dataclasses.replace(self.usecase, model=spec))

    def _check_layout(self) -> None:
        if self.stage_starts is not None:
            object.__setattr__(self, "stage_starts", tuple(self.stage_starts))
            starts = self.stage_starts
            if not starts or starts[0] != 0 or list(starts) != sorted(set(starts)):
                raise ConfigError("--stage-starts", f"{','.join(map(str, starts))}: give the "
                                  "first layer of each stage, starting at 0 and increasing, "
                                  "e.g. 0,9")
            per = stages_a_process(self.schedule)
            if self.stages is not None and self.stages * per != len(starts):
                each = f" x {per} stages a process under {self.schedule}" if per > 1 else ""
                raise ConfigError("--stage-starts", f"{len(starts)} stages start there but "
                                  f"--stages is {self.stages}{each}")

    def _check_output(self) -> None:
        if self.snapshot_every is not None and not self.snapshot:
            raise ConfigError("--snapshot-every", "cannot be used with --no-snapshot")
        if not 0 <= self.loader_workers <= MAX_LOADER_WORKERS:
            raise ConfigError("--loader-workers", f"must be 0 to {MAX_LOADER_WORKERS} "
                              f"processes, got {self.loader_workers!r}")
        if not 0 <= self.sample_hz <= 100:  # NaN too
            raise ConfigError("--sample-hz", f"must be between 0 (off) and 100, "
                              f"got {self.sample_hz}")
        check_folder(_named("--runs-dir", self.runs_dir, DEFAULT_RUNS_DIR), self.runs_dir)
        if self.mlflow is not None:  # the store the run logs to, checked and written out
            object.__setattr__(self, "mlflow", watcher("mlflow", "--mlflow").setting(
                self.mlflow, self.runs_dir, "--mlflow"))
        if self.data_dir is None and self.usecase.data.synthetic and \
                not (Path(self.datasets_dir) / self.usecase.data.name).is_dir():
            # Only a set that must be made needs a writable folder: a complete one on a
            # read-only mount is read (``data.prepare_data`` checks before it generates).
            check_folder(_named("--datasets-dir", self.datasets_dir, DEFAULT_DATASETS_DIR),
                         self.datasets_dir)
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ConfigError("--data-dir", f"{self.data_dir} is not a folder; give the root "
                              "of an ImageFolder tree (root/<class>/<image>)")

    def _resolved(self) -> Effective:
        if self.effective is None:
            raise RuntimeError("this RunConfig has not been through preflight: "
                               "ddlstudy.runner.resolve(cfg) sets its effective parallelism")
        return self.effective

    def data_parallel(self) -> int:
        """Workers that each take a slice of every global batch, over all nodes."""
        return self._resolved().data_parallel_workers

    @property
    def global_batch(self) -> int:
        """Images per optimizer step over all workers (see ``scaling``)."""
        return self._resolved().global_batch

    @property
    def lr(self) -> float:
        """The learning rate the optimizer uses (see ``lr_scaling``)."""
        return self._resolved().lr

    def to_dict(self) -> dict[str, Any]:
        """The recorded config (the manifest's ``config``): every field but ``effective``,
        which the manifest records in a block of its own."""
        out = jsonable(dataclasses.asdict(self))
        out.pop("effective")
        return out


PATHS = ("runs_dir", "datasets_dir", "data_dir", "init_weights")
"""The RunConfig fields that are paths: made absolute where the config is made."""


def _named(flag: str, path: Path, default: Path) -> str:
    """How a refusal names an output folder: its flag, or, left at its default, the
    DDLSTUDY_HOME it came from (no flag was given)."""
    return flag if Path(path) != default else f"DDLSTUDY_HOME's {default.name} folder"


def options() -> list[dataclasses.Field]:
    """The RunConfig fields that are run options (flags and study-plan keys)."""
    return declared(RunConfig)


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
