"""The resolved configuration of one run, and its effective parallelism.

Every run option is declared once, here, as a ``RunConfig`` field made by ``option``: its
default, its ``--help`` text and its group. The ``ddlstudy run`` flags, the study plans'
cell keys and the manifest's ``config`` block are all read from these fields
(``ddlstudy.config.options``), so they cannot drift apart.

How many workers a run really has (and so its global batch and learning rate) depends on
the strategy and the backend, which live above this layer: ``Effective`` holds the
answer, computed once at preflight (``ddlstudy.runner.preflight``) and carried in the
config from then on. It is the manifest's ``effective`` block.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddlstudy.config.catalog import BACKENDS, STRATEGIES
from ddlstudy.config.paths import DEFAULT_DATASETS_DIR, DEFAULT_RUNS_DIR
from ddlstudy.config.usecase import BadImagePolicy, UseCase, _choices, _positive
from ddlstudy.errors import ConfigError
from ddlstudy.files import check_folder
from ddlstudy.reducers import AUTO, get_reducer
from ddlstudy.reducers import REGISTRY as REDUCERS
from ddlstudy.reducers.compress import parse as parse_compress

SPARK_SYNCS = ("gloo", "allgather")
ALLREDUCE_OR_AUTO = (AUTO, "allreduce")
"""``--reduce`` values that leave MPI's own Allreduce available: buckets and compression
need one of them, and only these are allowed without ``--backend mpi``."""
PRECISIONS = ("fp32", "bf16", "fp16")
SCALINGS = ("strong", "weak")
LR_SCALINGS = ("none", "linear")
BALANCES = ("equal", "throughput")
TRANSPORTS = ("auto", "gloo")
SYNC_EVERY = 10
"""Steps between weight averages in Spark's allgather mode, unless --sync-every says."""
_SPARK_MASTER = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[(\d+),(\d+),(\d+)\]"
                           r"|spark://[\w.\-]+(:\d+)?(,[\w.\-]+(:\d+)?)*)$")


def _spark_master(master: str) -> re.Match:
    found = _SPARK_MASTER.match(master)
    if not found:
        raise ConfigError("--spark-master", f"{master!r} is not a Spark master; use local[N], "
                          f"local-cluster[N,cores,MiB] or spark://host:port")
    return found


def local_cluster(master: str) -> tuple[int, int, int] | None:
    """(workers, cores, MiB a worker) of a ``local-cluster[N,cores,MiB]`` master, else None."""
    found = _spark_master(master)
    return tuple(int(found.group(i)) for i in (5, 6, 7)) if found.group(5) else None


def spark_slots(master: str) -> int | None:
    """Task slots a Spark master offers (None: a cluster, known only once it runs)."""
    found = _spark_master(master)
    if master == "local":
        return 1
    if master.startswith("local["):
        return None if found.group(3) == "*" else int(found.group(3))
    cluster = local_cluster(master)
    if cluster is not None:
        workers, cores, mib = cluster
        ram_mib = psutil.virtual_memory().total // 2**20
        if workers * mib > ram_mib or not 0 < workers <= MAX_PROCESSES:
            raise ConfigError("--spark-master", f"{master}: {workers} executor JVM(s) of "
                              f"{mib} MiB do not fit in this machine's {ram_mib} MiB")
        return workers * cores
    return None


MAX_PROCESSES = 512
FORKS = " (every one is a process or a model copy: more would exhaust the machine)"
MAX_LOADER_WORKERS = 64

HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?$")


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """The hosts of an mpiexec host file and their slots: ``host``, ``host:N`` (hydra) or
    ``host slots=N`` (Open MPI) per line, ``#`` comments."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--hostfile", f"cannot read {path}: {getattr(exc, 'strerror', exc)}; "
                          "give a file with one host[:slots] per line") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        found = re.match(r"^([^\s:]+)(?::(\d+)|\s+slots=(\d+))?$", text)
        slots = int(found.group(2) or found.group(3) or 1) if found else 0
        if not found or not HOST_NAME.match(found.group(1)) or slots < 1:
            raise ConfigError("--hostfile", f"{path} line {number}: {text!r} is not host, "
                              "host:slots or host slots=N")
        hosts.append((found.group(1), slots))
    if not hosts:
        raise ConfigError("--hostfile", f"{path} lists no host")
    return hosts


def read_secret(path: Path) -> str:
    """The shared secret a Spark standalone cluster authenticates with: the file's first
    line (ddlstudy hosts spark writes 64 hex digits)."""
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--spark-secret-file", f"cannot read {path}: "
                          f"{getattr(exc, 'strerror', exc)}") from None
    if not secret or len(secret.split()) != 1 or len(secret) > 4096:
        raise ConfigError("--spark-secret-file", f"{path} must hold one secret on one line "
                          "(the cluster's spark.authenticate.secret)")
    return secret


def _check_secret(path: Path, master: str | None) -> None:
    if not (master or "").startswith("spark://"):
        raise ConfigError("--spark-secret-file", "authenticates to a Spark standalone "
                          "cluster: it needs --spark-master spark://HOST:PORT")
    read_secret(path)


def option(default: Any, help: str, *, group: str, type: Any = str, metavar: str | None = None,
           negate: bool = False, parse: str | None = None,
           choices: tuple[str, ...] = ()) -> Any:
    """A RunConfig field that is also a ``ddlstudy run`` flag and a study-plan key.

    ``help`` says what the flag does; ``type`` converts the flag's text (bool: a switch);
    ``negate`` makes the flag ``--no-<name>``, which sets the field False (its ``help``
    then says what ``--no-<name>`` does); ``parse`` names a converter in
    ``config.options`` for values argparse cannot type (a layer list); ``choices`` are
    the names it takes, shown by ``--help`` (the field's own check refuses others)."""
    return field(default=default, metadata={"help": help, "group": group, "type": type,
                                            "metavar": metavar, "negate": negate,
                                            "parse": parse, "choices": choices})


WHAT, NODES, SPARK, TASK, DATA, OUTPUT = ("what to train", "several nodes",
                                          "the Spark backend",
                                          "training task (override the use case's [train] table)",
                                          "data", "output")


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
class RunConfig:
    """Everything one `ddlstudy run` needs, resolved from the use case and the flags."""

    usecase: UseCase
    strategy: str = option("sequential", "local parallelism strategy; `ddlstudy strategies` "
                           "says what each does", group=WHAT, choices=tuple(STRATEGIES))
    workers: int | None = option(None, "replicas, processes or threads of the strategy "
                                 "(default: one per usable core)", group=WHAT, type=int)
    stages: int | None = option(None, "pipeline stages (default: one per core)", group=WHAT,
                                type=int)
    micro_batches: int = option(4, "GPipe micro-batches each global batch is split into",
                                group=WHAT, type=int)
    stage_starts: tuple[int, ...] | None = option(
        None, "the layer each pipeline stage starts at, e.g. 0,9 (default: cut where the "
        "measured forward times balance; a replay cuts where the run it replays did)",
        group=WHAT, metavar="L0,L1,...", parse="layers")
    replicas: int = option(2, "data-parallel replicas of the pipeline, for hybrid",
                           group=WHAT, type=int)
    devices: int | None = option(None, "GPUs for gpu-data (default: all visible)", group=WHAT,
                                 type=int)
    backend: str = option("local", "local (one node), mpi (each MPI rank a node) or spark "
                          "(each barrier task a node)", group=NODES, choices=BACKENDS)
    nodes: int | None = option(None, "with --backend mpi: start this many MPI ranks on this "
                               "machine (leave out under your own mpiexec); with spark: "
                               "barrier tasks", group=NODES, type=int)
    hosts: str | None = option(None, "with --backend mpi --nodes N: place the ranks on "
                               "host1,host2,... (mpiexec's ssh launcher) or on "
                               "emulated[:PREFIX], the hosts of `ddlstudy hosts up`",
                               group=NODES)
    hostfile: Path | None = option(None, "with --backend mpi: place the ranks on the hosts "
                                   "listed in FILE, mpiexec's format (one host[:slots] per "
                                   "line; --nodes defaults to the slots)", group=NODES,
                                   type=Path, metavar="FILE")
    reduce: str = option(AUTO, "how MPI nodes average gradients (auto: MPI's Allreduce for "
                         "small gradients, ring-allreduce for large ones, by size and rank "
                         "count)", group=NODES, choices=(AUTO, *REDUCERS))
    compress: str = option("none", "gradients on the wire between MPI nodes: none, fp16, or "
                           "topk:<ratio> with error feedback", group=NODES,
                           metavar="{none,fp16,topk:RATIO}")
    bucket_mb: float | None = option(None, "with --reduce auto or allreduce: reduce the "
                                     "gradients with MPI's Iallreduce in buckets of this "
                                     "many MiB, each as soon as backward has "
                                     "filled it, overlapping the exchange with the backward "
                                     "pass", group=NODES, type=float)
    balance: str = option("equal", "equal: each node an equal slice of every global batch; "
                          "throughput: slices in proportion to each node's images/s, "
                          "measured over the first steps (MPI nodes of unequal speed)",
                          group=NODES, choices=BALANCES)
    transport: str = option("auto", "how DDP's processes (cpu-processes, Spark's gloo "
                            "mode) average gradients: auto: through this host's shared "
                            "memory when every process runs on it, else gloo; gloo: "
                            "gloo's TCP always, as plain DDP does", group=NODES,
                            choices=TRANSPORTS)
    scaling: str = option("strong", "strong: --batch-size is the global batch, split over "
                          "the workers; weak: each worker's batch, so the global batch grows "
                          "with the workers", group=TASK, choices=SCALINGS)
    lr_scaling: str = option("none", "none, or linear: the learning rate times global batch "
                             "/ the use case's batch", group=TASK, choices=LR_SCALINGS)
    accumulate: int = option(1, "run each batch as K micro-batches, one optimizer step and "
                             "one gradient exchange per batch; --batch-size 64 --accumulate "
                             "4 trains batches of 64 in the memory of 16", group=TASK,
                             type=int, metavar="K")
    precision: str = option("fp32", "fp32, bf16 or fp16: forward and backward under "
                            "torch.autocast (weights stay fp32); fp16 with a gradient scaler "
                            "(sequential, cpu-intraop, cpu-processes, gpu-data, MPI nodes of "
                            "the first two, Spark gloo)", group=TASK, choices=PRECISIONS)
    spark_master: str | None = option(None, "local[N] (default: local[nodes]), "
                                      "local-cluster[N,cores,MiB] or spark://host:port",
                                      group=SPARK)
    spark_sync: str = option("gloo", "gloo: gradients all-reduced every step between the "
                             "tasks over torch.distributed; allgather: weights averaged "
                             "through Spark's barrier allGather every --sync-every steps "
                             "(SparkNet)", group=SPARK, choices=SPARK_SYNCS)
    sync_every: int = option(SYNC_EVERY, "steps between weight averages with --spark-sync "
                             "allgather",
                             group=SPARK, type=int)
    spark_ui: bool = option(False, "start Spark's web UI", group=SPARK, type=bool)
    spark_secret_file: Path | None = option(None, "a file holding a Spark standalone "
                                            "cluster's shared secret: the driver "
                                            "authenticates with it (spark.authenticate); "
                                            "ddlstudy hosts spark writes one",
                                            group=SPARK, type=Path)
    data_dir: Path | None = option(None, "a real ImageFolder tree (root/<class>/<img>) "
                                   "instead of the use case's synthetic set", group=DATA,
                                   type=Path)
    datasets_dir: Path = option(DEFAULT_DATASETS_DIR, "where synthetic sets live",
                                group=DATA, type=Path)
    on_bad_image: BadImagePolicy = option(BadImagePolicy.FAIL, "fail: stop naming the file; "
                                          "skip: train without it and list it in the "
                                          "manifest", group=DATA,
                                          choices=tuple(p.value for p in BadImagePolicy))
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
                                   "(quick measurements)", group=OUTPUT, type=int)
    max_val_steps: int | None = option(None, "validate on at most this many batches each "
                                       "epoch (quick measurements: advise's probes)",
                                       group=OUTPUT, type=int, metavar="N")
    snapshot: bool = option(True, "do not write snapshot.pt after each epoch", group=OUTPUT,
                            type=bool, negate=True)
    tensorboard: bool = option(False, "also write the metrics and resource samples as "
                               "TensorBoard scalars into <run>/tensorboard/ when the run "
                               "ends", group=OUTPUT, type=bool)
    snapshot_every: int | None = option(None, "also snapshot every N steps inside an epoch",
                                        group=OUTPUT, type=int, metavar="N")
    expect_fingerprint: str | None = None
    """Refuse to train unless the data set has this fingerprint (replay)."""
    replay_of: str | None = None
    """The run id this run replays."""
    effective: Effective | None = field(default=None, compare=False)
    """Set by preflight (``ddlstudy.runner.resolve``); not part of the recorded config."""

    def __post_init__(self) -> None:
        self._check_types()
        try:
            object.__setattr__(self, "on_bad_image", BadImagePolicy(self.on_bad_image))
        except (ValueError, TypeError):
            raise ConfigError("--on-bad-image", f"unknown policy {self.on_bad_image!r}; "
                              f"choose one of: {_choices(BadImagePolicy)}") from None
        self._check_layout()
        self._check_nodes()
        self._check_task()
        self._check_output()

    def _check_types(self) -> None:
        """Each option holds a value of its declared type (a study plan or a replayed
        manifest can hold anything): refused naming the flag, before any other check."""
        for f in options():
            value, kind = getattr(self, f.name), f.metadata["type"]
            if value is None and f.default is None:
                continue
            flag = "--" + ("no-" if f.metadata["negate"] else "") + f.name.replace("_", "-")
            if f.metadata["parse"] == "layers":
                ok = isinstance(value, list | tuple) and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value)
            elif kind is Path:
                ok = isinstance(value, str | Path) and str(value) != ""
                if ok:
                    object.__setattr__(self, f.name, Path(value))
            elif kind is bool:
                ok = isinstance(value, bool)
            elif kind is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str)
            if not ok:
                what = {Path: "a path", bool: "true or false", float: "a number",
                        int: "an integer"}.get(kind, "a name")
                raise ConfigError(flag, f"must be {what}, got {value!r}")

    def _check_layout(self) -> None:
        if self.workers is not None:
            _positive("--workers", self.workers, most=MAX_PROCESSES, why=FORKS)
        if self.stages is not None:
            _positive("--stages", self.stages, most=MAX_PROCESSES, why=FORKS)
        _positive("--micro-batches", self.micro_batches, most=4096)
        if self.stage_starts is not None:
            object.__setattr__(self, "stage_starts", tuple(self.stage_starts))
            starts = self.stage_starts
            if not starts or starts[0] != 0 or list(starts) != sorted(set(starts)):
                raise ConfigError("--stage-starts", f"{','.join(map(str, starts))}: give the "
                                  "first layer of each stage, starting at 0 and increasing, "
                                  "e.g. 0,9")
            if self.stages is not None and self.stages != len(starts):
                raise ConfigError("--stage-starts", f"{len(starts)} stages start there but "
                                  f"--stages is {self.stages}")
        _positive("--replicas", self.replicas, most=MAX_PROCESSES, why=FORKS)
        if self.devices is not None:
            _positive("--devices", self.devices, most=MAX_PROCESSES)

    def _check_nodes(self) -> None:
        if self.nodes is not None:
            _positive("--nodes", self.nodes, most=MAX_PROCESSES, why=FORKS)
            if self.backend == "local" and self.nodes > 1:
                raise ConfigError("--nodes", "more than one node needs --backend mpi or spark")
        if self.hosts is not None:
            if self.backend != "mpi":
                raise ConfigError("--hosts", "places MPI ranks: it needs --backend mpi (for "
                                  "Spark, give --spark-master spark://host:port)")
            names = self.hosts.split(",")
            emulated = len(names) == 1 and names[0].partition(":")[0] == "emulated"
            if not emulated and not all(HOST_NAME.match(n) for n in names):
                raise ConfigError("--hosts", f"{self.hosts!r}; give host names (letters, "
                                  "digits, dots, dashes) separated by commas, or "
                                  "emulated[:PREFIX]")
        if self.hostfile is not None:
            if self.backend != "mpi" or self.hosts is not None:
                raise ConfigError("--hostfile", "places MPI ranks: it needs --backend mpi, "
                                  "and either --hosts or --hostfile, not both")
            slots = sum(n for _, n in read_hostfile(self.hostfile))
            object.__setattr__(self, "hostfile", Path(self.hostfile).absolute())
            if self.nodes is None:
                object.__setattr__(self, "nodes", slots)
        if self.bucket_mb is not None:
            _positive("--bucket-mb", self.bucket_mb, float, most=65536,
                      why=" MiB (a bucket holds part of one model's gradients)")
            if self.backend != "mpi" or self.reduce not in ALLREDUCE_OR_AUTO or \
                    self.compress != "none":
                raise ConfigError("--bucket-mb", "buckets MPI's own Iallreduce: it needs "
                                  "--backend mpi with --reduce allreduce (or auto) and no "
                                  "--compress")
        if self.balance not in BALANCES:
            raise ConfigError("--balance", f"unknown policy {self.balance!r}; choose one of: "
                              f"{', '.join(BALANCES)}")
        if self.balance == "throughput" and self.backend != "mpi":
            raise ConfigError("--balance", "throughput shares each global batch between MPI "
                              "nodes of unequal speed: it needs --backend mpi")
        if parse_compress(self.compress) is not None:
            if self.backend != "mpi":
                raise ConfigError("--compress", "compresses the gradients sent between "
                                  "nodes: it needs --backend mpi")
            if self.reduce not in ALLREDUCE_OR_AUTO:
                raise ConfigError("--compress", f"exchanges the compressed gradients itself "
                                  f"(an allgather); leave --reduce at auto, not "
                                  f"{self.reduce}")
        if self.reduce not in ALLREDUCE_OR_AUTO and self.backend != "mpi":
            raise ConfigError("--reduce", f"{self.reduce} averages gradients between MPI "
                              "nodes: it needs --backend mpi")
        if self.transport not in TRANSPORTS:
            raise ConfigError("--transport", f"unknown transport {self.transport!r}; choose "
                              f"one of: {', '.join(TRANSPORTS)}")
        ddp = (self.backend, self.strategy) == ("local", "cpu-processes") or \
            (self.backend, self.spark_sync) == ("spark", "gloo")
        if self.transport != "auto" and not ddp:
            raise ConfigError("--transport", "chooses how DDP's processes average gradients: "
                              "it needs --strategy cpu-processes (one node) or --backend "
                              "spark with --spark-sync gloo")
        if self.spark_sync not in SPARK_SYNCS:
            raise ConfigError("--spark-sync", f"unknown mode {self.spark_sync!r}; choose one "
                              f"of: {', '.join(SPARK_SYNCS)}")
        _positive("--sync-every", self.sync_every, most=1_000_000)
        spark_flag = ("--spark-master" if self.spark_master else
                      "--spark-sync" if self.spark_sync != "gloo" else
                      "--spark-ui" if self.spark_ui else
                      "--spark-secret-file" if self.spark_secret_file else None)
        if self.backend != "spark" and spark_flag:
            raise ConfigError(spark_flag, "needs --backend spark")
        if self.sync_every != SYNC_EVERY and self.spark_sync != "allgather":
            raise ConfigError("--sync-every", "sets how often allgather mode averages the "
                              "weights: it needs --spark-sync allgather")
        if self.spark_secret_file is not None:
            _check_secret(self.spark_secret_file, self.spark_master)
        if self.spark_master is not None:
            slots = spark_slots(self.spark_master)
            if self.nodes and slots is not None and slots < self.nodes:
                raise ConfigError("--spark-master", f"{self.spark_master} has {slots} task "
                                  f"slot(s) but --nodes {self.nodes} barrier tasks must run "
                                  f"at once; give it at least {self.nodes}")
        if self.reduce != AUTO:
            get_reducer(self.reduce)

    def _check_task(self) -> None:
        _positive("--accumulate", self.accumulate, most=4096)
        if self.scaling not in SCALINGS:
            raise ConfigError("--scaling", f"unknown scaling {self.scaling!r}; choose one of: "
                              f"{', '.join(SCALINGS)}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError("--lr-scaling", f"unknown rule {self.lr_scaling!r}; choose one "
                              f"of: {', '.join(LR_SCALINGS)}")
        if self.precision not in PRECISIONS:
            raise ConfigError("--precision", f"unknown precision {self.precision!r}; choose "
                              f"one of: {', '.join(PRECISIONS)}")

    def _check_output(self) -> None:
        if self.max_steps is not None:
            _positive("--max-steps", self.max_steps)
        if self.max_val_steps is not None:
            _positive("--max-val-steps", self.max_val_steps)
        if self.snapshot_every is not None:
            _positive("--snapshot-every", self.snapshot_every)
            if not self.snapshot:
                raise ConfigError("--snapshot-every", "cannot be used with --no-snapshot")
        if isinstance(self.loader_workers, bool) or not isinstance(self.loader_workers, int) \
                or not 0 <= self.loader_workers <= MAX_LOADER_WORKERS:
            raise ConfigError("--loader-workers", f"must be 0 to {MAX_LOADER_WORKERS} "
                              f"processes, got {self.loader_workers!r}")
        if isinstance(self.sample_hz, bool) or not isinstance(self.sample_hz, int | float) \
                or not 0 <= self.sample_hz <= 100:
            raise ConfigError("--sample-hz", f"must be between 0 (off) and 100, "
                              f"got {self.sample_hz}")
        check_folder("--runs-dir", self.runs_dir)
        if self.data_dir is None:
            check_folder("--datasets-dir", self.datasets_dir)
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


def options() -> list[dataclasses.Field]:
    """The RunConfig fields that are run options (flags and study-plan keys)."""
    return [f for f in dataclasses.fields(RunConfig) if "help" in f.metadata]


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
