"""How a run option is declared: one ``RunConfig`` field (``option``) whose metadata give
its flag, its help, its type, the names it takes, its bounds and who owns it. The checks
every option shares read these (``check_declared``): a value of the wrong type, a name it
does not take, a number out of its bounds, a flag of a backend the run does not use."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Any

from ddlstudy.config.limits import most, why
from ddlstudy.config.usecase import _positive
from ddlstudy.errors import ConfigError

WHAT, NODES, SPARK, TASK, DATA, OUTPUT = ("what to train", "several nodes",
                                          "the Spark backend",
                                          "training task (override the use case's [train] table)",
                                          "data", "output")
MAX_PROCESSES = int(most("processes"))
FORKS = why("processes")


def option(default: Any, help: str, *, group: str, type: Any = str, metavar: str | None = None,
           negate: bool = False, parse: str | None = None, choices: tuple[str, ...] = (),
           noun: str = "value", most: float | None = None, why: str = "",
           owners: tuple[str, ...] = (), purpose: str = "", also: str = "",
           const: str | None = None) -> Any:
    """A RunConfig field that is also a ``ddlstudy run`` flag and a study-plan key.

    ``help`` says what the flag does; ``type`` converts the flag's text (bool: a switch);
    ``negate`` makes the flag ``--no-<name>``, which sets the field False (its ``help``
    then says what ``--no-<name>`` does); ``parse`` names a converter in
    ``config.options`` for values argparse cannot type (a layer list); ``choices`` are the
    names it takes (another is refused as an unknown ``noun``); ``most``: a number must be
    positive and at most this (``why`` says what more would do); ``owners``: the backends
    it belongs to, with any other refused as "``purpose``: it needs --backend ..."
    (``also``: what else it needs, said after); ``const``: the value of the flag given
    alone (its value is then optional: ``--mlflow [URI]``; a plan's ``true``)."""
    return field(default=default, metadata={
        "help": help, "group": group, "type": type, "metavar": metavar, "negate": negate,
        "parse": parse, "choices": choices, "noun": noun, "most": most, "why": why,
        "owners": owners, "purpose": purpose, "also": also, "const": const})


def flag_of(f: dataclasses.Field) -> str:
    """The flag of an option field (``--no-snapshot`` for ``snapshot``)."""
    return "--" + ("no-" if f.metadata["negate"] else "") + f.name.replace("_", "-")


def declared(cls) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are run options."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


_WHAT = {Path: "a path", bool: "true or false", float: "a number", int: "an integer"}


def _typed(f: dataclasses.Field, value: Any) -> bool:
    kind = f.metadata["type"]
    if f.metadata["parse"] == "layers":
        return isinstance(value, list | tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    if kind is Path:
        return isinstance(value, str | Path) and str(value) != ""
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)


def check_declared(cfg: Any) -> None:
    """Every option of ``cfg`` holds a value of its declared type (a study plan or a
    replayed manifest can hold anything), one of its names, within its bounds, and is
    left at its default unless the run's backend owns it: refused naming the flag."""
    fields = declared(type(cfg))
    for f in fields:
        value = getattr(cfg, f.name)
        if value is None and f.default is None:
            continue
        if not _typed(f, value):
            what = _WHAT.get(f.metadata["type"], "a name")
            raise ConfigError(flag_of(f), f"must be {what}, got {value!r}")
        if f.metadata["type"] is Path:
            object.__setattr__(cfg, f.name, Path(value))
    for f in fields:
        value, meta = getattr(cfg, f.name), f.metadata
        if meta["choices"] and value not in meta["choices"]:
            raise ConfigError(flag_of(f), f"unknown {meta['noun']} {value!r}; choose one of: "
                              f"{', '.join(meta['choices'])}")
        if meta["most"] is not None and value is not None:
            _positive(flag_of(f), value, meta["type"], most=meta["most"], why=meta["why"])
    for f in fields:
        owners, meta = f.metadata["owners"], f.metadata
        if owners and cfg.backend not in owners and getattr(cfg, f.name) != f.default:
            needs = f"it needs --backend {' or '.join(owners)}{meta['also']}"
            raise ConfigError(flag_of(f), f"{meta['purpose']}: {needs}" if meta["purpose"]
                              else needs.removeprefix("it "))
