"""Names the command line takes, mapped to what they name (strategies, backends,
reducers): registered where each is defined, and an unknown name answered with the list."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ddlstudy.errors import ConfigError

T = TypeVar("T")


def refuse_unknown(flag: str, noun: str, name: str, known) -> None:
    """The one refusal of a name the command line does not know, with the names it does."""
    raise ConfigError(flag, f"unknown {noun} {name!r}; choose one of: {', '.join(known)}")


class Registry(dict[str, T], Generic[T]):
    """``registry[name]`` in the order registered; ``named`` refuses an unknown name."""

    def __init__(self, flag: str, noun: str) -> None:
        super().__init__()
        self.flag, self.noun = flag, noun

    def register(self, item: Any) -> Any:
        """Add ``item`` under its ``name`` (usable as a class decorator)."""
        self[item.name] = item
        return item

    def named(self, name: str) -> T:
        if name not in self:
            refuse_unknown(self.flag, self.noun, name, self)
        return self[name]
