"""SIGINT and SIGTERM as exceptions, held back while a file is being written; and passed
on to a launcher's processes (``Forwarded``).

torch.save writes through a C++ zip writer; an exception raised inside it by a signal
handler comes out as an unrelated RuntimeError and the run would be recorded as failed
rather than interrupted. Inside ``handled()`` the two signals raise KeyboardInterrupt and
Terminated in the main thread as usual, except within ``deferred()``: there the signal is
remembered and raised as soon as the write is complete.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import psutil


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


def pending() -> int | None:
    """The SIGINT or SIGTERM ``deferred`` holds back until its block is done, if one came
    (a wait inside the block may end early for it)."""
    return _pending


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


class TimedOut(BaseException):
    """A ``time_limit`` ran out: raised in the main thread wherever it was (someone
    else's code too, whose ``except Exception`` must not take it for its own error)."""


SETUP_TIMEOUT_ENV = "DDLSTUDY_SETUP_TIMEOUT_S"
"""The set-up time limit a study gives its cells' runs (seconds; see ``time_limit``)."""


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise TimedOut (naming ``what``) in the main thread if the block takes longer than
    ``seconds`` (SIGALRM); no limit where ``seconds`` is None or off the main thread. A
    block stuck in Python (a factory that never returns) is stopped; one stuck inside a
    C call that never returns to Python is stopped when it does."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise TimedOut(f"{what} took longer than {seconds:g} s (the set-up time limit)")

    global _limits
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _limits += 1
    try:
        yield
    finally:
        _limits -= 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_limits = 0


def limited() -> bool:
    """Whether a ``time_limit`` is running (a wait in its block is ended by it)."""
    return _limits > 0


STOP_ENV = "DDLSTUDY_STOP_FILE"
"""A file whose appearance asks a run to write its snapshot at its next step and end
(``STOPPED_CODE``), to be continued by ``run --resume``: a Slurm job's batch shell creates
it when Slurm warns the job before its time limit (``study --warn-before``)."""
STOPPED_CODE = 75
"""The exit code of a run that stopped so: sysexits' EX_TEMPFAIL (try again later)."""


STOPPED = {signal.SIGINT: (130, "interrupted by SIGINT (Ctrl-C)"),
           signal.SIGTERM: (143, "terminated by SIGTERM")}
"""A signal's exit code and the error a run it ended records."""


class Forwarded:
    """SIGINT and SIGTERM that reach this process while a child runs go to the child.

    The child is a launcher (MPI's mpiexec) that passes them on to the processes it
    started: they record how the run ended, which this process could not if it died at
    once. This one waits for the child and says which signal came (``signum``); SIGHUP
    counts as SIGTERM. A child still running ``grace_s`` after the signal (a rank stuck in
    a collective cannot run its handler), or when a second signal comes, is killed with all
    its descendants. Start the child in a session of its own: a Ctrl-C at the terminal then
    reaches this process alone, and each rank gets the signal once."""

    CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self._child = None  # a subprocess.Popen
        self._sent = False
        self._timer: threading.Timer | None = None
        self._previous: dict = {}

    def __enter__(self) -> Forwarded:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in self.CAUGHT}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for s, h in self._previous.items():
            signal.signal(s, h)

    def attach(self, child) -> None:
        """The child to pass the signals on to (one that came before it started too)."""
        self._child = child
        if self.signum is not None:
            self._pass_on()

    def _handler(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            self.kill()  # asked twice: no more waiting
            return
        self.signum = signal.SIGTERM if signum == signal.SIGHUP else signum
        if self._child is not None:
            self._pass_on()

    def _pass_on(self) -> None:
        if self._sent:
            return
        self._sent = True
        self._child.send_signal(self.signum)
        self._timer = threading.Timer(self.grace_s, self.kill)
        self._timer.daemon = True
        self._timer.start()

    def kill(self) -> None:
        """SIGKILL the child and everything it started (found before any of them dies)."""
        if self._child is None:
            return
        try:
            root = psutil.Process(self._child.pid)
            tree = [*root.children(recursive=True), root]
        except psutil.Error:
            return
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()
