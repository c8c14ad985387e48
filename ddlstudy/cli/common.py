"""What several subcommands share: refusing values below 1, durations, sizes (read by
``config.limits.size_bytes``, which study plans share), host counts."""

from __future__ import annotations

import argparse
import math

from ddlstudy.config.limits import most, why
from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError

BOUND = {"max_steps": "steps", "steps": "steps", "epochs": "epochs", "repeats": "repeats",
         "threads": "threads", "nodes": "nodes", "rounds": "rounds", "top": "top",
         "cores": "cores", "processes": "processes", "rows": "top",
         "check_epochs": "epochs"}
"""Which bound of ``config.limits`` each integer flag has."""


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a value below 1 of these integer options, or above its bound
    (``config.limits``); one not given, or that this subcommand lacks, passes."""
    for name in names:
        value = getattr(args, name, None)
        flag = f"--{name.replace('_', '-')}"
        if value is not None and value <= 0:
            raise ConfigError(flag, f"must be a positive integer, got {value}")
        if value is not None and value > most(BOUND[name]):
            raise ConfigError(flag, f"{value} is above the limit of {most(BOUND[name]):g}"
                              f"{why(BOUND[name])}")


def seconds(flag: str, text: str) -> float:
    """90, 90s, 2m or 1h as seconds."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower(), None)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(flag, f"{text!r}; give seconds, e.g. 120, 90s or 5m")
    if value > most("seconds"):
        raise ConfigError(flag, f"{text!r} is above the limit of {most('seconds'):g}"
                          f"{why('seconds')}")
    return value


def host_count(spec: str) -> int:
    """How many hosts a ``--hosts`` value names."""
    from ddlstudy import hosts

    prefix = hosts.emulated_prefix(spec)
    return hosts.load(prefix).count if prefix else len([h for h in spec.split(",") if h])


def add_what(parser: argparse.ArgumentParser) -> None:
    """The flags that say what a command trains: a use case, or a folder of one's own
    images, and a model."""
    parser.add_argument("--usecase", help="a use case name or TOML file (default: tiny, or "
                        "with --data-dir alone, that folder's: its classes are its class "
                        "folders)")
    parser.add_argument("--data-dir", type=path_arg, help="a folder of your own images "
                        "(root/<class>/<image>) instead of the use case's (default: none)")
    parser.add_argument("--model", help="the network instead of the use case's (`ddlstudy "
                        "models` lists them; default: the use case's)")
    parser.add_argument("--datasets-dir", type=path_arg, help="where the synthetic sets are "
                        "(default: datasets/ under $DDLSTUDY_HOME or the working directory)")


def usecase_of(args: argparse.Namespace) -> str | None:
    """The use case ``add_what``'s flags name: theirs, none with --data-dir alone (the
    folder's), else tiny."""
    given = getattr(args, "usecase", None)
    if given is not None:
        return given  # '' too: refused where it is read
    return None if getattr(args, "data_dir", None) else "tiny"
