"""The tables as text: Markdown, CSV or LaTeX (booktabs), values shown alike in each; and
Markdown that fits a terminal (``fitted_markdown``, ``wrapped``: lines of at most ``WIDTH``
characters)."""

from __future__ import annotations

import re
import textwrap

import pandas as pd

FORMATS = {"markdown": "md", "csv": "csv", "latex": "tex"}
WIDTH = 100
"""The widest line printed to a terminal (a table that wraps there cannot be read)."""


def cell_text(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values shown as '-'."""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell_text(v) for v in row) + " |"
            for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def fitted_markdown(frame: pd.DataFrame, shrink: list[str], notes: dict[str, int],
                    width: int = WIDTH) -> str:
    """A Markdown table whose rows fit ``width``: where a row is too long, its cells of the
    ``shrink`` columns, in turn, keep their first and last words around '...' and a note number
    ('[2]'); ``notes`` maps each full text so cut to its number (shared by the tables of
    one report, so that a text cut twice has one note). Cells are not padded: the Markdown
    is that of the written files, only narrower."""
    at = [list(frame.columns).index(c) for c in shrink]
    lines = [_row([str(c) for c in frame.columns]),
             "|" + "|".join("---" for _ in frame.columns) + "|"]
    for values in frame.astype(object).itertuples(index=False):
        cells = [cell_text(v) for v in values]
        for i in at:
            room = width - len(_row(cells)) + len(cells[i])
            if len(cells[i]) > max(room, LEAST):  # a cut one is LEAST long at least
                cells[i] = _cut(cells[i], room, notes)
        lines.append(_row(cells))
    return "\n".join(lines)


LEAST = 16
"""The fewest characters a cut cell keeps, its note number included."""


def _cut(text: str, room: int, notes: dict[str, int]) -> str:
    """``text`` in ``room`` characters (``LEAST`` at least): as many of its first and last
    words as fit around ' ... ' (never a word cut: its first, the strategy's or backend's
    name, is kept whole even where it alone is longer), then its note."""
    mark = f" [{notes.setdefault(text, len(notes) + 1)}]"
    keep = max(room, LEAST) - len(mark) - len(" ... ")
    words = text.split(" ")
    head, tail = words[:1], []
    while len(head) + len(tail) < len(words) - 1:  # one word at least is left out
        grown = [(head + [words[len(head)]], tail), (head, [words[-len(tail) - 1], *tail])]
        fits = [(h, t) for h, t in grown if len(" ".join(h)) + len(" ".join(t)) <= keep]
        if not fits:
            break
        head, tail = fits[0] if len(tail) >= len(head) - 1 or len(fits) == 1 else fits[1]
    return f"{' '.join(head)} ... {' '.join(tail)}".rstrip() + mark


def wrapped(text: str, indent: str = "", width: int = WIDTH) -> str:
    """``text`` in lines of ``width``; continuation lines indented by ``indent`` (under a
    list item's text, so Markdown still reads one item)."""
    return textwrap.fill(text, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


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
    lines += [" & ".join(_latex_escape(cell_text(v)) for v in row) + r" \\"
              for row in frame.astype(object).itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def render(frame: pd.DataFrame, fmt: str, caption: str = "") -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "latex":
        return to_latex(frame, caption)
    return (f"**{caption}**\n\n" if caption else "") + to_markdown(frame)


def interval_bounds(text: str) -> tuple[float, float] | None:
    """The 95 % interval as the table prints it ('1.42-1.61', maybe followed by
    '(includes 1)') in numbers, None where it has none: the whiskers show what it says."""
    found = re.match(r"\s*(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)", text or "")
    return (float(found[1]), float(found[2])) if found else None
