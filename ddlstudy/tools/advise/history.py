"""What checks of advice on this host found, remembered (one JSON line a check): ``advise``
opens with how the last one did."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from ddlstudy.config import DEFAULT_RUNS_DIR
from ddlstudy.config.paths import ADVICE_CHECKS_ENV
from ddlstudy.errors import UsageError
from ddlstudy.reading import read_text
from ddlstudy.tools.advise.output import pct

log = logging.getLogger("ddlstudy")


def checks_file() -> Path:
    """Where the checks on this host are remembered (ADVICE_CHECKS_ENV)."""
    return Path(os.environ.get(ADVICE_CHECKS_ENV) or
                DEFAULT_RUNS_DIR / "advise" / "checks.jsonl")


def remember(result: dict, advice: dict, advice_path: Path) -> None:
    """Add the check's summary to ``checks_file`` (one JSON line; best effort: a check is
    not lost for a history that cannot be written)."""
    host = (advice.get("host") or {}).get("hostname") or socket.gethostname()
    line = {"host": host, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "usecase": advice["usecase"], "advice": str(Path(advice_path).resolve()),
            "criterion": result["criterion"], "noisy_left_out": result["noisy_left_out"],
            "summary": {k: v for k, v in result["summary"].items() if k != "by_basis"}}
    try:
        path = checks_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as exc:
        log.warning("could not remember this advice check in %s: %s", checks_file(), exc)


def last_check(usecase: str | None = None) -> dict | None:
    """The last check remembered on this host (of ``usecase`` if there is one, else of
    any), None where there is none or the history cannot be read."""
    try:
        text = read_text(checks_file(), "advice checks") if checks_file().is_file() else ""
    except UsageError:
        return None
    host = socket.gethostname()
    mine = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if _entry(entry) and entry["host"] == host:
            mine.append(entry)
    same = [e for e in mine if e.get("usecase") == usecase]
    return (same or mine or [None])[-1]


def _entry(entry: Any) -> bool:
    """Whether a line of the history is one ``remember`` wrote (a file anyone can edit)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("summary"), dict):
        return False
    s = entry["summary"]
    numbers = ("mape", "node_memory_mape", "spearman")
    return (isinstance(entry.get("host"), str) and isinstance(entry.get("criterion"), str)
            and isinstance(s.get("rows"), int) and all(
                s.get(k) is None or isinstance(s[k], int | float) for k in numbers)
            and (s.get("first_measured_rank") is None
                 or isinstance(s["first_measured_rank"], int)))


def last_check_line(usecase: str | None) -> str:
    """advise's line on how its last check on this host did."""
    entry = last_check(usecase)
    if entry is None:
        return ("this host has no advice check yet: `ddlstudy study --from-advice "
                "<out>/advise.json` measures the top rows and gives each one's error")
    s = entry["summary"]
    parts = [f"{entry['criterion']} off by {pct(s.get('mape'), signed=False)} on average"]
    if s.get("node_memory_mape") is not None:
        parts.append(f"a node's memory by {pct(s['node_memory_mape'], signed=False)}")
    if s.get("spearman") is not None:
        parts.append(f"rank correlation {s['spearman']:.2f}")
    if s.get("first_measured_rank") is not None:
        parts.append(f"its first choice measured rank {s['first_measured_rank']}")
    whose = "" if entry.get("usecase") == usecase else f" (of {entry.get('usecase')})"
    return (f"the last advice check on this host{whose}, {entry.get('at', '?')}: "
            f"{s.get('rows', 0)} configuration(s), " + ", ".join(parts))
