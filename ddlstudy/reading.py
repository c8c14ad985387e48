"""The one gate every file ddlstudy reads goes through, before any parser sees it.

A use case, a study plan, a manifest, study.json, advise.json, metrics.csv, samples.parquet,
a hostfile, a secret file, a cache index: each is read by ``read_bytes`` (or the readers
built on it), which refuses, in one line naming the file and the fix,

- what is not a regular file: a folder, a FIFO (which would block until a writer comes),
  a device such as /dev/zero (which never ends), a socket, a symlink loop;
- a file larger than the cap of its kind (a hostfile of 4 GB is no hostfile);
- text that is not UTF-8, and documents nested deeper than ``MAX_DEPTH`` (a parser would
  recurse until Python's stack gives out).

What passes is then checked against its format's schema (``ddlstudy.records.formats``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from ddlstudy.errors import UsageError

MiB = 1 << 20
MAX_DEPTH = 48
"""How deeply a JSON or TOML document may nest; ddlstudy's own files nest at most 5 deep."""

CAPS = {"text": 4 * MiB, "record": 64 * MiB, "table": 2048 * MiB}
"""The largest file of each kind: a configuration or a small list (text), a JSON record a
run or a study wrote (record), a table of measurements (table)."""


class BadFile(UsageError):
    """A file that cannot be read as what it should be; the message names it and the fix."""

    def __init__(self, what: str, path: Path | str, problem: str):
        self.path = Path(path)
        super().__init__(f"{what} {path}: {problem}")


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


def _open(path: Path, what: str) -> int:
    try:  # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadFile(what, path, "does not exist; check the path") from None
    except PermissionError:
        raise BadFile(what, path, "cannot be read by this user; check its "
                      "permissions") from None
    except OSError as exc:
        why = {errno.ELOOP: "is a loop of symbolic links",
               errno.ENAMETOOLONG: "is a name too long for this file system",
               errno.ENOTDIR: "has a file where a folder should be in its path"}
        raise BadFile(what, path, f"{why.get(exc.errno, exc.strerror)}; give the path "
                      "of a file") from None


def check_regular(path: Path | str, what: str) -> os.stat_result:
    """The file's status, if ``path`` is a regular file (after links); else BadFile."""
    fd = _open(Path(path), what)
    try:
        return _regular(fd, Path(path), what)
    finally:
        os.close(fd)


def _regular(fd: int, path: Path, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise BadFile(what, path, "is a folder; give the path of a file")
    if not stat.S_ISREG(st.st_mode):
        raise BadFile(what, path, f"is {_kind(st.st_mode)}, not a regular file; give the "
                      "path of a file")
    return st


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in words."""
    return ("a folder" if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")


def what_is(path: Path | str) -> str:
    """What is at ``path``, in words, found without opening it (a FIFO would block): 'a
    folder', 'a file', 'a FIFO', 'a socket', 'a device', a broken link; '' where nothing
    is there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link that leads nowhere" if os.path.islink(path) else ""
    except NotADirectoryError:  # a file where a folder should be in the path
        return ""
    except OSError as exc:
        return ("a loop of symbolic links" if exc.errno == errno.ELOOP
                else f"something that cannot be looked at ({exc.strerror})")
    return _kind(mode)


def read_bytes(path: Path | str, what: str, cap: int = CAPS["text"]) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes; else BadFile."""
    path = Path(path)
    fd = _open(path, what)
    try:
        st = _regular(fd, path, what)
        if st.st_size > cap:
            raise BadFile(what, path, f"is {_size(st.st_size)}, more than the {_size(cap)} "
                          "such a file can be; is it the right file?")
        os.set_blocking(fd, True)
        chunks, left = [], cap + 1
        while left > 0 and (chunk := os.read(fd, min(left, MiB))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise BadFile(what, path, f"cannot be read ({exc.strerror}); check the "
                      "file") from None
    finally:
        os.close(fd)
    if len(data) > cap:  # it grew while being read
        raise BadFile(what, path, f"is more than the {_size(cap)} such a file can be")
    return data


def decode(data: bytes, path: Path | str, what: str) -> str:
    """UTF-8 text (a byte-order mark is dropped), or BadFile saying where it is not."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadFile(what, path, f"is not UTF-8 text (byte {exc.start} is "
                      f"0x{data[exc.start]:02x}); save it as UTF-8") from None


def read_text(path: Path | str, what: str, cap: int = CAPS["text"]) -> str:
    """A UTF-8 text file through the gate."""
    return decode(read_bytes(path, what, cap), path, what)


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and mappings (a scalar: 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                stack.extend((v, level + 1) for v in
                             (item.values() if isinstance(item, dict) else item))
    return deepest


def _parsed(parse, text: str, path: Path | str, what: str) -> Any:
    """``parse(text)``, nested at most MAX_DEPTH deep (a parser that recurses deeper is
    stopped by Python's stack: the same refusal), else BadFile."""
    try:
        value = parse(text)
    except RecursionError:
        value = None
    else:
        if depth(value) <= MAX_DEPTH:
            return value
    raise BadFile(what, path, f"nests more than {MAX_DEPTH} levels deep; no ddlstudy file "
                  "does: is it the right file?")


def parse_json(text: str, path: Path | str, what: str) -> Any:
    """A JSON document, or BadFile with the line and column of the error."""
    try:
        return _parsed(json.loads, text, path, what)
    except json.JSONDecodeError as exc:
        raise BadFile(what, path, f"is not valid JSON ({exc.msg} at line {exc.lineno}, "
                      f"column {exc.colno})") from None


def read_json(path: Path | str, what: str, cap: int = CAPS["record"]) -> Any:
    """A JSON file through the gate."""
    return parse_json(read_text(path, what, cap), path, what)


def parse_toml(text: str, path: Path | str, what: str) -> dict[str, Any]:
    """A TOML document, or BadFile saying where it is wrong."""
    try:
        return _parsed(tomllib.loads, text, path, what)
    except tomllib.TOMLDecodeError as exc:
        raise BadFile(what, path, f"is not valid TOML: {exc}") from None


def read_toml(path: Path | str, what: str, cap: int = CAPS["text"]) -> dict[str, Any]:
    """A TOML file through the gate."""
    return parse_toml(read_text(path, what, cap), path, what)


def read_parquet(path: Path | str, what: str, columns: list[str] | None = None):
    """A Parquet table through the gate (a regular file within the table cap), as a
    pandas DataFrame; a file Parquet cannot read (or without ``columns``) is a BadFile."""
    st = check_regular(path, what)
    if st.st_size > CAPS["table"]:
        raise BadFile(what, path, f"is {_size(st.st_size)}, more than the "
                      f"{_size(CAPS['table'])} such a file can be; is it the right file?")
    import pandas as pd

    try:
        return pd.read_parquet(path, columns=columns)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds for a bad file
        raise BadFile(what, path, f"is not a Parquet table ddlstudy can read "
                      f"({type(exc).__name__}: {str(exc)[:120]})") from None
