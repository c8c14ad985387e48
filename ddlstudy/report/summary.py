"""What a reader who did not run the study wants first: the answer in a few lines per use
case (``answers``: the fastest configuration with its speedup and interval, the leanest in
memory, the first to the target, those killed for memory) and a short table of the
configurations (``short_table``: speedup [interval], images/s, the peak memory of a node
and of a process, the target, noisy). The page and speedup.md open with them; every
column is in speedup.csv, every run in runs.csv.
"""

from __future__ import annotations

import pandas as pd

from ddlstudy.records.memory import MEMORY
from ddlstudy.report.formats import cell_text, to_markdown
from ddlstudy.report.memory import killed, shared_hosts
from ddlstudy.report.paper import only_main
from ddlstudy.report.runs import KEY, is_baseline
from ddlstudy.report.tables import Report

SHORT = {"config": "configuration", "runs": "runs", "speedup": "speedup",
         "speedup_95": "95 % interval", "images_per_s": "images/s",
         "peak_node_gib": "node GiB", "peak_process_gib": "process GiB",
         "target": "target", "noisy": "noisy"}
"""The short table's columns, under their headers (the target's is named per use case in
Markdown: 'macro_f1 0.80')."""


def runs_of(report: Report) -> dict[tuple, pd.DataFrame]:
    """Each configuration's runs (every one: counted, noisy, failed), by its ``KEY``."""
    runs = report.runs[report.runs.run.astype(bool)]
    return {key: g for key, g in runs.groupby(KEY, sort=False, dropna=False)}


def runs_text(r) -> str:
    """A configuration's runs and how they went: '2 ok', '1 ok, 1 failed', 'skipped: ...'."""
    if r.noisy:  # the noisy column says how busy its host was
        return f"{r.runs} ok"
    if r.status.startswith("ok"):
        return f"{r.runs} {r.status}"
    return f"{r.runs} ok, {r.status}" if r.runs else r.status


def target_text(r) -> str:
    """The time to target of a configuration: '31.0 s (2/2)', 'not reached (0/2)', '1/2
    reached'; '' where its use case sets no target."""
    if not r.reached:
        return ""
    if pd.notna(r.time_to_target_s):
        return f"{cell_text(r.time_to_target_s)} s ({r.reached})"
    return f"not reached ({r.reached})" if r.reached.startswith("0/") else f"{r.reached} reached"


def noisy_text(r) -> str:
    """'yes (others 1.2 cores)' for figures measured on a busy host only, 'N left out'
    where quiet runs gave them, else ''."""
    if r.noisy:
        mark = r.status.split(",")[0]
        return "yes" + mark.removeprefix("noisy")
    left = [p.strip() for p in r.status.split(",") if p.strip().endswith("noisy left out")]
    return left[0].replace(" noisy", "") if left else ""


def short_table(report: Report) -> pd.DataFrame:
    """One row per configuration: its key, then ``SHORT``'s columns as values (numbers
    stay numbers, for sorting; the texts as the page and speedup.md show them)."""
    t = report.table
    out = t[[*KEY, "status"]].copy()
    dead = {(r.usecase, r.config): r.killed for r in killed(report).itertuples(index=False)}
    out["runs"] = [runs_text(r) + (f" ({dead[r.usecase, r.config]} killed for memory)"
                                   if (r.usecase, r.config) in dead else "")
                   for r in t.itertuples(index=False)]
    for column in ("speedup", "images_per_s", "peak_node_gib", "peak_process_gib"):
        out[column] = t[column]
    out["speedup_95"] = [i.split(" (")[0] for i in t.speedup_95]
    out["target"] = [target_text(r) for r in t.itertuples(index=False)]
    out["noisy"] = [noisy_text(r) for r in t.itertuples(index=False)]
    out["time_to_target_s"] = t.time_to_target_s
    return out


def target_header(report: Report, usecase: str) -> str:
    """The target column's header of a use case: its metric and target ('macro_f1 0.80'),
    'target' where its runs set none (or several)."""
    words = report.target_words(usecase)  # ' (target: macro_f1 0.80)'
    return words.removeprefix(" (target: ").removesuffix(")") if words else SHORT["target"]


def _fastest(rows: pd.DataFrame) -> str:
    measured = rows.dropna(subset=["images_per_s"])
    if measured.empty:
        return "fastest: no configuration completed"
    with_speedup = measured.dropna(subset=["speedup"])
    if with_speedup.empty:
        r = measured.loc[measured.images_per_s.idxmax()]
        return (f"fastest: {r.config}, {r.images_per_s:.1f} images/s (no sequential "
                f"baseline to divide by){_busy(r)}")
    r = with_speedup.loc[with_speedup.speedup.idxmax()]
    if is_baseline(with_speedup).loc[r.name]:
        return (f"fastest: the sequential baseline itself, {r.images_per_s:.1f} images/s: no "
                f"other configuration trained faster{_busy(r)}")
    bounds = r.speedup_95.replace(" (includes 1)", ", which includes 1")
    interval = f" (95 % interval {bounds})" if bounds else ""
    return (f"fastest: {r.config}, {r.speedup:.2f}x the sequential baseline{interval}, "
            f"{r.images_per_s:.1f} images/s{_busy(r)}")


def _busy(r) -> str:
    """', measured on a busy host only (others used 1.2 cores)' for a noisy one."""
    if not r.noisy:
        return ""
    others = r.status.split(",")[0].removeprefix("noisy").strip(" ()").removeprefix("others ")
    return ", measured on a busy host only" + (f" (others used {others})" if others else "")


def _leanest(rows: pd.DataFrame) -> str | None:
    measured = rows.dropna(subset=["peak_node_gib"])
    if measured.empty:
        return None
    r = measured.loc[measured.peak_node_gib.idxmin()]
    process = f" (its largest process {r.peak_process_gib:.2f} GiB)" \
        if pd.notna(r.peak_process_gib) else ""
    return f"leanest in memory: {r.config}, {r.peak_node_gib:.2f} GiB a node{process}"


def _first_to_target(report: Report, usecase: str, rows: pd.DataFrame) -> str | None:
    header = target_header(report, usecase)
    if header == SHORT["target"]:
        return None
    reached = rows.dropna(subset=["time_to_target_s"])
    if reached.empty:
        return f"time to {header}: no configuration reached it in every run"
    r = reached.loc[reached.time_to_target_s.idxmin()]
    speedup = f", {r.tta_speedup:.2f}x the baseline's" if pd.notna(r.tta_speedup) else ""
    return f"time to {header}: {r.config} first, in {r.time_to_target_s:.1f} s{speedup}"


def answers(report: Report) -> dict[str, list[str]]:
    """Per use case, the answer in lines: the fastest configuration, the leanest in
    memory, the first to the target (named by its metric), those killed for memory."""
    table = only_main(report.table)
    dead = killed(report)
    out = {}
    for uc, rows in table.groupby("usecase", sort=False):
        lines = [_fastest(rows), _leanest(rows), _first_to_target(report, uc, rows)]
        for r in dead[dead.usecase == uc].itertuples(index=False):
            limit = f" at the host's limit of {r.limit_gib:.2f} GiB" \
                if pd.notna(r.limit_gib) else ""
            lines.append(f"killed for memory: {r.config}, {r.killed} of {r.runs} runs{limit}")
        out[uc] = [line for line in lines if line]
    return out


def memory_notes(report: Report) -> list[str]:
    """What the memory columns are (a node's figure, in its one definition's words), and
    the configurations whose MPI nodes shared a host (a node is then a share of it)."""
    if report.table.peak_node_gib.isna().all():
        return []
    shared = shared_hosts(report)
    return [f"Node GiB: the {MEMORY['peak_node_bytes']}; process GiB: the "
            f"{MEMORY['peak_process_bytes']}."] + [
        f"{config}: its {n} nodes shared one host, and a node's figure is its share of it."
        for config, n in shared.items()]


def markdown(report: Report, opening: list[str] = ()) -> str:
    """speedup.md: ``opening`` (the advice check's summary, where the study checked one),
    the answer, a short table per use case (and setting), the noisy runs, and where every
    column is."""
    parts = [" ".join(opening)] if opening else []
    parts.append("**The answer**\n\n" + "\n\n".join(
        f"*{uc}*\n\n" + "\n".join(f"- {line}" for line in lines)
        for uc, lines in answers(report).items()))
    short = short_table(report)
    for (uc, setting), part in short.groupby(["usecase", "setting"], sort=False):
        several = (short[short.usecase == uc].setting != setting).any()
        shown = part[list(SHORT)]
        empty = [c for c in ("peak_node_gib", "peak_process_gib", "target", "noisy")
                 if not shown[c].map(lambda v: pd.notna(v) and v != "").any()]
        shown = shown.drop(columns=empty).rename(columns=SHORT)
        shown = shown.rename(columns={SHORT["target"]: f"time to {target_header(report, uc)}"})
        title = f"*{uc}, setting: {setting}*" if several else f"*{uc}*"
        parts.append(f"{title}\n\n{to_markdown(shown)}")
    parts += [" ".join(memory_notes(report))] if memory_notes(report) else []
    note = report.noisy_note()
    parts += [note] if note else []
    parts.append("Speedup: against the sequential baseline of the same setting, medians over "
                 "the repeats; 95 % interval: its bootstrap interval (one that includes 1 "
                 "cannot tell the configuration from the baseline). Every column of these "
                 "rows: speedup.csv; every run: runs.csv; the page: index.html.")
    return "\n\n".join(parts) + "\n"
