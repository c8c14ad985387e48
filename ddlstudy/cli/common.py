"""What several subcommands share: refusing values below 1, durations, sizes, host counts."""

from __future__ import annotations

import argparse
import math
import re

from ddlstudy.config.limits import most, why
from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError

BOUND = {"max_steps": "steps", "steps": "steps", "epochs": "epochs", "repeats": "repeats",
         "threads": "threads", "nodes": "nodes", "rounds": "rounds", "top": "top",
         "cores": "cores", "processes": "processes"}
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


UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
         "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
         "tib": 2**40}
"""--memory's units: SI (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB), any case."""


def size_bytes(flag: str, text: str) -> int:
    """``text`` (1GiB, 512MiB, 2.5GB, 3000000) as bytes; ConfigError where it is not one."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    value = float(found[1]) * UNITS[found[2]] if found and found[2] in UNITS else math.nan
    if not math.isfinite(value) or value < 1 or value > 2**60:
        raise ConfigError(flag, f"{text!r}; give a size a node may use, e.g. 1GiB, 512MiB "
                          "or 2.5GB")
    return int(value)


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
