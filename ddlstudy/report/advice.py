"""The advice check of a study that checked an advice (``study --from-advice``): its
``advice-check.json`` in the report folder, read for the page and speedup.md, which open
with its summary.

The record is the study's (``tools.advise``'s check): a criterion (images/s, or time to
target), a row per configuration it checked (predicted, measured, their signed error
(predicted - measured) / measured, and the same for the memory of a node and of a
process), a summary (mean absolute error, rank correlation, the first choice's measured
rank, whether the advice held) and the runs it left out as noisy. Any key may be missing
or null: what is there is shown, nothing else.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from ddlstudy.errors import UsageError
from ddlstudy.reading import read_json

log = logging.getLogger("ddlstudy")

CHECK = "advice-check.json"
FIGURE = "advice-check.svg"

COLUMNS = {"rank": "rank", "label": "configuration", "predicted": "predicted",
           "measured": "measured", "error": "error", "runs": "runs", "busy": "busy host",
           "predicted_node_bytes": "node GiB predicted", "measured_node_bytes": "measured",
           "node_error": "error", "predicted_process_bytes": "process GiB predicted",
           "measured_process_bytes": "measured", "process_error": "error"}
"""The rows' keys shown, in order, under their headers (bytes shown in GiB)."""


def read_check(folder: Path) -> dict | None:
    """``folder``'s advice-check.json, None where there is none; one that cannot be read
    (or is not a check) is left out, named in a warning."""
    path = Path(folder) / CHECK
    if not path.exists():
        return None
    try:
        record = read_json(path, "advice check")
    except UsageError as exc:
        log.warning("report: left out the advice check: %s", exc)
        return None
    if not isinstance(record, dict) or not isinstance(record.get("rows", []), list):
        log.warning("report: left out the advice check %s: not a check's record", path)
        return None
    return record


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value == value else None


def _percent(value) -> str:
    number = _number(value)
    return "" if number is None else f"{100 * number:+.0f} %"


def summary_lines(check: dict) -> list[str]:
    """The check in sentences: what it measured, how far the predictions were, whether the
    advice held, and the noisy runs it left out."""
    s = check.get("summary") if isinstance(check.get("summary"), dict) else {}
    rows = s.get("rows", len(check.get("rows") or []))
    criterion = check.get("criterion") or "its criterion"
    lines = [f"The study checked an advice: {rows} of its configurations measured, on "
             f"{criterion}."]
    errors = []
    if _number(s.get("mape")) is not None:
        errors.append(f"mean absolute error {100 * s['mape']:.0f} %")
    if _number(s.get("spearman")) is not None:
        errors.append(f"rank correlation {s['spearman']:.2f} (Spearman)")
    if isinstance(s.get("first_measured_rank"), int):
        errors.append(f"its first choice measured #{s['first_measured_rank']}")
    if _number(s.get("node_memory_mape")) is not None:
        worst = _number(s.get("node_memory_worst"))
        errors.append(f"a node's memory: mean absolute error {100 * s['node_memory_mape']:.0f} %"
                      + (f", worst {100 * worst:.0f} %" if worst is not None else ""))
    if errors:
        lines.append("Predictions against the runs: " + "; ".join(errors) + ".")
    confirmed = s.get("confirmed", check.get("confirmed"))
    if confirmed is True:
        lines.append("Confirmed: its first choice measured within 10 % of the best measured.")
    elif confirmed is False:
        lines.append("Not confirmed: its first choice measured more than 10 % short of the "
                     "best measured.")
    else:
        lines.append("Not judged: its first choice has no measurement to judge it on (did not "
                     "complete, only on a busy host, or did not reach the target).")
    noisy = check.get("noisy_left_out")
    if check.get("include_noisy") is True:
        lines.append("Runs marked noisy were counted (--include-noisy): a row measured on a "
                     "busy host says so.")
    elif isinstance(noisy, int) and noisy:
        lines.append(f"{noisy} run(s) marked noisy (other processes used their host) were "
                     f"left out of the check.")
    return lines


def rows_frame(check: dict) -> pd.DataFrame:
    """The check's rows under ``COLUMNS``' headers, as text: the columns no row has left
    out, errors as signed percentages, bytes in GiB."""
    rows = [r for r in check.get("rows") or [] if isinstance(r, dict)]
    keys = [k for k in COLUMNS if any(r.get(k) is not None for r in rows)]
    out = []
    for r in rows:
        cells = []
        for k in keys:
            value = r.get(k)
            if k.endswith("error"):
                cells.append(_percent(value))
            elif k.endswith("_bytes"):
                number = _number(value)
                cells.append("" if number is None else f"{number / 2**30:.2f}")
            elif isinstance(value, bool):
                cells.append("yes" if value else "")
            elif isinstance(value, float):
                cells.append(f"{value:.1f}")
            else:
                cells.append("" if value is None else str(value))
        out.append(cells)
    frame = pd.DataFrame(out, columns=range(len(keys)))
    frame.columns = [COLUMNS[k] for k in keys]
    return frame
