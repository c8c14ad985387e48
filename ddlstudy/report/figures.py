"""Seaborn figures of a runs folder, each written as PNG and SVG.

- ``resources``: CPU, RAM and threads over time per configuration, one line style per use
  case (the paper's Figures 2-5);
- ``distributed``: for multi-node runs, each host's CPU idle and iowait share over time (one
  line a host, naming its ranks);
- ``exchange``: for MPI runs, the milliseconds of a step each rank computes and exchanges;
- ``speedup``: speedup against the sequential baseline per configuration and use case,
  with the 95 % interval the table prints as a whisker (a configuration with noisy runs
  only is named "(noisy)");
- ``scaling``: speedup against the node count, with the ideal line;
- ``accuracy``: validation accuracy (or the metric the use case's target is of) against
  training wall time;
- ``memory``: per use case, images/s against the peak memory of a node, with both
  intervals, the configurations no other beats on both (the front) joined, those killed
  for memory and the hosts' limits (``report.memory``);
- ``timeline-<run>``: for every pipeline run that recorded its stages' time, its schedule
  (``report.timeline``: one row per stage, each micro-batch's forward and backward a box);
- ``confusion-<run>``: for every run, its last validation's confusion matrix
  (``report.confusion``: true class against predicted class).

Each ``plot_*`` function returns a matplotlib Figure (None when there is nothing to show,
say no multi-node run) built without pyplot, so it works with any backend: saved to files
here, shown inline in the notebook. A figure has one legend, outside its panels (a legend
inside one covers the data under it), and every line its own marker and line style (two
configurations that measure alike draw one line over the other).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from ddlstudy.config.recipe import TARGET_METRICS
from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write
from ddlstudy.machine.sampler import IDENTITY, read_samples
from ddlstudy.records.runfolder import SAMPLES
from ddlstudy.report.confusion import plot_confusion
from ddlstudy.report.formats import interval_bounds
from ddlstudy.report.legend import one_legend
from ddlstudy.report.memory import front as front
from ddlstudy.report.memory import plot_memory
from ddlstudy.report.paper import only_main
from ddlstudy.report.runs import LOCAL
from ddlstudy.report.tables import Report
from ddlstudy.report.timeline import plot_timeline

log = logging.getLogger("ddlstudy")


def _save(fig: Figure, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    atomic_write(paths[0], lambda f: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"))
    atomic_write(paths[1], lambda f: fig.savefig(f, format="svg", bbox_inches="tight"))
    return paths


def _first_completed(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per (use case, configuration): the first completed repeat."""
    done = runs[runs.status == "completed"]
    return done.groupby(["usecase", "config"], sort=False).head(1)


FIGURED = (*IDENTITY, "host", "proc_cpu_percent", "proc_rss_bytes", "proc_threads",
           "sys_cpu_percent", "sys_iowait_percent", "sys_ram_percent")
"""The sample columns the figures draw: a run whose samples lack one is left out of them."""


def samples_of(report: Report, runs: pd.DataFrame, scope: str = "node") -> pd.DataFrame:
    """The resource samples of ``runs`` (rows of ``report.runs``) in one frame, with the
    time since the run started and the process tree's CPU as a share of the host's cores.
    A run whose samples cannot be read (or are not ddlstudy's) is left out, named."""
    frames = []
    for r in runs.itertuples(index=False):
        path = Path(r.path) / SAMPLES
        if not path.is_file():
            continue
        try:
            s = read_samples(path, FIGURED)
        except UsageError as exc:
            log.warning("figures: left out the samples of run %s: %s", r.run, exc)
            continue
        s = s[s.scope == scope]
        if s.empty:
            continue
        cores = report.by_id.get(r.run, {}).get("host", {}).get("usable_cores") or 1
        s = s.assign(usecase=r.usecase, config=r.config, run=r.run, t=s.time - s.time.min(),
                     cpu=s.proc_cpu_percent / max(cores, 1),
                     rss=s.proc_rss_bytes / 2**30, idle=100 - s.sys_cpu_percent)
        frames.append(_smooth(s))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


SMOOTH = "2s"
"""Rolling mean over the samples of each run and rank, so a timeline reads at a glance."""


def _smooth(s: pd.DataFrame) -> pd.DataFrame:
    columns = ["cpu", "rss", "idle", "sys_iowait_percent", "sys_ram_percent"]
    out = []
    for _, part in s.groupby("rank", sort=False):
        part = part.sort_values("time")
        rolled = part.set_index(pd.to_datetime(part.time, unit="s"))[columns] \
            .rolling(SMOOTH).mean()
        out.append(part.assign(**{c: rolled[c].to_numpy() for c in columns}))
    return pd.concat(out, ignore_index=True)


def _timelines(s: pd.DataFrame, panels: list[tuple[str, str]], style: str | None,
               title: str, height: float, facet: str | None = None) -> Figure:
    """Panels of ``s`` over time, one row per panel and one column per value of
    ``facet``, sharing one legend (hue: the configuration, marker and line style:
    ``style``, else the configuration again, so that equal lines stay told apart)."""
    columns = list(dict.fromkeys(s[facet])) if facet else [None]
    style = style or "config"
    fig = Figure(figsize=(7 * len(columns) + 3, height), layout="constrained")
    axes = fig.subplots(len(panels), len(columns), sharex="col", squeeze=False)
    for j, value in enumerate(columns):
        part = s[s[facet] == value] if facet else s
        for i, (column, label) in enumerate(panels):
            ax = axes[i][j]
            # Every level in every panel's order: the colours and markers mean one thing.
            sns.lineplot(data=part, x="t", y=column, hue="config", style=style, ax=ax,
                         legend=i == 0 and j == 0, errorbar=None, linewidth=1.2,
                         hue_order=list(dict.fromkeys(s.config)), markers=True,
                         style_order=list(dict.fromkeys(s[style])), markersize=6)
            for k, line in enumerate(ax.lines):  # lines that coincide: markers side by side
                line.set_markevery((0.1 * k / len(ax.lines), 0.1))
            ax.set_ylabel(label if j == 0 else "")
            ax.set_xlabel("")
        axes[0][j].set_title(f"{title}: {value}" if facet else title)
        axes[-1][j].set_xlabel("time since the run started (s)")
    one_legend(fig)
    return fig


def _room_for_labels(ax, ends: list[float]) -> None:
    """Bars' x axis wide enough for the value written right of the longest (a label that
    hangs out of the axes runs into the legend beside them)."""
    ax.set_xlim(0, 1.2 * max(ends) or 1)


def plot_resources(report: Report) -> Figure | None:
    s = samples_of(report, _first_completed(report.runs))
    if s.empty:
        return None
    # Two-line labels: one line each would run into the next panel's.
    return _timelines(s[s["rank"] == 0], [("cpu", "CPU of the run\n(% of all cores)"),
                                         ("rss", "memory of the run\n(RSS, GiB)"),
                                         ("proc_threads", "threads\nof the run")],
                      None, "Resources (2 s means; multi-node: rank 0)", 9, facet="usecase")


def plot_distributed(report: Report) -> Figure | None:
    s = samples_of(report, _first_completed(report.runs[report.runs.backend != LOCAL]))
    if s.empty:
        return None
    # Idle and iowait are the host's: ranks that share a host are one line, which says so.
    # Its marker is its run's host (iowait is often 0 on every host of every run: lines
    # on top of each other, which colour alone, the configuration's, cannot tell apart).
    ranks = s.groupby(["run", "host"])["rank"].agg(lambda r: sorted(set(r)))
    s = s.assign(node=[f"{c}: {h} (rank{'s' if len(ranks[run, h]) > 1 else ''} "
                       f"{', '.join(map(str, ranks[run, h]))})"
                       for run, c, h in zip(s.run, s.config, s.host, strict=True)])
    first = s["rank"] == s.groupby(["run", "host"])["rank"].transform("min")
    return _timelines(s[first],
                      [("idle", "CPU idle\n(% of the host)"),
                       ("sys_iowait_percent", "CPU iowait (%)")],
                      "node", "Multi-node runs, idle and iowait per host", 6, facet="usecase")


def plot_exchange(report: Report) -> Figure | None:
    """Per rank of each multi-node MPI configuration: the seconds a step spent computing and
    in the gradient exchange (waiting for the slowest rank included)."""
    rows = []
    for r in _first_completed(report.runs[report.runs.backend == "mpi"]).itertuples(
            index=False):
        backend = report.by_id.get(r.run, {}).get("backend") or {}
        for x in (backend.get("exchange") or {}).get("per_rank") or []:
            steps = max(x["steps"], 1)
            rank = f"{r.usecase}: {r.config}\nrank {x['rank']} on {x['host']}"
            rows += [{"rank": rank, "part": "compute", "ms": 1e3 * x["compute_s"] / steps},
                     {"rank": rank, "part": "exchange", "ms": 1e3 * x["exchange_s"] / steps}]
    if not rows:
        return None
    p = pd.DataFrame(rows)
    fig = Figure(figsize=(10, 0.6 * p["rank"].nunique() + 1.5), layout="constrained")
    ax = fig.subplots()
    sns.barplot(data=p, y="rank", x="ms", hue="part", ax=ax, orient="h")
    for bars in ax.containers:
        ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
    _room_for_labels(ax, list(p.ms))
    one_legend(fig)
    ax.set_xlabel("milliseconds a step (mean over the run)")
    ax.set_ylabel("")
    # The figure's title, not the axes': one wider than them would run under the legend.
    fig.suptitle("Where an MPI rank's step goes: compute, and the exchange (waits included)")
    return fig


def plot_speedup(report: Report) -> Figure | None:
    t = only_main(report.table).dropna(subset=["speedup"])
    if t.empty:
        return None
    # A configuration measured on a busy host only says so, as in the tables.
    t = t.assign(config=[f"{c} (noisy)" if n else c for c, n in zip(t.config, t.noisy,
                                                                      strict=True)])
    configs, usecases = list(dict.fromkeys(t.config)), list(dict.fromkeys(t.usecase))
    fig = Figure(figsize=(10, 0.45 * len(configs) + 1.5), layout="constrained")
    ax = fig.subplots()
    sns.barplot(data=t, y="config", x="speedup", hue="usecase", order=configs,
                hue_order=usecases, ax=ax, orient="h")
    bounds = {(r.config, r.usecase): interval_bounds(r.speedup_95)
              for r in t.itertuples(index=False)}
    ends = []
    for usecase, bars in zip(usecases, list(ax.containers), strict=True):
        for bar in bars:  # its row: its place on the y axis, and its colour's use case
            config = configs[round(bar.get_y() + bar.get_height() / 2)]
            ends.append(_whisker_and_value(ax, bar, bounds.get((config, usecase))))
    _room_for_labels(ax, ends)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    one_legend(fig)
    ax.set_xlabel("speedup against the sequential baseline (x, images/s ratio)")
    ax.set_ylabel("")
    fig.suptitle("Speedup per configuration (dashed: the baseline; whiskers: 95 % interval)")
    return fig


def _whisker_and_value(ax, bar, bounds: tuple[float, float] | None) -> float:
    """A bar's 95 % interval as a whisker and its value right of whichever ends later
    (written on the whisker, it could not be read); returns where that is."""
    y, end = bar.get_y() + bar.get_height() / 2, bar.get_width()
    if bounds:
        low, high = bounds
        ax.errorbar((low + high) / 2, y, xerr=(high - low) / 2, fmt="none", ecolor="black",
                    elinewidth=1, capsize=3, label="95 % interval")
        end = max(end, high)
    ax.annotate(f"{bar.get_width():.2f}", (end, y), xytext=(3, 0), textcoords="offset points",
                va="center", fontsize=8)
    return end


def plot_scaling(report: Report) -> Figure | None:
    t = only_main(report.table).dropna(subset=["speedup"])
    multi = t[t.backend != LOCAL]
    if multi.empty:
        return None
    points = []
    for r in multi.itertuples(index=False):
        line = f"{r.usecase}: {r.backend} x {r.strategy}"
        points.append({"line": line, "nodes": r.nodes, "speedup": r.speedup})
        one = t[(t.usecase == r.usecase) & (t.strategy == r.strategy) & (t.backend == LOCAL)]
        if len(one):
            points.append({"line": line, "nodes": 1, "speedup": one.speedup.max()})
    p = pd.DataFrame(points).drop_duplicates(["line", "nodes"])
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    sns.lineplot(data=p, x="nodes", y="speedup", hue="line", style="line", markers=True,
                 ax=ax)
    top = int(p.nodes.max())
    base = p[p.nodes == 1].speedup.max() if (p.nodes == 1).any() else 1.0
    ax.plot([1, top], [base, base * top], color="grey", linestyle="--", label="ideal (linear)")
    ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("nodes")
    ax.set_ylabel("speedup against sequential (x)")
    fig.suptitle("Scaling with the node count")
    one_legend(fig)
    return fig


def plot_accuracy(report: Report) -> Figure | None:
    """Per use case, the validation figure its target is of (accuracy, or the metric its
    use case chose: ``target_metric``) against wall time, the target a dashed line."""
    rows = []
    for r in _first_completed(report.runs).itertuples(index=False):
        wall, key = 0.0, TARGET_METRICS[report.metrics.get(r.usecase, "accuracy")]
        for e in report.by_id.get(r.run, {}).get("epochs", []):
            wall = e.get("elapsed_s", wall + e["epoch_time_s"])
            rows.append({"usecase": r.usecase, "config": r.config, "wall": wall,
                         "value": e.get(key)})
    if not rows:
        return None
    a = pd.DataFrame(rows)
    usecases, configs = list(dict.fromkeys(a.usecase)), list(dict.fromkeys(a.config))
    fig = Figure(figsize=(7 * len(usecases) + 3, 5), layout="constrained")
    axes = fig.subplots(1, len(usecases), squeeze=False)
    for ax, uc in zip(axes[0], usecases, strict=True):
        metric = report.metrics.get(uc, "accuracy")
        sns.lineplot(data=a[a.usecase == uc], x="wall", y="value", hue="config",
                     style="config", hue_order=configs, style_order=configs, markers=True,
                     ax=ax)
        targets = set(report.runs[report.runs.usecase == uc].target.dropna())
        if len(targets) == 1:  # the time to target is read where a line first crosses it
            ax.axhline(targets.pop(), color="grey", linestyle="--", linewidth=1,
                       label=f"target {metric}")
        ax.set_title(f"{uc}: validation {metric} against wall time")
        ax.set_xlabel("training + validation time (s)")
        ax.set_ylabel(f"validation {metric}")
        ax.set_ylim(0, 1)
    one_legend(fig)
    return fig


FIGURES = {"resources": plot_resources, "distributed": plot_distributed,
           "exchange": plot_exchange, "speedup": plot_speedup, "scaling": plot_scaling,
           "accuracy": plot_accuracy, "memory": plot_memory}


def make_figures(report: Report, out: Path) -> list[Path]:
    """Every figure that has data, as PNG and SVG in ``out``, each pipeline run's
    schedule timeline and each run's confusion matrix."""
    sns.set_theme(style="whitegrid", context="notebook")
    paths: list[Path] = []
    for name, plot in FIGURES.items():
        fig = plot(report)
        if fig is not None:
            paths += _save(fig, Path(out), name)
    for r in report.runs[report.runs.run.astype(bool)].itertuples(index=False):
        fig = plot_timeline(report.by_id.get(r.run, {}), f"{r.usecase}: {r.config}, the "
                            f"last step of run {r.run}\n(its first pipeline)")
        if fig is not None:
            paths += _save(fig, Path(out), f"timeline-{r.run}")
        fig = plot_confusion(report.by_id.get(r.run, {}), f"{r.usecase}: {r.config}, run {r.run}")
        if fig is not None:
            paths += _save(fig, Path(out), f"confusion-{r.run}")
    return paths
