"""`ddlstudy study`: a plan of use cases x configurations x repeats, one run each."""

from __future__ import annotations

import argparse

from ddlstudy.cli.common import check_positive
from ddlstudy.config.options import path_arg
from ddlstudy.errors import UsageError
from ddlstudy.sampler import NOISY_CORES, WAIT_MOST_S


def register(sub) -> None:
    p = sub.add_parser("study", help="run a study plan: use cases x configurations x repeats")
    p.add_argument("plan", type=path_arg, nargs="?", help="a study plan TOML, e.g. "
                   "usecases/demo.toml, or "
                   "the name of one shipped with ddlstudy (demo, paper, ...)")
    p.add_argument("--repeat", type=int, help="repeats of every cell, interleaved (default: "
                   "the plan's repeat, else 3)")
    p.add_argument("--resume", action="store_true",
                   help="reuse this study's completed runs whose configuration matches")
    p.add_argument("--runs-dir", type=path_arg, help="default: the plan's, or runs/<name>")
    p.add_argument("--epochs", type=int, help="override every cell's epochs (default: the "
                   "plan's)")
    p.add_argument("--max-steps", type=int, help="override every cell's steps per epoch "
                   "(default: the plan's)")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex"],
                   help="how the tables are printed")
    p.add_argument("--wait-quiet", action="store_true", help="before each cell, wait until "
                   f"other processes use at most {NOISY_CORES} cores of this host (at most "
                   f"{WAIT_MOST_S:.0f} s)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p.add_argument("--from-advice", type=path_arg, metavar="ADVISE_JSON", help="instead of a "
                   "plan: run the top recommendations of `ddlstudy advise` (and the baseline)"
                   " and check its first place against what they measure (default: none)")
    p.add_argument("--top", type=int, default=3, help="with --from-advice: how many of its "
                   "recommendations to run")
    p.set_defaults(func=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    from ddlstudy.plan import configs, load_plan

    check_positive(args, "epochs", "max_steps", "top")
    overrides = {name: getattr(args, name) for name in ("epochs", "max_steps")
                 if getattr(args, name) is not None}
    if (args.plan is None) == (args.from_advice is None):
        raise UsageError("give a study plan (e.g. usecases/demo.toml) or --from-advice "
                         "advise.json, one of them")
    if args.from_advice is not None:
        from ddlstudy.plan import advice_plan

        plan = advice_plan(args.from_advice, args.top, args.repeat, args.runs_dir)
    else:
        plan = load_plan(args.plan, args.repeat, args.runs_dir)
    # A bad plan or cell is refused before torch is imported.
    configs(plan, overrides)
    from ddlstudy.study import study

    return study(plan, resume=args.resume, overrides=overrides, fmt=args.format,
                 wait_quiet=args.wait_quiet)
