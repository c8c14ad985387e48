"""`ddlstudy doctor`, `strategies` and `backends`: what this machine and this install
offer."""

from __future__ import annotations

import argparse
import textwrap
from importlib.util import find_spec


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine offers the study, with fixes")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("strategies", help="list the local parallelism strategies")
    p.set_defaults(func=cmd_strategies)
    p = sub.add_parser("backends", help="list the backends: how nodes start and talk")
    p.set_defaults(func=cmd_backends)
    p = sub.add_parser("models", help="list what --model and a use case's [model] arch take")
    p.set_defaults(func=cmd_models)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ddlstudy.tools.doctor import doctor

    return doctor()


def cmd_strategies(args: argparse.Namespace) -> int:
    from ddlstudy.strategies import REGISTRY  # the classes import no torch

    for name, cls in REGISTRY.loaded().items():
        print(f"{name:14s} {cls.summary}")
        if cls.flags:
            print(f"{'':14s} flags: {cls.flags}")
        if cls.shards:
            print(f"{'':14s} shards: {cls.shards}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from ddlstudy.backends import REGISTRY  # imports torch: backends run workers

    for name, cls in REGISTRY.loaded().items():
        print(f"{name:14s} {cls.summary}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from ddlstudy.models.sources import torchvision_names  # imports torchvision

    print("the paper's: alexnet, vgg16 (a use case's [model] width scales them down)")
    print("torchvision's classification models, built with fresh weights (never downloaded):")
    print(textwrap.fill(", ".join(torchvision_names()), 88, initial_indent="  ",
                        subsequent_indent="  "))
    print("your own: path/to/file.py:FUNCTION or package.module:FUNCTION, called as "
          "FUNCTION(num_classes=N)")
    timm = "installed" if find_spec("timm") else "not installed (pip install timm)"
    print(f"timm's: timm:NAME ({timm})")
    return 0
