"""A study of an advice's rows (``ddlstudy study --from-advice``): the plan made from an
advise.json, checked as a plan file is (an advise.json is a file anyone can edit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlstudy.config.loading import load_usecase
from ddlstudy.config.usecase import PLAIN_NAME
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.records.formats import Advice, load
from ddlstudy.records.plan import (
    CELL_KEYS,
    DEFAULT_REPEAT,
    Plan,
    _cell,
    _check_cells,
    _checked,
    _checked_repeat,
    cell_config,
)


def load_advice(path: Path) -> dict[str, Any]:
    """An advise.json, checked enough to build a study from (UsageError if not one)."""
    if not Path(path).exists():
        raise UsageError(f"{path} does not exist; write one with `ddlstudy advise --usecase "
                         "U --out DIR`")
    return load(path, Advice, "advise.json")


ADVICE_DATA = ("data_dir", "model", "datasets_dir", "heap")
"""The probe settings of an advise.json that say what it trained (and with which
allocator setting): its study trains that."""


def advice_data(advice: dict[str, Any]) -> dict[str, Any]:
    """An advice's probe settings that are ADVICE_DATA: what each of its rows' runs is
    given besides the row's flags."""
    return {k: v for k, v in (advice.get("probe_settings") or {}).items()
            if k in ADVICE_DATA}


def _usecase_name(path: Path, usecase: str) -> str:
    """The name of the use case an advise.json names by its file (written there by hand)."""
    try:
        return load_usecase(usecase).name
    except UsageError as exc:
        raise UsageError(f"{path}: usecase {exc}") from None


def _advised(path: Path, advice: dict[str, Any]) -> str | None:
    """The use case an advise.json trained, as ``ddlstudy run --usecase`` takes it: its
    ``origin`` (a name, or a file's absolute path), else its ``usecase``; None where it
    trained --data-dir's folder alone (its study trains that folder again)."""
    origin = advice.get("origin") or {}
    if not isinstance(origin, dict):
        raise UsageError(f"{path}: origin: must be a JSON object (where the advice's use case, "
                         "data and model came from)")
    usecase = origin.get("usecase", advice["usecase"])
    if usecase is None and origin.get("data_dir"):  # --data-dir's folder alone: trained so
        return None
    if usecase is None:
        raise UsageError(f"{path}: origin names neither a use case nor a --data-dir; run "
                         "`ddlstudy advise` again")
    if not isinstance(usecase, str) or not usecase.strip():
        raise UsageError(f"{path}: origin.usecase: must be a use case's name or file, got "
                         f"{usecase!r}")
    return usecase


def spread(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` of ``rows`` over the whole ranking: the first two, then evenly spaced
    down to the last (a check of the ranking, not only of its head, whose rows are
    often a few % apart)."""
    if count >= len(rows):
        return list(rows)
    head = rows[:min(2, count)]
    rest = rows[len(head):]
    more = count - len(head)
    picks = sorted({round((i + 1) * (len(rest) - 1) / more) for i in range(more)})
    return head + [rest[i] for i in picks]


def advice_plan(path: Path, top: int, repeat: int | None = None,
                runs_dir: Path | None = None, spread_out: bool = False) -> Plan:
    """A study of the ``top`` runnable recommendations of an advise.json (``spread_out``:
    ``top`` of them spread over its ranking), the baseline added as in every study, into
    ``<its folder>/confirm`` unless ``runs_dir`` says."""
    advice = load_advice(path)
    runnable = [r for r in advice["ranking"] if r.get("runnable", True)]
    rows = spread(runnable, top) if spread_out else runnable[:top]
    if not rows:
        why = f" (it predicts for a {advice['link']} link between other machines)" \
            if advice["ranking"] and advice.get("link") else ""
        raise UsageError(f"{path} has no recommendation that can run here{why}; run "
                         f"`ddlstudy advise` again")
    usecase = _advised(path, advice)
    settings = advice_data(advice)
    try:  # checked as a plan's cells are: an advise.json is a file anyone can edit
        _checked(_cell(True), settings, "probe_settings", CELL_KEYS - {"strategy"})
        _check_cells({}, [r["flags"] for r in rows], "ranking")
    except ConfigError as exc:
        raise UsageError(f"{path}: {exc}") from None
    repeat = _checked_repeat(repeat if repeat is not None else DEFAULT_REPEAT)
    name = advice["usecase"] if usecase is None or PLAIN_NAME.fullmatch(advice["usecase"]) \
        else _usecase_name(path, advice["usecase"])
    return Plan(name=f"advice-{name}", path=Path(path),
                usecases=[usecase], cells=[r["flags"] for r in rows],
                repeat=repeat, runs_dir=runs_dir or Path(path).parent / "confirm",
                description=f"the top {len(rows)} recommendations of {path}",
                settings=settings)


def row_configs(path: Path, advice: dict[str, Any]) -> list[tuple[dict, dict]]:
    """Each row of an advice with the configuration ``ddlstudy run`` makes of it (as a run's
    manifest records it), to match runs to rows; a row that cannot be made here (on
    hosts that are not up, for a --link's machines) is left out."""
    usecase = _advised(path, advice)
    data = advice_data(advice)
    out = []
    for row in advice["ranking"]:
        try:
            out.append((row, cell_config(usecase, data | row["flags"],
                                         Path(path).parent).to_dict()))
        except UsageError:
            continue
    return out
