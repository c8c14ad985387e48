"""The advice against a study of its recommendations (``ddlstudy study --from-advice``):
whether the first-ranked is the fastest measured."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from ddlstudy.report import load_runs
from ddlstudy.tools.advise.output import _figure
from ddlstudy.tools.advise.probes import fastest
from ddlstudy.tools.advise.ranking import finite

NOT_THE_CONFIGURATION = {"datasets_dir", "epochs", "max_steps", "max_val_steps",
                         "warmup_steps"}
"""A study cell's flags that say how long it trains or where its data is, not what it
runs: left out when matching cells to the advice's rows."""


def check(advice: dict, runs_dir: Path, study: dict) -> dict:
    """The advice against a study of its recommendations (``study.json``'s record): each
    cell's measured figure (its best repeat, as advise ranks on its best probe) beside the
    predicted one, and whether the first-ranked is within 10 % of the best measured. Runs
    marked noisy (other processes kept the host busy) are left out, as the report leaves
    them out of speedups."""
    by_flags = {json.dumps(r["flags"], sort_keys=True): r for r in advice["ranking"]}
    manifests = {m["id"]: m for m in load_runs(runs_dir)}
    ttt = bool((advice.get("convergence") or {}).get("factor"))
    measured: dict[str, list[float]] = {}
    noisy = 0
    for cell in study["cells"]:
        m = manifests.get(cell["run"])
        what = {k: v for k, v in cell["flags"].items() if k not in NOT_THE_CONFIGURATION}
        row = by_flags.get(json.dumps(what, sort_keys=True))
        if row is None or m is None or m.get("status") != "completed":
            continue
        if (m.get("host_load") or {}).get("noisy") is True:
            noisy += 1
            continue
        if ttt:
            tta = m.get("time_to_target") or {}
            value = tta["seconds"] if tta.get("reached") else math.inf
        else:
            value = statistics.median(e["steady_images_per_s"] for e in m["epochs"])
        measured.setdefault(json.dumps(row["flags"], sort_keys=True), []).append(value)
    rows = []
    for key, values in measured.items():
        r = by_flags[key]
        rows.append({"rank": r["rank"], "label": r["label"],
                     "predicted": r["time_to_target_s"] if ttt else r["images_per_s"],
                     "measured": min(values) if ttt else fastest(values),
                     "runs": len(values)})
    rows.sort(key=lambda r: r["rank"])
    out: dict[str, Any] = {"criterion": "time to target (s)" if ttt else "images/s",
                           "rows": rows, "noisy_left_out": noisy}
    if rows and rows[0]["rank"] == 1 and not math.isinf(min(r["measured"] for r in rows)):
        better = min if ttt else max
        best = better(rows, key=lambda r: r["measured"])
        first = rows[0]["measured"]
        ratio = (best["measured"] / first) if ttt else (first / best["measured"])
        out |= {"best_rank": best["rank"], "first_over_best": ratio,
                "confirmed": ratio >= 0.9}
    for r in rows:
        r["measured"] = finite(r["measured"])
    return out


def check_text(result: dict) -> str:
    lines = [f"advice against the measured runs ({result['criterion']}):", "",
             "| rank | configuration | predicted | measured | runs |", "|---|---|---|---|---|"]
    lines += [f"| {r['rank']} | {r['label']} | {_figure(r['predicted'])} | "
              f"{_figure(r['measured'])} | {r['runs']} |" for r in result["rows"]]
    if "confirmed" in result:
        verdict = "confirmed" if result["confirmed"] else "not confirmed"
        lines += ["", f"{verdict}: the first-ranked measured {result['first_over_best']:.0%} "
                  f"of the best measured (rank {result['best_rank']}); within 10 % confirms"]
    else:
        lines += ["", "not checked: the first-ranked configuration did not complete (or "
                  "only on a busy host), or none reached the target"]
    if result.get("noisy_left_out"):
        lines.append(f"({result['noisy_left_out']} run(s) left out: other processes kept "
                     "the host busy; --wait-quiet waits for a quiet host before each cell)")
    return "\n".join(lines)
