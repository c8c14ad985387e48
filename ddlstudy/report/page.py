"""report/index.html: the study as one page, for the people who did not run it.

One file that works offline (opened from disk, attached to a mail or to the study's
MLflow run): its style, script and figures are in it (``assets``; the figures are the
report's own SVGs, ``pagefigs``), and it asks no network for anything. It opens with the
answer (the advice check's summary first, where the study checked an advice; then per use
case the fastest configuration with its speedup and interval, the leanest in memory, the
time to target, what was killed for memory; what the noisy runs left out; the findings'
verdicts), then a summary table that sorts by any column and filters by use case,
strategy and backend (every column behind a toggle, and the CSV files linked), the
paper's findings with their evidence and projections, the figures in sections, and every
run, its id linking to its manifest and its own figures folded under it. It fits 1280 px
and prints.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import pandas as pd

from ddlstudy import __version__
from ddlstudy.files import atomic_write_text
from ddlstudy.report import advice
from ddlstudy.report.assets import CSS, JS
from ddlstudy.report.findings import PAPER, Finding, findings_notes
from ddlstudy.report.formats import cell_text
from ddlstudy.report.pagefigs import figure_sections, inline_svg, manifest_href, runs_section
from ddlstudy.report.runs import KEY
from ddlstudy.report.summary import (
    SHORT,
    answers,
    memory_notes,
    runs_of,
    short_table,
    target_header,
)
from ddlstudy.report.tables import Report

PAGE = "index.html"
NUMBERS = ("speedup", "images_per_s", "peak_node_gib", "peak_process_gib")
"""The short table's columns of numbers: sorted by value, shown as the tables show them."""
FILTERS = {"usecase": "use case", "strategy": "strategy", "backend": "backend"}
HEADERS = {"target": "time to target"}
"""The page's headers where not the short table's (each cell names its target)."""


def write_page(report: Report, out: Path, figures: list[Path],
               found: list[Finding]) -> Path:
    """The page of ``report`` into ``out``/index.html, with the SVGs among ``figures``
    and the findings ``found``; returns its path."""
    out = Path(out)
    svgs = {p.stem: p for p in figures if p.suffix == ".svg"}
    path = out / PAGE
    atomic_write_text(path, page(report, out, svgs, found))
    return path


def page(report: Report, out: Path, svgs: dict[str, Path], found: list[Finding]) -> str:
    """The page's HTML (``svgs``: the figures by name; ``out``: where the page goes, which
    its links to the runs' manifests start from)."""
    check = advice.read_check(out)
    title = _title(report)
    body = [_header(report, title, check is not None),
            _advice(check, out) if check is not None else "",
            _answer(report, found), _summary(report, out), _findings(report, found),
            figure_sections(report, svgs), runs_section(report, out, svgs),
            f"<footer>Written by ddlstudy {__version__} on "
            f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} from "
            f"{html.escape(str(report.runs_dir))}. The page is whole: it works offline and "
            f"asks no network for anything.</footer>"]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(body)}</main><script>{JS}</script></body></html>\n")


def _title(report: Report) -> str:
    names = {(m.get("study") or {}).get("name") for m in report.manifests} - {None}
    what = f"study {', '.join(sorted(map(str, names)))}" if names else \
        f"runs of {report.runs_dir.name}"
    return f"ddlstudy: {what}"


def _header(report: Report, title: str, checked: bool) -> str:
    runs = report.runs[report.runs.run.astype(bool)]
    usecases = ", ".join(dict.fromkeys(report.table.usecase))
    noisy = " (noisy runs counted: --include-noisy)" if report.include_noisy else ""
    links = [("advice", "advice check")] * checked + [
        ("answer", "answer"), ("summary", "summary"), ("findings", "findings"),
        ("figures", "figures"), ("runs", "runs")]
    return (f"<header><h1>{html.escape(title)}</h1><p class=\"meta\">{len(runs)} run(s) of "
            f"{len(report.table)} configuration(s) on {html.escape(usecases)}{noisy}.</p>"
            f'<nav class="toc">' + "".join(f'<a href="#{a}">{t}</a>' for a, t in links)
            + "</nav></header>")


def _list(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def _advice(check: dict, out: Path) -> str:
    """The advice check: its summary, its rows, its figure where the study drew one."""
    rows = advice.rows_frame(check)
    table = _plain_table(rows) if len(rows) else ""
    figure = out / str(check.get("figure") or advice.FIGURE)
    svg = inline_svg(figure, "f-advice-check") if figure.is_file() else ""
    figure_html = (f'<figure id="fig-advice-check" class="fig"><figcaption>Predicted '
                   f"against measured, a point a configuration.</figcaption>{svg}</figure>"
                   if svg else "")
    return (f'<section id="advice"><h2>The advice check</h2>'
            f"{_list(advice.summary_lines(check))}{table}{figure_html}</section>")


def _plain_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row)
                   + "</tr>" for row in frame.astype(object).itertuples(index=False))
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}' \
           f"</tbody></table></div>"


def _answer(report: Report, found: list[Finding]) -> str:
    cards = "".join(f'<div class="card"><h3>{html.escape(uc)}</h3>{_list(lines)}</div>'
                    for uc, lines in answers(report).items())
    notes = [n for n in [report.noisy_note()] if n]
    verdicts = "".join(
        f'<li>({f.letter}) {html.escape(f.claim)}: <span class="verdict '
        f'{_verdict_class(f.verdict)}">{html.escape(f.verdict)}</span></li>' for f in found)
    return (f'<section id="answer"><h2>The answer</h2><div class="answer">{cards}</div>'
            + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
            + (f"<h3>The paper's findings on these runs</h3><ul>{verdicts}</ul>"
               if verdicts else "") + "</section>")


def _verdict_class(verdict: str) -> str:
    return "v-" + verdict.split(" ")[0].replace(" ", "-") if verdict != "not measured" \
        else "v-not-measured"


def _summary(report: Report, out: Path) -> str:
    short = short_table(report)
    runs = runs_of(report)
    options = "".join(
        f'<label>{label} <select data-filter="{key}"><option value="">all</option>'
        + "".join(f'<option value="{html.escape(str(v))}">{html.escape(str(v))}</option>'
                  for v in dict.fromkeys(short[key]))
        + "</select></label>" for key, label in FILTERS.items())
    head = "".join(
        f'<th class="{"num" if c in NUMBERS else ""}" scope="col"><button type="button">'
        f"{html.escape(h)}</button></th>" for c, h in [("usecase", "use case"),
                                                       *(SHORT | HEADERS).items()])
    targets = {uc: target_header(report, uc) for uc in dict.fromkeys(short.usecase)}
    body = "".join(_row(r, runs.get(tuple(getattr(r, k) for k in KEY)), out, targets)
                   for r in short.itertuples(index=False))
    return ('<section id="summary"><h2>Summary</h2><p class="note">One row per '
            "configuration: medians over its repeats; speedup against the sequential "
            "baseline of the same setting, with its 95 % bootstrap interval; the peak memory "
            "of a node and of its largest process. Click a header to sort.</p>"
            + "".join(f'<p class="note">{html.escape(n)}</p>' for n in memory_notes(report))
            + f'<div class="controls">{options}<span class="note">showing <span id="shown">'
            f"</span> configurations</span><label><input type=\"checkbox\" id=\"show-full\">"
            f" every column</label><a href=\"speedup.csv\">speedup.csv</a>"
            f'<a href="runs.csv">runs.csv</a><a href="findings.md">findings.md</a></div>'
            f'<table id="configurations"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table>{_full(report)}</section>")


def _row(r, runs: pd.DataFrame | None, out: Path, targets: dict[str, str]) -> str:
    """A configuration's row; ``targets``: each use case's target by its metric's name."""
    attrs = "".join(f' data-{k}="{html.escape(str(getattr(r, k)))}"' for k in FILTERS)
    cells = [f"<td>{html.escape(r.usecase)}</td>", f"<td>{html.escape(r.config)}</td>",
             f"<td>{html.escape(r.runs)}{_links(runs, out)}</td>"]
    for column in SHORT:
        if column in ("config", "runs"):
            continue
        value = getattr(r, column)
        if column in NUMBERS:
            number = "" if pd.isna(value) else repr(float(value))
            cells.append(f'<td class="num" data-value="{number}">{cell_text(value)}</td>')
        elif column == "target":
            tta = "" if pd.isna(r.time_to_target_s) else repr(float(r.time_to_target_s))
            text = f"{targets[r.usecase]}: {value}" if value else ""
            cells.append(f'<td data-value="{tta}">{html.escape(text)}</td>')
        else:
            tight = ' class="tight"' if column == "speedup_95" else ""
            cells.append(f"<td{tight}>{html.escape(str(value))}</td>")
    noisy = ' class="noisy"' if r.noisy.startswith("yes") else ""
    return f"<tr{noisy}{attrs}>{''.join(cells)}</tr>"


def _links(runs: pd.DataFrame | None, out: Path) -> str:
    """A configuration's runs as numbered links to their manifests."""
    if runs is None or runs.empty:
        return ""
    return " " + " ".join(
        f'<a class="run-link" href="{manifest_href(r.path, out)}" title="run '
        f'{html.escape(r.run)}">#{i}</a>' for i, r in enumerate(runs.itertuples(index=False),
                                                                 start=1))


def _full(report: Report) -> str:
    """Every column of the speedup table (as in speedup.csv), hidden until asked."""
    table = report.table
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row)
                   + "</tr>" for row in table.astype(object).itertuples(index=False))
    return (f'<div id="full" class="scroll" hidden><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _findings(report: Report, found: list[Finding]) -> str:
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in findings_notes(report))
    items = []
    for f in found:
        parts = [_list(f.lines)]
        if f.differs:
            parts.append("<p>Not the paper's verdict (it confirms this); measured here:</p>"
                         + _list(f.differs))
        if f.projected:
            parts.append(f'<div class="projected"><p>Projected to {html.escape(str(f.hardware))}'
                         f" (a model fitted to these runs, not a measurement):</p>"
                         f"{_list(f.projected)}</div>")
        cls = _verdict_class(f.verdict)
        items.append(f'<article class="finding {cls}"><h3>({f.letter}) {html.escape(f.claim)}'
                     f': <span class="verdict {cls}">{html.escape(f.verdict)}</span></h3>'
                     f"{''.join(parts)}</article>")
    return (f'<section id="findings"><h2>Findings</h2><p class="note">The paper\'s '
            f"conclusions checked on these runs ({html.escape(PAPER)}; its figures came from "
            f"its cluster, these from this folder's hosts).</p>{notes}{''.join(items)}"
            f"</section>")
