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

import inspect
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
    unknown name; ``group`` names the entry points plugins declare, each of which must be
    a subclass of ``base`` (or, with ``instances``, an instance of it) with what ``base``
    declares and does not define: a text (``name``, ``summary``) or something to call."""

    def __init__(self, flag: str, noun: str, group: str | None = None,
                 base: type | None = None, instances: bool = False,
                 reserved: dict[str, str] | None = None) -> None:
        super().__init__()
        self.flag, self.noun, self.group = flag, noun, group
        self.base, self.instances = base, instances
        self.reserved = reserved or {}
        """Names only ddlstudy's own entries may take (a plugin's is left out), and why."""
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
            # ddlstudy's own first (declared as entry points too, as its watchers are):
            # a plugin of the same name then meets them, whatever order the metadata lists
            for point in sorted(entry_points(group=self.group), key=lambda p: not _own(p)):
                self._load(point)
        return self

    def _load(self, point) -> None:
        try:
            item = point.load()
        except BaseException as exc:  # noqa: BLE001 - even an import that exits or is stopped
            self._left_out(point, f"{type(exc).__name__}: {exc}")
            return
        if inspect.ismodule(item):  # a module whose import registered what it holds
            if point.name not in self:
                self._left_out(point, f"it names no {self.noun} (a module that registers none)")
            return
        misfit = self.misfit(item)
        if misfit:
            self._left_out(point, misfit)
            return
        if item.name in self.reserved and not _own(point):
            self._left_out(point, f"{item.name!r} is {self.reserved[item.name]}")
            return
        if self.get(item.name, item) is not item:
            self._left_out(point, f"{item.name!r} is another {self.noun}'s name already")
            return
        self.register(item)

    def misfit(self, item: Any) -> str | None:
        """Why ``item`` is not of the shape this registry's entries have (None if it is)."""
        base = self.base
        if base is None:
            return None if isinstance(getattr(item, "name", None), str) else \
                f"it names no {self.noun} (no name attribute)"
        what = f"an instance of {base.__name__}" if self.instances else \
            f"a subclass of {base.__name__}"
        fits = isinstance(item, base) if self.instances else \
            isinstance(item, type) and issubclass(item, base)
        if not fits:
            return f"it is {_kind(item)}, not {what}"
        if inspect.isabstract(item):
            return f"{item.__name__} does not define {', '.join(sorted(item.__abstractmethods__))}"
        for attr, annotation in inspect.get_annotations(base).items():
            if hasattr(base, attr):
                continue  # what the base defines, the item may keep
            value = getattr(item, attr, None)
            if str(annotation).removeprefix("ClassVar[").rstrip("]") == "str":
                if not isinstance(value, str) or not value.strip():
                    return f"its {attr} is {value!r}, not a text"
            elif not callable(value):
                return f"its {attr} is {value!r}, not something to call"
        return None

    def _left_out(self, point, why: str) -> None:
        log.warning("plugin %s = %s (entry point group %s) could not be loaded and is left "
                    "out: %s", point.name, point.value, self.group, why)


def _own(point) -> bool:
    """Whether entry point ``point`` names ddlstudy's own code."""
    return point.value.split(":")[0].split(".")[0] == "ddlstudy"


def _kind(item: Any) -> str:
    if isinstance(item, type):
        return f"the class {item.__name__}"
    if callable(item):
        return f"the function {getattr(item, '__name__', repr(item))}"
    return f"{type(item).__name__} {item!r:.60}"
