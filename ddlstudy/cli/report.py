"""`ddlstudy report`, `export` and `compare`: what a folder of runs says."""

from __future__ import annotations

import argparse
import logging
import sys

from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.redact import redact

log = logging.getLogger("ddlstudy")


def register(sub) -> None:
    p = sub.add_parser("report", help="speedup tables (and figures) of a folder of runs")
    p.add_argument("runs", type=path_arg, nargs="?", default=None, help="default: runs/")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex"],
                   help="how the tables are printed")
    p.add_argument("--out", type=path_arg, help="also write the tables, runs.csv, the figures "
                   "and the page that holds them all, index.html (offline, one file), into "
                   "this folder (default: print only)")
    p.add_argument("--no-figures", action="store_true", help="with --out: tables and the page, "
                   "no figures")
    p.add_argument("--include-noisy", action="store_true", help="count runs marked noisy "
                   "(other processes used their host) in medians, speedups and the findings "
                   "(without it they are shown only for a configuration with no quiet run, "
                   "marked noisy, and left out of the findings)")
    p.add_argument("--advice", type=path_arg, metavar="ADVISE_JSON", help="also check this "
                   "advice against the runs of the folder that are rows of it (matched by "
                   "their recorded configuration): each one's predicted and measured images/s "
                   "and memory, the errors, the rank correlation (with --out: "
                   "advice-check.md, .json and .svg, and the page opens with it; default: "
                   "no advice checked)")
    p.add_argument("--project", default="32@10gbit", metavar="CORES@LINK",
                   help="project each finding onto nodes of CORES cores joined by a LINK of "
                   "this rate (a model fitted to the runs, marked as one), or 'none' "
                   "(default: 32@10gbit)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("export", help="runs in other tools' formats")
    esub = p.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    e = esub.add_parser("tensorboard", help="per-epoch metrics and resource samples as "
                        "TensorBoard scalars, one TensorBoard run per ddlstudy run, and the "
                        "configurations for the HParams dashboard")
    e.add_argument("runs", type=path_arg, help="a run folder or a folder of runs")
    e.add_argument("--out", type=path_arg, required=True, help="the log folder to give "
                   "`tensorboard --logdir`")
    e = esub.add_parser("mlflow", help="runs as MLflow runs (a study: an experiment, its "
                        "report in a parent run, its runs nested), through MLflow's client; "
                        "again: updated, never duplicated")
    e.add_argument("runs", type=path_arg, help="a run folder or a folder of runs")
    e.add_argument("--tracking-uri", metavar="URI", help="the tracking server or store "
                   "(default: sqlite:///RUNS/mlflow.db, a SQLite store beside the runs)")
    e.add_argument("--experiment", metavar="NAME", help="the experiment of every run "
                   "(default: a run's study, else the name of the folder it is in)")
    e = esub.add_parser("model", help="a run's trained weights (a state dict, or an ONNX "
                        "file) and its use case beside them; ddlstudy.models.trained.load "
                        "reads a state dict back")
    e.add_argument("run", type=path_arg, help="a run folder")
    e.add_argument("--out", type=path_arg, required=True, help="the weights' file, e.g. "
                   "model.pt (the use case goes beside it: model.usecase.json)")
    e.add_argument("--format", choices=["pt", "onnx"], default="pt", help="pt: a state dict "
                   "(default); onnx: the network as an ONNX file (input 'images', N x 3 x size "
                   "x size, output 'logits'; any batch size), for onnxruntime; needs pip "
                   "install 'ddlstudy[onnx]'")
    e.add_argument("--force", action="store_true", help="replace those files if they exist")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("compare", help="what differs between two runs, and by how much")
    p.add_argument("a", type=path_arg, help="a run folder or its manifest.json")
    p.add_argument("b", type=path_arg, help="the other run folder or manifest.json")
    p.set_defaults(func=cmd_compare)


def cmd_report(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.files import check_folder
    from ddlstudy.report import Report
    from ddlstudy.report.projection import Hardware

    project = None if args.project == "none" else Hardware.parse(args.project)
    if args.out:
        check_folder("--out", args.out)
    runs = args.runs or DEFAULT_RUNS_DIR
    checked = None
    if args.advice is not None:  # before the page, which opens with it
        from ddlstudy.tools.advise import check_runs

        checked = check_runs(args.advice, runs, args.out, args.include_noisy)
    report = Report(runs, include_noisy=args.include_noisy, project=project)
    print(report.text(args.format))
    if checked is not None:
        print(f"\n{checked}")
    if args.out:
        paths = report.write(args.out, args.format, figures=not args.no_figures)
        print(f"\n{len(paths)} files written to {args.out}; the page: {paths[-1]}",
              file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.export_command == "model":
        from ddlstudy.models.trained import export as export_model

        for path in export_model(args.run, args.out, args.force, args.format):
            print(f"wrote {path}")
        return 0
    if args.export_command == "mlflow":
        return _export_mlflow(args)
    from ddlstudy.exports.tensorboard import export, write_hparams
    from ddlstudy.report import Report
    from ddlstudy.report.runs import KEY

    written = export(args.runs, args.out)
    try:  # the configurations, as the report groups the runs written
        sessions = write_hparams(args.out, Report(args.runs).table, KEY)
    except UsageError as exc:
        log.warning("no HParams summary: %s", exc)
        sessions = []
    print(f"{len(written)} run(s) written to {args.out}, and {len(sessions)} "
          f"configuration(s) for the HParams dashboard; view them with "
          f"`tensorboard --logdir {args.out}`")
    return 0


def _export_mlflow(args: argparse.Namespace) -> int:
    from ddlstudy.exports.mlflow.runs import export
    from ddlstudy.exports.mlflow.store import experiment_name_most

    if args.experiment is not None and (not args.experiment.strip() or
                                        not args.experiment.isprintable()):
        raise ConfigError("--experiment", f"{args.experiment!r:.200}: give a name of plain "
                          "text (no newline or other control character)")
    most = experiment_name_most()
    if args.experiment is not None and most is not None and len(args.experiment) > most:
        raise ConfigError("--experiment", f"{args.experiment[:40]!r}... is "
                          f"{len(args.experiment):,} characters long; MLflow takes experiment "
                          f"names of at most {most} characters")
    done = export(args.runs, args.tracking_uri, args.experiment)
    uri = redact(done["uri"])
    view = f"open {uri}" if uri.startswith(("http:", "https:")) else \
        f"view them with `mlflow ui --backend-store-uri {uri}`"
    print(f"{done['runs']} run(s) exported to {uri}, experiment(s) "
          f"{', '.join(done['experiments'])}; {view}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ddlstudy.records.manifests import compare, read_manifest

    print(compare(read_manifest(args.a), read_manifest(args.b)))
    return 0
