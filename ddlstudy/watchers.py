"""Watchers: what follows a run while it trains, told by its run folder when the folder is
made, as each epoch is recorded and when the folder is closed (ddlstudy's own: ``mlflow``,
`run --mlflow`'s live logging; a plugin may add its own).

The run folder sits floors below the tools a watcher speaks to, so it never imports one:
watchers are found through the entry point group ``ddlstudy.watchers``, ddlstudy's own
declared in its pyproject.toml like a plugin's::

    [project.entry-points."ddlstudy.watchers"]
    mlflow = "ddlstudy.exports.mlflow.live:WATCHER"

Each is an instance of ``Watcher``. Every hook is called for every run: a watcher reads
from the manifest whether the run asked for it (MLflow's: the configuration's ``mlflow``),
and a watcher that fails says so and lets the run go on (the run is never failed by it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ddlstudy.errors import ConfigError
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


WATCHERS: Registry[Watcher] = Registry("watchers", "watcher", group="ddlstudy.watchers",
                                       base=Watcher, instances=True)


def watcher(name: str, flag: str) -> Watcher:
    """ddlstudy's own watcher ``name``, for ``flag``: a ConfigError if its entry point is
    missing (ddlstudy's metadata out of date: installed before the watcher was declared)."""
    found = WATCHERS.loaded().get(name)
    if found is None:
        raise ConfigError(flag, f"ddlstudy's {name} watcher is not registered (entry point "
                          f"group ddlstudy.watchers): reinstall ddlstudy, e.g. `make "
                          f"install` or `pip install -e .` in its folder")
    return found


def tell(manifest: dict[str, Any], hook: Callable[[Watcher], None]) -> None:
    """``hook`` called on every installed watcher (ddlstudy's own and plugins', loaded once
    a process); one that raises is named in a warning and the run goes on. One of
    ddlstudy's own that the run asked for and this process cannot find (its metadata
    older than its code: a Spark executor's install) is said the same way, and noted in
    the manifest's block of its name, as its own failures are."""
    found = WATCHERS.loaded()
    for name in OWN:
        block = manifest.get(name) if isinstance(manifest.get(name), dict) else {}
        if (manifest.get("config") or {}).get(name) and name not in found \
                and not block.get("error"):
            manifest[name] = block | {"error": f"ddlstudy's {name} watcher is not "
                                      "registered in this process: reinstall ddlstudy"}
            log.warning("the run asked for %s, but %s; the run goes on without it", name,
                        manifest[name]["error"])
    for each in found.values():
        try:
            hook(each)
        except Exception as exc:  # noqa: BLE001 - a watcher never fails the run
            log.warning("watcher %s failed (%s: %s); the run goes on without it", each.name,
                        type(exc).__name__, " ".join(str(exc).split())[:300])
