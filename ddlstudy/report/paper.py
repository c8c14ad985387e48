"""The paper's layout of a speedup table (``paper_tables``: Tables 1-3, a row per
configuration and per use case the time per epoch and the speedup), and which of a use
case's settings they show (``only_main``: the one with the most runs; ``left_apart``
names the others, never merged with it)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ddlstudy.report.formats import cell_text
from ddlstudy.report.runs import is_baseline

TABLES = {
    1: "Table 1: data parallelism (CPU and GPU)",
    2: "Table 2: model and hybrid parallelism",
    3: "Table 3: several nodes (MPI and Spark)",
}


def main_settings(table: pd.DataFrame) -> dict[str, str]:
    """Each use case's setting with the most runs (the speedup table lists it first)."""
    return {uc: g.setting.iloc[0] for uc, g in table.groupby("usecase", sort=False)}


def only_main(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of each use case's main setting (what the paper's tables and the figures
    show; ``left_apart`` names the rest)."""
    main = main_settings(table)
    return table[np.array([main[uc] == s for uc, s in zip(table.usecase, table.setting,
                                                          strict=True)], dtype=bool)]


def left_apart(table: pd.DataFrame) -> list[str]:
    """What the report did not merge: per use case, the settings beside its main one, with
    their runs, and whether they have a baseline of their own to divide by."""
    notes = []
    main = main_settings(table)
    for (uc, other), g in table.groupby(["usecase", "setting"], sort=False):
        if other == main[uc]:
            continue
        base = "its own baseline" if is_baseline(g).any() and g.speedup.notna().any() else \
            "no sequential baseline of its own, so no speedup"
        notes.append(f"{uc}: {int(g.runs.sum())} run(s) of another setting ({other}) are "
                     f"kept apart from the main one ({main[uc]}): {base}")
    return notes


def paper_tables(table: pd.DataFrame, joined: bool = False) -> dict[int, pd.DataFrame]:
    """The paper's layout: per table, a row per configuration and per use case the time
    per epoch and the speedup (or why the cell is empty); ``joined``: both in one column
    per use case ('1.20 s, 1.65x'), narrow enough for a terminal."""
    out = {}
    usecases = list(dict.fromkeys(table.usecase))
    table = only_main(table)
    for number in TABLES:
        part = table[(table.table == number) | is_baseline(table)]
        if number != 1 and not (part.table == number).any():
            continue
        rows = {}
        for r in part.itertuples(index=False):
            rows.setdefault(r.config, {"configuration": r.config}).update(
                _paper_cells(r, joined))
        columns = ["configuration", *(usecases if joined else
                                      (f"{u} {c}" for u in usecases
                                       for c in ("epoch s", "speedup")))]
        out[number] = pd.DataFrame(list(rows.values()), columns=columns).fillna("-")
    return out


def _paper_cells(r, joined: bool) -> dict[str, str]:
    """A configuration's cells of the paper's tables: its figures (marked where they come
    from noisy runs only), or its status where it has none."""
    measured = r.status.startswith("ok") or r.noisy
    mark = " (noisy)" if r.noisy else ""
    if joined:
        speedup = f", {cell_text(r.speedup)}x" if pd.notna(r.speedup) else ""
        return {r.usecase: f"{cell_text(r.epoch_s)} s{speedup}{mark}" if measured else r.status}
    return {f"{r.usecase} epoch s": cell_text(r.epoch_s) + mark if measured else r.status,
            f"{r.usecase} speedup": cell_text(r.speedup) + mark if measured else ""}
