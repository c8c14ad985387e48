"""SIGINT and SIGTERM as exceptions, held back while a file is being written.

torch.save writes through a C++ zip writer; an exception raised inside it by a signal
handler comes out as an unrelated RuntimeError and the run would be recorded as failed
rather than interrupted. Inside ``handled()`` the two signals raise KeyboardInterrupt and
Terminated in the main thread as usual, except within ``deferred()``: there the signal is
remembered and raised as soon as the write is complete.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt is for SIGINT."""


_depth = 0
_pending: int | None = None


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def _handler(signum: int, frame: object) -> None:
    global _pending
    if _depth:
        _pending = signum
        return
    _raise(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT -> KeyboardInterrupt, SIGTERM -> Terminated, both deferrable."""
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back until the block is done (e.g. a snapshot write)."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            signum, _pending = _pending, None
            _raise(signum)
