"""The `ddlstudy` command.

    ddlstudy doctor                                       # what this machine offers
    ddlstudy dataset make --usecase simple-big            # datasets/synthetic-big/
    ddlstudy run --usecase tiny --strategy sequential     # runs/<id>/
    ddlstudy run --usecase simple-big --data-dir /path/to/imagefolder --epochs 2
    ddlstudy report runs/ --out report/                   # tables and figures
    ddlstudy study usecases/demo.toml --resume            # a whole matrix of runs
    ddlstudy advise --usecase tiny --nodes 1,2            # how to train it here
    ddlstudy study --from-advice runs/advise/advise.json  # run the top advice
    ddlstudy replay runs/<id>/manifest.json               # the same run again
    ddlstudy compare runs/<a> runs/<b>                    # what differs, by how much
    ddlstudy strategies                                   # what --strategy takes
    ddlstudy backends                                     # what --backend takes
    ddlstudy bench sampler --usecase tiny                 # sampler overhead

Bad input is reported as one sentence on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ddlstudy import __version__
from ddlstudy.cli import (
    advise,
    bench,
    dataset,
    hosts,
    listing,
    predict,
    report,
    run,
    study,
    usecase,
)
from ddlstudy.config.options import Parser
from ddlstudy.config.paths import HOME_PROBLEM
from ddlstudy.errors import UsageError
from ddlstudy.files import FREE, WriteFailed, full
from ddlstudy.logs import setup_logging
from ddlstudy.machine import collector, environment
from ddlstudy.records.runfolder import CHILD_ENV
from ddlstudy.redact import redact

COMMANDS = (run, dataset, usecase, listing, report, study, advise, hosts, predict, bench)
"""The modules of the subcommands, each registering its own parsers (``register``) and
the function each runs (``func``), in the order `ddlstudy --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ddlstudy", description=__doc__.split("\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddlstudy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand that has no description its one-line help as one, so that
    `ddlstudy doctor --help` says what doctor does; and every option's help its default
    where the help does not say it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                sub.description = sub.description or choice.help
                _describe(sub)
        elif action.option_strings and action.nargs != 0 and action.help and \
                action.default not in (None, argparse.SUPPRESS) and \
                "default" not in action.help:
            action.help += f" (default: {action.default})"


def said(exc: UsageError, most: int = 1000) -> str:
    """A refusal as one line of at most ``most`` characters (a value quoted in it can be
    any length: a list of 5,000 class names), a URI's secrets taken out."""
    text = redact(" ".join(str(exc).split("\n")))
    return text if len(text) <= most else f"{text[:most - 40]}... ({len(text)} characters)"


TRAINS = ("run", "replay")
"""The commands whose process trains (or launches what does): their start eases Python's
garbage collector until the first step (``machine.collector``)."""


def main(argv: list[str] | None = None) -> int:
    environment.use_huge_pages()  # before torch's first allocation
    # the clock of the manifest's first_step_s
    own = argv is None  # this process's own command line, not a call from Python
    environment.mark_command_start(own, launched=CHILD_ENV in os.environ)
    argv = sys.argv[1:] if own else argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"ddlstudy: error: {said(exc)}", file=sys.stderr)
        return 2
    args.argv = argv
    if own and args.command in TRAINS:
        collector.starting()
    setup_logging(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    try:
        if HOME_PROBLEM:
            raise UsageError(HOME_PROBLEM)
        return args.func(args)
    except UsageError as exc:
        print(f"ddlstudy: error: {said(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddlstudy: interrupted", file=sys.stderr)
        return 130
    except (OSError, WriteFailed) as exc:
        cause = exc.error if isinstance(exc, WriteFailed) else exc
        if not full(cause):
            raise
        print(f"ddlstudy: error: {said(exc) if isinstance(exc, WriteFailed) else disk_full(exc)}",
              file=sys.stderr)
        return 2


def disk_full(exc: OSError) -> str:
    """A full disk met outside the files ddlstudy writes whole (a data set's images,
    MLflow's store), in one line."""
    where = f" writing {exc.filename}" if exc.filename else ""
    return f"the disk is full{where} ({exc.strerror}); {FREE}"
