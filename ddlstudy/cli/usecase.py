"""`ddlstudy usecase new`: a use case of one's own images, every key written out."""

from __future__ import annotations

import argparse
import shlex
import tomllib
from pathlib import Path

from ddlstudy.config.options import path_arg
from ddlstudy.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("usecase", help="use cases of your own")
    usub = p.add_subparsers(dest="usecase_command", required=True, metavar="ACTION")
    new = usub.add_parser("new", help="write a use case TOML for a folder of your images, "
                          "every key written out (those left at their default commented)")
    new.add_argument("--data-dir", type=path_arg, required=True, help="an ImageFolder tree: "
                     "root/<class>/<image>")
    new.add_argument("--model", default="resnet18", help="the network (`ddlstudy models`)")
    new.add_argument("--image-size", type=int, default=224, help="side in pixels the images "
                     "are scaled to")
    new.add_argument("--name", help="the use case's name (default: the folder's)")
    new.add_argument("--out", type=path_arg, help="the TOML file to write (default: "
                     "<name>.toml here)")
    new.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_usecase)


def cmd_usecase(args: argparse.Namespace) -> int:
    from ddlstudy.config.folders import starter
    from ddlstudy.config.usecase import DataSpec
    from ddlstudy.files import check_output, write_outputs

    name = args.name or DataSpec(dir=args.data_dir).name
    out = args.out or Path(f"{name}.toml")
    if out.suffix != ".toml":
        raise ConfigError("--out", f"{out}: a use case is a .toml file")
    check_output("--out", out, args.force)
    text = starter(args.data_dir, args.model, args.image_size, out, args.name)
    from ddlstudy.config import usecase_from_dict
    from ddlstudy.config.folders import with_classes
    from ddlstudy.models import check  # imports torch: the model is built to be checked

    made = usecase_from_dict(tomllib.loads(text), source=str(out.resolve()))
    made = with_classes(made, made.data.dir)
    check(made.model, len(made.classes), made.train.image_size)  # refused before writing
    write_outputs("--out", {out: lambda f: f.write(text.encode())})
    print(f"wrote {out}; train it with `ddlstudy run --usecase {shlex.quote(str(out))}`")
    return 0
