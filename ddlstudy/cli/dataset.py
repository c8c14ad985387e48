"""`ddlstudy dataset make`: a use case's synthetic data set."""

from __future__ import annotations

import argparse
import time

from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n such as 0/4, got {text!r}") from None
    if n <= 0 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"need 0 <= i < n, got {text!r}")
    return i, n


def register(sub) -> None:
    p = sub.add_parser("dataset", help="synthetic data sets")
    dsub = p.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")
    make = dsub.add_parser("make", help="generate a use case's synthetic data set")
    make.add_argument("--usecase", default="tiny", help="a use case name or TOML file")
    make.add_argument("--out", type=path_arg, help="target folder (default: datasets/<data.name>)")
    make.add_argument("--shard", type=_shard, help="only images with index %% n == i, as i/n "
                      "(default: all)")
    make.add_argument("--workers", type=int, help="generator processes (default: cores)")
    make.add_argument("--force", action="store_true", help="regenerate even if complete")
    p.set_defaults(func=cmd_dataset)


def cmd_dataset(args: argparse.Namespace) -> int:
    from ddlstudy.config import DEFAULT_DATASETS_DIR, load_usecase
    from ddlstudy.data.generate import CLASSES, is_complete, make_dataset

    spec = load_usecase(args.usecase).data
    if not spec.synthetic:
        raise ConfigError("--usecase", f"{args.usecase} trains on your own images in "
                          f"{spec.dir}: there is no synthetic set to make; `ddlstudy run "
                          f"--usecase {args.usecase}` reads them as they are")
    out = args.out or DEFAULT_DATASETS_DIR / spec.name
    if args.shard and not args.out:
        out = out.with_name(f"{out.name}.shard-{args.shard[0]}-of-{args.shard[1]}")
    if args.workers is not None and not 0 < args.workers <= 64:
        raise ConfigError("--workers", f"must be 1 to 64 generator processes, got "
                          f"{args.workers}")
    from ddlstudy.files import check_folder

    check_folder("--out" if args.out else "the datasets folder (DDLSTUDY_HOME/datasets)", out)
    if is_complete(out, spec, args.shard) and not args.force:
        print(f"{out}: already complete ({spec.name}; --force makes it again)")
        return 0
    start = time.perf_counter()
    root = make_dataset(spec, out, shard=args.shard, workers=args.workers, force=args.force)
    images = sum(1 for p in root.rglob("*") if p.suffix in (".png", ".jpg", ".jpeg"))
    print(f"{root}: {images} images of {spec.source_size} px in {len(CLASSES)} classes "
          f"({', '.join(CLASSES)}), made in {time.perf_counter() - start:.1f} s")
    return 0
