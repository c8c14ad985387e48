"""`ddlstudy bench`: performance figures, measured side by side."""

from __future__ import annotations

import argparse
import time

from ddlstudy.cli.common import add_what, check_positive, usecase_of
from ddlstudy.config import HEAPS
from ddlstudy.config.catalog import ADVICE_CHECK_EPOCHS, BENCH_GROUPS
from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError
from ddlstudy.files import check_folder

COLLECTIVE_FLOATS = 16 * 2**20
"""``bench collectives``' default buffer: 64 MiB of float32."""
ALONE = ("reduce", "collectives")
"""The subcommands that time no model (no use case, no data)."""


def register(sub) -> None:
    p = sub.add_parser("bench", help="performance figures, measured side by side")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    b = bsub.add_parser("sampler", help="step time with the sampler on against off")
    add_what(b)
    b.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=5, help="on/off alternations")
    b.add_argument("--hz", type=float, default=10.0, help="sampling rate when on")
    b.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    b = bsub.add_parser("reduce", help="every gradient-averaging algorithm under mpiexec")
    b.add_argument("--size", default="alexnet", help="a model's gradient (any name `ddlstudy "
                   "models` lists, 3 classes) or a number of floats")
    b.add_argument("--nodes", type=int, default=2, help="MPI ranks (default 2)")
    b.add_argument("--hosts", help="place them on emulated[:PREFIX] or host1,host2 "
                   "(default: this host)")
    b.add_argument("--repeats", type=int, default=5, help="timings per reducer")
    b = bsub.add_parser("collectives", help="all-reduce, reduce-scatter and all-gather "
                        "between this host's processes: its shared memory against gloo")
    b.add_argument("--size", default=str(COLLECTIVE_FLOATS), help="float32s of the full "
                   f"buffer (default {COLLECTIVE_FLOATS}: 64 MiB) or a model's gradient (any "
                   "name `ddlstudy models` lists, 3 classes)")
    b.add_argument("--processes", type=int, default=2, help="processes (default 2)")
    b.add_argument("--repeats", type=int, default=5, help="alternations of the two")
    b = bsub.add_parser("all", help="every figure in one go, as ratios: JSON and Markdown")
    add_what(b)
    b.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    b.add_argument("--repeats", type=int, default=3, help="alternations of each pair")
    b.add_argument("--only", help=f"comma-separated groups: {', '.join(BENCH_GROUPS)} "
                   "(default: all)")
    b.add_argument("--hosts", help="time the reducers on emulated[:PREFIX] or host1,host2 "
                   "(default: this host)")
    b.add_argument("--out", type=path_arg, help="where bench.json and bench.md go "
                   "(default runs/bench/<time>)")
    b = bsub.add_parser("advise", help="how right advise is: on a fixed set of layouts, "
                        "advise then its check, a row of errors a layout")
    b.add_argument("--only", help="comma-separated layouts: tiny, tiny-resnet, tiny-2h-1gbit, "
                   "tiny-3h-1gbit, tiny-2h-100mbit, tiny-3h-100mbit, own, tiny-full "
                   "(default: all)")
    b.add_argument("--rows", type=int, default=6, help="rows of each advice checked, spread "
                   "over its ranking (default 6)")
    b.add_argument("--rounds", type=int, help="each advice's most probe rounds (default: "
                   "advise's own)")
    b.add_argument("--check-epochs", type=int, default=ADVICE_CHECK_EPOCHS,
                   help="epochs of each check run, whose images/s is the median of its "
                   f"epochs' (default {ADVICE_CHECK_EPOCHS})")
    b.add_argument("--datasets-dir", type=path_arg, help="where tiny's data set is (made "
                   "there if missing; default: datasets/)")
    b.add_argument("--wait-quiet", action="store_true", help="each probe and check run waits "
                   "for a quiet host first")
    b.add_argument("--include-noisy", action="store_true", help="the checks count the runs "
                   "marked noisy (other processes kept the host busy), each marked")
    b.add_argument("--heap", choices=HEAPS, help="advise's --heap (default: return)")
    b.add_argument("--out", type=path_arg, help="where bench.json, bench.md and each "
                   "layout's advice and check go (default runs/bench/advise-<time>)")
    b = bsub.add_parser("overhead", help="ddlstudy's loop against a raw torch loop")
    add_what(b)
    b.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=3, help="alternations of the two loops")
    b.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    check_positive(args, "steps", "repeats", "threads", "nodes", "processes", "rows",
                   "rounds", "check_epochs")
    if args.bench_command == "advise":
        return _bench_advise(args)
    hz = getattr(args, "hz", 1.0)
    if not 0 < hz <= 100:  # NaN too
        raise ConfigError("--hz", f"must be a rate above 0 and at most 100, got {hz}")
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.config.catalog import bench_groups

    groups = bench_groups(args.only) if args.bench_command == "all" else []
    from ddlstudy.machine.sampler import check_load
    from ddlstudy.tools.bench.ratios import gradient_floats

    out = getattr(args, "out", None) or DEFAULT_RUNS_DIR / "bench" / time.strftime(
        "%Y%m%d-%H%M%S")
    if args.bench_command == "all":
        check_folder("--out", out)  # before minutes of measuring, not after
    if args.bench_command in ALONE:
        gradient_floats(args.size)  # refused before the host's load is measured
    from ddlstudy.tools.bench.ratios import What, bench_overhead, bench_reduce, bench_sampler

    what = What(usecase_of(args), getattr(args, "data_dir", None),
                getattr(args, "model", None), getattr(args, "datasets_dir", None))
    if args.bench_command not in ALONE:
        what.config()  # what cannot train is refused alone, before the load is said
    if getattr(args, "hosts", None) is not None:
        from ddlstudy.backends.mpi.launch import placement

        placement(args.hosts, 2)  # hosts that are not up: refused before measuring
    check_load()  # figures measured on a busy host say little: say so first
    if args.bench_command == "all":
        from ddlstudy.tools.bench import suite

        result = suite.bench_all(what, args.steps, args.repeats, groups, args.hosts)
        print(suite.markdown(result))
        for path in suite.write(result, out):
            print(f"wrote {path}")
    elif args.bench_command == "reduce":
        print(bench_reduce(args.size, args.nodes, args.repeats, args.hosts))
    elif args.bench_command == "collectives":
        from ddlstudy.tools.bench.collectives import bench_collectives

        print(bench_collectives(args.size, args.processes, args.repeats))
    elif args.bench_command == "sampler":
        print(bench_sampler(what, steps=args.steps, repeats=args.repeats, hz=args.hz,
                            threads=args.threads))
    else:
        print(bench_overhead(what, steps=args.steps, repeats=args.repeats,
                             threads=args.threads))
    return 0


def _bench_advise(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.machine.sampler import check_load
    from ddlstudy.tools.bench import advise

    only = advise.names(args.only)
    out = args.out or DEFAULT_RUNS_DIR / "bench" / time.strftime("advise-%Y%m%d-%H%M%S")
    check_folder("--out", out)
    if out.is_dir() and any(out.iterdir()):  # its advices and checks would be taken as new
        raise ConfigError("--out", f"{out} holds files already (an earlier bench?): give a "
                          "new or empty folder")
    check_load(args.wait_quiet)
    result = advise.bench_advise(only, out, args.rows, args.datasets_dir,
                                 args.wait_quiet, args.rounds, args.include_noisy,
                                 args.check_epochs, args.heap)
    print(advise.markdown(result))
    for path in advise.write(result, out):
        print(f"wrote {path}")
    return 0
