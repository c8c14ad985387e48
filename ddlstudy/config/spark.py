"""The Spark backend's flags (``SparkOptions``, part of every ``RunConfig``) and their
checks: torch-free, so a bad combination is refused before anything is imported (and
before the CLI starts a Spark run's JVM early, ``ddlstudy.machine.sparkjvm``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddlstudy.config.fields import MAX_PROCESSES, SPARK, option
from ddlstudy.errors import ConfigError
from ddlstudy.reading import BadFile, read_text

SPARK_SYNCS = ("gloo", "allgather")
SYNC_EVERY = 10
"""Steps between weight averages in Spark's allgather mode, unless --sync-every says."""
_SPARK_MASTER = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[(\d+),(\d+),(\d+)\]"
                           r"|spark://[\w.\-]+(:\d+)?(,[\w.\-]+(:\d+)?)*)$")
SPARK_ONLY = ("spark",)


def _spark_master(master: str) -> re.Match:
    found = _SPARK_MASTER.fullmatch(master)
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


def read_secret(path: Path) -> str:
    """The shared secret a Spark standalone cluster authenticates with: the file's first
    line (ddlstudy hosts spark writes 64 hex digits)."""
    try:
        secret = read_text(path, "secret file", cap=64 * 1024).strip()
    except BadFile as exc:
        raise ConfigError("--spark-secret-file", str(exc)) from None
    if not secret or len(secret.split()) != 1 or len(secret) > 4096:
        raise ConfigError("--spark-secret-file", f"{path} must hold one secret on one line "
                          "(the cluster's spark.authenticate.secret)")
    return secret


@dataclass(frozen=True, kw_only=True)
class SparkOptions:
    """What only ``--backend spark`` reads: the cluster and how the tasks keep in step."""

    spark_master: str | None = option(None, "local[N] (default: local[nodes]), "
                                      "local-cluster[N,cores,MiB] or spark://host:port",
                                      group=SPARK, owners=SPARK_ONLY)
    spark_sync: str = option("gloo", "gloo: gradients all-reduced every step between the "
                             "tasks over torch.distributed; allgather: weights averaged "
                             "through Spark's barrier allGather every --sync-every steps "
                             "(SparkNet)", group=SPARK, choices=SPARK_SYNCS, noun="mode",
                             owners=SPARK_ONLY)
    sync_every: int = option(SYNC_EVERY, "steps between weight averages with --spark-sync "
                             "allgather", group=SPARK, type=int, most=1_000_000,
                             owners=SPARK_ONLY)
    spark_ui: bool = option(False, "start Spark's web UI", group=SPARK, type=bool,
                            owners=SPARK_ONLY)
    spark_secret_file: Path | None = option(None, "a file holding a Spark standalone "
                                            "cluster's shared secret: the driver "
                                            "authenticates with it (spark.authenticate); "
                                            "ddlstudy hosts spark writes one",
                                            group=SPARK, type=Path, owners=SPARK_ONLY)

    def check_spark(self) -> None:
        """What the Spark flags need of each other (each alone is checked as declared)."""
        if self.sync_every != SYNC_EVERY and self.spark_sync != "allgather":
            raise ConfigError("--sync-every", "sets how often allgather mode averages the "
                              "weights: it needs --spark-sync allgather")
        if self.spark_secret_file is not None:
            if not (self.spark_master or "").startswith("spark://"):
                raise ConfigError("--spark-secret-file", "authenticates to a Spark "
                                  "standalone cluster: it needs --spark-master "
                                  "spark://HOST:PORT")
            read_secret(self.spark_secret_file)
        if self.spark_master is not None:
            slots = spark_slots(self.spark_master)
            if self.nodes and slots is not None and slots < self.nodes:
                raise ConfigError("--spark-master", f"{self.spark_master} has {slots} task "
                                  f"slot(s) but --nodes {self.nodes} barrier tasks must run "
                                  f"at once; give it at least {self.nodes}")
