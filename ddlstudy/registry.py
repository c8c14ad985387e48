"""Names the command line takes, mapped to what they name (strategies, backends,
reducers): registered where each is defined, or by an installed plugin through an entry
point, and an unknown name answered with the list.

A plugin is any installed package that declares entry points in a registry's group, e.g.
in its pyproject.toml::

    [project.entry-points."ddlstudy.strategies"]
    local-sgd = "my_package.strategies:LocalSgd"

Plugins are loaded when a name is not one of ddlstudy's own, or when the whole list is
wanted (`ddlstudy strategies`), never at import. A plugin that fails to load is named in
one warning and left out; the others still work.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from ddlstudy.errors import ConfigError

T = TypeVar("T")
log = logging.getLogger("ddlstudy")


def refuse_unknown(flag: str, noun: str, name: str, known) -> None:
    """The one refusal of a name the command line does not know, with the names it does."""
    raise ConfigError(flag, f"unknown {noun} {name!r}; choose one of: {', '.join(known)}")


class Registry(dict[str, T], Generic[T]):
    """``registry[name]`` in the order registered (plugins last); ``named`` refuses an
    unknown name; ``group`` names the entry points plugins declare."""

    def __init__(self, flag: str, noun: str, group: str | None = None) -> None:
        super().__init__()
        self.flag, self.noun, self.group = flag, noun, group
        self._plugins_loaded = group is None

    def register(self, item: Any) -> Any:
        """Add ``item`` under its ``name`` (usable as a class decorator)."""
        self[item.name] = item
        return item

    def named(self, name: str) -> T:
        if name not in self:
            self.loaded()
        if name not in self:
            refuse_unknown(self.flag, self.noun, name, self)
        return self[name]

    def loaded(self) -> Registry[T]:
        """This registry with every installed plugin's entries loaded (once)."""
        if not self._plugins_loaded:
            self._plugins_loaded = True
            for point in entry_points(group=self.group):
                self._load(point)
        return self

    def _load(self, point) -> None:
        try:
            item = point.load()
        except Exception as exc:  # noqa: BLE001 - any error of someone else's package
            self._left_out(point, f"{type(exc).__name__}: {exc}")
            return
        name = getattr(item, "name", None)
        if not isinstance(name, str):  # a module whose import registered what it holds
            if point.name not in self:
                self._left_out(point, f"it names no {self.noun} (no name attribute)")
            return
        if self.get(name, item) is not item:
            self._left_out(point, f"{name!r} is another {self.noun}'s name already")
            return
        self.register(item)

    def _left_out(self, point, why: str) -> None:
        log.warning("plugin %s = %s (entry point group %s) could not be loaded and is left "
                    "out: %s", point.name, point.value, self.group, why)
