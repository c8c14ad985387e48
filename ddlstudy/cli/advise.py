"""`ddlstudy advise`: how to train a use case here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddlstudy.cli.common import (
    add_what,
    check_positive,
    host_count,
    seconds,
    usecase_of,
)
from ddlstudy.config import HEAPS, PRECISIONS, PROBE_SECONDS, REFAULT_PROBE_SECONDS
from ddlstudy.config import MIN_PROBE_SECONDS as MIN_BOX
from ddlstudy.config.limits import most, size_bytes
from ddlstudy.config.loading import is_usecase_path
from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError
from ddlstudy.files import check_folder
from ddlstudy.machine.sampler import NOISY_CORES, WAIT_MOST_S


def register(sub) -> None:
    p = sub.add_parser("advise", help="how to train a use case here: probes every local "
                       "strategy, measures the exchange, predicts and ranks")
    add_what(p)
    p.add_argument("--nodes", help="node counts to rank (default: 1,2,4; with --hosts, 1 "
                   "up to the hosts given)")
    p.add_argument("--hosts", help="where the nodes will run (emulated[:PREFIX] or "
                   "host1,host2): the exchange is measured there (default: this host)")
    p.add_argument("--link", help="instead of measuring hosts: predict separate machines "
                   "like this one joined by a link of this rate, e.g. 10gbit (default: none, "
                   "measure where the nodes are)")
    p.add_argument("--budget", default="auto", help="time for the whole advice, e.g. 90s or "
                   "5m: every layout is probed once first (with shorter probes where the "
                   "budget is short: what still does not fit is named, with the budget that "
                   "would probe it), then again while it lasts (default auto: every layout "
                   "and node count once, then the contenders again for at most half as long)")
    p.add_argument("--runs", type=path_arg, help="earlier runs of the use case: rank by "
                   "predicted time to its target accuracy, weighing what changes "
                   "convergence by the epochs it took there (default: none, rank by images/s)")
    p.add_argument("--strategies", help="probe only these strategies' layouts, "
                   "comma-separated (default: every installed strategy; sequential, the "
                   "baseline, is always probed: speedups are against it)")
    p.add_argument("--memory", help="the memory a node may use, e.g. 1GiB, 512MiB or 2.5GB: "
                   "each configuration's peak a node is predicted from the baseline's probe "
                   "before it is probed, and those that would need more are left out, named "
                   "(default: the memory each of --hosts' emulated hosts was given by hosts up "
                   "--memory, else the memory this host has available)")
    p.add_argument("--with-checkpointing", action="store_true", help="probe every layout "
                   "whose strategy can checkpoint also with --checkpoint-activations: the "
                   "memory it saves a node against the recomputation's time, both measured, "
                   "and what fits --memory only so")
    p.add_argument("--with-precision", metavar="LIST", help="probe every layout also in "
                   "these precisions, comma-separated: bf16, fp16 (each a configuration of its "
                   "own; default: fp32 only)")
    p.add_argument("--heap", choices=HEAPS, help="probe with ddlstudy run --heap (its check's "
                   "runs too): keep where a step makes and frees tensors over 32 MiB, for "
                   "steady steps (default: return, glibc's own rule)")
    p.add_argument("--rounds", type=int, default=3, help="most probe rounds")
    p.add_argument("--probe-seconds", type=float, metavar="S",
                   help="a probe's steady steps (after its warm-up) last about this long, "
                   f"however long a step takes (default {PROBE_SECONDS:g}; "
                   f"{REFAULT_PROBE_SECONDS:g} where this host's balloon takes freed memory "
                   "back and the model's steps map blocks over 32 MiB: advise's note says so)")
    p.add_argument("--wait-quiet", action="store_true", help="before each probe, wait until "
                   f"other processes use at most {NOISY_CORES} cores of this host (at most "
                   f"{WAIT_MOST_S:.0f} s; not charged to the budget). Without it, probes "
                   "on a busy host are still marked and not counted where a quiet one came")
    p.add_argument("--out", type=path_arg, help="where advise.json, advise.md and the probes' "
                   "runs go (default: runs/advise/<usecase>)")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "json"],
                   help="what is printed: the ranked tables (as advise.md), the ranking as "
                   "CSV (a row a configuration, with its command) or advise.json's content; "
                   "the files are written alike")
    p.add_argument("--quiet", action="store_true", help="warnings and errors only")
    p.set_defaults(func=cmd_advise)


def cmd_advise(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_RUNS_DIR
    from ddlstudy.records.plan import cell_config
    from ddlstudy.tools.predict import parse_list

    usecase, data = _what(args)
    # A use case, folder or model that cannot be trained is refused before anything runs
    # (checked as its probes' runs will be: under --out, the working directory untouched).
    if args.out is not None:
        check_folder("--out", args.out)
    sets = {"datasets_dir": str(args.datasets_dir)} if args.datasets_dir else {}
    uc = cell_config(usecase, data | sets, args.out or DEFAULT_RUNS_DIR).usecase
    budget = None if args.budget.strip().lower() == "auto" else seconds("--budget",
                                                                         args.budget)
    memory = size_bytes("--memory", args.memory) if args.memory is not None else None
    check_positive(args, "rounds")
    if args.probe_seconds is not None and not MIN_BOX <= args.probe_seconds <= most("seconds"):
        raise ConfigError("--probe-seconds", f"must be seconds from {MIN_BOX:g} (a shorter "
                          f"box times nothing) to {most('seconds'):g}, got "
                          f"{args.probe_seconds}")
    if args.link is not None:
        from ddlstudy.hosts import rate_bits

        if args.hosts is not None:
            raise ConfigError("--link", "give --hosts (the exchange measured there) or "
                              "--link (predicted for that rate), not both")
        rate_bits(args.link, "--link")
    if args.runs is not None:
        from ddlstudy.report.runs import runs_folder

        runs_folder(args.runs)
    strategies = _strategies(args.strategies) if args.strategies is not None else None
    out = args.out or DEFAULT_RUNS_DIR / "advise" / uc.name
    check_folder("--out", out)  # before the probes run, not after
    count = None
    if args.hosts is not None:
        from ddlstudy.backends.mpi.launch import placement

        placement(args.hosts, 2)  # hosts that are not up: refused before probing
        count = host_count(args.hosts)
        if memory is None:  # emulated hosts of a given size: theirs
            from ddlstudy import hosts

            prefix = hosts.emulated_prefix(args.hosts)
            memory = hosts.load(prefix).memory if prefix else None
    nodes = parse_list("--nodes", args.nodes) if args.nodes else \
        list(range(1, count + 1)) if count else [1, 2, 4]
    from ddlstudy.tools import advise

    result = advise.advise(usecase, nodes, args.hosts, args.link, budget, out,
                           runs=args.runs, rounds=args.rounds, box=args.probe_seconds,
                           datasets_dir=args.datasets_dir, host_count=count,
                           wait=args.wait_quiet, data=data, strategies=strategies,
                           memory=memory, checkpointed=args.with_checkpointing,
                           precisions=_precisions(args.with_precision))
    shown = {"markdown": advise.markdown, "csv": advise.as_csv, "json": advise.as_json}
    print(shown[args.format](result).rstrip("\n"))
    for path in advise.write(result, out):  # beside a script's CSV or JSON: not in it
        print(f"wrote {path}", file=sys.stdout if args.format == "markdown" else sys.stderr)
    return 0


def _what(args: argparse.Namespace) -> tuple[str | None, dict[str, str]]:
    """The use case and the data flags advise trains, as a study may give them again from
    any folder: a use case's file, --data-dir and a --model file as absolute paths."""
    from ddlstudy.config.usecase import ModelSpec

    usecase = usecase_of(args)
    if usecase is not None and is_usecase_path(usecase):
        usecase = str(Path(usecase).resolve())
    data = {}
    if args.data_dir is not None:
        data["data_dir"] = str(Path(args.data_dir).resolve())
    if args.model is not None:
        data["model"] = str(ModelSpec(arch=args.model).anchored(Path.cwd()).arch)
    if args.heap is not None:
        data["heap"] = args.heap
    return usecase, data


def _strategies(text: str) -> list[str]:
    """--strategies: installed strategies' names (plugins' too), each once."""
    from ddlstudy.registry import refuse_unknown
    from ddlstudy.strategies import REGISTRY

    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise ConfigError("--strategies", f"{text!r}; give strategy names separated by "
                          "commas, e.g. cpu-processes,pipeline")
    for name in names:
        if name not in REGISTRY.loaded():
            refuse_unknown("--strategies", "strategy", name, REGISTRY)
    return list(dict.fromkeys(names))


def _precisions(text: str | None) -> tuple[str, ...]:
    """--with-precision: bf16 and fp16, each once (fp32 is every layout's own)."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",")))
    others = [n for n in PRECISIONS if n != "fp32"]
    if not names or any(n not in others for n in names):
        raise ConfigError("--with-precision", f"{text!r}; give {' or '.join(others)}, "
                          "comma-separated (fp32 is every layout's own)")
    return names
