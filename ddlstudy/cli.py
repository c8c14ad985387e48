"""The `ddlstudy` command.

    ddlstudy doctor                                       # what this machine offers
    ddlstudy dataset make --usecase simple-big            # datasets/synthetic-big/
    ddlstudy run --usecase tiny --strategy sequential     # runs/<id>/
    ddlstudy run --usecase simple-big --data-dir /path/to/imagefolder --epochs 2
    ddlstudy report runs/ --out report/                   # tables and figures
    ddlstudy study usecases/demo.toml --resume            # a whole matrix of runs
    ddlstudy replay runs/<id>/manifest.json               # the same run again
    ddlstudy compare runs/<a> runs/<b>                    # what differs, by how much
    ddlstudy strategies                                   # what --strategy takes
    ddlstudy bench sampler --usecase tiny                 # sampler overhead

Bad input is reported as one sentence on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.logs import setup_logging

log = logging.getLogger("ddlstudy")


# --- argument parsing -------------------------------------------------------------------

def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n such as 0/4, got {text!r}") from None
    if n <= 0 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= i < n, got {text!r}")
    return i, n


def _add_run_args(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to train")
    what.add_argument("--usecase", default="tiny",
                      help="a name from usecases/ or a path to a TOML file (default: tiny)")
    what.add_argument("--strategy", default="sequential",
                      help="local parallelism strategy; `ddlstudy strategies` lists them")
    what.add_argument("--workers", type=int, help="replicas, processes or threads of the "
                      "strategy (default: one per usable core)")
    what.add_argument("--stages", type=int, help="pipeline stages (default: one per core)")
    what.add_argument("--micro-batches", type=int, default=4,
                      help="GPipe micro-batches per global batch (default 4)")
    what.add_argument("--stage-starts", metavar="L0,L1,...",
                      help="the layer each pipeline stage starts at, e.g. 0,9 (default: "
                      "balanced by measured forward times)")
    what.add_argument("--replicas", type=int, default=2,
                      help="data-parallel replicas of the pipeline, for hybrid (default 2)")
    what.add_argument("--devices", type=int, help="GPUs for gpu-data (default: all visible)")
    nodes = p.add_argument_group("several nodes")
    nodes.add_argument("--backend", default="local", help="local (default), mpi or spark")
    nodes.add_argument("--nodes", type=int, help="with --backend mpi: start this many MPI ranks "
                       "on this machine (leave out under your own mpiexec)")
    nodes.add_argument("--hosts", help="with --backend mpi --nodes N: place the ranks on "
                       "host1,host2,... (mpiexec's ssh launcher) or on emulated[:PREFIX], "
                       "the hosts of `ddlstudy hosts up`")
    nodes.add_argument("--bucket-mb", type=float, help="with --reduce allreduce: reduce the "
                       "gradients in buckets of this many MiB, each as soon as backward has "
                       "filled it, overlapping the exchange with the backward pass")
    nodes.add_argument("--balance", default="equal", help="equal (default): each node an "
                       "equal slice of every global batch; throughput: slices in proportion "
                       "to each node's images/s, measured over the first steps")
    nodes.add_argument("--compress", default="none", help="gradients on the wire between "
                       "MPI nodes: none (default), fp16, or topk:<ratio> with error feedback")
    nodes.add_argument("--reduce", default="allreduce", help="how nodes average gradients: "
                       "allreduce, parameter-server, ring-reduce, ring-allreduce, step-wise")
    spark = p.add_argument_group("the Spark backend")
    spark.add_argument("--spark-master", help="local[N] (default: local[nodes]), "
                       "local-cluster[N,cores,MiB] or spark://host:port")
    spark.add_argument("--spark-sync", default="gloo", help="gloo (default): gradients "
                       "all-reduced every step between the tasks over torch.distributed; "
                       "allgather: weights averaged through Spark every --sync-every steps")
    spark.add_argument("--sync-every", type=int, default=10,
                       help="steps between weight averages with --spark-sync allgather")
    spark.add_argument("--spark-ui", action="store_true", help="start Spark's web UI")
    task = p.add_argument_group("training task (override the use case's [train] table)")
    task.add_argument("--epochs", type=int)
    task.add_argument("--batch-size", type=int, help="global batch size")
    task.add_argument("--image-size", type=int, help="side in pixels the images are scaled to")
    task.add_argument("--seed", type=int)
    task.add_argument("--lr", type=float, help="learning rate")
    task.add_argument("--scaling", default="strong", help="strong (default): --batch-size is "
                      "the global batch, split over the workers; weak: each worker's batch, "
                      "so the global batch grows with the workers")
    task.add_argument("--lr-scaling", default="none", help="none (default) or linear: the "
                      "learning rate times global batch / the use case's batch")
    task.add_argument("--accumulate", type=int, default=1, metavar="K",
                      help="run each batch as K micro-batches, one optimizer step and one "
                      "gradient exchange per batch (default 1); --batch-size 64 --accumulate "
                      "4 trains batches of 64 in the memory of 16")
    task.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 "
                      "(autocast: bfloat16 matmuls and convolutions, fp32 weights)")
    data = p.add_argument_group("data")
    data.add_argument("--data-dir", type=Path, help="a real ImageFolder tree (root/<class>/<img>) "
                      "instead of the use case's synthetic set")
    data.add_argument("--datasets-dir", type=Path, help="where synthetic sets live "
                      "(default: datasets/)")
    data.add_argument("--on-bad-image", default="fail", help="fail (default): stop naming the "
                      "file; skip: train without it and list it in the manifest")
    data.add_argument("--loader-workers", type=int, default=0,
                      help="DataLoader processes that decode and augment (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--runs-dir", type=Path, help="where run folders go (default: runs/)")
    out.add_argument("--sample-hz", type=float, default=10.0,
                     help="resource sampling rate, 0 to turn it off (default 10)")
    out.add_argument("--max-steps", type=int, help="stop each epoch after this many steps")
    out.add_argument("--no-snapshot", action="store_true",
                     help="do not write snapshot.pt after each epoch")
    out.add_argument("--snapshot-every", type=int, metavar="N",
                     help="also snapshot every N steps inside an epoch")
    faults = p.add_argument_group("faults")
    faults.add_argument("--resume", type=Path, metavar="RUN", help="continue runs/<id> from "
                        "its last snapshot (its recorded configuration; other flags ignored)")
    faults.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="when a worker dies, restart from the last snapshot up to N "
                        "times (default 0)")
    out.add_argument("--quiet", action="store_true", help="warnings and errors only")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddlstudy", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="train one use case with one strategy into runs/<id>/")
    _add_run_args(p)

    p = sub.add_parser("dataset", help="synthetic data sets")
    dsub = p.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")
    make = dsub.add_parser("make", help="generate a use case's synthetic data set")
    make.add_argument("--usecase", default="tiny")
    make.add_argument("--out", type=Path, help="target folder (default: datasets/<data.name>)")
    make.add_argument("--shard", type=_shard, help="only images with index %% n == i, as i/n")
    make.add_argument("--workers", type=int, help="generator processes (default: cores)")
    make.add_argument("--force", action="store_true", help="regenerate even if complete")

    sub.add_parser("doctor", help="what this machine offers the study, with fixes")
    sub.add_parser("strategies", help="list the local parallelism strategies")

    p = sub.add_parser("report", help="speedup tables (and figures) of a folder of runs")
    p.add_argument("runs", type=Path, nargs="?", default=None, help="default: runs/")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex"])
    p.add_argument("--out", type=Path, help="also write the tables, runs.csv and the figures "
                   "into this folder")
    p.add_argument("--no-figures", action="store_true", help="with --out: tables only")

    p = sub.add_parser("study", help="run a study plan: use cases x configurations x repeats")
    p.add_argument("plan", type=Path, help="a study plan TOML, e.g. usecases/demo.toml")
    p.add_argument("--repeat", type=int, help="repeats of every cell (default: the plan's)")
    p.add_argument("--resume", action="store_true",
                   help="reuse this study's completed runs whose configuration matches")
    p.add_argument("--runs-dir", type=Path, help="default: the plan's, or runs/<name>")
    p.add_argument("--epochs", type=int, help="override every cell's epochs")
    p.add_argument("--max-steps", type=int, help="override every cell's steps per epoch")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex"])
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p = sub.add_parser("replay", help="run a manifest again: same config, seeds and data")
    p.add_argument("manifest", type=Path, help="runs/<id>/manifest.json or runs/<id>")
    p.add_argument("--runs-dir", type=Path, help="where the new run goes (default: the "
                   "original's runs folder)")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")

    p = sub.add_parser("compare", help="what differs between two runs, and by how much")
    p.add_argument("a", type=Path, help="a run folder or its manifest.json")
    p.add_argument("b", type=Path)

    p = sub.add_parser("hosts", help="emulated hosts (network namespaces) for multi-host runs")
    hsub = p.add_subparsers(dest="hosts_command", required=True, metavar="WHAT")
    h = hsub.add_parser("up", help="create N hosts joined by a bridge (root, iproute2)")
    h.add_argument("--count", type=int, default=2, help="hosts (default 2)")
    h.add_argument("--delay", help="one-way delay added on every host's link, e.g. 2ms")
    h.add_argument("--rate", help="bandwidth of every host's link, e.g. 1gbit")
    h.add_argument("--cpus", help="CPU time per host in cores, e.g. 1,0.5 (unequal nodes)")
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
                   "host1,host2): the reducers are timed there")
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
    b.add_argument("--usecase", default="tiny")
    b.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--hz", type=float, default=10.0)
    b.add_argument("--threads", type=int, default=1)
    b = bsub.add_parser("reduce", help="every gradient-averaging algorithm under mpiexec")
    b.add_argument("--size", default="alexnet", help="alexnet, vgg16 or a number of floats")
    b.add_argument("--nodes", type=int, default=2, help="MPI ranks (default 2)")
    b.add_argument("--hosts", help="place them on emulated[:PREFIX] or host1,host2 "
                   "(default: this host)")
    b.add_argument("--repeats", type=int, default=5)
    b = bsub.add_parser("all", help="every figure in one go, as ratios: JSON and Markdown")
    b.add_argument("--usecase", default="tiny")
    b.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--only", help="comma-separated groups: overhead, sampler, loader, "
                   "strategies, reducers, spark (default: all)")
    b.add_argument("--hosts", help="time the reducers on emulated[:PREFIX] or host1,host2")
    b.add_argument("--datasets-dir", type=Path, help="where the synthetic sets are")
    b.add_argument("--out", type=Path, help="where bench.json and bench.md go "
                   "(default runs/bench/<time>)")
    b = bsub.add_parser("overhead", help="ddlstudy's loop against a raw torch loop")
    b.add_argument("--usecase", default="tiny")
    b.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--threads", type=int, default=1)
    return parser


# --- commands ---------------------------------------------------------------------------

_TRAIN_FLAGS = ("epochs", "batch_size", "image_size", "seed", "lr")


def _layer_list(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError("--stage-starts", f"{text!r}: give layer numbers separated by "
                          "commas, e.g. 0,9") from None


def config_from_args(args: argparse.Namespace):
    from ddlstudy.config import DEFAULT_RUNS_DIR, RunConfig, load_usecase, with_overrides

    usecase = load_usecase(args.usecase)
    overrides = {k: getattr(args, k) for k in _TRAIN_FLAGS}
    try:
        usecase = with_overrides(usecase, **overrides)
    except ConfigError as exc:  # name the flag the user typed, not the TOML field
        flag = exc.field.removeprefix("train.").replace("_", "-")
        raise ConfigError(f"--{flag}", str(exc).split(": ", 1)[1]) from None
    extra = {}
    if args.datasets_dir:
        extra["datasets_dir"] = args.datasets_dir
    return RunConfig(usecase=usecase, strategy=args.strategy, workers=args.workers,
                     stages=args.stages, micro_batches=args.micro_batches,
                     stage_starts=_layer_list(args.stage_starts),
                     replicas=args.replicas, devices=args.devices, backend=args.backend,
                     nodes=args.nodes, hosts=args.hosts, reduce=args.reduce,
                     spark_master=args.spark_master,
                     spark_sync=args.spark_sync, sync_every=args.sync_every,
                     spark_ui=args.spark_ui, precision=args.precision,
                     accumulate=args.accumulate, scaling=args.scaling,
                     lr_scaling=args.lr_scaling, compress=args.compress, balance=args.balance,
                     bucket_mb=args.bucket_mb,
                     data_dir=args.data_dir, runs_dir=args.runs_dir or DEFAULT_RUNS_DIR,
                     on_bad_image=args.on_bad_image, loader_workers=args.loader_workers,
                     sample_hz=args.sample_hz, max_steps=args.max_steps,
                     snapshot=not args.no_snapshot, snapshot_every=args.snapshot_every,
                     **extra)


def cmd_run(args: argparse.Namespace) -> int:
    if args.max_restarts < 0:
        raise ConfigError("--max-restarts", f"must be 0 or more, got {args.max_restarts}")
    if args.resume is not None:
        from ddlstudy.runner import resume_config

        return train(resume_config(args.resume), args.argv, args.resume, args.max_restarts)
    return train(config_from_args(args), args.argv, max_restarts=args.max_restarts)


def train(cfg, argv: list[str], resume: Path | None = None, max_restarts: int = 0) -> int:
    """Run ``cfg`` (launching mpiexec for --backend mpi) and print where it went; with
    ``max_restarts``, a run that failed after a snapshot continues from it."""
    from ddlstudy import mpi
    from ddlstudy.runfolder import SNAPSHOT, RunFolder
    from ddlstudy.runner import RunFailed, launch_mpi, run

    restarts = 0
    while True:
        try:
            if cfg.backend == "mpi" and not mpi.under_mpiexec():
                folder = launch_mpi(cfg, argv, resume)
            else:
                folder = run(cfg, resume=resume)
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
    if not isinstance(folder, RunFolder) or os.environ.get(mpi.CHILD_ENV):
        return 0  # other MPI ranks stay quiet; under our own launcher, the launcher reports
    summary = folder.manifest.get("summary", {})
    print(f"{folder.path}  val accuracy {summary.get('final_val_accuracy', float('nan')):.3f}  "
          f"{summary.get('median_images_per_s', float('nan')):.1f} img/s")
    return 0


def cmd_dataset(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_DATASETS_DIR, load_usecase
    from ddlstudy.data.generate import make_dataset

    spec = load_usecase(args.usecase).data
    out = args.out or DEFAULT_DATASETS_DIR / spec.name
    if args.shard and not args.out:
        out = out.with_name(f"{out.name}.shard-{args.shard[0]}-of-{args.shard[1]}")
    if args.workers is not None and args.workers <= 0:
        raise ConfigError("--workers", f"must be a positive integer, got {args.workers}")
    root = make_dataset(spec, out, shard=args.shard, workers=args.workers, force=args.force)
    print(root)
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from ddlstudy.strategies import REGISTRY

    for name, cls in REGISTRY.items():
        print(f"{name:14s} {cls.summary}")
        if cls.flags:
            print(f"{'':14s} flags: {cls.flags}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ddlstudy.doctor import doctor

    return doctor()


def cmd_report(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.report import Report

    report = Report(args.runs or DEFAULT_RUNS_DIR)
    print(report.text(args.format))
    if args.out:
        if args.out.exists() and not args.out.is_dir():
            raise UsageError(f"--out {args.out} is a file; give a folder for the tables and "
                             "figures")
        paths = report.write(args.out, args.format, figures=not args.no_figures)
        print(f"\n{len(paths)} files written to {args.out}", file=sys.stderr)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from ddlstudy.study import study

    overrides = {}
    for name in ("epochs", "max_steps"):
        value = getattr(args, name)
        if value is not None:
            if value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}",
                                  f"must be a positive integer, got {value}")
            overrides[name] = value
    return study(args.plan, repeat=args.repeat, resume=args.resume, runs_dir=args.runs_dir,
                 overrides=overrides, fmt=args.format)


def cmd_replay(args: argparse.Namespace) -> int:
    from ddlstudy.replay import config_from_manifest, differences, read_manifest

    manifest = read_manifest(args.manifest)
    runs_dir = args.runs_dir or Path(manifest["path"]).parent
    cfg = config_from_manifest(manifest, runs_dir)
    for line in differences(manifest):
        log.warning("replay of %s differs: %s", manifest.get("id"), line)
    return train(cfg, args.argv)


def cmd_compare(args: argparse.Namespace) -> int:
    from ddlstudy.replay import compare, read_manifest

    print(compare(read_manifest(args.a), read_manifest(args.b)))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ddlstudy.bench import bench_overhead, bench_reduce, bench_sampler

    for name in ("steps", "repeats", "threads", "nodes"):
        if getattr(args, name, 1) <= 0:
            raise ConfigError(f"--{name}", f"must be a positive integer, got {getattr(args, name)}")
    if args.bench_command == "all":
        from ddlstudy import bench_all

        groups = args.only.split(",") if args.only else list(bench_all.GROUPS)
        result = bench_all.bench_all(args.usecase, args.steps, args.repeats, groups,
                                     args.hosts, args.datasets_dir)
        print(bench_all.markdown(result))
        out = args.out or Path("runs") / "bench" / time.strftime("%Y%m%d-%H%M%S")
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
              f"{made.spark_master}")
    elif args.hosts_command == "down":
        hosts.down(args.prefix)
        print(f"hosts {args.prefix}-h* removed")
    elif args.hosts_command == "spark":
        if args.cores <= 0:
            raise ConfigError("--cores", f"must be a positive integer, got {args.cores}")
        up = hosts.load(args.prefix)
        print(f"Spark master {hosts.spark_up(up, cores=args.cores)} with {up.count} worker(s) "
              f"of {args.cores} core(s)")
    else:
        up = hosts.load(args.prefix)
        print(hosts.status(up))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from ddlstudy import predict

    if args.repeats <= 0:
        raise ConfigError("--repeats", f"must be a positive integer, got {args.repeats}")
    nodes = predict.parse_list("--nodes", args.nodes)
    batches = predict.parse_list("--batches", args.batches) if args.batches else None
    links = [x for x in args.links.split(",") if x]
    if args.hosts is not None:
        from ddlstudy import mpi

        mpi.placement(args.hosts, 2)  # hosts that are not up: refused before measuring
    result = predict.predict(args.runs, args.hosts, nodes, links, batches, args.repeats)
    print(predict.markdown(result))
    for path in predict.write(result, args.out or args.runs / "predict"):
        print(f"wrote {path}")
    return 0


COMMANDS = {"run": cmd_run, "dataset": cmd_dataset, "strategies": cmd_strategies,
            "hosts": cmd_hosts, "predict": cmd_predict, "doctor": cmd_doctor,
            "report": cmd_report, "bench": cmd_bench,
            "study": cmd_study, "replay": cmd_replay, "compare": cmd_compare}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
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
