"""The ``ddlstudy run`` flags and the study plans' cell keys, read from the declarations.

A run option is a ``RunConfig`` field made with ``config.fields.option`` (or, for the use
case's training task, a ``TrainSpec`` field with a ``help``): this module turns those
fields into argparse arguments (help, type, default shown), into the keys a study plan's
cells may set, and parsed arguments back into a ``RunConfig``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

from ddlstudy.config.fields import DATA, NODES, OUTPUT, SPARK, TASK, WHAT
from ddlstudy.config.folders import usecase_of_folder
from ddlstudy.config.loading import load_usecase, with_overrides
from ddlstudy.config.run import RunConfig, options
from ddlstudy.config.usecase import TrainSpec
from ddlstudy.errors import ConfigError, UsageError

USECASE_DEFAULT = "tiny"
FOLDER_MODEL = "resnet18"
"""The model of a use case made of a folder alone (``--data-dir`` without ``--usecase``),
unless ``--model`` names another."""


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError("--stage-starts", f"{text!r}: give layer numbers separated by "
                          "commas, e.g. 0,9") from None


def path_arg(text: str) -> Path:
    """A path flag's value: an empty one is refused (Path("") would be the working
    directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a path, not an empty string")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(f"{text!r:.200} holds a control character (a "
                                         "newline, a tab); give a plain path")
    return Path(text)


PARSERS = {"layers": _layers}
"""Converters for flags whose text argparse cannot type by itself (errors name the flag)."""


def train_options() -> list[dataclasses.Field]:
    """The use case's [train] fields a flag may override."""
    return [f for f in dataclasses.fields(TrainSpec) if "help" in f.metadata]


def key(f: dataclasses.Field) -> str:
    """A field's study-plan key and argparse destination (``no_snapshot`` for snapshot)."""
    return f"no_{f.name}" if f.metadata.get("negate") else f.name


def flag(f: dataclasses.Field) -> str:
    return "--" + key(f).replace("_", "-")


def _shown_default(f: dataclasses.Field) -> str:
    default = f.default
    if f.metadata.get("type") is bool or "default" in f.metadata["help"]:
        return ""
    if default is None:
        return " (default: none)"
    if isinstance(default, Path):  # under the working directory or $DDLSTUDY_HOME
        default = f"{default.name}/ under $DDLSTUDY_HOME or the working directory"
    return f" (default: {default})"


def _add(group: argparse._ArgumentGroup, f: dataclasses.Field, default: str = "") -> None:
    meta = f.metadata
    kwargs: dict[str, Any] = {"dest": key(f), "default": None,
                              "help": meta["help"] + (default or _shown_default(f))}
    if meta.get("type") is bool:
        kwargs["action"] = "store_true"
        kwargs["default"] = False
    else:
        if meta.get("type") not in (None, str):
            kwargs["type"] = path_arg if meta["type"] is Path else meta["type"]
        if meta.get("choices"):
            kwargs["metavar"] = "{" + ",".join(meta["choices"]) + "}"
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
        if meta.get("const") is not None:  # the value may be left out
            kwargs |= {"nargs": "?", "const": meta["const"]}
    group.add_argument(flag(f), **kwargs)


GROUPS = (WHAT, NODES, TASK, SPARK, DATA, OUTPUT)
"""The order ``ddlstudy run --help`` shows the flags' groups in."""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Every run option as a flag, in its group."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    groups[WHAT].add_argument("--usecase", help="a name from usecases/ or a path to a TOML "
                              f"file (default: {USECASE_DEFAULT}; with --data-dir alone, "
                              "that folder's: its classes are its class folders, the model "
                              f"--model or {FOLDER_MODEL}, the task the flags')")
    for t in train_options():  # the use case's flags first in their group
        _add(groups[TASK], t, "" if "default" in t.metadata["help"] else
             " (default: the use case's)")
    for f in options():
        _add(groups[f.metadata["group"]], f)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one UsageError (one line, exit code 2, and
    within a study the plan and cell it came from) instead of printing its usage. A value
    that starts with a minus and a digit (``--link -5gbit``, ``--lr -1e-3``) is a value,
    refused by its own check, not taken for an unknown flag."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def run_parser() -> argparse.ArgumentParser:
    """A parser of the run options alone (a study's cells, checked as `ddlstudy run` would)."""
    parser = Parser(prog="ddlstudy run")
    add_run_options(parser)
    return parser


def cell_keys() -> set[str]:
    """The keys a study plan's cell (or its [settings]) may set: every run option but the
    use case and the runs folder, which the study sets itself."""
    return {key(f) for f in [*options(), *train_options()] if f.name != "runs_dir"}


def given_options(args: argparse.Namespace) -> list[str]:
    """The run flags given on the command line (not left at their parser default)."""
    return [a.option_strings[0] for a in run_parser()._actions
            if a.option_strings and a.dest != "help"
            and getattr(args, a.dest, a.default) != a.default]


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed ``ddlstudy run`` arguments (flags left out keep the use
    case's or the field's default). The strategy and backend are names here: their
    registries refuse an unknown one (``ddlstudy.runner.preflight``)."""
    if args.usecase is None and args.data_dir is not None:
        usecase = usecase_of_folder(Path(args.data_dir), FOLDER_MODEL)
    else:
        usecase = load_usecase(USECASE_DEFAULT if args.usecase is None else args.usecase)
    overrides = {f.name: getattr(args, f.name) for f in train_options()}
    try:
        usecase = with_overrides(usecase, **overrides)
    except ConfigError as exc:  # name the flag the user typed, not the TOML field
        name, _, inside = exc.field.removeprefix("train.").partition(".")  # a table's key
        flag = f"--{name.replace('_', '-')}" + (f" {inside}" if inside else "")
        raise ConfigError(flag, str(exc).split(": ", 1)[1]) from None
    kwargs: dict[str, Any] = {}
    for f in options():
        value = getattr(args, key(f))
        if f.metadata.get("negate"):
            value = not value
        elif value is None or (f.metadata.get("type") is bool and not value):
            continue
        elif f.metadata.get("parse"):
            value = PARSERS[f.metadata["parse"]](value)
        kwargs[f.name] = value
    return RunConfig(usecase=usecase, **kwargs)
