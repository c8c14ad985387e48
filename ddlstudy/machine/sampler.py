"""Resource sampling beside a run: psutil for the worker process tree and the system, NVML
for GPUs where present.

A daemon thread wakes ``hz`` times a second and appends one row. Counters (network, disk)
are stored cumulative, as the kernel gives them, so rates are a ``diff()`` away and no
sample is lost to rounding. Network traffic is split per interface (``pernic=True``):
``net_*`` counts the real interfaces, ``lo_*`` the loopback that single-host MPI or gloo
traffic uses. Every row carries the rank, host and scope so the samples of many workers merge: a
``node`` row covers the whole process tree of a run on one host, a ``worker`` row one
rank's own process (multi-process strategies write both).
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import socket
import threading
import time
from typing import Any

import psutil

from ddlstudy.files import atomic_write

log = logging.getLogger("ddlstudy")

COLUMNS = (
    "time", "t_s", "rank", "host", "scope", "proc_count", "proc_cpu_percent", "proc_rss_bytes",
    "proc_threads", "sys_cpu_percent", "sys_iowait_percent", "sys_ram_percent",
    "sys_ram_used_bytes", "net_sent_bytes", "net_recv_bytes", "lo_sent_bytes", "lo_recv_bytes",
    "disk_read_bytes", "disk_write_bytes", "gpu_count", "gpu_util_percent", "gpu_mem_used_bytes",
)


NOISY_CORES = 0.2
"""A run is ``noisy`` when processes other than its own used more than this many cores of
its host (the median over its samples). Measured on a 2-core machine with tiny: quiet runs
0.013, 0.040 (sequential) and 0.056 (cpu-processes 2) cores; one busy loop beside a
sequential run 1.0 core."""


class _Gpus:
    """NVML handles, or nothing where there is no NVIDIA driver."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no driver, no library, no device: sample without GPUs
            self.handles = []

    def read(self) -> tuple[int, float, float]:
        if not self.handles:
            return 0, math.nan, math.nan
        utils = [self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
        mem = [self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles]
        return len(self.handles), sum(utils) / len(utils), float(sum(mem))


class ResourceSampler:
    """Samples the process tree rooted at ``pid`` (default: this process) at ``hz``."""

    def __init__(self, hz: float = 10.0, *, rank: int = 0, host: str | None = None,
                 pid: int | None = None, scope: str = "node") -> None:
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.rank = rank
        self.scope = scope  # "node": the whole process tree; "worker": one rank's process
        self.host = host or socket.gethostname()
        self.root = psutil.Process(pid or os.getpid())
        self.rows: list[dict[str, Any]] = []
        self._procs: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus: _Gpus | None = None
        self._t0 = 0.0

    @property
    def enabled(self) -> bool:
        return self.period > 0

    def start(self) -> ResourceSampler:
        if not self.enabled:
            return self
        self._gpus = _Gpus()
        self._t0 = time.time()
        psutil.cpu_percent(None)  # the first call only sets the reference point
        psutil.cpu_times_percent(None)
        self._tree()
        self._thread = threading.Thread(target=self._loop, name="ddlstudy-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return self.rows

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.rows.append(self.sample())
            except psutil.Error:
                pass  # a worker ended between listing and reading it: next sample
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _tree(self) -> list[psutil.Process]:
        """The root and its live descendants, reusing Process objects so cpu_percent works."""
        try:
            current = [self.root]
            if self.scope == "node":
                current += self.root.children(recursive=True)
        except psutil.Error:
            current = []
        procs = [self._procs.setdefault(p.pid, p) for p in current]
        alive = {p.pid for p in current}
        for pid in list(self._procs):
            if pid not in alive:
                del self._procs[pid]
        return procs

    def sample(self) -> dict[str, Any]:
        now = time.time()
        cpu = rss = threads = 0.0
        procs = self._tree()
        for p in procs:
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                    threads += p.num_threads()
            except psutil.Error:
                continue
        times = psutil.cpu_times_percent(None)
        vm = psutil.virtual_memory()
        nics = psutil.net_io_counters(pernic=True)
        lo = nics.get("lo")
        real = [c for name, c in nics.items() if name != "lo"]
        disk = psutil.disk_io_counters()
        gpu_count, gpu_util, gpu_mem = self._gpus.read() if self._gpus else (0, math.nan, math.nan)
        return {
            "time": now, "t_s": now - self._t0, "rank": self.rank, "host": self.host,
            "scope": self.scope,
            "proc_count": len(procs), "proc_cpu_percent": cpu, "proc_rss_bytes": rss,
            "proc_threads": threads, "sys_cpu_percent": psutil.cpu_percent(None),
            "sys_iowait_percent": getattr(times, "iowait", math.nan),
            "sys_ram_percent": vm.percent, "sys_ram_used_bytes": float(vm.used),
            "net_sent_bytes": float(sum(c.bytes_sent for c in real)),
            "net_recv_bytes": float(sum(c.bytes_recv for c in real)),
            "lo_sent_bytes": float(lo.bytes_sent) if lo else math.nan,
            "lo_recv_bytes": float(lo.bytes_recv) if lo else math.nan,
            "disk_read_bytes": float(disk.read_bytes) if disk else math.nan,
            "disk_write_bytes": float(disk.write_bytes) if disk else math.nan,
            "gpu_count": gpu_count, "gpu_util_percent": gpu_util, "gpu_mem_used_bytes": gpu_mem,
        }

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def samples_frame(rows: list[dict[str, Any]]):
    """The rows as a DataFrame with every column, even when there are none."""
    import pandas as pd

    return pd.DataFrame(rows, columns=list(COLUMNS))


def write_rows(path, rows: list[dict[str, Any]]) -> None:
    """Rows to a parquet file, atomically (a worker's samples for its parent to merge)."""
    frame = samples_frame(rows)
    atomic_write(path, lambda f: frame.to_parquet(f, index=False))


KINDS = {"time": "timestamp", "rank": "integer", "host": "text", "scope": "text",
         "proc_count": "integer", "proc_threads": "integer", "gpu_count": "integer"}
"""The samples table's schema: each column of COLUMNS a number unless named here (any
column may be all null: a worker that sampled nothing). Other columns pass."""
IDENTITY = ("time", "rank", "scope")
"""The columns every reader of the samples needs: when, whose, and what it covers."""
KIND_WORDS = {"number": "numbers", "integer": "whole numbers", "text": "text",
              "timestamp": "seconds since 1970 (0 to 9e9)"}


def read_samples(path, need: tuple[str, ...] = IDENTITY):
    """A samples.parquet (or a worker's part) through the reading gate, as a DataFrame
    whose ddlstudy columns hold what KINDS says and which has every column of ``need``:
    else a BadFile naming the file, the column and what it must be. The one reader of
    samples: every use of them gets valid data."""
    from ddlstudy.reading import BadFile, read_parquet

    frame = read_parquet(path, "samples")
    missing = [c for c in need if c not in frame]
    if missing and len(frame):
        raise BadFile("samples", path, f"has no {', '.join(missing)} column(s) (ddlstudy's "
                      f"samples have {', '.join(COLUMNS[:5])}, ...); is it a samples file "
                      "ddlstudy wrote?")
    for column in COLUMNS:
        kind = KINDS.get(column, "number")
        bad = _first_bad(frame[column], kind) if column in frame else None
        if bad is not None:
            raise BadFile("samples", path, f"column {column} must hold {KIND_WORDS[kind]}, "
                          f"not {bad}; is it a samples file ddlstudy wrote, unedited?")
    return frame


def _first_bad(values, kind: str) -> str | None:
    """A value of the column (nulls aside) that is not of ``kind``, in words; None: all are."""
    import pandas as pd

    values = values.dropna()
    if values.empty:
        return None
    if kind == "text":
        wrong = values[~values.map(lambda v: isinstance(v, str))]
    elif not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        # object: numbers beside nulls (a merge with a part that had none) pass
        wrong = values[~values.map(lambda v: isinstance(v, numbers.Real)
                                   and not isinstance(v, bool))]
        if wrong.empty:
            return _first_bad(values.astype(float), kind)
    else:
        ok = values.abs() < math.inf
        if kind == "timestamp":
            ok &= values.between(0, 9e9)
        if kind == "integer":
            ok &= values % 1 == 0
        wrong = values[~ok]
    if wrong.empty:
        return None
    first = wrong.iloc[0]
    first = first.item() if hasattr(first, "item") else first  # numpy's: a plain value
    return f"{type(first).__name__} {first!r}"


def read_rows(path) -> list[dict[str, Any]]:
    return read_samples(path).to_dict("records")


def others_cores(frame, cores: int, one_machine: bool = False) -> dict[str, float] | None:
    """Per host, the cores that processes other than the run's used while it ran: the
    host's CPU (``sys_cpu_percent``, over ``cores`` logical CPUs) less the run's process
    trees (its ``node`` rows; several ranks on a host are summed), as medians over the
    samples. ``one_machine``: hosts that share one kernel (emulated hosts) count as one.
    None without samples."""
    node = frame[frame.scope == "node"]
    if not len(node):
        return None
    if one_machine:
        node = node.assign(host=",".join(sorted(set(node.host))))
    out = {}
    for host, g in node.groupby("host"):
        ranks = [r for _, r in g.groupby("rank")]
        if len(ranks) == 1:  # the same instants: the difference per sample
            others = (g.sys_cpu_percent * cores - g.proc_cpu_percent).median() / 100
        else:
            others = (g.sys_cpu_percent.median() * cores
                      - sum(r.proc_cpu_percent.median() for r in ranks)) / 100
        out[str(host)] = round(max(float(others), 0.0), 3)
    return out


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def host_busy(seconds: float = 1.0) -> float:
    """The cores other processes keep busy on this host now: the host's CPU over the next
    ``seconds`` less this process tree's own."""
    me = psutil.Process()
    tree = [me, *me.children(recursive=True)]
    own = _cpu_seconds(tree)
    psutil.cpu_percent(None)
    time.sleep(seconds)
    host = psutil.cpu_percent(None) / 100 * (psutil.cpu_count() or 1)
    return max(0.0, host - (_cpu_seconds(tree) - own) / seconds)


def _busy_cpu_seconds() -> float:
    """The host's busy CPU seconds since boot, all cores (what ``cpu_percent`` counts:
    everything but idle and iowait; guest time is already inside user time)."""
    t = psutil.cpu_times()
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total - t.idle - getattr(t, "iowait", 0.0)


def _tree_cpu_seconds(root: int) -> float:
    """The CPU seconds of process ``root`` and of every process below it, each with those
    of the children it reaped (a process that ended in the span is counted in its
    parent's): a run's workers, MPI ranks and Spark's JVM as much as a subprocess run to
    its end."""
    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in tree:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


TREE_ROOT_ENV = "DDLSTUDY_TREE_ROOT"
"""The process whose tree holds a run's processes on this host (ddlstudy's own mpiexec
sets it to the process that started it, above every rank); else the run's own."""


class OthersLoad:
    """The cores other processes kept busy on this host over a span: from its creation to
    ``cores()``, the host's busy CPU seconds (/proc/stat) less those of the process tree
    (``root``'s, else TREE_ROOT_ENV's, else this process's), per second. Needs no sampler:
    advise's probes and runs without samples (``--sample-hz 0``, Spark) are judged by it."""

    def __init__(self, root: int | None = None) -> None:
        self.root = root or int(os.environ.get(TREE_ROOT_ENV) or os.getpid())
        self.start = (time.monotonic(), _busy_cpu_seconds(), _tree_cpu_seconds(self.root))

    def cores(self) -> float:
        t0, host0, own0 = self.start
        t, host, own = time.monotonic(), _busy_cpu_seconds(), _tree_cpu_seconds(self.root)
        return max(0.0, ((host - host0) - (own - own0)) / max(t - t0, 1e-6))


WAIT_MOST_S = 300.0
"""How long ``--wait-quiet`` waits for a quiet host before measuring anyway (the runs
then measured on a busy host are marked noisy, and left out of speedups)."""


def wait_quiet(announce, most_s: float | None = None) -> float:
    """Wait until other processes use at most NOISY_CORES (3 quiet seconds in a row),
    saying what keeps the host busy every 10 s through ``announce``; returns the load
    last measured (which is above the limit only if ``most_s`` ran out)."""
    start, quiet, said = time.monotonic(), 0, 0.0
    while True:
        busy = host_busy(1.0)
        quiet = quiet + 1 if busy <= NOISY_CORES else 0
        waited = time.monotonic() - start
        if quiet >= 3 or (most_s is not None and waited >= most_s):
            return busy
        if waited - said >= 10:
            said = waited
            announce(busy, waited)


def wait_quiet_at_most() -> float:
    """``--wait-quiet``: wait for a quiet host, at most WAIT_MOST_S, logging what keeps it
    busy every 10 s; returns the load last measured."""
    return wait_quiet(lambda b, s: log.info("waiting for a quiet host: other processes use "
                                            "%.2f core(s) (%.0f s so far, at most %.0f)",
                                            b, s, WAIT_MOST_S), WAIT_MOST_S)


def check_load(wait: bool = False) -> float:
    """Say how busy the host is before measuring (other processes' cores) and warn when it
    is not quiet; with ``wait``, wait for it to be quiet first. Returns the cores busy."""
    if wait:
        busy = wait_quiet_at_most()
    else:
        busy = host_busy(1.0)
    if busy > NOISY_CORES:
        log.warning("this host is busy: other processes use %.2f core(s); runs where they "
                    "use more than %.2f are marked noisy and left out of speedups (--wait-quiet "
                    "waits for a quiet host before each cell)", busy, NOISY_CORES)
    else:
        log.info("host load: other processes use %.2f core(s) (quiet)", busy)
    return busy



def samples_reference() -> list[str]:
    """docs/formats.md's table of the samples' columns (``read_samples`` checks them)."""
    return ["## samples.parquet", "", "A run's resource samples (`ddlstudy.machine.sampler`), one "
            "row a sample. Any column may be null (nothing measured: no GPU, say); other columns "
            "pass. The report's figures also need the columns they draw, and leave out (naming "
            "it) a run whose samples lack one.", "", "| column | type | required |",
            "|---|---|---|", *(f"| `{c}` | {KIND_WORDS[KINDS.get(c, 'number')]} | "
              f"{'yes' if c in IDENTITY else 'no'} |" for c in COLUMNS), ""]
