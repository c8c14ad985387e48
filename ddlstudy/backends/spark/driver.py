"""The Spark driver's side of a run: the session, the barrier stage, what Spark did; and
what each barrier task runs (``--spark-sync gloo``; allgather mode is in ``allgather``)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

import psutil

from ddlstudy.backends.spark.allgather import (
    RPC_MAX_MB,
    SPARK_DEFAULT_HEAP_MB,
    allgather_rank,
    heap_mb,
)
from ddlstudy.config import RunConfig, spark_slots
from ddlstudy.config.run import local_cluster, read_secret
from ddlstudy.environment import usable_cores
from ddlstudy.errors import Unavailable
from ddlstudy.models import parameter_count
from ddlstudy.strategies.processes import data_parallel_rank
from ddlstudy.training.distributed import free_port
from ddlstudy.training.job import Job

log = logging.getLogger("ddlstudy")

SPARK_STRATEGIES = ("sequential", "cpu-intraop")
"""Local strategies a Spark task can run (one process per node)."""
BARRIER_TIMEOUT_S = 600
"""A task that stops answering fails the stage after this long instead of hanging it."""


def check(cfg: RunConfig) -> None:
    if cfg.strategy not in SPARK_STRATEGIES:
        raise Unavailable("--strategy", f"{cfg.strategy!r} cannot yet run inside Spark tasks; "
                          f"with --backend spark use one of: {', '.join(SPARK_STRATEGIES)}")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise Unavailable("--backend", "spark needs Java 17 or later, which was not found: "
                          "install a JDK (apt install openjdk-17-jre-headless) or set "
                          "JAVA_HOME")
    if cfg.snapshot_every:
        raise Unavailable("--snapshot-every", "Spark runs snapshot at epoch ends only")
    slots = spark_slots(master(cfg))
    if slots is not None and slots < nodes(cfg):
        raise Unavailable("--spark-master", f"{master(cfg)} has {slots} task slot(s) for "
                          f"{nodes(cfg)} barrier tasks")
    _check_heap(cfg)


def jvm_heap_mb(cfg: RunConfig) -> int | None:
    """The heap allgather mode's weights need in the driver and executor JVMs, where that
    is more than Spark's default (None: the default holds them, or gloo mode)."""
    if cfg.spark_sync != "allgather":
        return None
    weights = parameter_count(cfg.usecase.model, len(cfg.usecase.classes))
    heap = heap_mb(weights, nodes(cfg))
    return heap if heap > SPARK_DEFAULT_HEAP_MB else None


def _check_heap(cfg: RunConfig) -> None:
    """Refuse an allgather run whose JVMs this machine (or local-cluster's workers) cannot
    give the heap its weights need, rather than fail minutes later out of Java heap."""
    heap = jvm_heap_mb(cfg)
    if heap is None:
        return
    cluster = local_cluster(master(cfg))
    why = (f"allgather mode sends {cfg.usecase.name}'s weights through the JVMs, which "
           f"then need {heap} MiB of heap each")
    if cluster and cluster[2] < heap:
        raise Unavailable("--spark-master", f"{master(cfg)} gives each worker "
                          f"{cluster[2]} MiB but {why}: give the workers at least that "
                          f"(local-cluster[{cluster[0]},1,{heap}]) or use --spark-sync "
                          f"gloo")
    jvms = 1 + (cluster[0] if cluster else 0)  # the driver, and local-cluster's
    ram = psutil.virtual_memory().total // 2**20
    if jvms * heap > 0.8 * ram:
        raise Unavailable("--spark-sync", f"{why}: {jvms} JVM(s) of {heap} MiB do not fit "
                          f"in this machine's {ram} MiB; use --spark-sync gloo")


def nodes(cfg: RunConfig) -> int:
    if cfg.nodes:
        return cfg.nodes
    slots = spark_slots(cfg.spark_master) if cfg.spark_master else None
    return slots or 2


def master(cfg: RunConfig) -> str:
    return cfg.spark_master or f"local[{nodes(cfg)}]"


def describe(cfg: RunConfig) -> dict[str, Any]:
    out = {"name": "spark", "nodes": nodes(cfg), "master": master(cfg),
           "sync": cfg.spark_sync}
    if cfg.spark_sync == "allgather":
        out["sync_every"] = cfg.sync_every
        out["jvm_heap_mib"] = jvm_heap_mb(cfg) or SPARK_DEFAULT_HEAP_MB
    return out


JVM_LOG = "spark.log"
"""The run folder's file of what Spark's JVM printed (its log4j lines, at WARN and above)."""
_OWN_LINE = re.compile(r"^\d\d:\d\d:\d\d \[")
"""A ddlstudy log line (``12:00:01 [rank 1] ...``) that a task wrote through the JVM."""
_jvm_log: dict[str, Any] = {"file": None}


def _pump(stream) -> None:
    """The JVM's output, line by line: all of it into the run's spark.log, and the
    barrier tasks' own log lines (which Spark passes through the JVM) to the terminal."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        target = _jvm_log["file"]
        if target is not None:
            with contextlib.suppress(OSError, ValueError):
                target.write(line)
                target.flush()
        if _OWN_LINE.match(line):
            sys.stderr.write(line)


def _gateway(conf) -> None:
    """Start Spark's JVM with its output in a pipe that ``_pump`` reads, instead of on the
    terminal (once per process: later sessions reuse the JVM, as pyspark does)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE,
                                                 "stderr": subprocess.STDOUT})
    threading.Thread(target=_pump, args=(gateway.proc.stdout,), name="spark-jvm-output",
                     daemon=True).start()
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


def _session(cfg: RunConfig):
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this venv's Python
    local = not cfg.spark_master or cfg.spark_master.startswith("local")
    if local:  # the JVMs bind the loopback, not the machine's external address
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    heap = jvm_heap_mb(cfg)
    if heap is not None:  # the driver's heap is set as its JVM starts, the executors' below
        conf.set("spark.driver.memory", f"{heap}m")
    _gateway(conf)
    builder = (SparkSession.builder.master(master(cfg))
               .appName(f"ddlstudy-{cfg.usecase.name}-{cfg.strategy}")
               .config("spark.ui.enabled", "true" if cfg.spark_ui else "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.rpc.message.maxSize", str(RPC_MAX_MB))
               .config("spark.driver.maxResultSize", "0")
               .config("spark.barrier.sync.timeout", str(BARRIER_TIMEOUT_S))
               .config("spark.python.worker.reuse", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if heap is not None:
        builder = builder.config("spark.executor.memory", f"{heap}m")
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1") \
            .config("spark.driver.bindAddress", "127.0.0.1")
    elif cfg.spark_master.startswith("spark://"):
        # The executors call the driver back: give them this machine's address on the
        # route to the master (its host name may resolve to an address they cannot reach).
        host, _, port = cfg.spark_master.removeprefix("spark://").split(",")[0].partition(":")
        builder = builder.config("spark.driver.host", address_towards(host, int(port or 7077)))
    if cfg.spark_secret_file is not None:  # the cluster's master and workers hold it too
        builder = builder.config("spark.authenticate", "true") \
            .config("spark.authenticate.secret", read_secret(cfg.spark_secret_file))
    with warnings.catch_warnings():  # pyspark's pandas version notice is not ours to fix
        warnings.simplefilter("ignore", FutureWarning)
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError as exc:
        raise Unavailable("--spark-master", f"no route to the master's host {host!r}: "
                          f"{exc.strerror or exc}") from None


def fit(job: Job) -> None:
    """On the driver: start the session, run the barrier stage, record what Spark did."""
    cfg = job.cfg
    n = nodes(cfg)
    start = time.perf_counter()
    if job.folder is not None:
        _jvm_log["file"] = open(job.folder.path / JVM_LOG, "a")  # noqa: SIM115 (closed below)
    try:
        _fit(job, n, start)
    finally:
        if _jvm_log["file"] is not None:
            _jvm_log["file"].close()
            _jvm_log["file"] = None


def _fit(job: Job, n: int, start: float) -> None:
    cfg = job.cfg
    spark = _session(cfg)
    session_s = time.perf_counter() - start
    log.info("Spark session on %s started in %.1f s; %d barrier tasks, sync %s", master(cfg),
             session_s, n, cfg.spark_sync)
    if job.folder is not None:
        job.folder.manifest["backend"].update(session_start_s=round(session_s, 3),
                                              spark_version=spark.version)
        job.folder.write_manifest()
    level = logging.getLogger("ddlstudy").level
    task = functools.partial(_task, job, level)
    from py4j.protocol import Py4JJavaError

    try:
        start = time.perf_counter()
        spark.sparkContext.setJobGroup("ddlstudy", "training")
        # The shuffle after the barrier stage makes it a shuffle-map stage, which Spark
        # retries whole when a task fails (a failed barrier result stage is not retried).
        results = (spark.sparkContext.parallelize(range(n), n).barrier()
                   .mapPartitions(task).repartition(1).collect())
        stage_s = time.perf_counter() - start
        attempts = _stage_attempts(spark.sparkContext)
    except Py4JJavaError as exc:
        raise SparkJobFailed(_spark_reason(exc)) from None
    finally:
        spark.stop()
    if attempts > 1:
        log.warning("Spark retried the barrier stage: attempt %d succeeded", attempts)
    if job.folder is not None:
        job.folder.reload_epochs()
        job.folder.manifest["backend"].update(
            stage_attempts=attempts, stage_s=round(stage_s, 3),
            tasks=[{k: r[k] for k in ("rank", "host", "pid", "threads")} for r in results])
        job.folder.write_manifest()


class SparkJobFailed(RuntimeError):
    """Spark gave up on the barrier stage (after its retries)."""


def _stage_attempts(sc) -> int:
    """How many times Spark ran the barrier stage (1: no task failed)."""
    tracker = sc.statusTracker()
    attempts = 1
    for job_id in tracker.getJobIdsForGroup("ddlstudy"):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                attempts = max(attempts, stage.currentAttemptId + 1)
    return attempts


def _spark_reason(exc) -> str:
    """The lines of a Spark job failure that say what happened, without the Java stack."""
    try:
        text = str(exc.java_exception.getMessage())
    except Exception:  # py4j gone with the session: fall back to the Python text
        text = str(exc)
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.strip().startswith(("at ", "..."))]
    return " ".join(lines[:3])[:600]


def _threads(cfg: RunConfig, infos, rank: int) -> int:
    if cfg.strategy == "sequential":
        return 1
    mine = infos[rank].address.rsplit(":", 1)[0]
    on_host = sum(1 for i in infos if i.address.rsplit(":", 1)[0] == mine)
    return cfg.workers or max(1, usable_cores() // on_host)


def _task(job: Job, level: int, _partition):
    """One node: a Spark barrier task."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank, infos = ctx.partitionId(), ctx.getTaskInfos()
    world = len(infos)
    os.environ["RANK"] = str(rank)
    threads = _threads(job.cfg, infos, rank)
    if ctx.attemptNumber() and rank == 0:
        logging.getLogger("ddlstudy").warning("Spark attempt %d of the stage: training starts "
                                              "again", ctx.attemptNumber() + 1)
    if job.cfg.spark_sync == "gloo":
        hosts = {i.address.rsplit(":", 1)[0] for i in infos}
        host = "127.0.0.1" if len(hosts) == 1 else infos[rank].address.rsplit(":", 1)[0]
        addresses = ctx.allGather(f"{host}:{free_port(host)}")
        data_parallel_rank(rank, world, addresses[0], job, threads, level)
    else:
        allgather_rank(ctx, rank, world, job, threads, level)
    yield {"rank": rank, "attempt": ctx.attemptNumber(), "host": socket.gethostname(),
           "pid": os.getpid(), "threads": threads}


# --- --spark-sync allgather (SparkNet) ----------------------------------------------------


