"""The advice check as a figure: predicted against measured, both axes log, the diagonal
and a band of +-GOAL around it, one mark a configuration, numbered by its rank in the
advice and named in the legend; beside it the same for a node's peak memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter, ScalarFormatter

from ddlstudy.files import atomic_write

MARKERS = "osD^v<>pPX*h"
GOAL = 0.10
"""The band drawn around the diagonal (checking.GOAL: the error a prediction is held to)."""


def plot_check(result: dict) -> Figure | None:
    """Two panels: the criterion (images/s or time to target) and a node's peak memory
    (GiB), predicted on x, measured on y; None where no row has both."""
    rows = [r for r in result["rows"] if r["predicted"] and r["measured"]]
    if not rows:
        return None
    memory = [r for r in result["rows"]
              if r.get("predicted_node_bytes") and r.get("measured_node_bytes")]
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2 if memory else 1, squeeze=False)[0]
    _panel(axes[0], rows, lambda r: (r["predicted"], r["measured"]), result["criterion"])
    if memory:
        _panel(axes[1], memory, lambda r: (r["predicted_node_bytes"] / 2**30,
                                            r["measured_node_bytes"] / 2**30),
               "peak memory of a node (GiB)")
    handles = [axes[0].lines[i] for i in range(len(rows))]
    fig.legend(handles, [f"{r['rank']}: {r['label']}" + (" (busy host)" if r.get("busy")
                                                         else "") for r in rows],
               loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"advise's predictions against the measured runs (band: +-{GOAL:.0%})")
    return fig


def _panel(ax, rows: list[dict], xy, what: str) -> None:
    points = [xy(r) for r in rows]
    for i, (r, (x, y)) in enumerate(zip(rows, points, strict=True)):
        ax.plot([x], [y], linestyle="none", marker=MARKERS[i % len(MARKERS)], markersize=7)
        ax.annotate(str(r["rank"]), (x, y), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    values = [v for p in points for v in p]
    low, high = min(values) / 1.3, max(values) * 1.3
    line = np.geomspace(low, high, 50)
    ax.plot(line, line, color="grey", linewidth=1)
    ax.fill_between(line, line * (1 - GOAL), line * (1 + GOAL), color="grey", alpha=0.15,
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
