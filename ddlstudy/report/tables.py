"""Tables from a folder of runs: each configuration against its use case's baseline.

Speedup is the ratio of steady-state images per second to the sequential baseline's on the
same use case (so runs cut short with --max-steps still compare); parallel efficiency is
the speedup divided by the cores (or GPUs) the configuration used. Three views:

- ``runs_frame``: one row per run (the long, tidy table for your own analysis);
- ``speedup_table``: one row per configuration, medians and spread over repeats;
- ``paper_tables``: the paper's Tables 1-3 (data parallelism; model and hybrid
  parallelism; multi-node), a row per configuration and, per use case, the time per epoch
  and the speedup.

Cells a study planned but could not run (no GPU, a backend not available) come from the
study's ``study.json`` and are shown with the reason, never dropped.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_text
from ddlstudy.runfolder import MANIFEST
from ddlstudy.strategies import REGISTRY as STRATEGIES
from ddlstudy.strategies import Strategy

log = logging.getLogger("ddlstudy")

BASELINE = "sequential"
STUDY_FILE = "study.json"
FORMATS = {"markdown": "md", "csv": "csv", "latex": "tex"}
TABLES = {
    1: "Table 1: data parallelism (CPU and GPU)",
    2: "Table 2: model and hybrid parallelism",
    3: "Table 3: several nodes (MPI and Spark)",
}
LOCAL = "local"
"""The backend of one node: any other's runs go in Table 3."""
KEY = ["usecase", "setting", "config", "strategy", "backend", "nodes", "reduce", "precision",
       "cores", "gpus"]
"""A configuration: runs with the same key are repeats of one another. ``setting`` is what
changes the measured figures apart from the parallelism (``setting``); ``config`` and the
rest are the parallelism itself."""


def runs_folder(runs_dir: Path) -> Path:
    """``runs_dir`` if it is a folder, else a UsageError."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise UsageError(f"runs folder {runs_dir} does not exist")
    return runs_dir


def load_runs(runs_dir: Path) -> list[dict]:
    """Every manifest under ``runs_dir`` (any depth), oldest first."""
    runs_dir = runs_folder(runs_dir)
    manifests = []
    for path in sorted(runs_dir.rglob(MANIFEST)):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("report: skipped %s: unreadable (%s)", path, exc)
            continue
        reason = _unusable(manifest)
        if reason:  # a foreign or damaged file is not a run: the others are still reported
            log.warning("report: skipped %s: %s", path, reason)
            continue
        manifest["path"] = str(path.parent)
        manifests.append(manifest)
    if not manifests and not (runs_dir / STUDY_FILE).is_file():
        raise UsageError(f"no runs in {runs_dir}; train some with `ddlstudy run` first")
    return sorted(manifests, key=lambda m: m.get("started_at", ""))


def _unusable(manifest) -> str | None:
    """Why a manifest cannot be a row of the tables (None: it can)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("strategy"), dict):
        return "not a ddlstudy run manifest"
    try:
        row = _run_row(manifest)
    except Exception as exc:  # noqa: BLE001 - any malformed field
        return f"malformed ({type(exc).__name__}: {exc})"
    for key in _MEASURED:  # the tables divide and compare these
        if row[key] is not None and (isinstance(row[key], bool) or
                                     not isinstance(row[key], int | float)):
            return f"malformed ({key} is {row[key]!r}, not a number)"
    return None


_MEASURED = ("epoch_s", "images_per_s", "val_accuracy", "best_val_accuracy", "train_time_s",
             "tta_s")


def load_planned(runs_dir: Path) -> list[dict]:
    """Cells of the studies under ``runs_dir`` that have no run: skipped, or not reached."""
    planned = []
    for path in sorted(Path(runs_dir).rglob(STUDY_FILE)):
        try:
            study = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        planned += [c for c in study.get("cells", []) if not c.get("run")]
    return planned


def _gpus(manifest: dict) -> int:
    s = manifest.get("strategy", {})
    if s.get("device") == "cuda":
        return int(s.get("processes", 1)) * int(manifest.get("backend", {}).get("nodes", 1))
    return int(s.get("devices", 0)) * int(manifest.get("backend", {}).get("nodes", 1))


def cores_used(manifest: dict) -> int:
    """Cores the run kept busy: processes x threads, at most the cores it had, per node."""
    s = manifest.get("strategy", {})
    per_node = max(1, int(s.get("processes", 1)) * int(s.get("threads_per_process", 1)))
    per_node = min(per_node, manifest.get("host", {}).get("usable_cores") or per_node)
    return per_node * int(manifest.get("backend", {}).get("nodes", 1))


def _strategy(name: str) -> Strategy | None:
    """The strategy a run names, or None where it is not installed here (a plugin's)."""
    cls = STRATEGIES.get(name) or STRATEGIES.loaded().get(name)
    return cls() if cls is not None else None


def config_label(manifest: dict) -> str:
    """A short readable name of what ran: strategy, its degrees (the strategy's own
    ``label`` of its recorded layout), and the backend."""
    s = manifest.get("strategy", {})
    name = s.get("name", "?")
    strategy = _strategy(name)
    label = strategy.label(s) if strategy is not None else name
    config = manifest.get("config", {})
    if config.get("transport", "auto") != "auto":
        label += f" over {config['transport']}"
    if config.get("precision", "fp32") != "fp32":
        label += f" {config['precision']}"
    if config.get("accumulate", 1) > 1:
        label += f" accumulate {config['accumulate']}"
    if config.get("scaling", "strong") == "weak":
        batch = manifest.get("effective", {}).get("global_batch", "?")
        label += f" weak (batch {batch})"
    if config.get("lr_scaling", "none") != "none":
        label += f" lr {config['lr_scaling']}"
    backend = manifest.get("backend", {})
    if backend.get("name", LOCAL) != LOCAL:
        how = backend.get("reduce") or backend.get("sync")
        if config.get("compress", "none") != "none":  # replaces the reducer
            how = f"{config['compress']} allgather"
        how = f", {how}" if how else ""
        if backend.get("sync") == "allgather":
            how += f" every {backend.get('sync_every', '?')}"
        if config.get("bucket_mb"):
            how += f" in {config['bucket_mb']:g} MiB buckets"
        if config.get("balance", "equal") != "equal":
            how += f", balance {config['balance']}"
        if config.get("hosts"):
            how += f", hosts {config['hosts']}"
        launcher = (manifest.get("launch") or {}).get("launcher")
        if launcher in ("your mpiexec", "srun"):  # not ddlstudy's own: say whose
            how += f", under {launcher}"
        label = f"{backend['name']} {backend.get('nodes', '?')} nodes{how}: {label}"
    return label


def setting(manifest: dict) -> str:
    """What a run measured apart from its parallelism: epochs (and --max-steps), the
    per-run batch, the image size, the data (its fingerprint) and the host. Runs of
    different settings are never repeats of each other, and a speedup divides by the
    baseline of the same setting."""
    config = manifest.get("config") or {}
    train = (config.get("usecase") or {}).get("train") or {}
    parts = [f"{train.get('epochs', '?')} epochs"]
    if config.get("max_steps"):
        parts.append(f"{config['max_steps']} steps")
    parts += [f"batch {train.get('batch_size', '?')}", f"{train.get('image_size', '?')} px",
              f"data {str((manifest.get('data') or {}).get('fingerprint') or '?')[:8]}",
              f"host {(manifest.get('host') or {}).get('hostname', '?')}"]
    return ", ".join(parts)


def table_number(strategy: str, backend: str) -> int:
    """Which of the paper's three tables a configuration belongs to: 3 for several nodes,
    else the strategy's own (1 where it is not installed here)."""
    if backend != LOCAL:
        return 3
    found = _strategy(strategy)
    return found.table if found is not None else 1


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _time_to_target(m: dict) -> tuple[float | None, bool | None, float | None]:
    """(target, reached, seconds) of a run's time to accuracy; (None, None, None) for a run
    without a target (or from before time to accuracy was measured)."""
    tta = m.get("time_to_target") or {}
    reached = tta.get("reached")
    return tta.get("target"), reached, tta.get("seconds") if reached else None


def _run_row(m: dict) -> dict:
    """A run's row of ``runs_frame`` (raises on a malformed manifest)."""
    epochs = m.get("epochs") or []
    target, reached, tta = _time_to_target(m)
    backend = m.get("backend", {})
    strategy = m.get("strategy", {}).get("name", "?")
    backend_name = backend.get("name", LOCAL)
    return {
        "usecase": m.get("usecase", "?"), "setting": setting(m), "config": config_label(m),
        "strategy": strategy,
        "backend": backend_name, "nodes": int(backend.get("nodes", 1)),
        "reduce": backend.get("reduce") or backend.get("sync") or "",
        "precision": m.get("config", {}).get("precision", "fp32"),
        "scaling": m.get("config", {}).get("scaling", "strong"),
        "global_batch": m.get("effective", {}).get(
            "global_batch", m.get("config", {}).get("usecase", {}).get("train", {})
            .get("batch_size")),
        "cores": cores_used(m), "gpus": _gpus(m),
        "processes": int(m.get("strategy", {}).get("processes", 1)),
        "table": table_number(strategy, backend_name),
        "repeat": m.get("study", {}).get("repeat", 0), "status": m.get("status", "?"),
        "noisy": (m.get("host_load") or {}).get("noisy") is True,
        "reason": m.get("error") or "", "epochs": len(epochs),
        "epoch_s": _median([e["epoch_time_s"] for e in epochs]),
        "images_per_s": _median([e["steady_images_per_s"] for e in epochs]),
        "epoch_rates": [e["steady_images_per_s"] for e in epochs],  # checked by _unusable
        "val_accuracy": epochs[-1]["val_accuracy"] if epochs else None,
        "best_val_accuracy": max(e["val_accuracy"] for e in epochs) if epochs else None,
        "train_time_s": sum(e.get("train_time_s", 0.0) for e in epochs) if epochs else None,
        "target": target, "reached": reached, "tta_s": tta,
        "run": m.get("id", ""), "path": m.get("path", ""),
    }


def runs_frame(manifests: list[dict], planned: list[dict] = (),
               include_noisy: bool = False) -> pd.DataFrame:
    """One row per run (and per planned cell that has no run), in a long tidy layout.
    ``counted``: whether the run enters medians and speedups (completed, and not noisy
    unless ``include_noisy``)."""
    rows = [_run_row(m) for m in manifests]
    for c in planned:
        backend = c.get("backend", LOCAL)
        rows.append({
            "usecase": c["usecase"], "setting": None, "config": c["label"],
            "strategy": c["strategy"],
            "backend": backend, "nodes": c.get("nodes", 1), "reduce": "",
            "precision": c.get("flags", {}).get("precision", "fp32"),
            "scaling": c.get("flags", {}).get("scaling", "strong"), "global_batch": None,
            "cores": c.get("cores", 0),
            "gpus": 0, "processes": 1, "table": table_number(c["strategy"], backend),
            "repeat": c.get("repeat", 0), "status": c["status"], "noisy": False,
            "reason": c.get("reason", ""), "epochs": 0, "epoch_s": None,
            "images_per_s": None, "epoch_rates": [], "val_accuracy": None,
            "best_val_accuracy": None, "train_time_s": None, "target": None,
            "reached": None, "tta_s": None, "run": "", "path": "",
        })
    frame = pd.DataFrame(rows, columns=[*KEY, "scaling", "global_batch", "processes", "table",
                                        "repeat", "status", "noisy", "reason", "epochs", "epoch_s",
                                        "images_per_s", "epoch_rates", "val_accuracy",
                                        "best_val_accuracy", "train_time_s", "target",
                                        "reached", "tta_s", "run", "path"])
    # A planned cell that has no run belongs to its use case's usual setting.
    usual = {uc: g.setting.mode().iloc[0] for uc, g in frame.dropna(subset=["setting"])
             .groupby("usecase")}
    frame["setting"] = [s if isinstance(s, str) else usual.get(uc, "")
                        for uc, s in zip(frame.usecase, frame.setting, strict=True)]
    frame["counted"] = (frame.status == "completed") & (include_noisy | ~frame.noisy)
    baseline = frame[is_baseline(frame) & frame.counted]
    base = {k: _median(list(g.images_per_s.dropna()))
            for k, g in baseline.groupby(["usecase", "setting"])}
    frame["speedup"] = [r / base[k] if base.get(k) and r is not None and r == r else None
                        for k, r in zip(zip(frame.usecase, frame.setting, strict=True),
                                        frame.images_per_s, strict=True)]
    units = frame.gpus.where(frame.gpus > 0, frame.cores).clip(lower=1)
    frame["efficiency"] = frame.speedup / units
    return frame


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


def is_baseline(frame: pd.DataFrame) -> pd.Series:
    """The sequential baseline: one process on one node, nothing varied (not sequential
    ranks under MPI or Spark, not bf16, not accumulating)."""
    return (frame.config == BASELINE) & (frame.backend == LOCAL)


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


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values shown as '-'."""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |"
            for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body])


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#",
          "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def to_latex(frame: pd.DataFrame, caption: str = "") -> str:
    """A booktabs table (\\usepackage{booktabs}) with the values as shown in Markdown."""
    cols = "l" + "r" * (len(frame.columns) - 1)
    lines = [r"\begin{table}[ht]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
              " & ".join(_latex_escape(str(c)) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(_fmt(v)) for v in row) + r" \\"
              for row in frame.astype(object).itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


SUMMARY_COLUMNS = ["usecase", "config", "scaling", "cores", "runs", "status", "epoch_s",
                   "epoch_s_spread", "images_per_s", "speedup", "speedup_95", "efficiency",
                   "val_accuracy", "reached", "time_to_target_s", "tta_speedup"]


def render(frame: pd.DataFrame, fmt: str, caption: str = "") -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "latex":
        return to_latex(frame, caption)
    return (f"**{caption}**\n\n" if caption else "") + to_markdown(frame)


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
