"""The page's figures: the SVGs the report wrote, inline in the page (nothing fetched), in
sections with a line each saying what to read in it; each run's own figures (its
confusion matrix, a pipeline's timeline) folded under the run, whose id links to its
manifest.

An SVG goes in as its ``<svg>`` element, every ``id`` in it (and every reference to one)
prefixed with the figure's name: the figures are made apart and would otherwise share
ids, and a reference would find another figure's element.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from ddlstudy.reading import CAPS, read_text
from ddlstudy.records.runfolder import MANIFEST
from ddlstudy.report.formats import cell_text
from ddlstudy.report.memory import NODE
from ddlstudy.report.tables import Report

FIGURES = {
    "speedup": ("Speed", "Speedup per configuration",
                "Longer bars train more images a second than the sequential baseline (the "
                "dashed line at 1); a whisker is the 95 % interval, and one that crosses 1 "
                "cannot tell the configuration from the baseline."),
    "scaling": ("Speed", "Scaling with the node count",
                "A line a strategy spread over more nodes; the dashed line is linear scaling "
                "from one node: the farther below it, the more the nodes' exchange costs."),
    "exchange": ("Speed", "Where an MPI rank's step goes",
                 "Per MPI rank, the milliseconds of a step spent computing and in the "
                 "gradient exchange (waits for the slowest rank included): a long exchange "
                 "bar is time the node did not train."),
    "memory": ("Memory", "Speed against memory",
               "Up and to the left is better: faster and smaller. The dashed line joins the "
               "configurations no other beats on both; a cross on the x axis was killed for "
               "memory, a dotted vertical line is the hosts' limit. " + NODE[0].upper()
               + NODE[1:] + "."),
    "accuracy": ("Learning", "Validation {metric} against wall time",
                 "Where a line first crosses the dashed target is its time to target: a "
                 "configuration faster per image may still cross it later."),
    "resources": ("Resources", "CPU, memory and threads over time",
                  "How much of the host each configuration kept busy (rank 0 of a "
                  "multi-node run), its resident memory and its threads, in 2 s means."),
    "distributed": ("Resources", "Idle and iowait per host",
                    "Each host's idle CPU in the multi-node runs: a host idling while "
                    "another computes is waiting for it."),
}
"""The figures shown in sections, in order: name -> (section, title, what to read in it)."""

PER_RUN = {
    "confusion": "its last validation's confusion matrix: a row per true class, a column "
                 "per predicted one; the diagonal is each class's accuracy",
    "timeline": "its last step's schedule: a row per stage, each micro-batch's forward "
                "(light) and backward (dark) a box; where a row has no box, the stage "
                "waited for a neighbour or sent",
}
"""Each run's own figures, by the start of their name ('confusion-<run>')."""

_REFERENCE = re.compile(r'(\bid="|href="#|url\(#)([^")]+)')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


def inline_svg(path: Path, prefix: str) -> str:
    """The ``<svg>`` element of the SVG file ``path`` (read through the gate), its ids
    prefixed with ``prefix`` and ARIA-labelled as an image."""
    text = read_text(path, "report figure", CAPS["record"])
    start = text.find("<svg")
    if start < 0:
        return ""
    svg = _METADATA.sub("", text[start:])  # matplotlib's RDF: names, dates, no figure
    svg = _REFERENCE.sub(lambda m: f"{m[1]}{prefix}-{m[2]}", svg)
    return svg.replace("<svg", '<svg role="img"', 1)


def _figure(path: Path, name: str, title: str, line: str) -> str:
    return (f'<figure id="fig-{html.escape(name)}" class="fig"><h4>{html.escape(title)}</h4>'
            f"<figcaption>{html.escape(line)}</figcaption>{inline_svg(path, 'f-' + name)}"
            f"</figure>")


def figure_sections(report: Report, svgs: dict[str, Path]) -> str:
    """The figures that have data, in their sections (``FIGURES``)."""
    metrics = set(report.metrics.values()) or {"accuracy"}
    metric = metrics.pop() if len(metrics) == 1 else "metric (each use case's target's)"
    sections: dict[str, list[str]] = {}
    for name, (section, title, line) in FIGURES.items():
        if name in svgs:
            sections.setdefault(section, []).append(
                _figure(svgs[name], name, title.format(metric=metric), line))
    if not sections:
        return ('<h2 id="figures">Figures</h2><p class="note">No figures: the report was '
                "written without them (--no-figures), or no run recorded what they draw.</p>")
    return '<h2 id="figures">Figures</h2>' + "".join(
        f'<h3 class="section">{html.escape(section)}</h3>{"".join(figures)}'
        for section, figures in sections.items())


def manifest_href(run_path: str, out: Path) -> str:
    """The link from the page (in ``out``) to a run folder's manifest, relative: the page
    opened beside its runs finds it."""
    target = os.path.relpath(Path(run_path) / MANIFEST, Path(out).absolute())
    return quote(Path(target).as_posix())


def runs_section(report: Report, out: Path, svgs: dict[str, Path]) -> str:
    """Every run: its id (linking its manifest), configuration, status and speed, its
    own figures folded under it."""
    runs = report.runs[report.runs.run.astype(bool)]
    if runs.empty:
        return ""
    items = [_run(r, out, svgs) for r in runs.itertuples(index=False)]
    what = "; ".join(f"{name}: {line}" for name, line in PER_RUN.items())
    return (f'<h2 id="runs">Runs</h2><p class="note">{len(items)} run(s); each id opens '
            f"its manifest (everything that reruns it). Unfold a run for its own figures "
            f"({html.escape(what)}).</p>" + "".join(items))


def _run(r, out: Path, svgs: dict[str, Path]) -> str:
    speed = f" · {cell_text(r.images_per_s)} images/s" if pd.notna(r.images_per_s) else ""
    noisy = " · noisy (busy host)" if r.noisy else ""
    head = (f'<a class="run-id" href="{manifest_href(r.path, out)}">{html.escape(r.run)}</a> '
            f"· {html.escape(r.usecase)}: {html.escape(r.config)} · repeat {r.repeat} · "
            f"{html.escape(r.status)}{speed}{noisy}")
    body = [f'<p class="note">{html.escape(r.reason)}</p>'] if r.reason else []
    for kind in PER_RUN:
        name = f"{kind}-{r.run}"
        if name in svgs:
            body.append(f'<figure id="fig-{html.escape(name)}" class="fig"><figcaption>{kind}'
                        f"</figcaption>{inline_svg(svgs[name], 'f-' + name)}</figure>")
    if not body:
        body.append('<p class="note">No figure of its own.</p>')
    return (f'<details class="run" id="run-{html.escape(r.run)}"><summary>{head}</summary>'
            f'<div class="run-figures">{"".join(body)}</div></details>')
