"""Watchers: what follows a run while it trains, told by its run folder when the folder is
made, as each epoch is recorded and when the folder is closed (ddlstudy's own: ``mlflow``,
`run --mlflow`'s live logging; a plugin may add its own).

The run folder sits floors below the tools a watcher speaks to, so it never imports one:
watchers are found through the entry point group ``ddlstudy.watchers``, ddlstudy's own
declared in its pyproject.toml like a plugin's::

    [project.entry-points."ddlstudy.watchers"]
    mlflow = "ddlstudy.exports.mlflow.live:WATCHER"

Each is an instance of ``Watcher``. Every hook is called for every run: a watcher reads
from the manifest whether the run asked for it (MLflow's: the configuration's ``mlflow``).
A watcher is someone else's code inside every run, so it is held apart from the run:

- each hook runs in a thread of its own, for ``HOOK_LIMIT_S`` at most: one that takes
  longer is named in a warning and left out for the rest of the run, which goes on (a
  SIGINT or SIGTERM meanwhile stops the run at once);
- what it raises, ``sys.exit`` and KeyboardInterrupt included, is said in a warning and
  the run goes on (never taken for the user's Ctrl-C, never the run's exit);
- it is given a copy of the manifest, and what it notes is taken back from its own key
  alone (``manifest[name]``), if that is JSON of at most ``NOTE_BYTES``: it cannot change
  the run's status, configuration or epochs;
- what it prints goes to the log, not to stdout (``run --format json`` stays JSON);
- a plugin may not take the name of ddlstudy's own watchers or of a manifest's key
  (``RESERVED``): it is left out, as another name clash is.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from ddlstudy import signals
from ddlstudy.errors import ConfigError
from ddlstudy.reading import MAX_DEPTH, depth
from ddlstudy.registry import Registry

log = logging.getLogger("ddlstudy")

OWN = ("mlflow",)
"""ddlstudy's own watchers, each turned on by the run option of its name."""
ALONE = "default"
"""The value of a watcher's flag given alone (``--mlflow``): the watcher's default place."""


class Watcher:
    """What follows a run: ``setting`` checks the value of the run's option for it before
    anything starts; the other hooks are told of the run folder's life."""

    name: ClassVar[str]
    summary: ClassVar[str]

    def setting(self, value: str, runs_dir: Path, flag: str) -> str:
        """``value`` of ``flag`` checked (ConfigError, nothing written) and written out
        (``ALONE``: this watcher's default, given ``runs_dir``)."""
        return value

    def opened(self, manifest: dict[str, Any], folder: Path) -> None:
        """The run folder is made; its manifest is written next (what is noted in it
        is kept)."""

    def epoch(self, manifest: dict[str, Any], record: dict[str, Any]) -> None:
        """An epoch was recorded (``record``, metrics.csv's row), on the rank that records."""

    def closed(self, manifest: dict[str, Any]) -> None:
        """The run ended (its status in the manifest); the manifest is written next."""


MANIFEST_KEYS = ("schema", "id", "status", "started_at", "ended_at", "exit_code", "error",
                 "pid", "command", "usecase", "model", "strategy", "backend", "config",
                 "seeds", "effective", "data", "preprocessing", "git", "versions", "host",
                 "launch", "sampler", "study", "epochs", "summary", "time_to_target",
                 "val_confusion", "host_load", "samples", "resumed", "first_step_s",
                 "transport", "watchers", "startup")
"""The manifest's own keys (a test holds them to a run's and the format's): a watcher
notes under its name, so no watcher is named like one."""
RESERVED = {**dict.fromkeys(OWN, "the name of ddlstudy's own watcher"),
            **dict.fromkeys(MANIFEST_KEYS, "a key of the run's manifest, which a watcher "
                            "cannot note under")}
"""The names a plugin's watcher cannot take, and why."""
WATCHERS: Registry[Watcher] = Registry("watchers", "watcher", group="ddlstudy.watchers",
                                       base=Watcher, instances=True, reserved=RESERVED)


def watcher(name: str, flag: str) -> Watcher:
    """ddlstudy's own watcher ``name``, for ``flag``: a ConfigError if its entry point is
    missing (ddlstudy's metadata out of date: installed before the watcher was declared)."""
    found = WATCHERS.loaded().get(name)
    if found is None:
        raise ConfigError(flag, f"ddlstudy's {name} watcher is not registered (entry point "
                          f"group ddlstudy.watchers): reinstall ddlstudy, e.g. `make "
                          f"install` or `pip install -e .` in its folder")
    return found


HOOK_LIMIT_S = 120.0
"""How long one hook may take: MLflow's client gives up on a server that does not answer
after about this long (its retries); a hook that takes longer has hung."""
NOTE_BYTES = 1 << 20
"""The most a watcher may note in the manifest (as JSON), which every reader reads whole."""
_LEFT_OUT: set[tuple[str, str]] = set()
"""(watcher, run id) of the hooks that ran out of time: not called again in that run."""


def tell(manifest: dict[str, Any], hook: str, *args: Any) -> None:
    """Call ``hook`` (``opened``, ``epoch``, ``closed``) of every installed watcher
    (ddlstudy's own and plugins', loaded once a process) with a copy of ``manifest`` and
    ``args``, each held apart from the run (the module's docstring). One of ddlstudy's own
    that the run asked for and this process cannot find (its metadata older than its code:
    a Spark executor's install) is said in a warning, and noted in the manifest's block of
    its name, as its own failures are."""
    found = WATCHERS.loaded()
    for name in OWN:
        block = manifest.get(name) if isinstance(manifest.get(name), dict) else {}
        if (manifest.get("config") or {}).get(name) and name not in found \
                and not block.get("error"):
            manifest[name] = block | {"error": f"ddlstudy's {name} watcher is not "
                                      "registered in this process: reinstall ddlstudy"}
            log.warning("the run asked for %s, but %s; the run goes on without it", name,
                        manifest[name]["error"])
    for each in list(found.values()):
        if (each.name, str(manifest.get("id"))) not in _LEFT_OUT:
            _call(each, manifest, hook, args)


def _call(each: Watcher, manifest: dict[str, Any], hook: str, args: tuple) -> None:
    """One watcher's ``hook``, in its thread, its note taken back (``tell``)."""
    copy = _copied(manifest)
    args = tuple(_copied(a) if isinstance(a, dict) else a for a in args)  # a folder's Path
    raised: list[BaseException] = []

    def call() -> None:
        try:
            getattr(each, hook)(copy, *args)
        except BaseException as exc:  # noqa: BLE001 - its exit or interrupt is its own
            raised.append(exc)

    thread = threading.Thread(target=call, name=f"{THREAD}{each.name}", daemon=True)
    with _printed_to_log(thread):
        thread.start()
        ended = _waited(thread)
    if not ended:
        _LEFT_OUT.add((each.name, str(manifest.get("id"))))
        why = "the run was stopped" if signals.pending() else \
            f"it took longer than {HOOK_LIMIT_S:g} s"
        log.warning("watcher %s: its %s hook has not returned (%s); the run goes on "
                    "without it", each.name, hook, why)
    elif raised:
        exc = raised[0]
        what = "tried to end the process" if not isinstance(exc, Exception) else "failed"
        log.warning("watcher %s %s in its %s hook (%s: %s); the run goes on without it",
                    each.name, what, hook, type(exc).__name__, " ".join(str(exc).split())[:300])
    elif copy.get(each.name) is not None:
        _take_note(each.name, copy[each.name], manifest)


def _copied(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` as its JSON reads back (what a watcher does to it stays there)."""
    return json.loads(json.dumps(record, allow_nan=True, default=str))


def _waited(thread: threading.Thread) -> bool:
    """Whether ``thread`` ended within ``HOOK_LIMIT_S``; waited in slices, so that a
    SIGINT or SIGTERM held back meanwhile (``signals.deferred``) ends the wait at once."""
    deadline = time.monotonic() + HOOK_LIMIT_S
    while thread.is_alive() and time.monotonic() < deadline and signals.pending() is None:
        thread.join(min(0.1, max(0.0, deadline - time.monotonic())))
    return not thread.is_alive()


def _take_note(name: str, note: Any, manifest: dict[str, Any]) -> None:
    """``note`` as the manifest's ``name`` block, if it is JSON ddlstudy can read back."""
    try:
        text = json.dumps(note, allow_nan=True)
        problem = f"nests deeper than {MAX_DEPTH - 1} levels" if depth(note) >= MAX_DEPTH \
            else f"is {len(text)} bytes, more than {NOTE_BYTES}" if len(text) > NOTE_BYTES \
            else None
    except (TypeError, ValueError, RecursionError) as exc:  # not JSON, or circular
        problem = f"is not JSON ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if problem:
        log.warning("watcher %s: what it noted in the manifest %s; it is left out", name,
                    problem)
        return
    manifest[name] = json.loads(text)


THREAD = "ddlstudy-watcher-"
"""The start of a watcher's thread's name (``_Printed`` sends its prints to the log)."""


class _Printed(io.TextIOBase):
    """``sys.stdout`` while a watcher runs: its thread's prints to the log, line by line;
    every other thread's to the stream it replaced."""

    def __init__(self, stream, thread: threading.Thread) -> None:
        self.stream, self.thread, self.pending = stream, thread, ""

    def write(self, text: str) -> int:
        if threading.current_thread() is not self.thread:
            return self.stream.write(text)
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self._said(line)
        return len(text)

    def _said(self, line: str) -> None:
        log.info("watcher %s printed: %s", self.thread.name.removeprefix(THREAD), line[:1000])

    def flush(self) -> None:
        if threading.current_thread() is not self.thread:
            self.stream.flush()

    def end(self) -> None:
        """Log the last line printed without its newline."""
        if self.pending:
            self._said(self.pending)
            self.pending = ""


@contextmanager
def _printed_to_log(thread: threading.Thread) -> Iterator[None]:
    """Route the watcher ``thread``'s prints to the log while it runs (and after, where it
    does not end: it may print later)."""
    before = sys.stdout
    sys.stdout = printed = _Printed(before, thread)
    try:
        yield
    finally:
        if not thread.is_alive():
            printed.end()
            if sys.stdout is printed:
                sys.stdout = before
