"""`ddlstudy predict`: the alpha-beta model fitted from runs, 1 to 256 nodes."""

from __future__ import annotations

import argparse

from ddlstudy.cli.common import check_positive
from ddlstudy.config.options import path_arg
from ddlstudy.files import check_folder


def register(sub) -> None:
    p = sub.add_parser("predict", help="alpha-beta model fitted from runs: 1 to 256 nodes")
    p.add_argument("runs", type=path_arg, help="a folder holding a one-node run (and multi-node "
                   "MPI runs to check the model against)")
    p.add_argument("--hosts", help="where the runs' ranks ran (emulated[:PREFIX] or "
                   "host1,host2): the reducers are timed there (default: this host)")
    p.add_argument("--nodes", default=",".join(map(str, (1, 2, 3, 4, 8, 16, 32, 64, 128, 256))),
                   help="node counts to predict (default 1,2,3,4,8,...,256)")
    p.add_argument("--links", default="1gbit,10gbit,25gbit",
                   help="link rates to predict besides the measured one")
    p.add_argument("--batches", help="global batches (default: the runs' batch)")
    p.add_argument("--repeats", type=int, default=5, help="timings per reducer and size")
    p.add_argument("--out", type=path_arg, help="where predict.{json,md,png,svg} go "
                   "(default RUNS/predict)")
    p.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from ddlstudy.report.runs import runs_folder

    runs_folder(args.runs)  # refused before torch is imported
    out = args.out or args.runs / "predict"
    check_folder("--out", out)  # before minutes of measuring, not after
    from ddlstudy.tools import predict

    check_positive(args, "repeats")
    nodes = predict.parse_list("--nodes", args.nodes)
    batches = predict.parse_list("--batches", args.batches) if args.batches else None
    links = [x for x in args.links.split(",") if x]
    if args.hosts is not None:
        from ddlstudy.backends.mpi.launch import placement

        placement(args.hosts, 2)  # hosts that are not up: refused before measuring
    result = predict.predict(args.runs, args.hosts, nodes, links, batches, args.repeats)
    print(predict.markdown(result))
    for path in predict.write(result, out):
        print(f"wrote {path}")
    return 0
