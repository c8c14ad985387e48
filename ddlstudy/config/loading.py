"""Reading a use case: by its name (usecases/<name>.toml) or a TOML file's path, through
the reading gate, checked against the declarations of ``config.usecase`` by pydantic
(``config.schema``): a wrong type, a missing key or an unknown one is refused naming the
key and, for an unknown one, the keys its table takes."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ddlstudy.config.paths import USECASES_DIR
from ddlstudy.config.recipe import NONE
from ddlstudy.config.schema import problem, validate
from ddlstudy.config.usecase import DataSpec, ModelSpec, TrainSpec, UseCase
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.reading import read_toml

_SECTIONS = {"model": ModelSpec, "data": DataSpec, "train": TrainSpec}


def available_usecases() -> list[str]:
    return sorted(p.stem for p in USECASES_DIR.glob("*.toml") if _is_usecase_file(p))


def _is_usecase_file(path: Path) -> bool:
    try:
        return "model" in read_toml(path, "use case")
    except UsageError:
        return False


def is_usecase_path(name_or_path: str) -> bool:
    """Whether a use case is given as a TOML file's path, not a name from usecases/."""
    return Path(name_or_path).suffix == ".toml" or "/" in name_or_path


def resolve_usecase_path(name_or_path: str) -> Path:
    """A name from usecases/ or a path to a TOML file."""
    if not name_or_path.strip():
        raise ConfigError("--usecase", f"{name_or_path!r} is empty; give a use case's name "
                          f"({', '.join(available_usecases())}) or a TOML file's path")
    path = Path(name_or_path)
    if path.is_dir():
        raise UsageError(f"use case {name_or_path} is a folder; give a use case's TOML file, "
                         "or --data-dir FOLDER to train on a folder of images")
    if is_usecase_path(name_or_path):
        if not path.exists() and not path.is_symlink():  # a link's trouble: the gate says
            raise UsageError(f"use-case file {name_or_path} does not exist")
        return path
    candidate = USECASES_DIR / f"{name_or_path}.toml"
    if candidate.is_file() and not _is_usecase_file(candidate):
        raise UsageError(f"{candidate} is a study plan, not a use case; run it with "
                         f"`ddlstudy study {candidate}`")
    if not candidate.is_file():
        raise UsageError(f"unknown use case {name_or_path!r}; choose one of: "
                         f"{', '.join(available_usecases())}, or give a path to a TOML file")
    return candidate


def load_usecase(name_or_path: str) -> UseCase:
    path = resolve_usecase_path(name_or_path)
    return usecase_from_dict(read_toml(path, "use case"), source=str(path))


@functools.cache
def _adapter() -> TypeAdapter:
    return TypeAdapter(UseCase)


def usecase_from_dict(raw: dict[str, Any], source: str = "") -> UseCase:
    """The use case of a parsed TOML document (or a manifest's record of one), checked
    against the declarations above: ConfigError naming the key."""
    if not isinstance(raw, dict):
        raise ConfigError("use case", "must be a TOML document of tables")
    if "source" in raw:  # set here, from where the file is, never by the file
        raise ConfigError("source", "unknown key in the use case")
    try:
        usecase = validate(_adapter(), raw | {"source": source})
    except ValidationError as exc:
        field, message = problem(exc)
        raise ConfigError(field, _fix(field, message)) from None
    if source:  # a factory file or a data folder named in a use case is found beside it
        usecase = dataclasses.replace(usecase, model=usecase.model.anchored(Path(source).parent),
                                      data=usecase.data.anchored(Path(source).parent))
    return usecase


def _fix(field: str, message: str) -> str:
    """What to do about a key that is unknown or missing: the keys its table takes."""
    section, _, key = field.rpartition(".")
    cls = _SECTIONS.get(section, UseCase if not section else None)
    if cls is None:
        return message
    if message == "unknown key":
        allowed = sorted(f.name for f in dataclasses.fields(cls) if f.name != "source")
        return f"unknown key in {f'[{section}]' if section else 'the use case'}; allowed " \
               f"keys: {', '.join(allowed)}"
    if message == "is required" and key in _SECTIONS:
        return f"the [{key}] table is missing"
    return message


def with_overrides(usecase: UseCase, **train_overrides: Any) -> UseCase:
    """Apply CLI flags such as --epochs to the use case's [train] table (None: keep;
    ``none``: set to None, e.g. no target accuracy)."""
    changes = {k: None if v == NONE else v for k, v in train_overrides.items()
               if v is not None}
    if not changes:
        return usecase
    return dataclasses.replace(usecase, train=dataclasses.replace(usecase.train, **changes))
