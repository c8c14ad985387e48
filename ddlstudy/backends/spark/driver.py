"""The Spark driver's side of a run: the session, the barrier stage, what Spark did; and
what each barrier task runs (``--spark-sync gloo``; allgather mode is in ``allgather``)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
from typing import Any

import psutil

from ddlstudy.backends.spark.allgather import SPARK_DEFAULT_HEAP_MB, allgather_rank, heap_mb
from ddlstudy.config import RunConfig
from ddlstudy.config.spark import local_cluster
from ddlstudy.errors import Unavailable
from ddlstudy.machine import collector
from ddlstudy.machine.environment import usable_cores
from ddlstudy.machine.sparkjvm import check as check_flags
from ddlstudy.machine.sparkjvm import context, jvm_output, master, nodes
from ddlstudy.models import parameter_count
from ddlstudy.strategies import Layout, get_strategy
from ddlstudy.training.distributed import Work, free_port, group_rank
from ddlstudy.training.job import Job

log = logging.getLogger("ddlstudy")

def check(cfg: RunConfig) -> None:
    check_flags(cfg)
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


def describe(cfg: RunConfig) -> dict[str, Any]:
    out = {"name": "spark", "nodes": nodes(cfg), "master": master(cfg),
           "sync": cfg.spark_sync}
    if cfg.spark_sync == "allgather":
        out["sync_every"] = cfg.sync_every
        out["jvm_heap_mib"] = jvm_heap_mb(cfg) or SPARK_DEFAULT_HEAP_MB
    return out


def unsynced(cfg: RunConfig) -> str:
    """Why an allgather run's steps never average the weights ("" where they do): its
    tasks count steps over the whole run, and it runs fewer than --sync-every."""
    epochs = cfg.usecase.train.epochs
    if cfg.spark_sync != "allgather" or not cfg.max_steps or \
            cfg.max_steps * epochs >= cfg.sync_every:
        return ""
    return (f"--max-steps {cfg.max_steps} x {epochs} epoch(s) is under --sync-every "
            f"{cfg.sync_every}: the tasks average their weights only at each epoch's end, "
            "so images/s leave the averaging out")


JVM_LOG = "spark.log"
"""The run folder's file of what Spark's JVM printed (its log4j lines, at WARN and above)."""


def fit(job: Job) -> None:
    """On the driver: take the Spark context (started early, or now), run the barrier
    stage, record what Spark did."""
    cfg = job.cfg
    n = nodes(cfg)
    start = time.perf_counter()
    log_file = None if job.folder is None else open(job.folder.path / JVM_LOG, "a")  # noqa: SIM115
    jvm_output.to(log_file)
    try:
        _fit(job, n, start)
    finally:
        jvm_output.to(None)
        if log_file is not None:
            log_file.close()


def _fit(job: Job, n: int, start: float) -> None:
    cfg = job.cfg
    sc = context(cfg, jvm_heap_mb(cfg))
    session_s = time.perf_counter() - start
    log.info("Spark context on %s ready (%.1f s waited for it); %d barrier tasks, sync %s",
             master(cfg), session_s, n, cfg.spark_sync)
    why = unsynced(cfg)
    if why:
        log.warning("%s", why)
    if job.folder is not None:
        job.folder.manifest["backend"].update(session_start_s=round(session_s, 3),
                                              spark_version=sc.version)
        job.folder.write_manifest()
    level = logging.getLogger("ddlstudy").level
    strategy = get_strategy(cfg.strategy)
    task = functools.partial(_task, job, strategy.worker, strategy.layout(cfg), level)
    from py4j.protocol import Py4JError, Py4JJavaError

    collector.settled()  # the driver's start ends here: its tasks train
    try:
        start = time.perf_counter()
        sc.setJobGroup("ddlstudy", "training")
        # The shuffle after the barrier stage makes it a shuffle-map stage, which Spark
        # retries whole when a task fails (a failed barrier result stage is not retried).
        results = (sc.parallelize(range(n), n).barrier()
                   .mapPartitions(task).repartition(1).collect())
        stage_s = time.perf_counter() - start
        attempts = _stage_attempts(sc)
    except Py4JJavaError as exc:
        raise SparkJobFailed(_spark_reason(exc)) from None
    except Py4JError as exc:  # a Ctrl-C in collect, then pyspark's own last call to the
        if interrupted(exc):  # JVM (its call site's reset) found the connection broken
            raise KeyboardInterrupt from None
        raise
    finally:
        # An interrupt (Ctrl-C) that lands inside a call to the JVM leaves that call's
        # connection without its answer: stopping may then fail, and must not turn the
        # interrupt into a failure (the JVM ends with this process all the same).
        with contextlib.suppress(Py4JError):
            sc.stop()
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


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while an interrupt (KeyboardInterrupt) was handled."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False


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


def _threads(cfg: RunConfig, layout: Layout, infos, rank: int) -> int:
    """The intra-op threads of a task: its strategy's, at most its share of the cores of a
    host that runs several tasks, unless --workers says."""
    mine = infos[rank].address.rsplit(":", 1)[0]
    on_host = sum(1 for i in infos if i.address.rsplit(":", 1)[0] == mine)
    share = max(1, usable_cores() // on_host)
    return layout.torch_threads if cfg.workers else min(layout.torch_threads, share)


def _task(job: Job, work: Work, layout: Layout, level: int, _partition):
    """One node: a Spark barrier task, its strategy's worker."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank, infos = ctx.partitionId(), ctx.getTaskInfos()
    world = len(infos)
    os.environ["RANK"] = str(rank)
    threads = _threads(job.cfg, layout, infos, rank)
    if ctx.attemptNumber() and rank == 0:
        logging.getLogger("ddlstudy").warning("Spark attempt %d of the stage: training starts "
                                              "again", ctx.attemptNumber() + 1)
    if job.cfg.spark_sync == "gloo":
        hosts = {i.address.rsplit(":", 1)[0] for i in infos}
        host = "127.0.0.1" if len(hosts) == 1 else infos[rank].address.rsplit(":", 1)[0]
        addresses = ctx.allGather(f"{host}:{free_port(host)}")
        group_rank(rank, world, addresses[0], job, work, threads, level)
    else:
        allgather_rank(ctx, rank, world, job, work, threads, level)
    yield {"rank": rank, "attempt": ctx.attemptNumber(), "host": socket.gethostname(),
           "pid": os.getpid(), "threads": threads}
