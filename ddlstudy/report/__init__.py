"""A folder of runs as tables (``tables``: speedups against the sequential baseline, the
paper's Tables 1-3) and seaborn figures (``figures``); ``Report.write`` writes both."""

from __future__ import annotations

from pathlib import Path

from ddlstudy.report import tables
from ddlstudy.report.figures import make_figures
from ddlstudy.report.tables import (
    BASELINE,
    FORMATS,
    STUDY_FILE,
    config_label,
    cores_used,
    load_runs,
    paper_tables,
    render,
    runs_frame,
    speedup_table,
    to_latex,
    to_markdown,
)


class Report(tables.Report):
    """The tables of a runs folder, and its figures."""

    def write(self, out: Path, fmt: str = "markdown", figures: bool = True) -> list[Path]:
        """Tables in ``fmt`` (plus the tidy runs.csv) and, with ``figures``, the figures."""
        paths = self.write_tables(out, fmt)
        if figures:
            paths += make_figures(self, Path(out) / "figures")
        return paths


__all__ = ["BASELINE", "FORMATS", "STUDY_FILE", "Report", "config_label", "cores_used",
           "load_runs", "make_figures", "paper_tables", "render", "runs_frame",
           "speedup_table", "to_latex", "to_markdown"]
