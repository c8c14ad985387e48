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
_once = False
_raised = False


def _raise(signum: int) -> None:
    global _raised
    _raised = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated


def _handler(signum: int, frame: object) -> None:
    global _pending
    if _once and _raised:
        return  # already shutting down: a second signal must not break the cleanup
    if _depth:
        _pending = signum
        return
    _raise(signum)


@contextlib.contextmanager
def handled(once: bool = False) -> Iterator[None]:
    """SIGINT -> KeyboardInterrupt, SIGTERM -> Terminated, both deferrable. With ``once``
    (a worker process, which both Ctrl-C and its parent's SIGTERM reach) only the first
    signal is raised; the ones after it are ignored while the worker cleans up."""
    global _once, _raised
    _once, _raised = once, False
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
