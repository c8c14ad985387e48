"""Each emulated host's cgroups: its CPU share (``--cpus``) and its memory (``--memory``),
and what the kernel's memory limit did to the processes in it.

cgroup v1 keeps one hierarchy a controller (``/sys/fs/cgroup/cpu``, ``.../memory``); v2 one
group holds both (``/sys/fs/cgroup/ddlstudy-<host>``). A host's processes join its groups
through the launcher (``namespaces._write_launcher``), so every rank or daemon started on
the host counts against its limits. When its processes together need more than the limit,
the kernel kills one of them (``memory.oom_control``'s or ``memory.events``' ``oom_kill``
counts it), exactly as a machine of that size would; ``oom_kills`` and ``peak`` let the run
say so."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddlstudy.errors import Unavailable

ROOT = Path("/sys/fs/cgroup")
_V1_FILE = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes"}


def group(name: str, controller: str) -> Path | None:
    """Host ``name``'s cgroup for ``controller`` (cpu or memory): v1's own hierarchy, or the
    unified one; None where this kernel has neither."""
    if (ROOT / controller / _V1_FILE[controller]).exists() or \
            (ROOT / controller / "tasks").exists():
        return ROOT / controller / f"ddlstudy-{name}"
    if (ROOT / "cgroup.controllers").exists():
        return ROOT / f"ddlstudy-{name}"
    return None


def groups(name: str, cpus: bool, memory: bool) -> list[Path]:
    """The groups a process on host ``name`` joins (one under v2, a controller each under
    v1), for the limits the set has."""
    wanted = [c for c, on in (("cpu", cpus), ("memory", memory)) if on]
    found = [group(name, c) for c in wanted]
    return list(dict.fromkeys(g for g in found if g is not None))


def _make(path: Path, made) -> None:
    if not path.is_dir():  # under v2 the CPU limit may have made it already
        path.mkdir()  # absent before: up refuses a set whose names exist
        made.record("cgroups", str(path))


_SIZES = {"cpu": ("--cpus", "unequal CPU shares"), "memory": ("--memory", "a memory size")}


def _limit(name: str, controller: str, made, write: Callable[[Path], None]) -> None:
    """Make host ``name``'s group for ``controller`` (once) and set its limit by
    ``write``; Unavailable, naming the flag that asked, where this kernel cannot."""
    flag, what = _SIZES[controller]
    path = group(name, controller)
    if path is None:
        raise Unavailable(flag, f"no {controller} cgroup here (/sys/fs/cgroup/{controller} "
                          f"or cgroup v2), so hosts cannot be given {what}")
    try:
        _make(path, made)
        write(path)
    except OSError as exc:
        raise Unavailable(flag, f"cannot set a {controller} limit in {path}: "
                          f"{exc.strerror}") from None


def limit_cpu(name: str, cores: float, made) -> None:
    """At most ``cores`` of CPU time for the host's processes (a CFS quota)."""
    def write(path: Path) -> None:
        period = 10_000  # 10 ms: throttled in slices finer than a training step
        if (path / "cpu.cfs_quota_us").exists():
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(int(cores * period)))
        else:
            (path / "cpu.max").write_text(f"{int(cores * period)} {period}")

    _limit(name, "cpu", made, write)


def limit_memory(name: str, nbytes: int, made) -> None:
    """At most ``nbytes`` of memory for the host's processes together, swap included (a
    host of that size: past it the kernel kills one of them)."""
    def write(path: Path) -> None:
        if (path / "memory.limit_in_bytes").exists():  # v1; memsw must stay >= the limit
            (path / "memory.limit_in_bytes").write_text(str(nbytes))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(nbytes))
        elif (path / "memory.max").exists():
            (path / "memory.max").write_text(str(nbytes))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        else:
            raise Unavailable("--memory", f"{path} has no memory controller (cgroup v2 "
                              f"without +memory in {ROOT}/cgroup.subtree_control)")

    _limit(name, "memory", made, write)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


@dataclass(frozen=True)
class HostMemory:
    """What the kernel's memory limit of one host did during a run."""

    host: str
    limit: int
    oom_kills: int
    peak: int | None
    """The most the host's processes held together since the run started (cgroup v1);
    None where the kernel does not say (v2)."""


def oom_kills(name: str) -> int:
    """How many processes the kernel has killed in host ``name`` for its memory limit."""
    path = group(name, "memory")
    if path is None:
        return 0
    return _counter(_read(path / "memory.oom_control"), "oom_kill") + \
        _counter(_read(path / "memory.events"), "oom_kill")


def reset_peak(name: str) -> None:
    """Start the host's peak afresh (v1's ``memory.max_usage_in_bytes``)."""
    path = group(name, "memory")
    try:
        if path is not None and (path / "memory.max_usage_in_bytes").exists():
            (path / "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        pass


def memory_of(name: str, limit: int, kills_before: int) -> HostMemory:
    """Host ``name``'s memory now: its limit, the kills since ``kills_before``, its peak
    since ``reset_peak`` (None under cgroup v2, whose ``memory.peak`` counts from the
    host's making, not the run's start)."""
    path = group(name, "memory")
    text = _read(path / "memory.max_usage_in_bytes").strip() if path is not None else ""
    return HostMemory(name, limit, oom_kills(name) - kills_before,
                      int(text) if text.isdigit() else None)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemoryWatch:
    """The kernel's memory kills on a set's hosts during one run: made before the run
    starts (the kill counters then, the peaks started afresh), read once it has ended."""

    names: tuple[str, ...]
    limit: int
    before: tuple[int, ...]

    @classmethod
    def start(cls, names: list[str], limit: int) -> MemoryWatch:
        for name in names:
            reset_peak(name)
        return cls(tuple(names), limit, tuple(oom_kills(n) for n in names))

    def now(self) -> list[HostMemory]:
        return [memory_of(n, self.limit, k) for n, k in zip(self.names, self.before,
                                                            strict=True)]

    def killed(self) -> list[HostMemory]:
        """The hosts where the kernel killed a process for memory since ``start``."""
        return [h for h in self.now() if h.oom_kills > 0]

    def record(self) -> dict[str, dict[str, int | None]]:
        """Each host's limit, the most its processes were charged together (``peak``),
        and the kernel's kills there since ``start``: for the run's manifest."""
        return {h.host: {"limit_bytes": h.limit, "peak_charged_bytes": h.peak,
                         "oom_kills": h.oom_kills} for h in self.now()}


def out_of_memory(killed: list[HostMemory], who: dict[str, str]) -> str:
    """The run's failure in words: which process (``who``: a host's name -> its ranks in
    words), which host, its limit and the peak its processes reached."""
    said = []
    for h in killed:
        peak = f", and its processes held {_gib(h.peak)} at their peak" if h.peak else ""
        if h.peak is not None and h.peak < 0.9 * h.limit:  # not the host's limit: the machine's
            peak += " (below it: the machine itself ran out of memory)"
        kills = f" ({h.oom_kills} processes)" if h.oom_kills > 1 else ""
        said.append(f"{who.get(h.host, 'a process')} on host {h.host} was killed by the "
                    f"kernel for memory{kills}: the host has {_gib(h.limit)}{peak}")
    return ("; ".join(said) + ". Give the hosts more memory (hosts up --memory), or train "
            "with a strategy that holds less a process (sharded, zero, tensor, or "
            "--checkpoint-activations); advise --memory ranks what fits")
