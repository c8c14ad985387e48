"""Where a figure's one legend goes: right of its panels, over none of their data (a
legend inside an axes covers what is drawn under it, and panels that share their series
need them once)."""

from __future__ import annotations

from matplotlib.figure import Figure

LEGEND = {"loc": "outside right upper", "fontsize": 8}


def one_legend(fig: Figure) -> None:
    """The entries of every panel's legend (and labelled artists) in one legend of the
    figure, outside the panels. An entry is its label's first handle; the title is the
    first panel legend's."""
    entries: dict = {}
    title = ""
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
        if ax.get_legend():
            title = title or ax.get_legend().get_title().get_text()
            ax.get_legend().remove()
    if entries:
        fig.legend(list(entries.values()), list(entries), title=title or None, **LEGEND)
