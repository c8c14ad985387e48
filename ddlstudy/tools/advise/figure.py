"""The advice check as a figure: predicted against measured, both axes log, the diagonal
and the band of the errors within the goal around it, one mark a configuration, numbered
by its rank in the advice and named in the legend; beside it the same for a node's peak
memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, NullFormatter, ScalarFormatter

from ddlstudy.files import atomic_write

MARKERS = "osD^v<>pPX*h"


def plot_check(result: dict, goal: float) -> Figure | None:
    """Two panels: the criterion (images/s or time to target) and a node's peak memory
    (GiB), predicted on x, measured on y, a configuration the same mark and colour in
    both; the band holds the errors within ``goal``. None where no row has both."""
    style = {r["rank"]: (MARKERS[i % len(MARKERS)], f"C{i % 10}")
             for i, r in enumerate(result["rows"])}
    rows = [r for r in result["rows"] if r["predicted"] and r["measured"]]
    if not rows:
        return None
    memory = [r for r in result["rows"]
              if r.get("predicted_node_bytes") and r.get("measured_node_bytes")]
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if memory else 1, squeeze=False)[0]
    _panel(axes[0], rows, style, lambda r: (r["predicted"], r["measured"]),
           result["criterion"], goal)
    if memory:
        _panel(axes[1], memory, style, lambda r: (r["predicted_node_bytes"] / 2**30,
                                                   r["measured_node_bytes"] / 2**30),
               "peak memory of a node (GiB)", goal)
    shown = {r["rank"]: r for r in rows + memory}
    handles = [Line2D([], [], linestyle="none", marker=style[k][0], color=style[k][1])
               for k in shown]
    fig.legend(handles, [f"{r['rank']}: {r['label']}" + (" (busy host)" if r.get("busy")
                                                         else "") for r in shown.values()],
               loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"advise's predictions against the measured runs (band: errors within "
                 f"+-{goal:.0%})")
    return fig


def _panel(ax, rows: list[dict], style: dict, xy, what: str, goal: float) -> None:
    points = [xy(r) for r in rows]
    for r, (x, y) in zip(rows, points, strict=True):
        marker, colour = style[r["rank"]]
        ax.plot([x], [y], linestyle="none", marker=marker, color=colour, markersize=7)
        ax.annotate(str(r["rank"]), (x, y), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    values = [v for p in points for v in p]
    low, high = min(values) / 1.3, max(values) * 1.3
    line = np.geomspace(low, high, 50)
    ax.plot(line, line, color="grey", linewidth=1)
    # error = (predicted - measured) / measured within +-goal: measured in x / (1 +- goal)
    ax.fill_between(line, line / (1 + goal), line / (1 - goal), color="grey", alpha=0.15,
                    linewidth=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    narrow = high / low < 30  # within about a decade: the minor ticks named too
    for axis in (ax.xaxis, ax.yaxis):  # 0.4, not 4 x 10^-1
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(FormatStrFormatter("%g") if narrow else NullFormatter())
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel(f"predicted {what}")
    ax.set_ylabel(f"measured {what}")


def save(fig: Figure, out: Path, name: str) -> list[Path]:
    """``name``.svg and ``name``.png in ``out``, each written whole or not at all."""
    paths = [out / f"{name}.svg", out / f"{name}.png"]
    atomic_write(paths[0], lambda f: fig.savefig(f, format="svg", bbox_inches="tight"))
    atomic_write(paths[1], lambda f: fig.savefig(f, format="png", dpi=110,
                                                 bbox_inches="tight"))
    return paths
