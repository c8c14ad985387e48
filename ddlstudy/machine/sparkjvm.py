"""The Spark driver's JVM and SparkContext, which a Spark run may start early.

Spark's JVM and its SparkContext take most of a Spark run's time before its first step
(on 2 cores: about 3 s to launch the JVM, 3-6 s more for the context), and the driver
does not need torch for them. So ``ddlstudy run --backend spark`` starts them in a
background thread (``start_early``) as soon as its flags are read, while its main thread
imports torch and prepares the data; the backend then takes the context (``context``):
the early one where it was started with the same settings, else one started there.

This module must stay free of torch: the CLI imports it before torch is imported.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import warnings
from typing import Any, TextIO

from ddlstudy.config import RunConfig, spark_slots
from ddlstudy.config.spark import read_secret
from ddlstudy.errors import Unavailable
from ddlstudy.machine.environment import SAFE_PATH_ENV

RPC_MAX_MB = 512
"""spark.rpc.message.maxSize: an allGather reply (allgather mode) carries every task's chunk."""
BARRIER_TIMEOUT_S = 600
"""A task that stops answering fails the stage after this long instead of hanging it."""
BARRIER_CHECK_S = 1
"""How often a barrier job waits for its task slots: local-cluster's and a standalone
cluster's executors register seconds after the context, and Spark's own 15 s between
checks made each such run wait 15 s for executors that were there after 2."""
SLOTS_WAIT_S = 40 * 15
"""How long in all a barrier job waits for its slots: Spark's default (40 checks 15 s apart)."""

_OWN_LINE = re.compile(r"^\d\d:\d\d:\d\d \[rank ")
"""A ddlstudy log line (``12:00:01 [rank 1] ...``) that a task wrote through the JVM."""

def check(cfg: RunConfig) -> None:
    """Refuse, as Unavailable, a Spark run that cannot start (all but allgather mode's
    heap, which the backend checks: it needs the model)."""
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


def nodes(cfg: RunConfig) -> int:
    if cfg.nodes:
        return cfg.nodes
    slots = spark_slots(cfg.spark_master) if cfg.spark_master else None
    return slots or 2


def master(cfg: RunConfig) -> str:
    return cfg.spark_master or f"local[{nodes(cfg)}]"


def is_local(cfg: RunConfig) -> bool:
    return not cfg.spark_master or cfg.spark_master.startswith("local")


class _JvmOutput:
    """The JVM's output, line by line: into the run's spark.log once it has one (the lines
    before it are kept and written first), and the barrier tasks' own log lines (which
    Spark passes through the JVM) to the terminal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.file: TextIO | None = None
        self.early: list[str] = []

    def pump(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            with self.lock:
                if self.file is None:
                    self.early.append(line)
                else:
                    with contextlib.suppress(OSError, ValueError):
                        self.file.write(line)
                        self.file.flush()
            if _OWN_LINE.match(line):
                sys.stderr.write(line)

    def to(self, file: TextIO | None) -> None:
        """Send what came so far and what follows into ``file``; None: keep what follows
        back for the next file (what came so far belonged to the file before)."""
        with self.lock:
            if file is not None:
                with contextlib.suppress(OSError, ValueError):
                    file.writelines(self.early)
                    file.flush()
            self.early.clear()
            self.file = file


jvm_output = _JvmOutput()


def _gateway(conf) -> None:
    """Start Spark's JVM with its output in a pipe that ``jvm_output`` reads, instead of on
    the terminal (once per process: later contexts reuse the JVM, as pyspark does)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE,
                                                 "stderr": subprocess.STDOUT})
    threading.Thread(target=jvm_output.pump, args=(gateway.proc.stdout,),
                     name="spark-jvm-output", daemon=True).start()
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


def settings(cfg: RunConfig, heap_mb: int | None) -> tuple[tuple[str, str], ...]:
    """The SparkConf of ``cfg``'s run; ``heap_mb`` sizes the driver's and executors' heaps
    (None: Spark's default)."""
    pairs = {"spark.master": master(cfg),
             "spark.app.name": f"ddlstudy-{cfg.usecase.name}-{cfg.strategy}",
             "spark.ui.enabled": "true" if cfg.spark_ui else "false",
             "spark.pyspark.python": sys.executable,
             **{f"spark.executorEnv.{k}": v for k, v in SAFE_PATH_ENV.items()},
             "spark.rpc.message.maxSize": str(RPC_MAX_MB),
             "spark.driver.maxResultSize": "0",
             "spark.barrier.sync.timeout": str(BARRIER_TIMEOUT_S),
             "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": f"{BARRIER_CHECK_S}s",
             "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures":
                 str(SLOTS_WAIT_S // BARRIER_CHECK_S),
             "spark.python.worker.reuse": "false",
             "spark.ui.showConsoleProgress": "false"}
    if heap_mb is not None:
        pairs["spark.driver.memory"] = pairs["spark.executor.memory"] = f"{heap_mb}m"
    if is_local(cfg):  # the JVMs bind the loopback, not the machine's external address
        pairs["spark.driver.host"] = pairs["spark.driver.bindAddress"] = "127.0.0.1"
    elif cfg.spark_master.startswith("spark://"):
        # The executors call the driver back: give them this machine's address on the
        # route to the master (its host name may resolve to an address they cannot reach).
        host, _, port = cfg.spark_master.removeprefix("spark://").split(",")[0].partition(":")
        pairs["spark.driver.host"] = address_towards(host, int(port or 7077))
    if cfg.spark_secret_file is not None:  # the cluster's master and workers hold it too
        pairs["spark.authenticate"] = "true"
        pairs["spark.authenticate.secret"] = read_secret(cfg.spark_secret_file)
    return tuple(sorted(pairs.items()))


def address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return probe.getsockname()[0]
    except OSError as exc:
        raise Unavailable("--spark-master", f"no route to the master's host {host!r}: "
                          f"{exc.strerror or exc}") from None


def _start(cfg: RunConfig, pairs: tuple[tuple[str, str], ...]):
    """The JVM and a SparkContext with ``pairs`` (a plain SparkContext: ddlstudy needs no
    SparkSession, whose SQL classes cost seconds more to load)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this venv's Python
    if is_local(cfg):
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAll(pairs)
    _gateway(conf)  # reads the driver's heap: it is fixed as the JVM starts
    with warnings.catch_warnings():  # pyspark's pandas version notice is not ours to fix
        warnings.simplefilter("ignore", FutureWarning)
        sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    return sc


class _Early:
    """A context being started in a background thread, with the settings it was asked for."""

    def __init__(self, cfg: RunConfig, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs
        self.sc: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(cfg,), name="spark-start",
                                       daemon=True)
        self.thread.start()

    def _run(self, cfg: RunConfig) -> None:
        try:
            self.sc = _start(cfg, self.pairs)
        except BaseException as exc:  # noqa: BLE001 (handed to whoever takes the context)
            self.error = exc

    def take(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.sc


_early: dict[str, _Early | None] = {"start": None}


def start_early(cfg: RunConfig) -> None:
    """Start the JVM and the context of ``cfg``'s Spark run in the background, where its
    settings need no torch (gloo mode: allgather mode sizes the heaps from the model)."""
    if cfg.backend != "spark" or cfg.spark_sync != "gloo" or _early["start"] is not None:
        return
    try:
        check(cfg)
        pairs = settings(cfg, None)
    except Unavailable:  # refused (exit 2) when the run checks its flags, JVM or not
        return
    _early["start"] = _Early(cfg, pairs)


def context(cfg: RunConfig, heap_mb: int | None):
    """The SparkContext for ``cfg``'s run: the one ``start_early`` started, where its
    settings are these, else one started now."""
    pairs = settings(cfg, heap_mb)
    early, _early["start"] = _early["start"], None
    if early is not None:
        sc = early.take()
        if early.pairs == pairs:
            return sc
        sc.stop()  # started for other settings (the JVM stays, as pyspark keeps it)
    return _start(cfg, pairs)
