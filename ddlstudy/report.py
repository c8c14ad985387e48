"""Speedup tables from a folder of runs: each strategy against its use case's baseline.

Speedup is the ratio of steady-state images per second to the sequential baseline's on the
same use case (so runs cut short with --max-steps still compare); parallel efficiency is
the speedup divided by the cores the strategy used.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from ddlstudy.errors import UsageError
from ddlstudy.runfolder import MANIFEST

BASELINE = "sequential"


def load_runs(runs_dir: Path) -> list[dict]:
    """Every manifest under ``runs_dir`` (any depth), oldest first."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise UsageError(f"runs folder {runs_dir} does not exist")
    manifests = []
    for path in sorted(runs_dir.rglob(MANIFEST)):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a foreign or damaged file is not a run
        manifest["path"] = str(path.parent)
        manifests.append(manifest)
    if not manifests:
        raise UsageError(f"no runs in {runs_dir}; train some with `ddlstudy run` first")
    return sorted(manifests, key=lambda m: m.get("started_at", ""))


def _cores(manifest: dict) -> int:
    """Cores the strategy kept busy: processes x threads, at most the cores it had."""
    s = manifest.get("strategy", {})
    per_node = max(1, int(s.get("processes", 1)) * int(s.get("threads_per_process", 1)))
    per_node = min(per_node, manifest.get("host", {}).get("usable_cores") or per_node)
    return per_node * int(manifest.get("backend", {}).get("nodes", 1))


def _rate(manifest: dict) -> float | None:
    epochs = manifest.get("epochs") or []
    return statistics.median(e["steady_images_per_s"] for e in epochs) if epochs else None


def speedup_table(manifests: list[dict]) -> pd.DataFrame:
    """One row per (use case, strategy, cores): medians over repeats, spread as min-max."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for m in manifests:
        key = (m.get("usecase", "?"), m.get("strategy", {}).get("name", "?"), _cores(m))
        groups.setdefault(key, []).append(m)
    baselines = {}
    for (uc, strat, _), runs in groups.items():
        rates = [r for r in map(_rate, runs) if r is not None]
        if strat == BASELINE and rates:
            baselines[uc] = statistics.median(rates)
    rows = []
    for (uc, strat, cores), runs in sorted(groups.items()):
        done = [r for r in runs if r.get("status") == "completed" and r.get("epochs")]
        rates = [_rate(r) for r in done]
        epoch_times = [statistics.median(e["epoch_time_s"] for e in r["epochs"]) for r in done]
        accs = [r["epochs"][-1]["val_accuracy"] for r in done]
        base = baselines.get(uc)
        rate = statistics.median(rates) if rates else None
        speedup = rate / base if rate and base else None
        failed = len(runs) - len(done)
        rows.append({
            "usecase": uc, "strategy": strat, "cores": cores, "runs": len(done),
            "status": "ok" if not failed else f"{failed} not completed",
            "epoch_s": statistics.median(epoch_times) if epoch_times else None,
            "epoch_s_spread": (f"{min(epoch_times):.2f}-{max(epoch_times):.2f}"
                               if epoch_times else ""),
            "images_per_s": rate,
            "speedup": speedup,
            "efficiency": speedup / cores if speedup else None,
            "val_accuracy": statistics.median(accs) if accs else None,
        })
    return pd.DataFrame(rows)


def _number(v: float) -> str:
    """Three significant digits, without scientific notation for large values."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values shown as '-'."""
    def cell(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return _number(v) if isinstance(v, float) else str(v)

    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body])
