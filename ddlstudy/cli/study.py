"""`ddlstudy study`: a plan of use cases x configurations x repeats, one run each."""

from __future__ import annotations

import argparse

from ddlstudy.cli.common import check_positive
from ddlstudy.config.options import path_arg
from ddlstudy.errors import UsageError
from ddlstudy.machine.sampler import NOISY_CORES, WAIT_MOST_S

JOB_OPTIONS = {"partition": "the jobs' partition (default: the cluster's)",
               "account": "the account the jobs are charged to (default: yours)",
               "time": "each job's time limit, e.g. 1:00:00 (default: the partition's)"}
"""The options of every Slurm job of a study (sbatch's flags of the same names)."""


EXIT_CODES = ("exit codes: 0 every cell completed (with --submit slurm: every cell "
              "submitted; with --resume of a submitted study: none failed, though some may "
              "still wait); 1 a cell failed, and the others ran (its reason is in the table, "
              "in study.json and in logs/; --resume --resubmit, or --resume here, runs it "
              "again); 2 refused before anything ran or was written (one line says why); 130 "
              "interrupted (Ctrl-C, or a cell's run interrupted): --resume goes on")


def register(sub) -> None:
    p = sub.add_parser("study", help="run a study plan: use cases x configurations x repeats",
                       epilog=EXIT_CODES)
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
    p.add_argument("--include-noisy", action="store_true", help="count the runs marked noisy "
                   "(other processes kept the host busy) in the report and in an advice's "
                   "check, each marked (default: left out, and counted)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p.add_argument("--submit", choices=["slurm"], help="submit every cell as a Slurm job "
                   "(a batch script each, kept in <runs dir>/slurm) and return; --resume then "
                   "shows where they stand and writes the report once all are done")
    for name, what in JOB_OPTIONS.items():
        p.add_argument(f"--{name}", help=f"with --submit slurm: {what}")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="with --submit slurm: one more #SBATCH line of every job, e.g. "
                   "--sbatch-arg=--mem=8G (repeatable)")
    p.add_argument("--warn-before", type=int, metavar="SECONDS", help="with --submit slurm: "
                   "Slurm warns each job this long before its time limit (--signal=B:USR1@"
                   "SECONDS): its run writes a snapshot at its next step and the job is "
                   "requeued, to continue from it (default: no warning)")
    p.add_argument("--resubmit", action="store_true", help="with --resume of a study "
                   "submitted to Slurm: submit its failed cells (and cells it lacks) again")

    p.add_argument("--from-advice", type=path_arg, metavar="ADVISE_JSON", help="instead of a "
                   "plan: run the top recommendations of `ddlstudy advise` (and the baseline)"
                   " and check its first place against what they measure (default: none)")
    p.add_argument("--top", type=int, default=3, help="with --from-advice: how many of its "
                   "recommendations to run")
    p.add_argument("--spread", action="store_true", help="with --from-advice: take the --top "
                   "rows spread over the whole ranking (the first two, then evenly down to the "
                   "last), so that the check measures the ranking, not only its head")
    p.set_defaults(func=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    from ddlstudy.records.plan import configs, load_plan

    check_positive(args, "epochs", "max_steps", "top")
    if args.spread and args.from_advice is None:
        raise UsageError("--spread picks the rows of an advice: give it with --from-advice")
    overrides = {name: getattr(args, name) for name in ("epochs", "max_steps")
                 if getattr(args, name) is not None}
    sbatch = _sbatch(args)
    if (args.plan is None) == (args.from_advice is None):
        raise UsageError("give a study plan (e.g. usecases/demo.toml) or --from-advice "
                         "advise.json, one of them")
    if args.from_advice is not None:
        from ddlstudy.records.advised import advice_plan

        plan = advice_plan(args.from_advice, args.top, args.repeat, args.runs_dir,
                           args.spread)
    else:
        plan = load_plan(args.plan, args.repeat, args.runs_dir)
    # A bad plan or cell is refused before torch is imported.
    checked = configs(plan, overrides)
    if args.submit or args.resubmit:
        from ddlstudy.hosts.slurm import require_client
        from ddlstudy.study.jobscript import ask_controller
        from ddlstudy.study.slurm import no_secret

        no_secret(checked)
        require_client()
        ask_controller(sbatch)  # the controller's word on the jobs' options
    from ddlstudy.study.slurm import slurm_study, submitted

    if args.submit or args.resubmit or submitted(plan.runs_dir):  # its jobs: never run here
        return slurm_study(plan, resume=args.resume, resubmit=args.resubmit, sbatch=sbatch,
                           overrides=overrides, fmt=args.format,
                           include_noisy=args.include_noisy)
    from ddlstudy.study.matrix import study

    return study(plan, resume=args.resume, overrides=overrides, fmt=args.format,
                 wait_quiet=args.wait_quiet, include_noisy=args.include_noisy)


def _sbatch(args: argparse.Namespace):
    """The jobs' options (--partition, --account, --time, --sbatch-arg, --warn-before),
    refused where no job is submitted, or where one would not fit on an #SBATCH line."""
    from ddlstudy.study.jobscript import Sbatch

    given = [f"--{n.replace('_', '-')}" for n in ("partition", "account", "time", "sbatch_arg",
                                                  "warn_before")
             if getattr(args, n) is not None and getattr(args, n) != []]
    if args.resubmit and not args.resume:
        raise UsageError("--resubmit goes with --resume (of a study submitted with --submit "
                         "slurm)")
    if args.submit and args.resume:
        raise UsageError("--submit slurm submits a new study's jobs, --resume reads where a "
                         "submitted study's jobs stand; give one of them")
    if given and not (args.submit or args.resubmit):
        raise UsageError(f"{', '.join(given)}: an option of Slurm jobs; give it with "
                         "--submit slurm or --resume --resubmit")
    if args.wait_quiet and (args.submit or args.resubmit):
        raise UsageError("--wait-quiet waits for this host before each cell; a study "
                         "submitted to Slurm runs its cells elsewhere: leave it out")
    return Sbatch(args.partition, args.account, args.time, tuple(args.sbatch_arg),
                  args.warn_before)
