"""The warm server a run's processes are forked from, instead of each starting Python anew.

A spawned process imports torch, torch's compiler front end (every optimizer loads it:
``torch._compile``) and ddlstudy before it does anything: about 3.5 s of CPU on a 2-core
host, paid again by every rank, study cell and advise probe. The server (multiprocessing's
forkserver) imports them once, beside the process that starts it, and forks each child
from that state.

Spawn's isolation is kept. The server only imports: no CUDA, no thread of its own at a
fork (numpy's OpenBLAS stops its pool before every fork), no file but its sockets. Each
child first takes its parent's environment as it is when the child starts, not the
server's (``adopt``), and SIGTERM's default action (the server ignores it, so that a
signal to the whole process group reaches the ranks' own handlers and a snapshot being
written is finished, as under spawn). A parent that dies still ends its children: the
server ends when the last process holding its "alive" pipe does (the parent; each child
closes its copy), and a rank asks the kernel for SIGKILL when its parent, the server, ends
(``training.distributed``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing import forkserver, reduction

from ddlstudy.machine import collector, environment

PRELOAD = ("__main__", "ddlstudy.cli", "ddlstudy.runner", "ddlstudy.training.preload")
"""What the server imports before it forks anything (``training.preload`` lists the
rest); torchvision too where the run's model needs it (``warm``)."""
SERVER_ENV = "DDLSTUDY_FORKSERVER"
"""Set only in the server's environment: ``training.preload`` calls ``serve`` there."""
GRACE_S = 30.0
"""How long a warm command interrupted by Ctrl-C may take to end before SIGKILL."""
REAP_S = 10.0
"""How long a process waits at its exit for its server to end (one still importing reads
its "alive" pipe once it has: seconds at most)."""

_started = {"pid": None}


def warm(*modules: str) -> None:
    """Start the server now, if this process has not: it imports beside this process, so
    that its children are forked from it at once when they are needed. ``modules``: what
    it imports besides PRELOAD (torchvision, where the model comes from it: about 0.2 s
    once torch's compiler front end is in; pandas for commands, which write samples)."""
    if _started["pid"] == os.getpid():
        return
    multiprocessing.set_forkserver_preload([*PRELOAD, *modules])
    # the server is ``python -c``: without -P its path would start with the working
    # directory (Python 3.11's forkserver ignores the path it is given), and a folder's
    # own ddlstudy/ or torch/ would be what it imports, as ``python_module``'s -P prevents
    # for every other Python ddlstudy starts
    server_env = {SERVER_ENV: "1"} | {k: v for k, v in environment.SAFE_PATH_ENV.items()
                                      if k not in os.environ}
    os.environ.update(server_env)
    try:
        forkserver.ensure_running()
    finally:
        for key in server_env:
            os.environ.pop(key, None)
    _started["pid"] = os.getpid()
    atexit.register(_reap)


def _reap() -> None:
    """At this process's exit: the server told to end, and waited for (at most REAP_S).
    Reaped, its CPU seconds and its children's (the ranks it forked) count in this
    process's; left to init, they would vanish from the tree that ``sampler.OthersLoad``
    measures (advise's probes: their ranks' CPU seen as other processes')."""
    server = forkserver._forkserver
    pid = server._forkserver_pid
    if pid is None or _started["pid"] != os.getpid():
        return
    server._forkserver_pid = None
    _let_go()
    deadline = time.monotonic() + REAP_S
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)


def serve() -> None:
    """In the server, as it imports (``training.preload``): SIGTERM ignored, so that a
    signal to the whole process group reaches the ranks' own handlers rather than ending
    them through it; and its exit, once its parent has ended, at once (``_ended``)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    atexit.register(_ended)


def _ended() -> None:
    """The server's exit without the interpreter's teardown of torch's modules (seconds
    on a busy host, while its children wait for it to end to end themselves)."""
    os._exit(0)


def context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context whose processes are forked from the server (started
    here if it was not)."""
    warm()
    return multiprocessing.get_context("forkserver")


class _Fd:
    """A file descriptor of the parent, sent to the child as a duplicate (pickled while
    the child is being started, when multiprocessing can send descriptors)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def inherited() -> tuple[dict[str, str], _Fd, _Fd]:
    """What a child of the server takes from the process that starts it (``adopt``): its
    environment, and its output and errors (a test's capture, a study's log) as they are
    now, where the server's are those of when it started."""
    return dict(os.environ), _Fd(1), _Fd(2)


def adopt(env: dict[str, str], out: int | None = None, err: int | None = None) -> None:
    """In a child of the server, first of all: ``env`` (its parent's environment when it
    started the child) as its own, ``out`` and ``err`` as its standard output and error,
    SIGTERM's default action, and the server's "alive" pipe closed (the server ends once
    its parent has, then its children); and what it was forked with (the server's
    imports: torch, ddlstudy) left out of the garbage collector's passes (``gc.freeze``).
    Scanned, they cost each child's first full pass a write to every one of them: 22,000
    pages of the server's copied (86 MiB) and 0.19 s, in the middle of a step."""
    gc.freeze()
    atexit.unregister(_ended)
    os.environ.clear()
    os.environ.update(env)
    for fd, target in ((out, 1), (err, 2)):
        if fd is not None and fd != target:
            os.dup2(fd, target)
            os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _let_go()


def _let_go() -> None:
    """This process's copy of its server's "alive" pipe closed: the server ends once no
    process holds it (the parent that started it, and each child that was handed a copy
    as it was forked)."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def loader_worker(worker_id: int) -> None:
    """A DataLoader worker's first step (``worker_init_fn``). Where its rank was forked
    from a server, the workers come from a server of the rank's own (the rank's default
    start method), and, as each of its children, hold that server's "alive" pipe: the
    server then outlives the rank, and the workers (whose parent it is) wait for the
    rank's indices for ever, each holding the run's output pipes. Closed here, the
    server ends with the rank, and torch's watchdog ends the workers once their parent
    has gone. A worker forked in the middle of its rank's start (the rank's first batch)
    puts the collector's thresholds back (``collector.settled``)."""
    collector.settled()
    _let_go()


def die_with_parent() -> None:
    """In a child of the server: its end when the process that started it ends, however
    that ended. A parent killed by SIGKILL (a scheduler's, a test's timeout) would
    otherwise leave a rank waiting in a collective for ever, or a study's cell training
    on, orphaned, holding a core and its memory. The kernel sends SIGKILL when the child's
    own parent, the server, ends, which it does once the process that started the child
    has ended. Linux only (prctl); snapshots are written whole or not at all, so nothing
    is left half-written."""
    if not sys.platform.startswith("linux"):
        return
    server = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    parent = multiprocessing.parent_process()  # the starter: its end closes the sentinel
    if os.getppid() != server or (parent is not None and not parent.is_alive()):
        os._exit(1)  # it ended before the call


def command(argv: list[str], env: dict[str, str], out: int, err: int) -> int:
    """``python -P -m ddlstudy ARGV`` (what ``environment.python_module`` starts) run in a
    child of the server, with ``env`` and its output and errors to the descriptors ``out``
    and ``err``: the same command, without its seconds of imports. Its exit code; Ctrl-C
    here reaches the child too (the same process group), which is given GRACE_S to end."""
    warm("torchvision", "pandas", "pyarrow.parquet")
    proc = context().Process(target=_command, name="ddlstudy", args=(
        list(argv), dict(env), os.getcwd(), _Fd(out), _Fd(err)))
    proc.start()
    try:
        proc.join()
    except KeyboardInterrupt:
        proc.join(GRACE_S)
        if proc.is_alive():
            proc.kill()
        raise
    return proc.exitcode


def captured(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` with its output and errors captured as text, as ``subprocess.run``'s
    ``capture_output=True, text=True`` gives them."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code = command(argv, env, out.fileno(), err.fileno())
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return subprocess.CompletedProcess(argv, code, *texts)


def _command(argv: list[str], env: dict[str, str], cwd: str, out: int, err: int) -> None:
    """The warm command, in the child: its environment, folder and output, then ddlstudy's
    ``__main__`` as ``python -m`` runs it, and the interpreter's exit (atexit's
    functions, the streams flushed) with its code."""
    adopt(env, out, err)
    die_with_parent()
    os.chdir(cwd)
    environment.this_process("command (forked warm)")
    sys.argv = ["ddlstudy", *argv]
    code = 0
    try:
        runpy.run_module("ddlstudy", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # a message, as the interpreter says it
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)
