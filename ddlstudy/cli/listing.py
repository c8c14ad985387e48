"""`ddlstudy doctor`, `strategies` and `backends`: what this machine and this install
offer."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine offers the study, with fixes")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("strategies", help="list the local parallelism strategies")
    p.set_defaults(func=cmd_strategies)
    p = sub.add_parser("backends", help="list the backends: how nodes start and talk")
    p.set_defaults(func=cmd_backends)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ddlstudy.tools.doctor import doctor

    return doctor()


def cmd_strategies(args: argparse.Namespace) -> int:
    from ddlstudy.strategies import REGISTRY  # the classes import no torch

    for name, cls in REGISTRY.loaded().items():
        print(f"{name:14s} {cls.summary}")
        if cls.flags:
            print(f"{'':14s} flags: {cls.flags}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from ddlstudy.backends import REGISTRY  # imports torch: backends run workers

    for name, cls in REGISTRY.loaded().items():
        print(f"{name:14s} {cls.summary}")
    return 0
