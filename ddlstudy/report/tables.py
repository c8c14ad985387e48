"""Tables from a folder of runs: each configuration against its use case's baseline.

Speedup is the ratio of steady-state images per second to the sequential baseline's on the
same use case (so runs cut short with --max-steps still compare); parallel efficiency is
the speedup divided by the cores (or GPUs) the configuration used. Three views:

- ``runs_frame`` (in ``runs``): one row per run (the long, tidy table for your own analysis);
- ``speedup_table``: one row per configuration, medians and spread over repeats;
- ``paper_tables``: the paper's Tables 1-3 (data parallelism; model and hybrid
  parallelism; multi-node), a row per configuration and, per use case, the time per epoch
  and the speedup.

Cells a study planned but could not run (no GPU, a backend not available) come from the
study's ``study.json`` and are shown with the reason, never dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ddlstudy.files import atomic_write_text
from ddlstudy.report.formats import FORMATS, _fmt, render
from ddlstudy.report.runs import (
    KEY,
    _median,
    is_baseline,
    load_planned,
    load_runs,
    runs_frame,
)
from ddlstudy.strategies import REGISTRY as STRATEGIES

TABLES = {
    1: "Table 1: data parallelism (CPU and GPU)",
    2: "Table 2: model and hybrid parallelism",
    3: "Table 3: several nodes (MPI and Spark)",
}


def _reached_text(g: pd.DataFrame) -> str:
    """How many of a configuration's counted runs reached its target ('2/3'), '' when its
    use case sets none."""
    judged = [r for r in g.reached if r is not None and r == r]
    return f"{sum(bool(r) for r in judged)}/{len(judged)}" if judged else ""


def _tta(g: pd.DataFrame) -> tuple[float | None, float | None]:
    """(target, median time to it) of a configuration's counted runs; the time only when
    every one of them reached the same target (a median of the lucky ones would flatter)."""
    targets = {t for t in g.target if t is not None and t == t}
    if len(targets) != 1 or g.empty or not all(r is True for r in g.reached):
        return (targets.pop() if len(targets) == 1 else None), None
    return targets.pop(), _median(list(g.tta_s.dropna()))


def short_reason(reason: str) -> str:
    """A skip reason without the flag it names and the advice after the semicolon."""
    reason = reason.split(": ", 1)[1] if reason.startswith("--") and ": " in reason else reason
    return reason.split(";")[0]


def _status(statuses: list[str], reasons: list[str], noisy: int = 0) -> str:
    done = statuses.count("completed")
    left_out = f"{noisy} noisy left out" if noisy else ""
    if done == len(statuses):
        return f"ok, {left_out}" if left_out else "ok"
    if done == 0 and statuses[0] == "skipped":
        return f"skipped: {short_reason(reasons[0])}"
    others = [s for s in statuses if s != "completed"]
    return ", ".join([*(f"{others.count(s)} {s}" for s in dict.fromkeys(others)),
                      *([left_out] if left_out else [])])


BOOTSTRAP = 2000
"""Resamples behind every 95 % interval (seeded: a report is the same every time)."""


def spread_of(g: pd.DataFrame) -> list[float]:
    """What a configuration's speed varies over: its repeats' images/s, or, with one
    repeat, that run's epochs (each epoch's steady images/s)."""
    if len(g) >= 2:
        return list(g.images_per_s.dropna())
    return list(g.epoch_rates.iloc[0]) if len(g) == 1 else []


def interval(mine: list[float], base: list[float] | None = None) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of the median of ``mine`` (divided by the median of
    ``base``, resampled alike, for a speedup); None with fewer than 2 values a side."""
    if len(mine) < 2 or (base is not None and len(base) < 2):
        return None
    rng = np.random.default_rng(0)
    values = np.median(rng.choice(mine, (BOOTSTRAP, len(mine))), axis=1)
    if base is not None:
        values = values / np.median(rng.choice(base, (BOOTSTRAP, len(base))), axis=1)
    low, high = np.quantile(values, [0.025, 0.975])
    return float(low), float(high)


def _interval_text(bounds: tuple[float, float] | None, mark_one: bool = False) -> str:
    if bounds is None:
        return ""
    text = f"{_fmt(bounds[0])}-{_fmt(bounds[1])}"
    return f"{text} (includes 1)" if mark_one and bounds[0] <= 1.0 <= bounds[1] else text


def speedup_table(manifests: list[dict], planned: list[dict] = (),
                  include_noisy: bool = False) -> pd.DataFrame:
    """One row per configuration: medians over the completed repeats (not the noisy ones,
    unless ``include_noisy``), epoch-time spread."""
    frame = runs_frame(manifests, planned, include_noisy)
    baselines = frame[is_baseline(frame) & frame.counted].groupby(["usecase", "setting"])
    bases = {k: spread_of(g) for k, g in baselines}
    base_tta = {k: _tta(g) for k, g in baselines}
    rows = []
    for key, g in frame.groupby(KEY, sort=True, dropna=False):
        ok = g[g.counted]
        spread = spread_of(ok)
        base = bases.get((g.usecase.iloc[0], g.setting.iloc[0]), [])
        times = list(ok.epoch_s.dropna())
        noisy = int(((g.status == "completed") & ~g.counted).sum())
        target, tta = _tta(ok)
        b_target, b_tta = base_tta.get((g.usecase.iloc[0], g.setting.iloc[0]), (None, None))
        rows.append({
            **dict(zip(KEY, key, strict=True)), "table": int(g.table.iloc[0]),
            "processes": int(g.processes.iloc[0]),
            "scaling": g.scaling.iloc[0], "runs": len(ok),
            "status": _status(list(g.status), list(g.reason), noisy),
            "epoch_s": _median(times),
            "epoch_s_spread": f"{min(times):.2f}-{max(times):.2f}" if times else "",
            "images_per_s": _median(list(ok.images_per_s.dropna())),
            "images_per_s_95": _interval_text(interval(spread)),
            "speedup": _median(list(ok.speedup.dropna())),
            "speedup_95": _interval_text(interval(spread, base), mark_one=True)
            if base else "",
            "efficiency": _median(list(ok.efficiency.dropna())),
            "val_accuracy": _median(list(ok.val_accuracy.dropna())),
            "target": target, "reached": _reached_text(ok), "time_to_target_s": tta,
            "tta_speedup": b_tta / tta if tta and b_tta and b_target == target else None,
        })
    columns = [*KEY, "table", "processes", "scaling", "runs", "status", "epoch_s", "epoch_s_spread",
               "images_per_s", "images_per_s_95", "speedup", "speedup_95", "efficiency",
               "val_accuracy", "target", "reached", "time_to_target_s", "tta_speedup"]
    table = pd.DataFrame(rows, columns=columns)
    # The main setting first (most runs), then the baseline, then by table and speed.
    rank = {name: i for i, name in enumerate(STRATEGIES.loaded())}
    runs = table.groupby(["usecase", "setting"]).runs.transform("sum")
    order = table.assign(_runs=-runs, _base=~is_baseline(table),
                         _strategy=table.strategy.map(lambda n: rank.get(n, len(rank))))
    order = order.sort_values(["usecase", "_runs", "setting", "_base", "table", "nodes",
                               "_strategy", "config"], kind="stable")
    return order.drop(columns=["_runs", "_base", "_strategy"]).reset_index(drop=True)


def main_settings(table: pd.DataFrame) -> dict[str, str]:
    """Each use case's setting with the most runs (the speedup table lists it first)."""
    return {uc: g.setting.iloc[0] for uc, g in table.groupby("usecase", sort=False)}


def only_main(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of each use case's main setting (what the paper's tables and the figures
    show; ``left_apart`` names the rest)."""
    main = main_settings(table)
    return table[[main[uc] == s for uc, s in zip(table.usecase, table.setting, strict=True)]]


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


def paper_tables(table: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """The paper's layout: per table, a row per configuration and per use case the time
    per epoch and the speedup (or why the cell is empty)."""
    out = {}
    usecases = list(dict.fromkeys(table.usecase))
    table = only_main(table)
    for number in TABLES:
        part = table[(table.table == number) | is_baseline(table)]
        if number != 1 and not (part.table == number).any():
            continue
        rows = {}
        for r in part.itertuples(index=False):
            row = rows.setdefault(r.config, {"configuration": r.config})
            row[f"{r.usecase} epoch s"] = (_fmt(r.epoch_s) if r.status == "ok"
                                           else r.status)
            row[f"{r.usecase} speedup"] = _fmt(r.speedup) if r.status == "ok" else ""
        columns = ["configuration", *(f"{u} {c}" for u in usecases
                                      for c in ("epoch s", "speedup"))]
        out[number] = pd.DataFrame(list(rows.values()), columns=columns).fillna("-")
    return out


SUMMARY_COLUMNS = ["usecase", "config", "scaling", "cores", "runs", "status", "epoch_s",
                   "epoch_s_spread", "images_per_s", "speedup", "speedup_95", "efficiency",
                   "val_accuracy", "reached", "time_to_target_s", "tta_speedup"]


class Report:
    """Everything ``ddlstudy report`` shows, computed once from a runs folder."""

    def __init__(self, runs_dir: Path, include_noisy: bool = False) -> None:
        self.runs_dir = Path(runs_dir)
        self.manifests = load_runs(self.runs_dir)
        self.by_id = {m.get("id"): m for m in self.manifests}
        self.planned = load_planned(self.runs_dir)
        self.runs = runs_frame(self.manifests, self.planned, include_noisy)
        self.table = speedup_table(self.manifests, self.planned, include_noisy)
        self.paper = paper_tables(self.table)

    def text(self, fmt: str = "markdown") -> str:
        """The summary table, then the paper's tables (of each use case's main setting),
        then what was kept apart, in one format."""
        columns = list(SUMMARY_COLUMNS)
        apart = left_apart(self.table)
        if apart:  # several settings: each row says which
            columns.insert(1, "setting")
        parts = [render(self.table[columns], fmt, "Speedup against the sequential "
                        "baseline of the same setting (medians over repeats)")]
        if fmt != "csv":
            parts += [render(t, fmt, TABLES[n]) for n, t in self.paper.items()]
            parts += ["Kept apart (runs of different settings are never merged):\n"
                      + "\n".join(f"- {note}" for note in apart)] if apart else []
        return "\n\n".join(parts)

    def write_tables(self, out: Path, fmt: str = "markdown") -> list[Path]:
        """Tables in ``fmt`` (plus the tidy runs.csv)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        ext = FORMATS[fmt]
        written = {out / f"speedup.{ext}": render(self.table, fmt),
                   out / "runs.csv": self.runs.drop(columns=["epoch_rates"]).to_csv(index=False)}
        for n, t in self.paper.items():
            written[out / f"table{n}.{ext}"] = render(t, fmt, TABLES[n])
        for path, text in written.items():
            atomic_write_text(path, text.rstrip("\n") + "\n")
        return list(written)
