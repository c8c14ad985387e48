"""A folder of runs as tables (``tables``: speedups against the sequential baseline, the
paper's Tables 1-3), seaborn figures (``figures``) and one page that holds them all
(``page``: index.html, the answer first); ``Report.write`` writes them."""

from __future__ import annotations

import functools
from pathlib import Path

from ddlstudy.files import atomic_write_text
from ddlstudy.report import advice, summary, tables
from ddlstudy.report.figures import make_figures
from ddlstudy.report.findings import Finding, findings, findings_notes, render_findings
from ddlstudy.report.formats import FORMATS, render, to_latex, to_markdown
from ddlstudy.report.page import PAGE, write_page
from ddlstudy.report.runs import (
    BASELINE,
    STUDY_FILE,
    config_label,
    cores_used,
    load_runs,
    runs_frame,
)
from ddlstudy.report.tables import paper_tables, speedup_table


class Report(tables.Report):
    """The tables of a runs folder, its findings (the paper's conclusions checked against
    its runs) and its figures."""

    @functools.cached_property
    def findings(self) -> list[Finding]:
        """The paper's conclusions judged on these runs (computed once: some read samples)."""
        return findings(self)

    def findings_text(self) -> str:
        """The findings in Markdown, with what they left out (noisy runs, say)."""
        return render_findings(self.findings, findings_notes(self))

    def text(self, fmt: str = "markdown") -> str:
        """The tables, then (in Markdown) the findings."""
        text = super().text(fmt)
        return text if fmt != "markdown" else f"{text}\n\n{self.findings_text()}"

    def write(self, out: Path, fmt: str = "markdown", figures: bool = True) -> list[Path]:
        """Tables in ``fmt`` (speedup.md: the short summary, opened by the advice check's
        where the study checked one; speedup.csv and runs.csv: every column),
        findings.md, with ``figures`` the figures, and last the page, index.html, which
        holds all of them."""
        out = Path(out)
        paths = self.write_tables(out, fmt)
        if fmt == "markdown":
            check = advice.read_check(out)
            paths.append(out / "speedup.md")
            atomic_write_text(paths[-1], summary.markdown(
                self, advice.summary_lines(check) if check else []))
        paths.append(out / "findings.md")
        atomic_write_text(paths[-1], self.findings_text() + "\n")
        drawn = make_figures(self, out / "figures") if figures else []
        return [*paths, *drawn, write_page(self, out, drawn, self.findings)]


__all__ = ["BASELINE", "FORMATS", "PAGE", "STUDY_FILE", "Finding", "Report", "config_label",
           "cores_used", "findings", "load_runs", "make_figures", "paper_tables", "render",
           "runs_frame", "speedup_table", "to_latex", "to_markdown"]
