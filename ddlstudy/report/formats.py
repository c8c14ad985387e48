"""The tables as text: Markdown, CSV or LaTeX (booktabs), values shown alike in each."""

from __future__ import annotations

import pandas as pd

FORMATS = {"markdown": "md", "csv": "csv", "latex": "tex"}


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values shown as '-'."""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |"
            for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body])


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#",
          "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def to_latex(frame: pd.DataFrame, caption: str = "") -> str:
    """A booktabs table (\\usepackage{booktabs}) with the values as shown in Markdown."""
    cols = "l" + "r" * (len(frame.columns) - 1)
    lines = [r"\begin{table}[ht]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
              " & ".join(_latex_escape(str(c)) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(_fmt(v)) for v in row) + r" \\"
              for row in frame.astype(object).itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def render(frame: pd.DataFrame, fmt: str, caption: str = "") -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "latex":
        return to_latex(frame, caption)
    return (f"**{caption}**\n\n" if caption else "") + to_markdown(frame)
