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
    ddlstudy bench sampler --usecase tiny                 # sampler overhead

Bad input is reported as one sentence on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path

from ddlstudy import __version__, environment
from ddlstudy.config.catalog import BENCH_GROUPS
from ddlstudy.config.options import Parser, add_run_options
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.logs import setup_logging
from ddlstudy.progress import on_terminal
from ddlstudy.runfolder import CHILD_ENV
from ddlstudy.sampler import NOISY_CORES, WAIT_MOST_S
from ddlstudy.sparkjvm import start_early

log = logging.getLogger("ddlstudy")
PREPARING_NOTICE_S = 1.0
"""A run not started (nor refused) this long after the command says it is preparing."""


# --- argument parsing -------------------------------------------------------------------

def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n such as 0/4, got {text!r}") from None
    if n <= 0 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= i < n, got {text!r}")
    return i, n


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ddlstudy", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddlstudy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="train one use case with one strategy into runs/<id>/")
    add_run_options(p)
    faults = p.add_argument_group("faults")
    faults.add_argument("--resume", type=Path, metavar="RUN", help="continue runs/<id> from "
                        "its last snapshot, with its recorded configuration (default: a new "
                        "run)")
    faults.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="when a worker dies, restart from the last snapshot up to N "
                        "times (default 0)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p = sub.add_parser("dataset", help="synthetic data sets")
    dsub = p.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")
    make = dsub.add_parser("make", help="generate a use case's synthetic data set")
    make.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    make.add_argument("--out", type=Path, help="target folder (default: datasets/<data.name>)")
    make.add_argument("--shard", type=_shard, help="only images with index %% n == i, as i/n "
                      "(default: all)")
    make.add_argument("--workers", type=int, help="generator processes (default: cores)")
    make.add_argument("--force", action="store_true", help="regenerate even if complete")

    sub.add_parser("doctor", help="what this machine offers the study, with fixes")
    sub.add_parser("strategies", help="list the local parallelism strategies")

    p = sub.add_parser("report", help="speedup tables (and figures) of a folder of runs")
    p.add_argument("runs", type=Path, nargs="?", default=None, help="default: runs/")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex"],
                   help="how the tables are printed")
    p.add_argument("--out", type=Path, help="also write the tables, runs.csv and the figures "
                   "into this folder (default: print only)")
    p.add_argument("--no-figures", action="store_true", help="with --out: tables only")
    p.add_argument("--include-noisy", action="store_true", help="count runs marked noisy "
                   "(other processes used their host) in medians and speedups")

    p = sub.add_parser("study", help="run a study plan: use cases x configurations x repeats")
    p.add_argument("plan", type=Path, nargs="?", help="a study plan TOML, e.g. "
                   "usecases/demo.toml, or "
                   "the name of one shipped with ddlstudy (demo, paper, ...)")
    p.add_argument("--repeat", type=int, help="repeats of every cell, interleaved (default: "
                   "the plan's repeat, else 3)")
    p.add_argument("--resume", action="store_true",
                   help="reuse this study's completed runs whose configuration matches")
    p.add_argument("--runs-dir", type=Path, help="default: the plan's, or runs/<name>")
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

    p.add_argument("--from-advice", type=Path, metavar="ADVISE_JSON", help="instead of a "
                   "plan: run the top recommendations of `ddlstudy advise` (and the baseline)"
                   " and check its first place against what they measure (default: none)")
    p.add_argument("--top", type=int, default=3, help="with --from-advice: how many of its "
                   "recommendations to run")

    p = sub.add_parser("advise", help="how to train a use case here: probes every local "
                       "strategy, measures the exchange, predicts and ranks")
    p.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    p.add_argument("--nodes", help="node counts to rank (default: 1,2,4; with --hosts, 1 "
                   "up to the hosts given)")
    p.add_argument("--hosts", help="where the nodes will run (emulated[:PREFIX] or "
                   "host1,host2): the exchange is measured there (default: this host)")
    p.add_argument("--link", help="instead of measuring hosts: predict separate machines "
                   "like this one joined by a link of this rate, e.g. 10gbit (default: none, "
                   "measure where the nodes are)")
    p.add_argument("--budget", default="120s", help="time for the whole advice, e.g. 90s or "
                   "5m; more probe rounds while it lasts")
    p.add_argument("--runs", type=Path, help="earlier runs of the use case: rank by "
                   "predicted time to its target accuracy, weighing what changes "
                   "convergence by the epochs it took there (default: none, rank by images/s)")
    p.add_argument("--rounds", type=int, default=3, help="most probe rounds")
    p.add_argument("--steps", type=int, default=24, help="steady steps a probe times")
    p.add_argument("--wait-quiet", action="store_true", help="before each probe, wait until "
                   f"other processes use at most {NOISY_CORES} cores of this host (at most "
                   f"{WAIT_MOST_S:.0f} s; not charged to the budget). Without it, probes "
                   "on a busy host are still marked and not counted where a quiet one came")
    p.add_argument("--datasets-dir", type=Path, help="where the synthetic sets are "
                   "(default: datasets/)")
    p.add_argument("--out", type=Path, help="where advise.json, advise.md and the probes' "
                   "runs go (default: runs/advise/<usecase>)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p = sub.add_parser("replay", help="run a manifest again: same config, seeds and data")
    p.add_argument("manifest", type=Path, help="runs/<id>/manifest.json or runs/<id>")
    p.add_argument("--runs-dir", type=Path, help="where the new run goes (default: the "
                   "original's runs folder)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p = sub.add_parser("export", help="runs in other tools' formats")
    esub = p.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    e = esub.add_parser("tensorboard", help="per-epoch metrics and resource samples as "
                        "TensorBoard scalars, one TensorBoard run per ddlstudy run")
    e.add_argument("runs", type=Path, help="a run folder or a folder of runs")
    e.add_argument("--out", type=Path, required=True, help="the log folder to give "
                   "`tensorboard --logdir`")

    p = sub.add_parser("compare", help="what differs between two runs, and by how much")
    p.add_argument("a", type=Path, help="a run folder or its manifest.json")
    p.add_argument("b", type=Path, help="the other run folder or manifest.json")

    p = sub.add_parser("hosts", help="emulated hosts (network namespaces) for multi-host runs")
    hsub = p.add_subparsers(dest="hosts_command", required=True, metavar="WHAT")
    h = hsub.add_parser("up", help="create N hosts joined by a bridge (root, iproute2)")
    h.add_argument("--count", type=int, default=2, help="hosts (default 2)")
    h.add_argument("--delay", help="one-way delay added on every host's link, e.g. 2ms "
                   "(default: none)")
    h.add_argument("--rate", help="bandwidth of every host's link, e.g. 1gbit (default: "
                   "unlimited)")
    h.add_argument("--cpus", help="CPU time per host in cores, e.g. 1,0.5 for unequal nodes "
                   "(default: unlimited)")
    h.add_argument("--subnet", default="10.77.0", help="their /24 (default 10.77.0)")
    hsub.add_parser("down", help="remove the hosts and what runs on them")
    hsub.add_parser("status", help="the hosts that are up, their links and Spark daemons")
    h = hsub.add_parser("spark", help="a Spark standalone master on host 1 and a worker on "
                        "each")
    h.add_argument("--cores", type=int, default=1, help="task slots per worker (default 1)")
    for h in hsub.choices.values():
        h.add_argument("--prefix", default="ddl", help="names the set (default ddl)")

    p = sub.add_parser("predict", help="alpha-beta model fitted from runs: 1 to 256 nodes")
    p.add_argument("runs", type=Path, help="a folder holding a one-node run (and multi-node "
                   "MPI runs to check the model against)")
    p.add_argument("--hosts", help="where the runs' ranks ran (emulated[:PREFIX] or "
                   "host1,host2): the reducers are timed there (default: this host)")
    p.add_argument("--nodes", default=",".join(map(str, (1, 2, 3, 4, 8, 16, 32, 64, 128, 256))),
                   help="node counts to predict (default 1,2,3,4,8,...,256)")
    p.add_argument("--links", default="1gbit,10gbit,25gbit",
                   help="link rates to predict besides the measured one")
    p.add_argument("--batches", help="global batches (default: the runs' batch)")
    p.add_argument("--repeats", type=int, default=5, help="timings per reducer and size")
    p.add_argument("--out", type=Path, help="where predict.{json,md,png,svg} go "
                   "(default RUNS/predict)")

    p = sub.add_parser("bench", help="performance figures, measured side by side")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    b = bsub.add_parser("sampler", help="step time with the sampler on against off")
    b.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    b.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=5, help="on/off alternations")
    b.add_argument("--hz", type=float, default=10.0, help="sampling rate when on")
    b.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    b = bsub.add_parser("reduce", help="every gradient-averaging algorithm under mpiexec")
    b.add_argument("--size", default="alexnet", help="alexnet, vgg16 or a number of floats")
    b.add_argument("--nodes", type=int, default=2, help="MPI ranks (default 2)")
    b.add_argument("--hosts", help="place them on emulated[:PREFIX] or host1,host2 "
                   "(default: this host)")
    b.add_argument("--repeats", type=int, default=5, help="timings per reducer")
    b = bsub.add_parser("all", help="every figure in one go, as ratios: JSON and Markdown")
    b.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    b.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    b.add_argument("--repeats", type=int, default=3, help="alternations of each pair")
    b.add_argument("--only", help=f"comma-separated groups: {', '.join(BENCH_GROUPS)} "
                   "(default: all)")
    b.add_argument("--hosts", help="time the reducers on emulated[:PREFIX] or host1,host2 "
                   "(default: this host)")
    b.add_argument("--datasets-dir", type=Path, help="where the synthetic sets are "
                   "(default: datasets/ under $DDLSTUDY_HOME or the working directory)")
    b.add_argument("--out", type=Path, help="where bench.json and bench.md go "
                   "(default runs/bench/<time>)")
    b = bsub.add_parser("overhead", help="ddlstudy's loop against a raw torch loop")
    b.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    b.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=3, help="alternations of the two loops")
    b.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
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


# --- commands ---------------------------------------------------------------------------

def _check_positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a value below 1 of these integer options (one not given, or that this
    subcommand lacks, passes)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}",
                              f"must be a positive integer, got {value}")


def cmd_run(args: argparse.Namespace) -> int:
    if args.max_restarts < 0:
        raise ConfigError("--max-restarts", f"must be 0 or more, got {args.max_restarts}")
    if args.resume is not None:
        from ddlstudy.config.options import given_options
        from ddlstudy.manifests import resume_config

        given = given_options(args)
        if given:
            raise ConfigError("--resume", f"continues a run with its recorded configuration, "
                              f"so {given[0]} would be ignored; leave it out (or start a new "
                              f"run, or `ddlstudy replay` one)")

        return train(resume_config(args.resume), args.argv, args.resume, args.max_restarts)
    from ddlstudy.config.options import config_from_args

    return train(config_from_args(args), args.argv, max_restarts=args.max_restarts)


def train(cfg, argv: list[str], resume: Path | None = None, max_restarts: int = 0) -> int:
    """Run ``cfg`` (launching mpiexec for --backend mpi) and print where it went; with
    ``max_restarts``, a run that failed after a snapshot continues from it."""

    # The imports below take seconds: on a terminal, say what is going on, unless a
    # refusal came first (a refusal stays one line; logs and pipes get no notice at all).
    notice = threading.Timer(PREPARING_NOTICE_S, log.info, args=(
        "preparing %s on %s (importing torch, checking the data) ...", cfg.strategy,
        cfg.usecase.name))
    notice.daemon = True
    if CHILD_ENV not in os.environ and on_terminal():
        notice.start()
    if resume is None:  # a Spark run's JVM and context start beside those imports
        start_early(cfg)
    try:
        return _train(cfg, argv, resume, max_restarts)
    finally:
        notice.cancel()


def _train(cfg, argv: list[str], resume: Path | None, max_restarts: int) -> int:
    from ddlstudy.runfolder import SNAPSHOT, RunFolder
    from ddlstudy.runner import RunFailed, start

    restarts = 0
    while True:
        try:
            folder = start(cfg, argv, resume)
            break
        except RunFailed as exc:
            restartable = (exc.folder is not None and exc.exit_code not in (2, 130, 143)
                           and (exc.folder.path / SNAPSHOT).is_file())
            if restarts >= max_restarts or not restartable:
                print(f"ddlstudy: {exc}", file=sys.stderr)
                return exc.exit_code
            restarts += 1
            resume = exc.folder.path
            argv = ["run", "--resume", str(resume), *(["--quiet"] if "--quiet" in argv else [])]
            log.warning("%s; restarting from its last snapshot (restart %d of %d)", exc,
                        restarts, max_restarts)
    if not isinstance(folder, RunFolder) or os.environ.get(CHILD_ENV):
        return 0  # other MPI ranks stay quiet; under our own launcher, the launcher reports
    summary = folder.manifest.get("summary", {})
    print(f"{folder.path}  val accuracy {summary.get('final_val_accuracy', float('nan')):.3f}  "
          f"{summary.get('median_images_per_s', float('nan')):.1f} img/s"
          f"{_reached(folder.manifest.get('time_to_target') or {})}")
    return 0


def _reached(tta: dict) -> str:
    """The run's time to accuracy, as its last line says it."""
    if tta.get("reached") is True:
        return f"  target {tta['target']:.2f} reached in {tta['seconds']:.1f} s " \
               f"(epoch {tta['epoch']})"
    if tta.get("reached") is False:
        return f"  target {tta['target']:.2f} not reached"
    return ""


def cmd_dataset(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_DATASETS_DIR, load_usecase
    from ddlstudy.data.generate import CLASSES, is_complete, make_dataset

    spec = load_usecase(args.usecase).data
    out = args.out or DEFAULT_DATASETS_DIR / spec.name
    if args.shard and not args.out:
        out = out.with_name(f"{out.name}.shard-{args.shard[0]}-of-{args.shard[1]}")
    if args.workers is not None and not 0 < args.workers <= 64:
        raise ConfigError("--workers", f"must be 1 to 64 generator processes, got "
                          f"{args.workers}")
    from ddlstudy.files import check_folder

    check_folder("--out" if args.out else "--datasets-dir", out)
    if is_complete(out, spec, args.shard) and not args.force:
        print(f"{out}: already complete ({spec.name}; --force makes it again)")
        return 0
    start = time.perf_counter()
    root = make_dataset(spec, out, shard=args.shard, workers=args.workers, force=args.force)
    images = sum(1 for p in root.rglob("*") if p.suffix in (".png", ".jpg", ".jpeg"))
    print(f"{root}: {images} images of {spec.source_size} px in {len(CLASSES)} classes "
          f"({', '.join(CLASSES)}), made in {time.perf_counter() - start:.1f} s")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ddlstudy.tensorboard import export

    written = export(args.runs, args.out)
    print(f"{len(written)} run(s) written to {args.out}; view them with "
          f"`tensorboard --logdir {args.out}`")
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from ddlstudy.strategies import REGISTRY  # the classes import no torch

    for name, cls in REGISTRY.loaded().items():
        print(f"{name:14s} {cls.summary}")
        if cls.flags:
            print(f"{'':14s} flags: {cls.flags}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ddlstudy.tools.doctor import doctor

    return doctor()


def cmd_report(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.files import check_folder
    from ddlstudy.report import Report

    if args.out:
        check_folder("--out", args.out)
    report = Report(args.runs or DEFAULT_RUNS_DIR, include_noisy=args.include_noisy)
    print(report.text(args.format))
    if args.out:
        paths = report.write(args.out, args.format, figures=not args.no_figures)
        print(f"\n{len(paths)} files written to {args.out}", file=sys.stderr)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from ddlstudy.plan import configs, load_plan

    _check_positive(args, "epochs", "max_steps", "top")
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


def _seconds(flag: str, text: str) -> float:
    """90, 90s, 2m or 1h as seconds."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower(), None)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(flag, f"{text!r}; give seconds, e.g. 120, 90s or 5m")
    return value


def cmd_advise(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR, load_usecase
    from ddlstudy.tools.predict import parse_list

    uc = load_usecase(args.usecase)  # an unknown use case is refused before anything runs
    budget = _seconds("--budget", args.budget)
    _check_positive(args, "rounds", "steps")
    if args.link is not None:
        from ddlstudy.hosts import rate_bits

        if args.hosts is not None:
            raise ConfigError("--link", "give --hosts (the exchange measured there) or "
                              "--link (predicted for that rate), not both")
        rate_bits(args.link, "--link")
    if args.runs is not None:
        from ddlstudy.report.tables import runs_folder

        runs_folder(args.runs)
    count = None
    if args.hosts is not None:
        from ddlstudy.backends.mpi.launch import placement

        placement(args.hosts, 2)  # hosts that are not up: refused before probing
        count = _host_count(args.hosts)
    nodes = parse_list("--nodes", args.nodes) if args.nodes else \
        list(range(1, count + 1)) if count else [1, 2, 4]
    from ddlstudy.tools import advise

    out = args.out or DEFAULT_RUNS_DIR / "advise" / uc.name
    result = advise.advise(args.usecase, nodes, args.hosts, args.link, budget, out,
                           runs=args.runs, rounds=args.rounds, steps=args.steps,
                           datasets_dir=args.datasets_dir, host_count=count,
                           wait=args.wait_quiet)
    print(advise.markdown(result))
    for path in advise.write(result, out):
        print(f"wrote {path}")
    return 0


def _host_count(spec: str) -> int:
    """How many hosts a ``--hosts`` value names."""
    from ddlstudy import hosts

    prefix = hosts.emulated_prefix(spec)
    return hosts.load(prefix).count if prefix else len([h for h in spec.split(",") if h])


def cmd_replay(args: argparse.Namespace) -> int:
    from ddlstudy.manifests import config_from_manifest, differences, read_manifest

    manifest = read_manifest(args.manifest)
    runs_dir = args.runs_dir or Path(manifest["path"]).parent
    cfg = config_from_manifest(manifest, runs_dir)
    for line in differences(manifest):
        log.warning("replay of %s differs: %s", manifest.get("id"), line)
    return train(cfg, args.argv)


def cmd_compare(args: argparse.Namespace) -> int:
    from ddlstudy.manifests import compare, read_manifest

    print(compare(read_manifest(args.a), read_manifest(args.b)))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    _check_positive(args, "steps", "repeats", "threads", "nodes")
    hz = getattr(args, "hz", 1.0)
    if not 0 < hz <= 100:  # NaN too
        raise ConfigError("--hz", f"must be a rate above 0 and at most 100, got {hz}")
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.config.catalog import bench_groups

    groups = bench_groups(args.only) if args.bench_command == "all" else []
    from ddlstudy.sampler import check_load

    check_load()  # figures measured on a busy host say little: say so first
    from ddlstudy.tools.bench import bench_overhead, bench_reduce, bench_sampler

    if args.bench_command == "all":
        from ddlstudy.tools import bench_all

        result = bench_all.bench_all(args.usecase, args.steps, args.repeats, groups,
                                     args.hosts, args.datasets_dir)
        print(bench_all.markdown(result))
        out = args.out or DEFAULT_RUNS_DIR / "bench" / time.strftime("%Y%m%d-%H%M%S")
        for path in bench_all.write(result, out):
            print(f"wrote {path}")
    elif args.bench_command == "reduce":
        print(bench_reduce(args.size, args.nodes, args.repeats, args.hosts))
    elif args.bench_command == "sampler":
        print(bench_sampler(args.usecase, steps=args.steps, repeats=args.repeats, hz=args.hz,
                            threads=args.threads))
    else:
        print(bench_overhead(args.usecase, steps=args.steps, repeats=args.repeats,
                             threads=args.threads))
    return 0


def cmd_hosts(args: argparse.Namespace) -> int:
    from ddlstudy import hosts

    if args.hosts_command == "up":
        made = hosts.up(args.count, args.prefix, args.subnet, args.delay, args.rate,
                        hosts.parse_cpus(args.cpus))
        link = ", ".join(x for x in (made.delay and f"delay {made.delay}",
                                     made.rate and f"rate {made.rate}",
                                     made.cpus and f"cpus {args.cpus}") if x) or "unshaped"
        print(f"{made.count} hosts up ({link}): "
              + ", ".join(f"{n} {a}" for n, a in made.members))
        flag = "emulated" if args.prefix == hosts.DEFAULT_PREFIX else f"emulated:{args.prefix}"
        print(f"  MPI:   ddlstudy run ... --backend mpi --nodes {made.count} --hosts {flag}")
        named = "" if flag == "emulated" else f" --prefix {args.prefix}"
        print(f"  Spark: ddlstudy hosts spark{named}, then --backend spark --spark-master "
              f"{made.spark_master} --spark-secret-file {hosts.spark_secret_file(made.prefix)}")
    elif args.hosts_command == "down":
        hosts.down(args.prefix)
        print(f"hosts {args.prefix}-h* removed")
    elif args.hosts_command == "spark":
        _check_positive(args, "cores")
        up = hosts.load(args.prefix)
        master = hosts.spark_up(up, cores=args.cores)
        print(f"Spark master {master} with {up.count} worker(s) of {args.cores} core(s); "
              f"run with --backend spark --spark-master {master} --spark-secret-file "
              f"{hosts.spark_secret_file(up.prefix)}")
    else:
        up = hosts.load(args.prefix)
        print(hosts.status(up))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from ddlstudy.report.tables import runs_folder

    runs_folder(args.runs)  # refused before torch is imported
    from ddlstudy.tools import predict

    _check_positive(args, "repeats")
    nodes = predict.parse_list("--nodes", args.nodes)
    batches = predict.parse_list("--batches", args.batches) if args.batches else None
    links = [x for x in args.links.split(",") if x]
    if args.hosts is not None:
        from ddlstudy.backends.mpi.launch import placement

        placement(args.hosts, 2)  # hosts that are not up: refused before measuring
    result = predict.predict(args.runs, args.hosts, nodes, links, batches, args.repeats)
    print(predict.markdown(result))
    for path in predict.write(result, args.out or args.runs / "predict"):
        print(f"wrote {path}")
    return 0


COMMANDS = {"run": cmd_run, "dataset": cmd_dataset, "strategies": cmd_strategies,
            "hosts": cmd_hosts, "predict": cmd_predict, "advise": cmd_advise, "doctor": cmd_doctor,
            "report": cmd_report, "bench": cmd_bench,
            "study": cmd_study, "replay": cmd_replay, "compare": cmd_compare,
            "export": cmd_export}


def main(argv: list[str] | None = None) -> int:
    # the clock of the manifest's first_step_s
    environment.mark_command_start(argv is None, launched=CHILD_ENV in os.environ)
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"ddlstudy: error: {exc}", file=sys.stderr)
        return 2
    args.argv = argv
    setup_logging(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"ddlstudy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddlstudy: interrupted", file=sys.stderr)
        return 130
