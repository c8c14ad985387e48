"""Tables from a folder of runs: each configuration against its use case's baseline.

Speedup is the ratio of steady-state images per second to the sequential baseline's on the
same use case (so runs cut short with --max-steps still compare); parallel efficiency is
the speedup divided by the cores (or GPUs) the configuration used. Three views:

- ``runs_frame`` (in ``runs``): one row per run (the long, tidy table for your own analysis);
- ``speedup_table``: one row per configuration, medians and spread over repeats;
- ``paper_tables`` (in ``paper``): the paper's Tables 1-3 (data parallelism; model and
  hybrid parallelism; multi-node), a row per configuration and, per use case, the time per
  epoch and the speedup.

Cells a study planned but could not run (no GPU, a backend not available) come from the
study's ``study.json`` and are shown with the reason, never dropped. Runs marked noisy (other
processes used their host) are left out of a configuration's figures when it has quiet runs;
when it has none, its noisy runs give them, marked ``noisy`` with the cores the others used
(a busy host's report is never empty).

``Report.text`` prints, in Markdown, a table that fits a terminal (``TERMINAL``: fewer
columns, plain headers); speedup.csv and the printed CSV keep every column under its name.
Every place the report shows a use case's target names the metric it is of
(``target_metrics``: accuracy, or macro_f1 where ``[train] target_metric`` chose it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ddlstudy.config.recipe import TARGET_METRICS
from ddlstudy.files import atomic_write_text
from ddlstudy.records.memory import MEMORY
from ddlstudy.report.formats import FORMATS, cell_text, fitted_markdown, render, wrapped
from ddlstudy.report.paper import TABLES as TABLES
from ddlstudy.report.paper import left_apart, paper_tables
from ddlstudy.report.paper import main_settings as main_settings
from ddlstudy.report.paper import only_main as only_main
from ddlstudy.report.projection import DEFAULT_HARDWARE, Hardware
from ddlstudy.report.runs import (
    KEY,
    PEAKS,
    _median,
    is_baseline,
    load_planned,
    load_runs,
    memory_cells,
    reached_text,
    runs_frame,
    short_reason,
    shown,
    time_to_target,
)
from ddlstudy.strategies import REGISTRY as STRATEGIES


def _status(statuses: list[str], reasons: list[str], noisy: int = 0, mark: str = "") -> str:
    """'ok', or what went otherwise; ``noisy``: the noisy runs left out, ``mark``: the
    noisy mark of figures that come from noisy runs only (it stands in for 'ok')."""
    done = statuses.count("completed")
    left_out = [f"{noisy} noisy left out"] if noisy else []
    if done == len(statuses):
        return ", ".join([mark or "ok", *left_out])
    if done == 0 and statuses[0] == "skipped":
        return f"skipped: {short_reason(reasons[0])}"
    others = [s for s in statuses if s != "completed"]
    return ", ".join([*([mark] if mark else []),
                      *(f"{others.count(s)} {s}" for s in dict.fromkeys(others)), *left_out])


def _noisy_mark(runs: pd.DataFrame, cores: dict[str, float | None]) -> str:
    """'noisy (others 1.2 cores)' for figures from noisy runs only ('' otherwise): the
    most cores other processes used on its host, over its runs."""
    if runs.empty or not runs.noisy.all():
        return ""
    used = sorted(c for c in (cores.get(r) for r in runs.run) if c is not None)
    if not used:
        return "noisy"
    span = f"{used[0]:.1f}" if f"{used[0]:.1f}" == f"{used[-1]:.1f}" else \
        f"{used[0]:.1f}-{used[-1]:.1f}"
    return f"noisy (others {span} cores)"


def others_cores(manifest: dict) -> float | None:
    """The most cores other processes used on any host of a run (None: not measured)."""
    others = (manifest.get("host_load") or {}).get("others_cores") or {}
    return max(others.values()) if others else None


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
    return quotient_interval((mine, 1), *([] if base is None else [(base, -1)]))


def quotient_interval(*parts: tuple[list[float], int]) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of a product of medians, each of a part's values
    resampled (in the order given) and multiplied in (power 1) or divided out (-1);
    None with fewer than 2 values in any part."""
    if min(len(values) for values, _ in parts) < 2:
        return None
    rng = np.random.default_rng(0)
    product = None
    for values, power in parts:
        median = np.median(rng.choice(values, (BOOTSTRAP, len(values))), axis=1)
        product = median if product is None else \
            product * median if power > 0 else product / median
    low, high = np.quantile(product, [0.025, 0.975])
    return float(low), float(high)


def _interval_text(bounds: tuple[float, float] | None, mark_one: bool = False) -> str:
    if bounds is None:
        return ""
    text = f"{cell_text(bounds[0])}-{cell_text(bounds[1])}"
    return f"{text} (includes 1)" if mark_one and bounds[0] <= 1.0 <= bounds[1] else text


COLUMNS = [*KEY, "table", "processes", "scaling", "runs", "status", "noisy", "epoch_s",
           "epoch_s_spread", "images_per_s", "images_per_s_95", "speedup", "speedup_95",
           "efficiency", "val_accuracy", "val_macro_f1", "target", "target_metric", "reached",
           "time_to_target_s", "tta_speedup",
           *(f"peak_{what}_gib{end}" for what in PEAKS for end in ("", "_min", "_max"))]
"""The columns of ``speedup_table`` (speedup.csv's; the notebook shows them)."""


def speedup_table(manifests: list[dict], planned: list[dict] = (),
                  include_noisy: bool = False) -> pd.DataFrame:
    """One row per configuration: medians over the completed repeats (not the noisy ones,
    unless ``include_noisy`` or the configuration has no other), epoch-time spread."""
    frame = runs_frame(manifests, planned, include_noisy)
    cores = {m.get("id"): others_cores(m) for m in manifests}
    bases = {k: (spread_of(shown(g)), time_to_target(shown(g)))
             for k, g in frame[is_baseline(frame)].groupby(["usecase", "setting"])}
    rows = [_config_row(dict(zip(KEY, key, strict=True)), g,
                        bases.get((g.usecase.iloc[0], g.setting.iloc[0]), ([], (None, None))),
                        cores)
            for key, g in frame.groupby(KEY, sort=True, dropna=False)]
    return _ordered(pd.DataFrame(rows, columns=COLUMNS))


def _config_row(key: dict, g: pd.DataFrame, baseline: tuple[list[float], tuple],
                cores: dict[str, float | None]) -> dict:
    """A configuration's row from its runs ``g``, against its baseline's (spread, (target,
    time to it)); ``cores``: what other processes used, per run."""
    ok = shown(g)
    spread = spread_of(ok)
    base, (b_target, b_tta) = baseline
    times = list(ok.epoch_s.dropna())
    noisy = int(((g.status == "completed") & ~g.counted).sum()) - int((~ok.counted).sum())
    target, tta = time_to_target(ok)
    mark = _noisy_mark(ok, cores)
    return {
        **key, "table": int(g.table.iloc[0]), "processes": int(g.processes.iloc[0]),
        "scaling": g.scaling.iloc[0], "runs": len(ok),
        "status": _status(list(g.status), list(g.reason), noisy, mark), "noisy": bool(mark),
        "epoch_s": _median(times),
        "epoch_s_spread": f"{min(times):.2f}-{max(times):.2f}" if times else "",
        "images_per_s": _median(list(ok.images_per_s.dropna())),
        "images_per_s_95": _interval_text(interval(spread)),
        "speedup": _median(list(ok.speedup.dropna())),
        "speedup_95": _interval_text(interval(spread, base), mark_one=True) if base else "",
        "efficiency": _median(list(ok.efficiency.dropna())),
        "val_accuracy": _median(list(ok.val_accuracy.dropna())),
        "val_macro_f1": _median(list(ok.val_macro_f1.dropna())), "target": target,
        "target_metric": ok.target_metric.dropna().iloc[0] if target is not None else None,
        "reached": reached_text(ok), "time_to_target_s": tta,
        "tta_speedup": b_tta / tta if tta and b_tta and b_target == target else None,
        **memory_cells(ok),
    }


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    """The main setting first (most runs), then the baseline, then by table and speed."""
    rank = {name: i for i, name in enumerate(STRATEGIES.loaded())}
    runs = table.groupby(["usecase", "setting"]).runs.transform("sum")
    order = table.assign(_runs=-runs, _base=~is_baseline(table),
                         _strategy=table.strategy.map(lambda n: rank.get(n, len(rank))))
    order = order.sort_values(["usecase", "_runs", "setting", "_base", "table", "nodes",
                               "_strategy", "config"], kind="stable")
    return order.drop(columns=["_runs", "_base", "_strategy"]).reset_index(drop=True)


SUMMARY_COLUMNS = ["usecase", "config", "scaling", "cores", "runs", "status", "epoch_s",
                   "epoch_s_spread", "images_per_s", "speedup", "speedup_95", "efficiency",
                   "val_accuracy", "reached", "time_to_target_s", "tta_speedup",
                   *COLUMNS[COLUMNS.index("peak_process_gib"):]]
"""The summary's columns in the CSV and LaTeX that ``ddlstudy report`` prints (and in the
notebook)."""

CAPTION = "Speedup against the sequential baseline of the same setting (medians over repeats)"

TERMINAL = {"config": "configuration", "runs": "runs", "speedup": "speedup",
            "speedup_95": "95 % interval", "val_accuracy": "accuracy",
            "time_to_target_s": "time to target", "peak_process_gib": "peak GiB proc/node"}
"""The summary's columns printed to a terminal (one table per use case), under plain
headers: what fits ``WIDTH`` (the time per epoch is in the paper's tables below; images/s,
efficiency, cores, the spreads and the median peaks are in the CSV and speedup.csv); the
accuracy column is the validation figure of the use case's target metric, under its name."""


def terminal_table(table: pd.DataFrame, metrics: dict[str, str] | None = None) -> pd.DataFrame:
    """``table``'s rows as printed: the ``TERMINAL`` columns under their headers, with the
    status in the runs ('3 ok, 1 noisy left out'), the interval bare (a note under the
    table says what one that includes 1 means), the validation figure of the metric
    each use case's target is of (``metrics``, ``target_metrics``: accuracy where not
    given; ``terminal`` names it in the header) and, where not every run reached the
    target, how many did ('1/2 reached')."""
    out = table[list(TERMINAL)].copy()
    out["val_accuracy"] = [getattr(r, TARGET_METRICS[(metrics or {}).get(r.usecase, ACCURACY)])
                           for r in table.itertuples(index=False)]
    out["runs"] = [f"{r.runs} {r.status}" if r.status.startswith("ok") or r.noisy else
                   f"{r.runs} ok, {r.status}" if r.runs else r.status
                   for r in table.itertuples(index=False)]
    out["speedup_95"] = [i.split(" (")[0] or None for i in table.speedup_95]
    out["time_to_target_s"] = [f"{cell_text(t)} s" if pd.notna(t) else
                               f"{reached} reached" if reached else None
                               for t, reached in zip(table.time_to_target_s, table.reached,
                                                     strict=True)]
    out["peak_process_gib"] = ["/".join(_peak_text(r, what) for what in PEAKS)
                               for r in table.itertuples(index=False)]
    return out.rename(columns=TERMINAL)


def _peak_text(r, what: str) -> str:
    """A configuration's peak per ``what`` as printed: its least-most over the repeats
    where they differ, else its value ('-': not recorded)."""
    low, high = (cell_text(getattr(r, f"peak_{what}_gib{end}")) for end in ("_min", "_max"))
    return low if low == high else f"{low}-{high}"


SHRINK = ["configuration", "runs"]
"""The terminal table's columns cut (with a note) where a row does not fit, in turn."""

INTERVAL = ("95 % interval: of the speedup, over the repeats (one run: over its epochs); "
            "one that includes 1 cannot tell the configuration from the baseline.")
MEMORY_NOTE = (f"peak GiB proc/node: the {MEMORY['peak_process_bytes']} while training, then "
               f"the {MEMORY['peak_node_bytes']}, least-most over the repeats where they "
               f"differ ('-': not recorded).")


ACCURACY = "accuracy"


def target_metrics(runs: pd.DataFrame, by_id: dict[str, dict]) -> dict[str, str]:
    """Each use case's target metric: what its runs' time to target, and every place the
    report shows the target, are of (``[train] target_metric``: accuracy or macro_f1;
    accuracy where its runs name none)."""
    out: dict[str, str] = {}
    for usecase, run in zip(runs.usecase, runs.run, strict=True):
        config = (by_id.get(run) or {}).get("config") or {}
        train = (config.get("usecase") or {}).get("train") or {}
        metric = train.get("target_metric")
        if metric in TARGET_METRICS and out.get(usecase, ACCURACY) == ACCURACY:
            out[usecase] = metric
        out.setdefault(usecase, ACCURACY)
    return out


class Report:
    """Everything ``ddlstudy report`` shows, computed once from a runs folder."""

    def __init__(self, runs_dir: Path, include_noisy: bool = False,
                 project: Hardware | None = DEFAULT_HARDWARE) -> None:
        self.runs_dir = Path(runs_dir)
        self.include_noisy = include_noisy
        self.project = project
        """The nodes the findings are projected onto (None: no projection)."""
        self.manifests = load_runs(self.runs_dir)
        self.by_id = {m.get("id"): m for m in self.manifests}
        self.planned = load_planned(self.runs_dir)
        self.runs = runs_frame(self.manifests, self.planned, include_noisy)
        self.table = speedup_table(self.manifests, self.planned, include_noisy)
        self.paper = paper_tables(self.table)
        self.metrics = target_metrics(self.runs, self.by_id)
        """Each use case's target metric (``target_metrics``)."""

    def target_words(self, usecase: str) -> str:
        """' (target: macro_f1 0.80)': the use case's target by its metric's name ('' where
        its runs set none, or several)."""
        targets = set(self.runs[self.runs.usecase == usecase].target.dropna())
        return f" (target: {self.metrics.get(usecase, ACCURACY)} {targets.pop():.2f})" \
            if len(targets) == 1 else ""

    def text(self, fmt: str = "markdown") -> str:
        """The summary table, then the paper's tables (of each use case's main setting),
        then what was kept apart, in one format; Markdown as ``terminal`` prints it."""
        if fmt == "markdown":
            return self.terminal()
        columns = list(SUMMARY_COLUMNS)
        apart = left_apart(self.table)
        if apart:  # several settings: each row says which
            columns.insert(1, "setting")
        parts = [render(self.table[columns], fmt, CAPTION)]
        if fmt != "csv":
            parts += [render(t, fmt, TABLES[n]) for n, t in self.paper.items()]
            parts += ["Kept apart (runs of different settings are never merged):\n"
                      + "\n".join(f"- {note}" for note in apart)] if apart else []
        return "\n\n".join(parts)

    def terminal(self) -> str:
        """The tables in Markdown whose lines fit ``WIDTH`` (a terminal's): the summary's
        ``TERMINAL`` columns, a table per use case (and setting), the paper's tables, the
        labels cut to fit in full, what was kept apart and the noisy runs."""
        notes: dict[str, int] = {}
        rows, memory = terminal_table(self.table, self.metrics), TERMINAL["peak_process_gib"]
        parts = [f"**{CAPTION}**"]
        for (usecase, setting), part in rows.groupby([self.table.usecase, self.table.setting],
                                                     sort=False):
            several = (self.table[self.table.usecase == usecase].setting != setting).any()
            if (part[memory] == "-/-").all():  # runs from before memory was recorded
                part = part.drop(columns=[memory])
            metric = self.metrics.get(usecase, ACCURACY)
            part = part.rename(columns={TERMINAL["val_accuracy"]: metric})
            title = f"*{usecase}, setting: {setting}*" if several else f"*{usecase}*"
            parts.append(wrapped(title + self.target_words(usecase)) + "\n\n"
                         + fitted_markdown(part, SHRINK, notes))
        parts.append(wrapped(INTERVAL + (" " + MEMORY_NOTE if memory in "".join(parts) else "")))
        parts += [f"**{TABLES[n]}** (per use case: seconds per epoch, speedup)\n\n"
                  + fitted_markdown(t, ["configuration"], notes)
                  for n, t in paper_tables(self.table, joined=True).items()]
        if notes:
            parts.append("Cut to fit:\n" + "\n".join(wrapped(f"- [{n}] {text}", "  ")
                                                      for text, n in notes.items()))
        apart = left_apart(self.table)
        parts += ["Kept apart (runs of different settings are never merged):\n"
                  + "\n".join(wrapped(f"- {note}", "  ") for note in apart)] if apart else []
        parts += [wrapped(note) for note in [self.noisy_note()] if note]
        parts.append(wrapped("Every column (images/s, efficiency, cores, spreads): "
                             "`ddlstudy report --format csv`, or speedup.csv and runs.csv "
                             "in the folder `--out` writes, beside index.html, the page."))
        return "\n\n".join(parts)

    def noisy_note(self) -> str:
        """What the tables did with the runs marked noisy ('' where there are none)."""
        noisy = self.runs[(self.runs.status == "completed") & self.runs.noisy]
        if noisy.empty:
            return ""
        cores = [c for c in (others_cores(self.by_id.get(r, {})) for r in noisy.run) if c]
        busy = (f"other processes used their host (up to {max(cores):.1f} cores)" if cores
                else "other processes used their host")
        if self.include_noisy:
            return f"{len(noisy)} noisy run(s), counted as asked (--include-noisy): {busy}."
        return (f"{len(noisy)} run(s) marked noisy: {busy}. A configuration with no quiet run "
                f"shows its noisy runs' figures, marked 'noisy (others N cores)'; one with "
                f"quiet runs leaves them out. `ddlstudy report --include-noisy` counts them "
                f"all.")

    def write_tables(self, out: Path, fmt: str = "markdown") -> list[Path]:
        """The paper's tables in ``fmt``, every column of the speedup table in speedup.csv
        (and speedup.tex for LaTeX), and the tidy runs.csv."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        ext = FORMATS[fmt]
        written = {out / "speedup.csv": render(self.table, "csv"),
                   out / "runs.csv": self.runs.drop(columns=["epoch_rates"]).to_csv(index=False)}
        if fmt == "latex":  # Markdown's speedup.md is the short summary (report.summary)
            written[out / "speedup.tex"] = render(self.table, fmt)
        for n, t in self.paper.items():
            written[out / f"table{n}.{ext}"] = render(t, fmt, TABLES[n])
        for path, text in written.items():
            atomic_write_text(path, text.rstrip("\n") + "\n")
        return list(written)
