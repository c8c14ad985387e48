"""A study plan: the use cases, the [settings] every cell shares and the [[cells]], read
and checked without torch (so a bad plan is refused at once); ``ddlstudy.study.matrix`` runs it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, TypeAdapter, ValidationError, create_model

from ddlstudy.config import DEFAULT_RUNS_DIR, HOME, USECASES_DIR, RunConfig
from ddlstudy.config.fields import NODES, SPARK
from ddlstudy.config.limits import most, size_bytes, why
from ddlstudy.config.loading import is_usecase_path
from ddlstudy.config.options import (
    cell_keys,
    config_from_args,
    key,
    options,
    run_parser,
    train_options,
)
from ddlstudy.config.recipe import NONE, accuracy, table
from ddlstudy.config.schema import WRITTEN, Finite, dotted, problem, validate
from ddlstudy.config.usecase import PLAIN_NAME
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.reading import read_toml

CELL_KEYS = cell_keys()
SETUP_TIMEOUT_S = 600.0
"""A cell's set-up time limit where the plan does not say ([study] setup_timeout_s)."""
DEFAULT_REPEAT = 3
"""Repeats of every cell where the plan does not say: enough for a median and a 95 %
interval; the repeats are interleaved (every cell once, then again)."""


@dataclass
class Plan:
    """A study: every cell run on every use case, ``repeat`` times, interleaved (each cell
    once, then again), with the sequential baseline added where a use case lacks it."""

    name: str
    path: Path
    usecases: list[str]
    cells: list[dict[str, Any]]
    repeat: int = 1
    runs_dir: Path = DEFAULT_RUNS_DIR
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    setup_timeout_s: float = SETUP_TIMEOUT_S
    """How long a cell's set-up may take (``StudyTable.setup_timeout_s``)."""
    mem_per_node: int | None = None
    """Bytes of memory a node of every cell asks of a scheduler (``--submit slurm``)."""
    usecase_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``[settings.<use case>]``: what differs for one use case (a VGG16 step takes 20
    times an AlexNet one: fewer --max-steps), between [settings] and the cells."""


@dataclass(frozen=True, kw_only=True)
class StudyTable:
    """A plan's ``[study]`` table: what the cells run on and where their runs go."""

    __pydantic_config__ = WRITTEN

    usecases: list[str]
    """The use cases every cell runs on: names from usecases/, or TOML files (a relative
    path is found beside the plan)."""
    name: str | None = None
    """The study's name: the folder its runs go into (default: the plan file's name)."""
    description: str = ""
    """One line on what the study compares, kept in study.json."""
    repeat: int = DEFAULT_REPEAT
    """Runs of every cell (interleaved: every cell once, then again), for a median and a
    95 % interval; ``--repeat`` overrides it."""
    cells_from: str | None = None
    """Run the [[cells]] of another plan (a shipped plan's name, or a file beside this
    one) instead of listing them: a quick variant of a plan keeps exactly its cells."""
    runs_dir: str | None = None
    """Where the runs and the report go (``--runs-dir`` overrides it; default runs/<name>);
    a relative path is taken from DDLSTUDY_HOME."""
    setup_timeout_s: float = SETUP_TIMEOUT_S
    """Seconds a cell's set-up may take (its checks, its model built: a factory of one's
    own that never returns) before it is a failed cell, with that reason, and the study
    goes on with the next (default 600)."""
    mem_per_node: str | None = None
    """The memory each node of a cell asks for when the study is submitted to Slurm
    (``--submit slurm``: each job's ``--mem``), e.g. "3GiB"; default: the partition's."""

    def __post_init__(self) -> None:
        if not self.usecases or not all(self.usecases):
            raise ConfigError("study.usecases", "list at least one use case by name or "
                              "path, e.g. [\"tiny\"]")
        if self.name is not None and not PLAIN_NAME.fullmatch(self.name):
            raise ConfigError("study.name", f"{self.name!r}: a study's name is the folder "
                              "its runs go into; use letters, digits, '.', '_' or '-'")
        _checked_repeat(self.repeat)
        if self.runs_dir is not None and not self.runs_dir.strip():
            raise ConfigError("study.runs_dir", "give a folder's path, e.g. \"runs/my-study\"")
        if isinstance(self.setup_timeout_s, bool) or \
                not 0 < self.setup_timeout_s <= most("seconds"):  # NaN too
            raise ConfigError("study.setup_timeout_s", f"must be seconds above 0, at most "
                              f"{most('seconds'):g}, got {self.setup_timeout_s!r}")
        if self.mem_per_node is not None:
            size_bytes("study.mem_per_node", self.mem_per_node)


STUDY_KEYS = {f.name for f in dataclasses.fields(StudyTable)}


def _value_type(f) -> Any:
    """The type a plan's value of the run option ``f`` must have, from its declaration."""
    kind = f.metadata.get("type")
    if f.metadata.get("parse") == "layers":
        return list[int]
    if kind is accuracy:
        return Finite | Literal[NONE]
    if kind is table:  # optimizer_args = {weight_decay = 0.05}
        return dict[str, Any]
    if f.metadata.get("const") is not None:  # true: the flag alone; false: not given
        what = f"must be true (the flag alone), false or a {f.metadata['metavar'] or 'value'}"
        return Annotated[bool | str, PlainValidator(functools.partial(_switch_or_text, what))]
    return {Path: Annotated[str, Field(min_length=1)], bool: bool, int: int,
            float: Finite}.get(kind, str)


def _switch_or_text(what: str, value: Any) -> bool | str:
    """A plan's value of a flag whose value may be left out (``--mlflow [URI]``)."""
    if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
        return value
    raise ValueError(what)


@functools.cache
def _cell(settings: bool) -> TypeAdapter:
    """A cell's table (or, ``settings``, the [settings] every cell shares, which names no
    strategy), typed from the run options' declarations."""
    fields = {key(f): (_value_type(f), None) for f in [*options(), *train_options()]
              if key(f) in CELL_KEYS and not (settings and key(f) == "strategy")}
    return TypeAdapter(create_model("Settings" if settings else "Cell", __config__=WRITTEN,
                                    **fields))


def _checked(adapter: TypeAdapter, values: Any, where: str, allowed: set[str]) -> Any:
    """``values`` validated by ``adapter``, else ConfigError naming ``where`` and the key."""
    if not isinstance(values, dict):
        raise ConfigError(where, "must be a TOML table")
    try:
        return validate(adapter, values)
    except ValidationError as exc:
        field, message = problem(exc, lambda loc: f"{where}.{dotted(loc)}")
        if message == "unknown key":
            message += f"; allowed: {', '.join(sorted(allowed))}"
        raise ConfigError(field, message) from None


def _keys(where: str, values: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ConfigError(where, "must be a TOML table")
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key; allowed: "
                          f"{', '.join(sorted(allowed))}")
    return values


def _plan_path(path: Path) -> Path:
    """A plan file, or the name of one shipped with ddlstudy (``demo``, ``paper``);
    anything else that exists is left to the reading gate to refuse (a folder, a FIFO)."""
    if path.exists() and not path.is_dir():
        return path
    shipped = USECASES_DIR / f"{path}.toml"
    if path.suffix != ".toml" and len(path.parts) == 1 and shipped.is_file():
        return shipped
    raise UsageError(f"study plan {path} does not exist")


def load_plan(path: Path, repeat: int | None = None, runs_dir: Path | None = None) -> Plan:
    path = _plan_path(Path(path))
    raw = read_toml(path, "study plan")
    if "model" in raw:
        raise UsageError(f"{path} is a use case, not a study plan; train it with "
                         f"`ddlstudy run --usecase {path}`")
    _keys("plan", raw, {"study", "settings", "cells"})
    study = _checked(TypeAdapter(StudyTable), raw.get("study", {}), "study", STUDY_KEYS)
    settings, own = _usecase_settings(raw.get("settings", {}), study.usecases)
    cells = _cells_from(study.cells_from, path.parent) if study.cells_from else \
        raw.get("cells", [])
    if study.cells_from and "cells" in raw:
        raise ConfigError("study.cells_from", "the plan lists [[cells]] too; keep one of them")
    if not isinstance(cells, list) or not cells:
        raise ConfigError("[[cells]]", "the plan needs at least one [[cells]] table with a "
                          "strategy")
    _check_cells(settings, cells, "[[cells]]")
    usecases = [_beside(u, path.parent) for u in study.usecases]
    if len(usecases) * len(cells) > most("cells"):
        raise ConfigError("[[cells]]", f"{len(cells)} cells x {len(usecases)} use case(s) is "
                          f"above the limit of {most('cells'):g}{why('cells')}")
    name = study.name or path.stem
    if not PLAIN_NAME.fullmatch(name):
        raise ConfigError("study.name", f"{name!r} (the plan file's name): a study's name is "
                          "the folder its runs go into; give [study] name")
    repeat = _checked_repeat(repeat if repeat is not None else study.repeat)
    if runs_dir is None:
        runs_dir = Path(study.runs_dir) if study.runs_dir else DEFAULT_RUNS_DIR / name
        if not runs_dir.is_absolute():
            runs_dir = HOME / runs_dir
    return Plan(name=name, path=path, usecases=usecases, cells=cells, repeat=repeat,
                runs_dir=runs_dir, description=study.description, settings=settings,
                setup_timeout_s=study.setup_timeout_s, mem_per_node=None
                if study.mem_per_node is None else size_bytes("study.mem_per_node",
                                                              study.mem_per_node),
                usecase_settings={_beside(u, path.parent): v for u, v in own.items()})


def _cells_from(name: str, folder: Path) -> Any:
    """The [[cells]] of the plan ``name`` (its own cells_from is not followed)."""
    beside = folder / name
    try:
        path = _plan_path(beside if beside.is_file() else Path(name))
    except UsageError as exc:
        raise ConfigError("study.cells_from", f"{exc}; name a shipped plan (demo, paper) or "
                          "a plan file beside this one") from None
    cells = read_toml(path, "study plan").get("cells")
    if not cells:
        raise ConfigError("study.cells_from", f"{path} lists no [[cells]] of its own (a "
                          "plan's cells_from is not followed): name a plan that lists them")
    return cells


def _usecase_settings(settings: Any, usecases: list[str]) -> tuple[Any, dict[str, dict]]:
    """[settings] without its tables, and those tables (``[settings.<use case>]``), each
    checked: named after one of the plan's use cases, holding settings."""
    if not isinstance(settings, dict):
        return settings, {}  # refused by _check_cells as any bad [settings]
    own = {k: v for k, v in settings.items() if isinstance(v, dict)}
    for name, values in own.items():
        if name not in usecases:
            raise ConfigError(f"[settings.{name}]", f"{name!r} is not one of this plan's use "
                              f"cases ({', '.join(usecases)}); a table in [settings] holds "
                              "what differs for one of them (a use case given as a path: "
                              "quote it, [settings.\"uc/x.toml\"])")
        _checked(_cell(True), values, f"[settings.{name}]", CELL_KEYS - {"strategy"})
    return {k: v for k, v in settings.items() if k not in own}, own


def _check_cells(settings: dict[str, Any], cells: list, where_cells: str) -> None:
    """Every cell a table of known flags (never --runs-dir, which the study owns) with
    values of their declared types: refused naming the cell and the key."""
    _checked(_cell(True), settings, "[settings]", CELL_KEYS - {"strategy"})
    for i, cell in enumerate(cells, 1):
        _checked(_cell(False), cell, f"{where_cells} #{i}", CELL_KEYS)


def _beside(usecase: str, folder: Path) -> str:
    """A plan's use case given as a path: found beside the plan (else, as any path, from
    the working directory); a name stays a name."""
    if is_usecase_path(usecase) and not Path(usecase).is_absolute() \
            and (folder / usecase).is_file():
        return str((folder / usecase).resolve())
    return usecase


def _checked_repeat(repeat: Any) -> int:
    if isinstance(repeat, bool) or not isinstance(repeat, int) or \
            not 0 < repeat <= most("repeats"):
        raise ConfigError("--repeat", f"must be an integer from 1 to {most('repeats'):g}, got "
                          f"{repeat!r}")
    return repeat


def run_flags(usecase: str | None, flags: dict[str, Any], runs_dir: Path) -> list[str]:
    """The ``ddlstudy run`` flags of a cell of ``usecase`` (None: the use case of the
    cell's --data-dir alone)."""
    named = ["--usecase", usecase] if usecase is not None else []
    return [*named, "--runs-dir", str(runs_dir), *cell_flags(flags)]


def cell_flags(flags: dict[str, Any]) -> list[str]:
    """A cell's keys as ``ddlstudy run`` flags."""
    out = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else []
        elif isinstance(value, list):  # stage_starts = [0, 9]
            out += [flag, ",".join(map(str, value))]
        elif isinstance(value, dict):  # optimizer_args = {weight_decay = 0.05}
            out += [flag, json.dumps(value)]
        elif str(value).startswith("-"):  # a value, even where it looks like a flag
            out += [f"{flag}={value}"]
        else:
            out += [flag, str(value)]
    return out


def cell_config(usecase: str | None, flags: dict[str, Any], runs_dir: Path) -> RunConfig:
    """The config ``ddlstudy run`` would make of a cell's flags (UsageError if bad)."""
    return config_from_args(run_parser().parse_args(run_flags(usecase, flags, runs_dir)))


NOT_THE_BASELINE = frozenset(
    {f.name for f in dataclasses.fields(RunConfig)
     if f.metadata.get("group") in (NODES, SPARK)}
    | {"scaling", "lr_scaling", "workers", "stages", "micro_batches", "schedule",
       "stage_starts", "reshard_after_forward", "shared_buffers", "tensor", "replicas",
       "devices"})
"""Settings a study's added baseline does not take from the plan: where and how the cells
are distributed and laid out. The baseline is the local sequential run, whatever the
cells' backend (a memory plan's MPI settings gave it an MPI baseline, and every speedup
was '-')."""


def baseline(settings: dict[str, Any]) -> dict[str, Any]:
    """The cell of the sequential baseline a study adds: the plan's ``settings`` of what is
    trained and for how long, on one local process."""
    return {k: v for k, v in settings.items() if k not in NOT_THE_BASELINE} | {
        "strategy": "sequential"}


def configs(plan: Plan, overrides: dict[str, Any]) -> list[tuple[str, dict, RunConfig]]:
    """Every cell of every use case (the baseline first where the plan lacks it) with its
    config, checked as ``ddlstudy run`` checks its flags (still without torch): a bad value
    is refused naming the plan, the use case and the cell."""
    specs = []
    for uc in plan.usecases:
        settings = dict(plan.settings) | plan.usecase_settings.get(uc, {})
        cells = [settings | c | overrides for c in plan.cells]
        if not any(c.get("strategy") == "sequential" and c.get("backend", "local") == "local"
                   and not set(c) - {"strategy", "backend", "nodes"} for c in plan.cells):
            cells.insert(0, baseline(settings | overrides))
        specs += [(uc, c) for c in cells]
    out = []
    for uc, flags in specs:
        try:
            cfg = cell_config(uc, flags, plan.runs_dir)
        except UsageError as exc:
            raise UsageError(f"{plan.path}, use case {uc}, cell {flags}: {exc}") from None
        out.append((uc, flags, cfg))
    return out
