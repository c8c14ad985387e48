"""Files written so that a crash, a signal or a full disk never leaves a half-written one.

A write goes through a temporary file beside its target, is fsynced, then renamed over it;
SIGINT and SIGTERM wait until it is done (``ddlstudy.signals.deferred``).
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil

from ddlstudy.errors import ConfigError
from ddlstudy.signals import deferred


class WriteFailed(RuntimeError):
    """A file could not be written (disk full, file-size limit); the previous one is kept."""


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
            if isinstance(exc, OSError | RuntimeError) and isinstance(cause, OSError) \
                    and cause.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise WriteFailed(f"could not write {path} ({cause.strerror}); "
                                  f"the previous {path.name}, if any, is kept: free some space "
                                  f"and resume the run") from exc
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


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
    try:
        _check_folder(flag, path)
    except OSError as exc:
        raise ConfigError(flag, f"{str(path):.200} cannot be made: {exc.strerror or exc}; "
                          "give another folder") from None


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
    a folder, a file inside a run folder (its results are never overwritten), an existing
    file unless ``force``, or a place that cannot be written. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a folder; give a new file's path")
    for folder in [path.parent, *path.parent.parents]:
        if (folder / "manifest.json").is_file():
            raise ConfigError(flag, f"{path} is inside run folder {folder}, whose files are "
                              f"never overwritten; give a path outside run folders")
    if path.exists() and not force:
        raise ConfigError(flag, f"{path} exists; give another path, or --force to replace it")
    check_folder(flag, path.parent if str(path.parent) else Path("."))
    return path


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
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise ConfigError(flag, f"cannot write {exc.filename or path}: {exc.strerror or exc}; "
                          f"give another path") from None
