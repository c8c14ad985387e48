"""The advice against the runs that measure it (``ddlstudy study --from-advice``, or any
folder of runs that holds configurations of an advice): per configuration, the predicted
and the measured images/s (or time to target) and peak memory of a node and of a
process, each error in %; over the rows, the mean absolute % error, the rank correlation
(Spearman) between predicted and measured, and the measured rank of the first choice.

An error is (predicted - measured) / measured: +0.10 predicted 10 % more than measured.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ddlstudy.files import atomic_write_json, atomic_write_text
from ddlstudy.records.advised import advice_data, load_advice, row_configs
from ddlstudy.records.formats import Study as StudyRecord
from ddlstudy.records.formats import load
from ddlstudy.records.memory import memory_of
from ddlstudy.report import STUDY_FILE, load_runs
from ddlstudy.tools.advise.figure import plot_check, save
from ddlstudy.tools.advise.history import remember
from ddlstudy.tools.advise.memory import refault_note
from ddlstudy.tools.advise.output import pct
from ddlstudy.tools.advise.probes import steady_speed
from ddlstudy.tools.advise.ranking import finite

NOT_THE_CONFIGURATION = {"datasets_dir", "epochs", "max_steps", "max_val_steps",
                         "warmup_steps", "no_snapshot", "sample_hz", "data_dir", "model",
                         "runs_dir", "snapshot_every", "quiet"}
"""A cell's flags that say how long it trains, where its data is or where it writes, not
what configuration it runs: left out when matching runs to the advice's rows."""
log = logging.getLogger("ddlstudy")
GOAL = 0.10
"""The error a prediction is held to (the first choice within 10 % of the best measured;
an images/s or memory row within 10 % of its measurement)."""
MIN_RANKED = 3
"""Rows it takes for a rank correlation to say anything (2 rows: always +1 or -1)."""


def check(advice: dict, manifests: list[dict], cells: list[dict] | None = None,
          include_noisy: bool = False,
          configs: list[tuple[dict, dict]] | None = None) -> dict:
    """The advice against ``manifests`` (completed runs). A run is matched to a row by its
    study cell's flags (``cells``: a study of the advice names each one's run), else by
    the configuration its manifest records, against the configuration ``ddlstudy run``
    makes of each row (``configs``: (row, its config); by default the row's flags alone);
    advise's own probes (paced: --steady-seconds) are no run of the advice. Each
    configuration's measured figure is its best repeat's (advise ranks on its best
    probe). Runs marked noisy (other processes kept the host busy) are left out and
    counted, as the report leaves them out of speedups; ``include_noisy`` counts them, a
    row whose figure comes from one marked ``busy``."""
    ttt = bool((advice.get("convergence") or {}).get("factor"))
    found: dict[int, tuple[dict, list[tuple[dict, bool]]]] = {}
    noisy = 0
    for m, row in _runs(manifests, cells, advice, configs):
        if m.get("status") != "completed":
            continue
        busy = (m.get("host_load") or {}).get("noisy") is True
        if busy and not include_noisy:
            noisy += 1
            continue
        found.setdefault(id(row), (row, []))[1].append((m, busy))
    rows = sorted((_row(row, runs, ttt) for row, runs in found.values()),
                  key=lambda r: r["rank"])
    returned = any((m.get("config") or {}).get("heap") != "keep"  # the note is of theirs
                   for _, runs in found.values() for m, _ in runs)
    out: dict[str, Any] = {"criterion": "time to target (s)" if ttt else "images/s",
                           "rows": rows, "noisy_left_out": noisy,
                           "include_noisy": include_noisy,
                           "summary": summary(rows, ttt),
                           "refaults": advice.get("refaults") if returned else None}
    first = out["summary"]
    if first.get("first_over_best") is not None:  # the keys earlier checks had
        out |= {"best_rank": first["best_rank"], "first_over_best": first["first_over_best"],
                "confirmed": first["confirmed"]}
    return out


def _runs(manifests: list[dict], cells: list[dict] | None, advice: dict,
          configs: list[tuple[dict, dict]] | None) -> list[tuple[dict, dict]]:
    """Each run that is a row of the advice, with that row."""
    if cells is not None:  # a cell's flags are its row's and the advice's data (--heap)
        by_id = {m["id"]: m for m in manifests}
        data = advice_data(advice)
        by_flags = {_key(data | r["flags"]): r for r in advice["ranking"]}
        return [(by_id[c["run"]], by_flags[_key(c["flags"])]) for c in cells
                if c.get("run") in by_id and _key(c["flags"]) in by_flags]
    rows = configs if configs is not None else [
        (r, {"backend": "local"} | r["flags"]) for r in advice["ranking"]]
    by_config = {identity(config): r for r, config in rows}
    return [(m, by_config[identity(m.get("config") or {})]) for m in manifests
            if not (m.get("config") or {}).get("steady_seconds")  # advise's own probes
            and m.get("usecase") == advice["usecase"]
            and identity(m.get("config") or {}) in by_config]


NOT_WHAT_RUNS = frozenset({"runs_dir", "datasets_dir", "data_cache", "sample_hz", "max_steps",
                           "max_val_steps", "warmup_steps", "steady_seconds", "snapshot",
                           "snapshot_every", "tensorboard", "mlflow", "spark_ui",
                           "expect_fingerprint", "replay_of", "effective"})
"""A run's settings that say how long it trains, where its files go and what it records,
not what configuration it runs (nor its use case's epochs and file)."""


def identity(config: dict) -> str:
    """What configuration a run's recorded ``config`` is: all of it but NOT_WHAT_RUNS."""
    what = {k: v for k, v in config.items() if k not in NOT_WHAT_RUNS}
    usecase = dict(what.get("usecase") or {})
    usecase.pop("source", None)
    if isinstance(usecase.get("train"), dict):
        usecase["train"] = {k: v for k, v in usecase["train"].items() if k != "epochs"}
    return json.dumps(what | {"usecase": usecase}, sort_keys=True, default=str)


def _key(flags: dict) -> str:
    return json.dumps({k: v for k, v in flags.items() if k not in NOT_THE_CONFIGURATION},
                      sort_keys=True)


def _row(advised: dict, runs: list[tuple[dict, bool]], ttt: bool) -> dict[str, Any]:
    """One configuration: the advice's prediction beside its runs' measurement."""
    values = [_measured(m, ttt) for m, _ in runs]
    measured = statistics.median(values)  # what a run is likely to measure, as predicted
    best, busy = runs[min(range(len(values)), key=lambda i: abs(values[i] - measured))]
    memory = [memory_of(m) for m, _ in runs]
    node = _median([x["peak_node_bytes"] for x in memory])
    process = _median([x["peak_process_bytes"] for x in memory])
    predicted = advised.get("time_to_target_s") if ttt else advised["images_per_s"]
    pred_node = advised.get("predicted_need_node_bytes")
    pred_process = advised.get("predicted_peak_process_bytes")
    return {"rank": advised["rank"], "label": advised["label"],
            "nodes": advised.get("nodes", 1), "basis": advised.get("basis"),
            "predicted": predicted, "measured": finite(measured),
            "error": error(predicted, measured), "runs": len(runs), "best_run": best["id"],
            "busy": busy or None,
            "predicted_node_bytes": pred_node, "measured_node_bytes": node,
            "node_error": error(pred_node, node),
            "predicted_process_bytes": pred_process, "measured_process_bytes": process,
            "process_error": error(pred_process, process)}


def _measured(m: dict, ttt: bool) -> float:
    """A run's images/s (``steady_speed``), or its training seconds to the target (its
    epochs' train_time_s up to the one that reached it: advise predicts training time,
    without the validations in between)."""
    if not ttt:
        return steady_speed(m)
    tta = m.get("time_to_target") or {}
    if not tta.get("reached"):
        return math.inf
    return sum(e.get("train_time_s") or 0.0 for e in m["epochs"][:tta.get("epoch", 0)]) \
        or tta["seconds"]


def _median(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known)) if known else None


def error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None where either is unknown or never."""
    if predicted is None or measured is None or not math.isfinite(measured) or measured <= 0:
        return None
    return (predicted - measured) / measured


def spearman(a: list[float], b: list[float]) -> float | None:
    """The rank correlation of ``a`` and ``b`` (ties averaged; None with fewer than
    MIN_RANKED pairs, or where one side has no spread)."""
    if len(a) < MIN_RANKED:
        return None
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def summary(rows: list[dict], ttt: bool) -> dict[str, Any]:
    """Over the rows: the mean absolute % error of the criterion, of a node's and of a
    process's peak (and the worst of a node's), each kind of row's (its ``basis``), the
    rank correlation, the first choice's measured rank and whether it came within GOAL of
    the best measured."""
    timed = [r for r in rows if r["error"] is not None]
    out: dict[str, Any] = {"rows": len(rows), "mape": _mape(r["error"] for r in timed)}
    for side in ("node", "process"):
        errors = [r[f"{side}_error"] for r in rows if r[f"{side}_error"] is not None]
        out[f"{side}_memory_mape"] = _mape(errors)
        out[f"{side}_memory_worst"] = max(errors, key=abs) if errors else None
    out["by_basis"] = {b: {"rows": len(rs), "mape": _mape(r["error"] for r in rs)}
                       for b in sorted({r["basis"] or "?" for r in timed})
                       for rs in [[r for r in timed if (r["basis"] or "?") == b]]}
    out["spearman"] = spearman([r["predicted"] for r in timed],
                               [r["measured"] for r in timed])
    measured = [r for r in rows if r["measured"] is not None]
    first = next((r for r in rows if r["rank"] == 1), None)
    out |= {"first_measured_rank": None, "best_rank": None, "first_over_best": None,
            "confirmed": None}
    if first is None or first["measured"] is None or not measured:
        return out
    order = sorted(measured, key=lambda r: r["measured"], reverse=not ttt)
    best = order[0]
    ratio = best["measured"] / first["measured"] if ttt else first["measured"] / best[
        "measured"]
    return out | {"first_measured_rank": order.index(first) + 1, "best_rank": best["rank"],
                  "first_over_best": ratio, "confirmed": ratio >= 1 - GOAL}


def _mape(errors) -> float | None:
    errors = [abs(e) for e in errors]
    return statistics.fmean(errors) if errors else None


def check_text(result: dict) -> str:
    """The check as advice-check.md: the table, then what it adds up to."""
    crit = result["criterion"]
    lines = [f"advice against the measured runs ({crit}; error = (predicted - measured) / "
             "measured):", "",
             "| rank | configuration | predicted | measured | error | node GiB predicted "
             "| measured | error | process GiB predicted | measured | error | runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rank']} | {r['label']}{' (busy host)' if r.get('busy') else ''} | "
              f"{_figure(r['predicted'])} | {_figure(r['measured'])} | {pct(r['error'])} | "
              f"{_gib(r['predicted_node_bytes'])} | {_gib(r['measured_node_bytes'])} | "
              f"{pct(r['node_error'])} | {_gib(r['predicted_process_bytes'])} | "
              f"{_gib(r['measured_process_bytes'])} | {pct(r['process_error'])} | "
              f"{r['runs']} |" for r in result["rows"]]
    lines += ["", *summary_lines(result)]
    return "\n".join(lines)


def summary_lines(result: dict) -> list[str]:
    """What the check adds up to, in a few lines (advise and the report open with them)."""
    s = result.get("summary") or {}
    if not result["rows"]:
        why = ("every run that matched was on a busy host: `--include-noisy` counts them, "
               "marked" if result.get("noisy_left_out") else
               "no completed run matched a row of the advice")
        return [f"not checked: {why}"]
    off = (f"{result['criterion']} off by {pct(s['mape'], signed=False)} on average (mean "
           "absolute error)" if s.get("mape") is not None else
           f"no {result['criterion']} measured (none reached the target)")
    out = [f"{s['rows']} configuration(s) checked: {off}"
           + (f"; rank correlation {s['spearman']:.2f} (Spearman)"
              if s.get("spearman") is not None else
              f"; no rank correlation with fewer than {MIN_RANKED} rows")]
    if s.get("node_memory_mape") is not None:
        out.append(f"peak memory of a node off by {pct(s['node_memory_mape'], signed=False)}"
                   f" on average, at worst {pct(s['node_memory_worst'])}; of a process by "
                   f"{pct(s['process_memory_mape'], signed=False)}")
    if s.get("confirmed") is None:
        out.append("the first choice was not measured (it failed, or only on a busy host), or "
                   "none reached the target: its place is not checked")
    else:
        verdict = "confirmed" if s["confirmed"] else "not confirmed"
        out.append(f"{verdict}: the first choice measured {s['first_over_best']:.0%} of the "
                   f"best measured (rank {s['best_rank']}), measured rank "
                   f"{s['first_measured_rank']} of {_measured_rows(result)}; within "
                   f"{GOAL:.0%} confirms")
    if result.get("noisy_left_out"):
        out.append(f"({result['noisy_left_out']} run(s) left out: other processes kept the "
                   "host busy; --wait-quiet waits for a quiet host before each cell, "
                   "--include-noisy counts them, marked)")
    out += [f"(as the advice said: {note})" for note in refault_note(result.get("refaults"))]
    if any(r.get("busy") for r in result["rows"]):
        out.append("(rows marked 'busy host' were measured while other processes kept the "
                   "host busy: their errors say as much of the host as of the advice)")
    return out


def _measured_rows(result: dict) -> int:
    return sum(r["measured"] is not None for r in result["rows"])


def _figure(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def _gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f}"


def write_check(result: dict, out: Path) -> list[Path]:
    """advice-check.json, advice-check.md and the figure (predicted against measured) into
    ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    fig = plot_check(result, GOAL)
    paths = save(fig, out, "advice-check") if fig is not None else []
    result = result | ({"figure": "advice-check.svg"} if paths else {})
    atomic_write_json(out / "advice-check.json", result)
    atomic_write_text(out / "advice-check.md", check_text(result) + "\n")
    return [out / "advice-check.json", out / "advice-check.md", *paths]


def check_study(advice_path: Path, runs_dir: Path, include_noisy: bool = False) -> str:
    """A study of an advice's rows (its study.json) checked against the advice: written to
    ``<runs_dir>/report`` (before the report, which opens with it), remembered for
    ``advise``, and returned as text."""
    record = load(runs_dir / STUDY_FILE, StudyRecord, "study record")
    return check_runs(advice_path, runs_dir, runs_dir / "report", include_noisy,
                      record["cells"])


def check_runs(advice_path: Path, runs_dir: Path, out: Path | None,
               include_noisy: bool = False, cells: list[dict] | None = None) -> str:
    """The runs of ``runs_dir`` that are rows of the advice (its study's ``cells``, else
    matched by the configuration each manifest records) checked against it: written to
    ``out`` and remembered for ``advise`` (None: printed only), returned as text."""
    advice = load_advice(advice_path)
    configs = None if cells is not None else row_configs(advice_path, advice)
    result = check(advice, load_runs(runs_dir), cells, include_noisy, configs)
    if out is not None:
        write_check(result, out)
        if result["rows"]:
            remember(result, advice, advice_path)
    return check_text(result)
