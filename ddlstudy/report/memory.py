"""The memory figure: per use case, images/s against the peak memory of a node, and what a
host's memory limit did to the runs.

A node's figure is ``memory_of``'s ``peak_node_bytes`` (``records.runfolder``: its one
definition; ``MEMORY`` says it in words, and the figure prints those words under its
panels). Each configuration is a point with both intervals as whiskers (the table's 95 %
interval of images/s, the least-most peak over its repeats); the front of those no other
beats on both is joined by a dashed line. On hosts of a given size (``hosts up --memory``)
the runs record each host's limit (``backend.memory.hosts``): the limit is a vertical
line, and a configuration whose runs the kernel killed for memory is a cross on the x
axis, at the most a node of its runs was charged (else at the limit): it has no images/s.
A configuration whose MPI nodes shared one host says so in its label: its "node" is a
share of that host, not a machine of its own.
"""

from __future__ import annotations

from statistics import median

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from ddlstudy.records.memory import GIB, MEMORY
from ddlstudy.report.formats import interval_bounds
from ddlstudy.report.legend import one_legend
from ddlstudy.report.paper import main_settings, only_main
from ddlstudy.report.tables import Report

KILLED_WORDS = "killed by the kernel for memory"
"""What a run's error says when the kernel killed one of its processes at its host's
limit (``hosts.cgroups.out_of_memory``), for runs that did not record the kills."""


def host_limit(manifest: dict) -> int | None:
    """The memory limit of the run's hosts in bytes (the largest, where they differ);
    None where they had none (a host without ``hosts up --memory``)."""
    hosts = ((manifest.get("backend") or {}).get("memory") or {}).get("hosts") or {}
    limits = [h.get("limit_bytes") for h in hosts.values() if isinstance(h, dict)]
    return max((v for v in limits if isinstance(v, int) and v > 0), default=None)


def killed_for_memory(manifest: dict) -> bool:
    """Whether the kernel killed a process of the run at its host's memory limit."""
    if manifest.get("status") != "failed":
        return False
    hosts = ((manifest.get("backend") or {}).get("memory") or {}).get("hosts") or {}
    kills = [h.get("oom_kills") for h in hosts.values() if isinstance(h, dict)]
    return any(isinstance(k, int) and k > 0 for k in kills) or \
        KILLED_WORDS in str(manifest.get("error") or "")


def nodes_per_host(manifest: dict) -> int:
    """How many of the run's nodes shared each host (1: a host each, or one node)."""
    backend = manifest.get("backend") or {}
    hosts = [h for h in backend.get("hosts") or [] if isinstance(h, str)]
    nodes = int(backend.get("nodes") or 1)
    return max(1, nodes // len(set(hosts))) if hosts else 1


def killed(report: Report) -> pd.DataFrame:
    """The configurations of each use case's main setting killed for memory: use case,
    configuration, runs killed, where to draw them (GiB: the most a node was charged, else
    the host's limit) and that limit (NaN where the runs did not record it)."""
    rows = []
    main = main_settings(report.table)  # the table lists each use case's main one first
    runs = report.runs[report.runs.run.astype(bool)]
    runs = runs[np.array([main.get(uc) == s for uc, s in zip(runs.usecase, runs.setting,
                                                             strict=True)], dtype=bool)]
    for (uc, config), g in runs.groupby(["usecase", "config"], sort=False):
        dead = [r for r in g.itertuples(index=False)
                if killed_for_memory(report.by_id.get(r.run, {}))]
        if not dead:
            continue
        limits = [v for r in dead if (v := host_limit(report.by_id.get(r.run, {})))]
        peaks = [r.peak_node_bytes for r in dead if pd.notna(r.peak_node_bytes)]
        at = median(peaks) if peaks else max(limits, default=None)
        rows.append({"usecase": uc, "config": config, "killed": len(dead), "runs": len(g),
                     "gib": at / GIB if at else float("nan"),
                     "limit_gib": max(limits) / GIB if limits else float("nan")})
    return pd.DataFrame(rows, columns=["usecase", "config", "killed", "runs", "gib",
                                       "limit_gib"])


def limits_gib(report: Report, usecase: str) -> list[float]:
    """The host memory limits (GiB) the runs of ``usecase`` ran under, each once."""
    runs = report.runs[(report.runs.usecase == usecase) & report.runs.run.astype(bool)]
    return sorted({v / GIB for r in runs.run if (v := host_limit(report.by_id.get(r, {})))})


def shared_hosts(report: Report) -> dict[str, int]:
    """Configurations whose MPI nodes shared a host: how many nodes each host had."""
    out = {}
    for r in report.runs[report.runs.run.astype(bool)].itertuples(index=False):
        n = nodes_per_host(report.by_id.get(r.run, {}))
        if n > 1:
            out[r.config] = n
    return out


def front(points: list[tuple[float, float]]) -> list[bool]:
    """Which (images/s, GiB) points no other beats on both: as fast or faster and as small
    or smaller, and better on one of them."""
    return [not any(o[0] >= p[0] and o[1] <= p[1] and o != p for o in points)
            for p in points]


MARKERS = "osD^vP*Xph<>"
NODE = f"a node's figure: the {MEMORY['peak_node_bytes']}"
"""What the x axis is, in the words of its one definition (printed under the panels)."""


def plot_memory(report: Report) -> Figure | None:
    """Per use case, images/s against the peak memory of a node: a point a configuration,
    the front joined, the configurations killed for memory as crosses on the x axis and
    the hosts' limits as vertical lines (None: nothing recorded its memory)."""
    t = only_main(report.table).dropna(subset=["images_per_s", "peak_node_gib"])
    dead = killed(report)
    if t.empty and dead.empty:
        return None
    usecases = list(dict.fromkeys([*t.usecase, *dead.usecase]))
    configs = list(dict.fromkeys([*t.config, *dead.config]))
    shared = shared_hosts(report)
    fig = Figure(figsize=(7 * len(usecases) + 3, 5.4), layout="constrained")
    colours = dict(zip(configs, sns.color_palette(n_colors=len(configs)), strict=True))
    for ax, uc in zip(fig.subplots(1, len(usecases), squeeze=False)[0], usecases,
                      strict=True):
        part = t[t.usecase == uc]
        for r in part.itertuples(index=False):
            low, high = interval_bounds(r.images_per_s_95) or (r.images_per_s,) * 2
            i = configs.index(r.config)
            ax.errorbar(r.peak_node_gib, r.images_per_s, fmt=MARKERS[i % len(MARKERS)],
                        xerr=[[r.peak_node_gib - r.peak_node_gib_min],
                              [r.peak_node_gib_max - r.peak_node_gib]],
                        yerr=[[max(r.images_per_s - low, 0)], [max(high - r.images_per_s, 0)]],
                        color=colours[r.config], capsize=3, markersize=7,
                        label=_label(r.config, shared))
        if len(part):
            best = part[front(list(zip(part.images_per_s, part.peak_node_gib, strict=True)))]
            best = best.sort_values("peak_node_gib")
            ax.plot(best.peak_node_gib, best.images_per_s, color="grey", linestyle="--",
                    linewidth=1, zorder=0, label="front: none faster and smaller")
        _limits_and_kills(ax, dead[dead.usecase == uc], limits_gib(report, uc), colours)
        ax.set_title(f"{uc}: speed against memory")
        ax.set_xlabel("peak memory of a node (GiB)")
        ax.set_ylabel("images/s")
        ax.set_ylim(bottom=0)
    fig.text(0.01, 0, NODE, fontsize=8, ha="left", va="top", wrap=True)
    one_legend(fig)
    return fig


def _label(config: str, shared: dict[str, int]) -> str:
    """A configuration's legend entry; one whose MPI nodes shared a host says so."""
    n = shared.get(config)
    return f"{config}\n({n} nodes on one host: a node is its share)" if n else config


def _limits_and_kills(ax, dead: pd.DataFrame, limits: list[float], colours: dict) -> None:
    """The hosts' memory limits as vertical lines, and the configurations killed for
    memory as crosses on the x axis (no images/s: they did not finish)."""
    for limit in limits:
        ax.axvline(limit, color="firebrick", linestyle=":", linewidth=1.2,
                   label=f"host's limit ({limit:.2f} GiB)")
    for r in dead.dropna(subset=["gib"]).itertuples(index=False):
        ax.scatter([r.gib], [0], marker="X", s=90, color=colours[r.config], clip_on=False,
                   edgecolors="firebrick", zorder=3,
                   label=f"{r.config}: killed for memory ({r.killed} of {r.runs} runs)")
