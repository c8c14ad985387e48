"""The config layer under arbitrary values (hypothesis): every run option, every use-case
key and every study-plan cell key either gives a valid configuration or is refused with a
ConfigError (a UsageError for the plan's flags) that names it; nothing else escapes."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlstudy.config import RunConfig, usecase_from_dict
from ddlstudy.config.options import flag, train_options
from ddlstudy.config.run import options
from ddlstudy.config.usecase import DataSpec, ModelSpec, TrainSpec
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.records.plan import CELL_KEYS, configs, load_plan

ANY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "0", "1", "-1", "nan", "inf", "1e308", "../x", "a,b", "0,9",
                     "local[2]", "mpi", "fp16", "topk:0.1", "/", "emulated"]),
    st.lists(st.integers(min_value=-2, max_value=40), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
SLOW = settings(max_examples=int(os.environ.get("DDLSTUDY_EXAMPLES", 150)), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
RUN_FIELDS = [f for f in options() if f.name not in ("data_dir",)]  # data_dir: a real tree


def _names_it(exc: Exception, *names: str) -> bool:
    text = str(exc)
    return any(n in text for n in names)


@SLOW
@given(field=st.sampled_from(RUN_FIELDS), value=ANY)
def test_any_value_of_any_run_option(tiny, tmp_path_factory, field, value):
    base = {"usecase": tiny, "runs_dir": tmp_path_factory.getbasetemp() / "runs"}
    try:
        RunConfig(**(base | {field.name: value}))
    except ConfigError as exc:
        # the option itself, or the option it needs (e.g. --hosts needs --backend mpi)
        assert exc.field.startswith("--"), exc
        assert _names_it(exc, flag(field), "--backend", "--nodes", "--spark", "--reduce"), exc


SECTIONS = {"model": ModelSpec, "data": DataSpec, "train": TrainSpec}
KEYS = [("", k) for k in ("name", "description", "classes")] + [
    (s, f.name) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _tiny_dict(tiny) -> dict:
    return {"name": tiny.name, "description": tiny.description, "classes": list(tiny.classes),
            "model": {"arch": str(tiny.model.arch), "width": tiny.model.width},
            "data": dataclasses.asdict(tiny.data), "train": dataclasses.asdict(tiny.train)}


@SLOW
@given(key=st.sampled_from(KEYS), value=ANY)
def test_any_value_of_any_usecase_key(tiny, key, value):
    raw = _tiny_dict(tiny)
    section, name = key
    (raw[section] if section else raw)[name] = value
    try:
        usecase_from_dict(raw)
    except ConfigError as exc:  # the key, or an item of it (classes[0])
        assert exc.field.split("[")[0] in (name, f"{section}.{name}"), exc


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{_string(k)} = {_toml(v)}" for k, v in value.items()) + "}"


CELL = sorted(CELL_KEYS - {"strategy", "usecase", "data_dir"})


@SLOW
@given(key=st.sampled_from(CELL), value=ANY.filter(lambda v: v is not None))
def test_any_value_of_any_study_cell_key(tmp_path_factory, key, value):
    folder = tmp_path_factory.mktemp("plan")
    plan = folder / "plan.toml"
    plan.write_text(f'[study]\nusecases = ["tiny"]\n[[cells]]\nstrategy = "sequential"\n'
                    f"{key} = {_toml(value)}\n")
    try:
        configs(load_plan(plan, runs_dir=folder / "runs"), {})
    except UsageError as exc:
        flagged = "--" + key.replace("_", "-")
        assert _names_it(exc, flagged, f".{key}", "--backend", "--nodes", "--spark",
                         "--reduce", "--snapshot"), exc


@pytest.mark.parametrize("f", [f for f in train_options() if f.metadata["type"] is float],
                         ids=lambda f: f.name)
def test_train_flags_refuse_non_finite_numbers(tiny, f):
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match=f.name):
            usecase_from_dict(_tiny_dict(tiny) | {"train": _tiny_dict(tiny)["train"]
                                                   | {f.name: bad}})
