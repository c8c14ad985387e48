"""The report's and predict's figures as matplotlib lays them out (Agg): no legend over
the data, one legend for a row of panels, the speedup bars' whiskers the table's 95 %
intervals, series that measure alike told apart by marker or line style, and the memory
figure's kills, hosts' limits and nodes that shared a host."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from test_findings import _manifest, _report, memory_block

from ddlstudy.cli import main
from ddlstudy.records.memory import GIB
from ddlstudy.records.runfolder import SAMPLES
from ddlstudy.report.figures import FIGURES, interval_bounds
from ddlstudy.report.memory import NODE
from ddlstudy.report.tables import interval, only_main, spread_of
from ddlstudy.tools.predict import REDUCERS, Cost, Node
from ddlstudy.tools.predict import figure as predict_figure

MPI = {"name": "mpi", "nodes": 2, "reduce": "allreduce"}
EXCHANGE = [{"rank": 0, "host": "a", "steps": 10, "compute_s": 8.0, "exchange_s": 9.0},
            {"rank": 1, "host": "b", "steps": 10, "compute_s": 9.0, "exchange_s": 8.5}]
"""Every bar long: no corner of the axes is free, so a legend inside them sits over a bar
or its value (what a user saw)."""


def _samples(hosts: list[str], cpu: float) -> pd.DataFrame:
    """Forty seconds of node samples a host (rank i on hosts[i]), the same for every run
    given the same ``cpu``: lines that coincide."""
    return pd.DataFrame([
        {"scope": "node", "time": 1000.0 + t / 2, "rank": rank, "host": host,
         "proc_cpu_percent": cpu + (t % 7), "proc_rss_bytes": 2**30, "proc_threads": 4,
         "sys_cpu_percent": cpu, "sys_iowait_percent": 1.0, "sys_ram_percent": 30.0}
        for rank, host in enumerate(hosts) for t in range(80)])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two use cases; u with two local configurations as fast as each other and two MPI
    ones alike too (equal lines in the scaling, accuracy and resources figures)."""
    runs = [_manifest("sequential", [20.0, 21.0, 19.0]),
            _manifest("cpu-intraop", [40.0, 43.0, 38.0], threads=2),
            _manifest("cpu-threads", [40.0, 43.0, 38.0], threads=2),
            _manifest("cpu-processes", [30.0, 34.0, 27.0], processes=2),
            _manifest("cpu-intraop", [70.0, 72.0, 66.0], threads=2, backend=MPI,
                      exchange=EXCHANGE, hosts=["a", "b"]),
            _manifest("cpu-threads", [70.0, 72.0, 66.0], threads=2, backend=MPI,
                      exchange=EXCHANGE, hosts=["a", "b"]),
            _manifest("sequential", [10.0, 11.0, 9.0], usecase="w"),
            _manifest("cpu-intraop", [25.0, 28.0, 21.0], usecase="w", threads=2)]
    for i, m in enumerate(runs):  # each recorded its memory (the memory figure's points)
        m["backend"]["memory"] = memory_block([(i + 1) * 2**28] * 2, ["a", "b"])
    report = _report(tmp_path_factory.mktemp("runs"), runs)
    for i, r in enumerate(report.runs.itertuples(index=False)):
        mpi = r.backend == "mpi"  # MPI configurations differ on their hosts' idle share
        _samples(["a", "b"] if mpi else ["h"], 40.0 + 10 * i * mpi).to_parquet(
            f"{r.path}/{SAMPLES}", index=False)
    return report


def _predict_result() -> dict:
    """``predict``'s result on two links, as ``predict`` builds it (the parameter server
    and the ring reduce cost alike: their lines coincide)."""
    node = Node("u", 100.0, 3200, 32, 1.0, 40_000_000, "r")
    links = {"measured": 8 / 1e9, "10gbit": 8 / 10e9}
    one = node.epoch_s(Cost(50e-6, links["measured"]), "allreduce", 1, 32)
    table = [{"link": link, "reduce": reducer, "batch": 32, "nodes": n, "overlap": overlap,
              "speedup": one / node.epoch_s(Cost(50e-6, beta), reducer, n, 32, overlap)}
             for link, beta in links.items() for reducer in REDUCERS
             for n in (1, 2, 4, 16, 64) for overlap in (False, True)]
    return {"node": node.__dict__, "table": table,
            "validation": [{"nodes": 2, "measured_images_per_s": 150.0}]}


def _drawn(fig):
    """``fig`` laid out by Agg, and its renderer (display coordinates are then final)."""
    assert fig is not None
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _figure(name, report):
    fig = predict_figure(_predict_result()) if name == "predict" else FIGURES[name](report)
    return fig, _drawn(fig)


ALL = [*FIGURES, "predict"]


def _legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def _data_boxes(fig, renderer) -> list[tuple[str, Bbox]]:
    """What a legend must not cover: each value label, each line's end point, each bar."""
    boxes = []
    for ax in fig.axes:
        boxes += [(f"label {t.get_text()!r}", t.get_window_extent(renderer)) for t in ax.texts]
        for line in ax.lines:
            if len(line.get_xdata()):
                x, y = ax.transData.transform((line.get_xdata()[-1], line.get_ydata()[-1]))
                boxes.append((f"end of {line.get_label()}", Bbox([[x - 3, y - 3],
                                                                  [x + 3, y + 3]])))
        boxes += [("bar", p.get_window_extent(renderer)) for p in ax.patches
                  if p.get_width() > 0 and p.get_height() > 0]
    return boxes


@pytest.mark.parametrize("name", ALL)
def test_no_legend_covers_a_label_a_line_end_or_a_bar(name, report):
    fig, renderer = _figure(name, report)
    boxes = _data_boxes(fig, renderer)
    assert boxes
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        covered = [what for what, data in boxes if box.overlaps(data)]
        assert not covered, f"{name}: the legend covers {covered}"
    for legend in _legends(fig):  # nor a title, an axis label or a tick's
        box = legend.get_window_extent(renderer)
        own = set(legend.findobj(Text))
        covered = [t.get_text() for t in fig.findobj(Text) if t not in own and t.get_text()
                   and t.get_visible() and box.overlaps(t.get_window_extent(renderer))]
        assert not covered, f"{name}: the legend covers {covered}"
    for ax in fig.axes:  # a label that hangs out of its axes runs into the legend beside it
        for text in ax.texts:
            assert ax.bbox.contains(*text.get_window_extent(renderer).p1), text.get_text()


@pytest.mark.parametrize("name", ALL)
def test_each_row_of_panels_has_one_legend_beside_them(name, report):
    fig, renderer = _figure(name, report)
    assert [ax for ax in fig.axes if ax.get_legend()] == []  # none a panel
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.bbox) for ax in fig.axes)
    rows = {ax.get_subplotspec().rowspan.start for ax in fig.axes}
    columns = {ax.get_subplotspec().colspan.start for ax in fig.axes}
    if name in ("resources", "accuracy", "memory", "predict"):  # a row of panels
        assert len(columns) == 2, name
    assert len(fig.axes) == len(rows) * len(columns)


def test_the_speedup_bars_carry_the_tables_95_percent_intervals(report):
    fig, renderer = _figure("speedup", report)
    ax = fig.axes[0]
    table = only_main(report.table).dropna(subset=["speedup"])
    configs = [t.get_text() for t in ax.get_yticklabels()]
    usecases = list(dict.fromkeys(table.usecase))
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    whiskers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    rows = table.set_index(["config", "usecase"])
    assert len(whiskers) == sum(len(b) for b in bars) == len(table) == 8
    centre = {}
    for usecase, container in zip(usecases, bars, strict=True):
        for bar in container:
            y = bar.get_y() + bar.get_height() / 2
            centre[y] = (configs[round(y)], usecase)
            assert bar.get_width() == pytest.approx(rows.speedup[centre[y]])
    for whisker in whiskers:
        ((low, y), (high, y_end)), = whisker.lines[2][0].get_segments()
        row = rows.loc[centre[y]]
        assert y == y_end and (low, high) == pytest.approx(interval_bounds(row.speedup_95))
        # The printed interval is the bootstrap's, to its printed digits.
        runs = report.runs[(report.runs.usecase == centre[y][1]) & (report.runs.config
                                                                     == centre[y][0])]
        base = report.runs[(report.runs.usecase == centre[y][1])
                           & (report.runs.strategy == "sequential")
                           & (report.runs.backend == "local")]
        exact = interval(spread_of(runs), spread_of(base))
        assert (low, high) == pytest.approx(exact, abs=0.006)
        # Its value is written right of the whisker, not on it.
        (label,) = [t for t in ax.texts if abs(t.xy[1] - y) < 1e-9]
        assert label.get_text() == f"{row.speedup:.2f}"
        assert label.get_window_extent(renderer).x0 >= ax.transData.transform((high, y))[0]


@pytest.mark.parametrize("name", ["resources", "distributed", "scaling", "accuracy",
                                  "predict"])
def test_series_with_equal_values_are_told_apart(name, report):
    fig, _ = _figure(name, report)
    alike = 0
    for ax in fig.axes:
        lines = [line for line in ax.lines if len(line.get_xdata())]
        by_data = itertools.groupby(sorted(lines, key=_values), key=_values)
        for _, group in by_data:
            group = list(group)
            alike += len(group) > 1
            looks = {(line.get_marker(), line.get_linestyle()) for line in group}
            assert len(looks) == len(group), f"{name}: {len(group)} lines drawn as one"
    assert alike, f"{name}: the synthetic data were to draw equal lines"
    handles = [h for h in fig.legends[0].legend_handles
               if isinstance(h, Line2D) and h.get_marker() not in ("None", "", None)]
    markers = [str(h.get_marker()) for h in handles]
    assert len(set(markers)) == len(markers) >= 2  # the legend tells them apart too


def _values(line) -> tuple:
    return tuple(round(float(v), 6) for v in [*line.get_xdata(), *line.get_ydata()])


def test_predict_names_the_reducers_drawn_on_top_of_each_other():
    fig, _ = _figure("predict", None)
    title = fig.legends[0].get_title().get_text()
    assert title == "drawn on top of each other: parameter-server, ring-reduce"


def test_the_memory_figure_shows_the_kills_the_hosts_limit_and_shared_hosts(tmp_path, capsys):
    """Hosts of 2.75 GiB (``hosts up --memory``): a configuration the kernel killed for
    memory is a cross at the limit, the limit a line; MPI nodes that shared one host say so."""
    limit = int(2.75 * GIB)
    fits = _manifest("sequential", [20.0, 21.0], memory=memory_block([GIB]))
    fits["backend"]["memory"]["hosts"] = {
        "a": {"limit_bytes": limit, "peak_charged_bytes": GIB, "oom_kills": 0}}
    shared = _manifest("sequential", [30.0, 31.0], backend=MPI, hosts=["h", "h"],
                       memory=memory_block([GIB, GIB], ["h", "h"]))
    dead = _manifest("cpu-processes", [1.0], processes=2, backend=MPI, hosts=["a", "b"],
                     memory={"hosts": {h: {"limit_bytes": limit, "peak_charged_bytes": limit,
                                           "oom_kills": int(h == "a")} for h in "ab"}})
    dead |= {"status": "failed", "epochs": [], "error": "MPI rank 0 on host a was killed by "
             "the kernel for memory: the host has 2.75 GiB"}
    report = _report(tmp_path / "runs", [fits, shared, dead])
    fig, _ = _figure("memory", report)
    (ax,) = fig.axes
    (line,) = [line for line in ax.lines if line.get_label().startswith("host's limit")]
    assert line.get_label() == "host's limit (2.75 GiB)"
    assert list(line.get_xdata()) == pytest.approx([2.75, 2.75])
    (cross,) = [c for c in ax.collections if "killed for memory" in c.get_label()]
    assert cross.get_label() == "mpi 2 nodes, allreduce: cpu-processes (2 processes): killed " \
        "for memory (1 of 1 runs)"
    assert cross.get_offsets().tolist() == [pytest.approx([2.75, 0.0])]
    labels = fig.legends[0].get_texts()
    assert "mpi 2 nodes, allreduce: sequential\n(2 nodes on one host: a node is its share)" \
        in [t.get_text() for t in labels]
    assert [t.get_text() for t in fig.texts] == [NODE]  # what a node's figure is, in words
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    page = (tmp_path / "out" / "index.html").read_text()
    assert "killed for memory: mpi 2 nodes, allreduce: cpu-processes (2 processes), 1 of 1 " \
        "runs at the host&#x27;s limit of 2.75 GiB" in page
    assert "1 failed (1 killed for memory)" in (tmp_path / "out" / "speedup.md").read_text()
