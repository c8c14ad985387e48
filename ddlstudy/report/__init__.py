"""A folder of runs as tables (``tables``: speedups against the sequential baseline, the
paper's Tables 1-3) and seaborn figures (``figures``); ``Report.write`` writes both."""

from __future__ import annotations

import functools
from pathlib import Path

from ddlstudy.files import atomic_write_text
from ddlstudy.report import tables
from ddlstudy.report.figures import make_figures
from ddlstudy.report.findings import Finding, findings, findings_notes, render_findings
from ddlstudy.report.formats import FORMATS, render, to_latex, to_markdown
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
        """Tables in ``fmt`` (plus the tidy runs.csv), findings.md and, with ``figures``,
        the figures."""
        paths = self.write_tables(out, fmt)
        paths.append(Path(out) / "findings.md")
        atomic_write_text(paths[-1], self.findings_text() + "\n")
        if figures:
            paths += make_figures(self, Path(out) / "figures")
        return paths


__all__ = ["BASELINE", "FORMATS", "STUDY_FILE", "Finding", "Report", "config_label",
           "cores_used", "findings", "load_runs", "make_figures", "paper_tables", "render",
           "runs_frame", "speedup_table", "to_latex", "to_markdown"]
