"""The advice as text: ``advise.md``'s Markdown (as printed: lines of at most ``WIDTH``
characters), CSV and JSON for scripts (``advise --format``), and ``write`` (advise.json
beside advise.md)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd

from ddlstudy.files import atomic_write_json, atomic_write_text
from ddlstudy.machine.sampler import NOISY_CORES
from ddlstudy.redact import redacted
from ddlstudy.report.formats import WIDTH, cell_text, fitted_markdown, wrapped
from ddlstudy.tools.advise.ranking import CHANGES, SAME

PREDICTED_ONLY = "predicted for that link: run it with --hostfile on such machines"
"""What runs a row predicted for ``--link``'s machines (it cannot run here)."""
SCALING_EFFICIENCY = ("scaling efficiency: images/s / (nodes x the fastest one-node "
                      "probe's images/s); not the report's efficiency (speedup / cores)")
CSV_COLUMNS = ["rank", "list", "label", "nodes", "images_per_s", "low", "high", "basis",
               "noisy", "speedup", "scaling_efficiency", "time_to_target_s",
               "convergence", "predicted_peak_node_bytes", "predicted_need_node_bytes",
               "measured_peak_node_bytes", "memory_basis",
               "runnable", "command"]
"""``advise --format csv``: a row a ranked configuration."""


def _header(result: dict) -> list[str]:
    """The advice's first lines: where, how long, whether every layout was probed, and how
    right the last check on this host found advise."""
    where = result["link"] and f"a {result['link']} link between machines like this one" \
        or result["hosts"] or "this host (nodes share its cores and memory)"
    lines = [f"# ddlstudy advise: {result['usecase']}", "",
             wrapped(f"{result['cores']} cores, {result['gpus']} GPU(s); nodes "
                     f"{result['nodes']} on {where}; {result['rounds']} probe round(s) in "
                     f"{result['seconds']:.0f} s (budget "
                     + ("auto" if result["budget_s"] is None else f"{result['budget_s']:.0f} s")
                     + (f"; {result['waited_s']:.0f} s more waiting for a quiet host"
                        if result.get("waited_s") else "") + ")"), ""]
    if result.get("budget_needed_s"):
        lines += [wrapped(f"not every configuration was probed: --budget "
                          f"{result['budget_needed_s']}s (or auto, the default) would probe "
                          "them all"), ""]
    if result.get("last_check"):
        lines += [wrapped(f"How right advise has been: {result['last_check']}"), ""]
    return lines


def markdown(result: dict, top: int = 10) -> str:
    lines = _header(result)
    conv = result["convergence"]
    ttt = bool(conv.get("factor"))
    ranked = f"predicted time to {conv['target']}" if ttt else "images/s"
    lines.append(wrapped(f"ranked by {ranked}; {result['sureness']}"))
    if conv.get("note"):
        lines.append(wrapped(f"({conv['note']})"))
    best: dict[int, dict] = {}
    for r in result["ranking"]:
        if r.get("list", SAME) == SAME:
            best.setdefault(r["nodes"], r)
    named = {r["rank"] for r in best.values()}
    notes: dict[str, int] = {}
    for title, rows in ((f"{SAME} as the baseline", [
            r for r in result["ranking"] if r.get("list", SAME) == SAME]),
                        (f"{CHANGES} (another model is trained: ranked by images/s only, "
                         "its epochs to target not measured; measure them with --runs)", [
            r for r in result["ranking"] if r.get("list", SAME) == CHANGES])):
        shown = [r for i, r in enumerate(rows) if i < top or r["rank"] in named]
        if shown:
            lines += ["", wrapped(f"## {title}"), "", _table(shown, conv, notes)]
            if len(shown) < len(rows):
                lines.append(f"\n({len(rows) - len(shown)} more in advise.json)")
    lines += ["", wrapped("images/s: the probes' median (*: a busy host's probes only: their "
                          "fastest; every probe's range in advise.json); basis: probed, or a "
                          "probe's compute + the exchange's model, or a model of one node; "
                          f"{SCALING_EFFICIENCY}; epochs: to the target, against the "
                          "baseline's (measured in --runs); "
                          "GiB: a node's predicted memory, what it is held to (its processes' "
                          "peaks less the libraries' pages, shared memory once; --memory leaves "
                          "out what would not fit)")]
    lines += ["", f"best per node count ({SAME}), and how to run it:", ""]
    lines += [wrapped(f"- {n}: {r['label']}, {r['images_per_s']:.1f} images/s (rank "
                      f"{r['rank']})", "  ") for n, r in sorted(best.items())]
    lines += ["", "```"] + [line for _, r in sorted(best.items()) for line in (
        f"# rank {r['rank']}", *_how(r))] + ["```"]
    lines.append(wrapped("Every row's command: advise.json's ranking[].command (or `ddlstudy "
                         "advise ... --format csv`)."))
    if notes:
        lines += ["", "Cut to fit:"] + [wrapped(f"- [{n}] {text}", "  ")
                                        for text, n in notes.items()]
    lines += [""] + [wrapped(f"- {note}", "  ") for note in result["notes"]]
    noisy = [n for p in result["probes"] for n in p.get("noisy", [])]
    if noisy:
        lines.append(wrapped(
            f"- {len(noisy)} probe(s) ran while other processes kept more than {NOISY_CORES} "
            f"cores of this host busy (up to {max(n['others_cores'] for n in noisy):.2f}): "
            "not counted where the configuration had a quiet probe; rows marked 'busy host' "
            "had none. --wait-quiet waits for a quiet host before each probe", "  "))
    skipped = [p for p in result["probes"] + result.get("left_out", []) if "skipped" in p]
    if skipped:
        lines += ["", "not ranked:", ""] + [wrapped(f"- {p['label']}: {p['skipped']}", "  ")
                                             for p in skipped]
    return "\n".join(lines)


def _table(rows: list[dict], conv: dict, notes: dict[str, int]) -> str:
    """The ranked rows as a Markdown table that fits ``WIDTH``: the labels (and what
    changes convergence) cut between words to fit, in full under 'Cut to fit'."""
    factors = conv.get("factor") or {}
    table = pd.DataFrame([{
        "#": str(r["rank"]), "configuration": r["label"], "nodes": str(r["nodes"]),
        "images/s": cell_text(r["images_per_s"]) + ("*" if r.get("noisy") else ""),
        "basis": r["basis"].replace(" + ", "+"), "speedup": cell_text(r["speedup"]),
        "scaling eff.": f"{scaling(r):.0%}",
        "GiB": _gib(r.get("predicted_need_node_bytes")),
        **({"to target": _figure(r.get("time_to_target_s"), " s")} if factors else {}),
        "epochs": _converges(r.get("convergence_key", "baseline"), factors)} for r in rows])
    return fitted_markdown(table, ["epochs", "configuration"], notes, WIDTH)


def _converges(key: str, factors: dict) -> str:
    """A row's epochs to target in a few words: the baseline's, the measured factor,
    never reached, or not measured (what changes convergence: in the label)."""
    if key == "baseline":
        return "baseline's"
    if key in factors:
        return "never reached" if factors[key] is None else f"x{factors[key]:.2f}"
    return "not measured"


def _how(row: dict) -> list[str]:
    """A row's command as shell lines of at most ``WIDTH`` characters (continued with a
    backslash), or why it cannot run here."""
    if not row.get("runnable", True):
        return [f"# {PREDICTED_ONLY}"]
    lines, line = [], ""
    for word in row["command"].split(" "):
        if line and len(line) + 1 + len(word) > WIDTH - 2:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def scaling(row: dict) -> float:
    """A row's scaling efficiency (older advise.json files call it ``efficiency``)."""
    return row["scaling_efficiency"] if "scaling_efficiency" in row else row["efficiency"]


def as_csv(result: dict) -> str:
    """``advise --format csv``: the ranking, a row a configuration, best first."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in result["ranking"]:
        writer.writerow(r | {"list": r.get("list", SAME), "scaling_efficiency": scaling(r),
                             "command": r["command"] if r.get("runnable", True)
                             else PREDICTED_ONLY})
    return out.getvalue()


def as_json(result: dict) -> str:
    """``advise --format json``: advise.json's content (no URI's secrets)."""
    return json.dumps(redacted(result), indent=2)


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "advise.json", out / "advise.md"]
    atomic_write_json(paths[0], result)
    atomic_write_text(paths[1], markdown(result) + "\n")
    return paths


def _figure(value: float | None, unit: str = "") -> str:
    return "never" if value is None else f"{value:.1f}{unit}"


def _gib(nbytes: int | None) -> str:
    """A row's predicted peak a node in GiB ('?' where the baseline recorded no memory)."""
    return "?" if nbytes is None else f"{nbytes / 2**30:.2f}"


def pct(value: float | None, signed: bool = True, digits: int = 0) -> str:
    """A fraction in %: signed (an error) or not (a mean absolute error); '-' for none."""
    return "-" if value is None else f"{value:+.{digits}%}" if signed else f"{value:.{digits}%}"
