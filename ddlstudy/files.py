"""Files written so that a crash, a signal or a full disk never leaves a half-written one.

A write goes through a temporary file beside its target, is fsynced, then renamed over it;
SIGINT and SIGTERM wait until it is done (``ddlstudy.signals.deferred``).
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import logging
import os
import shlex
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.redact import redacted
from ddlstudy.signals import deferred

log = logging.getLogger("ddlstudy")


FREE = "free some space, then run it again"


class WriteFailed(RuntimeError):
    """A file could not be written (disk full, file-size limit); the previous one is kept.
    ``error``: the OSError that said so."""

    error: OSError | None = None


def full(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a disk (or quota, or file-size limit) that is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def atomic_write(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write through ``.<name>.tmp-<pid>`` in the same folder, fsync, then rename over
    ``path``; SIGINT and SIGTERM wait until it is done (see ddlstudy.signals). A failed
    write leaves ``path`` as it was and no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with deferred():  # a Ctrl-C or SIGTERM lands after the write, not inside it
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            cause = exc if isinstance(exc, OSError) else exc.__cause__ or exc.__context__
            if isinstance(exc, OSError | RuntimeError) and full(cause):
                failed = WriteFailed(f"could not write {path} ({cause.strerror}); the "
                                     f"previous {path.name}, if any, is kept; {FREE}")
                failed.error = cause
                raise failed from exc
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def atomic_write_json(path: Path, record: Any, **dumps: Any) -> None:
    """A JSON record (a manifest, a study's record) written through ``atomic_write_text``,
    with the secrets of every URI in it taken out (``ddlstudy.redact``)."""
    atomic_write_text(path, json.dumps(redacted(record), indent=2, **dumps) + "\n")


def sweep_temporaries(folder: Path) -> list[Path]:
    """Remove the ``.<name>.tmp-<pid>`` files that processes no longer alive left behind
    (a write killed by SIGKILL cannot clean up after itself)."""
    swept = []
    for tmp in Path(folder).glob(".*.tmp-*"):
        try:
            pid = int(tmp.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not psutil.pid_exists(pid):
            tmp.unlink(missing_ok=True)
            swept.append(tmp)
    return swept


LOCK = ".ddlstudy.lock"


@contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s lock (``.ddlstudy.lock`` in it) while ``what`` writes there: a
    second writer is refused (UsageError naming the holder's PID, host and command); a
    lock its holder left behind when it died (the kernel frees the lock itself) is taken
    over, and said."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{folder} is in use by another {what}: {_holder(fd)}; wait "
                             f"until it ends, or give another folder") from None
        left = _holder(fd, "")
        if left:
            log.warning("%s: took over the lock left by %s, which is gone", folder, left)
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(redacted(mine)).encode(), 0)
        yield
        os.ftruncate(fd, 0)  # a lock released in good order leaves nothing to take over
    finally:
        os.close(fd)


@contextmanager
def turn(folder: Path) -> Iterator[None]:
    """Wait for, then hold, ``folder``'s own lock (the folder itself, no file in it): what
    two processes must not do at once there (make an MLflow store's tables) is done in
    turn."""
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    if key in _TURNS:  # held already, further up this process's stack
        yield
        return
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _TURNS.add(key)
        yield
    finally:
        _TURNS.discard(key)
        os.close(fd)


_TURNS: set[str] = set()


def _holder(fd: int, unknown: str = "a process that has not said which") -> str:
    """Who the lock file ``fd`` says holds it."""
    try:
        held = json.loads(os.pread(fd, 65536, 0) or b"null")
        return f"PID {held['pid']} on {held['host']} ({shlex.join(held['command'])[:300]})"
    except (ValueError, TypeError, KeyError, OSError):
        return unknown


def check_folder(flag: str, path: Path) -> None:
    """The one check of every folder ddlstudy writes into, before anything is measured or
    written: refused (ConfigError naming ``flag``) if its name holds a control character,
    if it is a file or has a file above it, lies inside a run folder (whose files are never
    overwritten), or cannot be made or written here (no permission, /proc, /sys, a
    read-only file system, a symlink loop, a name too long): a folder is really made, and
    removed, beside where it would go."""
    path = Path(path)
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        raise ConfigError(flag, f"{str(path)!r:.200} holds a control character (a newline, "
                          "a tab); give a plain path")
    if not str(path).isascii() and not _utf8(str(path)):
        raise ConfigError(flag, f"{str(path)!r:.200} is not a UTF-8 name (ddlstudy records "
                          "paths as UTF-8 text); give a folder whose name is")
    try:
        _check_folder(flag, path)
    except OSError as exc:
        raise ConfigError(flag, f"{str(path):.200} cannot be made: {exc.strerror or exc}; "
                          "give another folder") from None


def _utf8(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


def _check_folder(flag: str, path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(flag, f"{path} is a file, not a folder; give a folder")
    existing = path
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():
        raise ConfigError(flag, f"{path} cannot be made: {existing} is a symbolic link that "
                          "leads nowhere (a loop, or a missing target)")
    if not existing.is_dir():
        raise ConfigError(flag, f"{path} cannot be made: {existing} is a file")
    for folder in [existing, *existing.parents]:
        if (folder / "manifest.json").is_file():
            raise ConfigError(flag, f"{path} is inside run folder {folder}, whose files are "
                              "never overwritten; give a folder outside run folders")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{path} cannot be written: {existing} is not writable by "
                          "this user; give another folder")
    os.rmdir(tempfile.mkdtemp(prefix=".ddlstudy-check-", dir=existing))
    if len(str(path.absolute())) >= os.pathconf(existing, "PC_PATH_MAX"):
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    for part in path.parts:
        if len(part.encode()) > os.pathconf(existing, "PC_NAME_MAX"):
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))


def check_output(flag: str, path: Path, force: bool = False) -> Path:
    """Refuse (ConfigError naming ``flag``) a file a command would write where it must not:
    a folder, a device, FIFO or socket (never replaced, even with ``force``), a file inside
    a run folder (its results are never overwritten), an existing file unless ``force``,
    or a place that cannot be written. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a folder; give a new file's path")
    kind = _special_kind(path)
    if kind:
        raise ConfigError(flag, f"{path} is {kind}, not a file; it is never replaced, even "
                          "with --force (which replaces only a file or a symbolic link): "
                          "give a file's path")
    for folder in [path.parent, *path.parent.parents]:
        if (folder / "manifest.json").is_file():
            raise ConfigError(flag, f"{path} is inside run folder {folder}, whose files are "
                              f"never overwritten; give a path outside run folders")
    if path.exists() and not force:
        raise ConfigError(flag, f"{path} exists; give another path, or --force to replace it")
    check_folder(flag, path.parent if str(path.parent) else Path("."))
    return path


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it is neither missing, a regular file nor a symbolic link
    (itself, not its target: ``--force`` replaces a link, never what it leads to)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def write_outputs(flag: str, texts: dict[Path, Callable[[io.BufferedWriter], None]]) -> None:
    """Write each file (parents made as needed) through ``atomic_write``; an error of this
    machine (no permission, a read-only file system) is a refusal naming ``flag``, and
    removes what this call wrote, so that no half of a pair is left."""
    written = []
    try:
        for path, write in texts.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, write)
            written.append(path)
    except (OSError, WriteFailed) as exc:
        for done in written:
            done.unlink(missing_ok=True)
        cause = exc.error if isinstance(exc, WriteFailed) else exc
        raise ConfigError(flag, f"cannot write {path}: {cause.strerror or cause}; give another "
                          f"path{', or free some space' if full(cause) else ''}") from None
