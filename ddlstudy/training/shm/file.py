"""One file in this host's shared memory and a doorbell per rank, for the Python
torch.distributed groups of one host's ranks (``pipes``' rings, the slots of
``collectives``).

Rank 0 makes the file (``average.reserve``, a random token at its start) and a FIFO per
rank; every rank maps the file, checks the token and opens every FIFO; the ranks agree
through the group's store, so either every rank has them or none keeps them (another host,
no /dev/shm, no room). The paths are unlinked once every rank has them open or gave up:
nothing is left in /dev/shm, even after a crash. A rank that must wait sleeps in ``poll``
on its doorbell (``sleep_until``), rung by a peer that did something it may wait for.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import platform
import secrets
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from ddlstudy.training.shm.average import SHM_DIR, reserve

log = logging.getLogger("ddlstudy")

TOKEN_BYTES = 32
"""The token's length at the file's start (its first page, ``average.HEADER``, is left to
it)."""


@dataclass
class Shared:
    """The file, mapped, and every rank's doorbell, open."""

    mm: mmap.mmap
    bells: list[int]

    def ring(self, rank: int) -> None:
        """Wakes ``rank`` if it sleeps (a byte in its FIFO; a full FIFO is rung already)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.bells[rank], b"\0")

    def close(self) -> None:
        """Closes the doorbells and unmaps, unless tensors still view the file."""
        for fd in self.bells:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.bells = []
        with contextlib.suppress(BufferError):
            self.mm.close()


def _paths(base: Path | str, size: int) -> list[Path]:
    """The shared file and every rank's doorbell."""
    return [Path(f"{base}.shm"), *(Path(f"{base}-{r}.bell") for r in range(size))]


def _make(base: Path, total: int, size: int, token: str) -> None:
    """Rank 0's file of ``total`` bytes and the doorbells; nothing left behind where that
    fails."""
    file, *bells = _paths(base, size)
    try:
        reserve(file, total, token.encode())
        for bell in bells:
            os.mkfifo(bell, 0o600)
    except OSError:
        for path in (file, *bells):
            path.unlink(missing_ok=True)
        raise


def open_shared(store: dist.Store, rank: int, size: int, total: int, prefix: str,
                what: str, hint: str = "") -> Shared | None:
    """Every rank of a new group (a collective over ``store``): the file of ``total`` bytes
    (its first page the token's) and the doorbells, or None on every rank where some rank
    could not open them; then rank 0 logs that ``what`` go through gloo, and why (a
    full or missing /dev/shm: a warning, with ``hint``)."""
    shared, why = _open_shared(store, rank, size, total, prefix)
    if shared is None and rank == 0 and why:  # a host whose /dev/shm is missing or too small
        log.warning("%s through gloo, not shared memory: %s; give the container more "
                    "(docker run --shm-size)%s", what, why, hint)
    elif shared is None and rank == 0:
        log.info("%s through gloo: not every rank could open this host's shared memory "
                 "(ranks on several hosts)", what)
    return shared


def _open_shared(store: dist.Store, rank: int, size: int, total: int,
                 prefix: str) -> tuple[Shared | None, str]:
    """``open_shared``'s file and doorbells, and on rank 0 why it could not make them."""
    why = ""
    if rank == 0:
        token = secrets.token_hex(TOKEN_BYTES // 2)
        base = SHM_DIR / f"{prefix}-{os.getpid()}-{token[:16]}"
        try:
            _make(base, total, size, token)
            store.set("base", f"{base}\n{token}")
        except OSError as exc:
            why = f"{SHM_DIR}: {exc.strerror or exc} ({total / 2**20:.0f} MiB wanted)"
            store.set("base", "")
    name = store.get("base").decode()
    base, _, token = name.partition("\n")
    try:
        return _open_all(store, rank, size, base, token, total), why
    finally:  # every rank has them open or gave up, or this rank failed: none is left
        if rank == 0 and base:
            for path in _paths(base, size):
                path.unlink(missing_ok=True)


def _open_all(store: dist.Store, rank: int, size: int, base: str, token: str,
              total: int) -> Shared | None:
    """This rank's map of the file and its doorbells where every rank opened its own,
    else None (whatever this rank opened is closed)."""
    mm, bells = None, []
    try:
        if base:
            fd = os.open(_paths(base, size)[0], os.O_RDWR)
            try:
                if os.fstat(fd).st_size == total:
                    mm = mmap.mmap(fd, total)
            finally:
                os.close(fd)
            if mm is not None and mm[:len(token)] != token.encode():
                mm.close()  # another file by that name: not the one rank 0 made
                mm = None
            for path in _paths(base, size)[1:]:
                bells.append(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    except OSError:
        pass  # this rank says so below; every rank then gives up
    store.set(f"ok{rank}", "1" if mm is not None and len(bells) == size else "0")
    answers = [store.get(f"ok{r}") for r in range(size)]  # every rank reads every answer
    if mm is not None and all(a == b"1" for a in answers):
        return Shared(mm, bells)
    for fd in bells:
        os.close(fd)
    if mm is not None:
        mm.close()
    return None


def sleep_until(bell: int, ready: Callable[[], bool], seconds: float,
                late: Callable[[], str]) -> None:
    """Until ``ready()``, asked again each time doorbell ``bell`` rings (at least once a
    second); raises RuntimeError(``late()``) after ``seconds``."""
    deadline = time.monotonic() + seconds
    poller = select.poll()
    poller.register(bell, select.POLLIN)
    while not ready():
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(late())
        if poller.poll(min(left, 1.0) * 1000):
            with contextlib.suppress(BlockingIOError):
                os.read(bell, 1 << 16)


def usable() -> str:
    """Why this host's ranks cannot share memory through these files ("" if they can):
    their counters rely on x86-64's store order, and they need /dev/shm."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return (f"its counters in shared memory rely on x86-64's store order, and this is "
                f"{platform.machine()}")
    if not SHM_DIR.is_dir():
        return f"{SHM_DIR} does not exist"
    return ""


class NamedGroup(dist.ProcessGroup):
    """A Python process group's names: torch asks a Python group for them through these
    methods (its own C++ keeps none)."""

    def __init__(self, rank: int, size: int, backend: str) -> None:
        super().__init__(rank, size)
        self._me, self._size = rank, size  # plain ints: rank() and size() cross into C++
        self._backend = self._name = self._desc = backend

    def getBackendName(self) -> str:  # noqa: N802
        return self._backend

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc


def register(backend: str, creator: Callable) -> None:
    """Backend ``backend`` made by ``creator`` (torch's extended API, CPU), once a process."""
    if backend.upper() not in dist.Backend._plugins:  # noqa: SLF001 (torch keeps no other list)
        dist.Backend.register_backend(backend, creator, extended_api=True, devices=["cpu"])
