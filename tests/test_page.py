"""The study as one page (report/index.html), tested on the report of a real study of
several strategies and backends (local and MPI), in a real browser: Debian's chromium,
driven by Playwright's Python package with the system browser (never a browser of its
own). Without chromium, or without Playwright, the browser tests skip and say why.

The study's use case chose macro-F1 as its target metric: every place that shows the
target (the printed table, speedup.md, the page, the figure) names it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import statistics
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest

from ddlstudy.cli import main
from ddlstudy.records.memory import GIB
from ddlstudy.report import Report
from ddlstudy.report.figures import plot_accuracy

PLAN = """
[study]
name = "page"
usecases = ["tiny"]
repeat = 1

[settings]
epochs = 2
max_steps = 4
datasets_dir = "{datasets}"
sample_hz = 5
no_snapshot = true
target_metric = "macro_f1"
target_accuracy = 0.2

[[cells]]
strategy = "cpu-processes"
workers = 2

[[cells]]
strategy = "pipeline"
stages = 2
micro_batches = 2

[[cells]]
strategy = "sequential"
backend = "mpi"
nodes = 2
"""

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
"""What the system's chromium needs as root in a container, and nothing it may fetch."""
WIDTH = 1280


@pytest.fixture(scope="module")
def study(tmp_path_factory, datasets_dir) -> tuple[Path, str]:
    """A real study through the command line: the baseline (added), cpu-processes, the
    pipeline and 2 MPI nodes on tiny, 2 epochs of 4 steps, macro-F1 as the target metric;
    its runs folder and what it printed."""
    root = tmp_path_factory.mktemp("page")
    plan = root / "plan.toml"
    plan.write_text(PLAN.format(datasets=datasets_dir))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["study", str(plan), "--runs-dir", str(root / "runs")])
    assert code == 0, out.getvalue()[-3000:]
    return root / "runs", out.getvalue()


def test_the_study_writes_one_page_that_needs_nothing_else(study):
    runs, _ = study
    page = (runs / "report" / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script src" not in page
    assert "http://" not in page.replace("http://www.w3.org/", "") and "https://" not in page
    assert "<link" not in page and "<img" not in page and "@import" not in page
    for section in ("answer", "summary", "findings", "figures", "runs"):
        assert f'id="{section}"' in page
    for name in ("speedup", "memory", "accuracy", "resources", "exchange"):
        assert f'id="fig-{name}"' in page  # drawn by the report, inline
    report = Report(runs)
    for run in report.runs.run:
        assert f'id="run-{run}"' in page and f'id="fig-confusion-{run}"' in page
    (pipeline,) = report.runs[report.runs.strategy == "pipeline"].run
    assert f'id="fig-timeline-{pipeline}"' in page  # folded under its run


def test_every_place_that_shows_the_target_names_its_metric(study):
    runs, printed = study
    report = Report(runs)
    assert report.metrics == {"tiny": "macro_f1"}
    summary = printed[:printed.index("**Table 1")]
    assert "*tiny* (target: macro_f1 0.20)" in summary
    assert "| macro_f1 |" in summary and "accuracy" not in summary
    speedup = (runs / "report" / "speedup.md").read_text()
    assert "time to macro_f1 0.20" in speedup and "accuracy" not in speedup
    page = (runs / "report" / "index.html").read_text()
    assert "Validation macro_f1 against wall time" in page
    assert page.count(">macro_f1 0.20: ") == (report.table.reached != "").sum() > 0
    ax = plot_accuracy(report).axes[0]
    assert ax.get_ylabel() == "validation macro_f1"
    assert "target macro_f1" in ax.get_legend_handles_labels()[1]
    tta = report.table.time_to_target_s.dropna()
    if len(tta):  # on a busy host no quiet run may have reached it: then said so
        assert "time to macro_f1 0.20:" in page


CHECK = {"criterion": "images/s", "noisy_left_out": 1, "figure": "advice-check.svg",
         "rows": [{"rank": 1, "label": "cpu-processes (2 processes)", "predicted": 33.6,
                   "measured": 30.0, "error": 0.12, "runs": 2,
                   "predicted_node_bytes": int(2.46 * GIB), "measured_node_bytes": None,
                   "node_error": None},
                  {"rank": 2, "label": "sequential", "predicted": 18.4, "measured": 20.0,
                   "error": -0.08, "runs": 2, "busy": True}],
         "summary": {"rows": 2, "mape": 0.1, "spearman": 1.0, "first_measured_rank": 1,
                     "node_memory_mape": None, "confirmed": True}}
"""An advice check as the study writes it before its report (any key may be null)."""


def test_the_page_and_speedup_md_open_with_the_advice_check(tmp_path, capsys):
    from matplotlib.figure import Figure
    from test_findings import _manifest, _report

    runs = _report(tmp_path / "runs", [_manifest("sequential", [20.0, 19.0]),
                                       _manifest("cpu-processes", [30.0, 31.0], processes=2)])
    out = tmp_path / "out"
    out.mkdir()
    (out / "advice-check.json").write_text(json.dumps(CHECK))
    Figure(figsize=(2, 2)).savefig(out / "advice-check.svg")
    assert main(["report", str(runs.runs_dir), "--out", str(out), "--no-figures"]) == 0
    capsys.readouterr()
    page = (out / "index.html").read_text()
    assert page.index('id="advice"') < page.index('id="answer"') < page.index('id="summary"')
    advice = page[page.index('id="advice"'):page.index('id="answer"')]
    for said in ("2 of its configurations measured, on images/s",
                 "mean absolute error 10 %; rank correlation 1.00 (Spearman); its first "
                 "choice measured #1", "Confirmed: its first choice measured within 10 %",
                 "1 run(s) marked noisy (other processes used their host) were left out",
                 "<td>+12 %</td>", "<td>-8 %</td>", "<td>2.46</td>", "<th>busy host</th>",
                 "<td>yes</td>", 'id="fig-advice-check"'):
        assert said in advice, said
    assert "node_error" not in advice and "a node&#x27;s memory" not in advice  # all null
    assert "No figures" in page  # --no-figures: the page says so
    speedup = (out / "speedup.md").read_text()
    assert speedup.startswith("The study checked an advice: 2 of its configurations measured")
    assert "| cpu-processes (2 processes) | 1 ok | 1.56 | 1.50-1.63 | 30.5 |" in speedup
    assert "- fastest: cpu-processes (2 processes), 1.56x the sequential baseline (95 % " \
        "interval 1.50-1.63), 30.5 images/s\n- time to accuracy 0.60: no configuration " \
        "reached it in every run\n" in speedup  # the answer (no memory recorded: no leanest)
    # A check with only some keys: what is there is shown.
    (out / "advice-check.json").write_text(json.dumps({"rows": [], "criterion": None}))
    assert main(["report", str(runs.runs_dir), "--out", str(out), "--no-figures"]) == 0
    assert "0 of its configurations measured" in (out / "index.html").read_text()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless chromium for the module (a fresh profile), through Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the browser tests need Playwright's Python package: pip install "
                    "'ddlstudy[dev]' (it drives the system's chromium; no browser download)")
    exe = _chromium()
    if exe is None:
        pytest.skip("the browser tests need Debian's chromium: apt-get install chromium "
                    "(.ci/run installs it as root)")
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=exe,
            headless=True, args=CHROMIUM_FLAGS, viewport={"width": WIDTH, "height": 900})
        yield context
        context.close()


class Opened:
    """The page opened in a tab, with every request it made and every error it logged."""

    def __init__(self, context, path: Path):
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.tab = context.new_page()
        self.tab.on("request", lambda r: self.requests.append(r.url))
        self.tab.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))
        self.tab.goto(path.absolute().as_uri())
        self.tab.wait_for_load_state("load")

    def rows(self) -> list[dict]:
        """The summary's rows as shown: filters' attributes, cells' text and values."""
        return self.tab.evaluate("""() => Array.from(
            document.querySelectorAll('#configurations tbody tr')).map(tr => ({
              hidden: tr.hidden, backend: tr.dataset.backend, strategy: tr.dataset.strategy,
              usecase: tr.dataset.usecase,
              cells: Array.from(tr.cells).map(td => td.textContent.trim()),
              values: Array.from(tr.cells).map(td => td.getAttribute('data-value'))}))""")

    def column(self, header: str) -> int:
        return self.tab.evaluate("""h => Array.from(
            document.querySelectorAll('#configurations thead th')).findIndex(
              th => th.textContent.trim() === h)""", header)


@pytest.fixture
def opened(browser, study):
    runs, _ = study
    page = Opened(browser, runs / "report" / "index.html")
    yield page
    page.tab.close()


def test_the_page_asks_nothing_of_the_network_and_logs_no_error(opened):
    opened.tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    opened.tab.check("#show-full")
    opened.tab.wait_for_timeout(200)
    assert opened.requests and all(u.startswith("file://") for u in opened.requests), \
        opened.requests
    assert opened.errors == []


def test_every_figure_is_drawn(opened):
    sizes = opened.tab.evaluate("""() => {
        document.querySelectorAll('details').forEach(d => d.open = true);
        return Array.from(document.querySelectorAll('figure svg')).map(s => {
          const r = s.getBoundingClientRect(); return [s.closest('figure').id, r.width,
                                                       r.height]; }); }""")
    assert len(sizes) >= 10
    assert [s for s in sizes if s[1] < 50 or s[2] < 50] == []


def test_the_summary_gives_runs_csvs_numbers(opened, study):
    runs, _ = study
    csv = pd.read_csv(runs / "report" / "runs.csv")
    done = csv[csv.status == "completed"]
    rows = opened.rows()
    columns = {h: opened.column(h) for h in ("configuration", "images/s", "speedup",
                                             "node GiB", "process GiB")}
    assert -1 not in columns.values() and len(rows) == csv.config.nunique()
    for row in rows:
        mine = done[done.config == row["cells"][columns["configuration"]]]
        counted = mine[~mine.noisy] if (~mine.noisy).any() else mine  # as the report shows
        expect = {"images/s": statistics.median(counted.images_per_s),
                  "speedup": statistics.median(counted.speedup),
                  "node GiB": statistics.median(counted.peak_node_bytes) / GIB,
                  "process GiB": statistics.median(counted.peak_process_bytes) / GIB}
        for header, value in expect.items():
            assert float(row["values"][columns[header]]) == pytest.approx(value, rel=1e-9), \
                (row["cells"][columns["configuration"]], header)


def test_sorting_by_speedup_orders_the_rows_and_filters_hide_and_show_them(opened):
    at = opened.column("speedup")
    button = opened.tab.locator("#configurations thead th").nth(at).locator("button")
    for order in ("descending", "ascending"):
        button.click()
        values = [float(r["values"][at]) for r in opened.rows() if r["values"][at]]
        assert values == sorted(values, reverse=order == "descending") and len(values) >= 4
    every = opened.rows()
    opened.tab.select_option("select[data-filter=backend]", "mpi")
    shown = [r for r in opened.rows() if not r["hidden"]]
    assert shown and {r["backend"] for r in shown} == {"mpi"}
    assert len(shown) == sum(r["backend"] == "mpi" for r in every) < len(every)
    assert opened.tab.text_content("#shown") == f"{len(shown)} of {len(every)}"
    opened.tab.select_option("select[data-filter=backend]", "")
    opened.tab.select_option("select[data-filter=strategy]", "pipeline")
    assert {r["strategy"] for r in opened.rows() if not r["hidden"]} == {"pipeline"}
    opened.tab.select_option("select[data-filter=strategy]", "")
    assert not any(r["hidden"] for r in opened.rows())


def test_every_run_link_opens_its_manifest(opened, study):
    runs, _ = study
    links = opened.tab.eval_on_selector_all("a.run-id, a.run-link", "as => as.map(a => a.href)")
    report = Report(runs)
    ids = set(report.runs.run) - {""}
    assert len(links) == 2 * len(ids)  # in the summary and in the runs section
    files = {Path(unquote(urlparse(link).path)) for link in links}
    assert all(f.is_file() and f.name == "manifest.json" for f in files)
    assert {f.parent.name for f in files} == ids
    opened.tab.goto(links[0])
    shown = json.loads(opened.tab.text_content("body"))
    assert shown["id"] == Path(unquote(urlparse(links[0]).path)).parent.name


def test_the_page_fits_1280_px_and_prints(opened):
    opened.tab.check("#show-full")
    wide = opened.tab.evaluate("""() => {
        document.querySelectorAll('details').forEach(d => d.open = true);
        return [document.documentElement.scrollWidth, Math.max(...Array.from(
          document.querySelectorAll('main *')).map(e => e.closest('.scroll') ? 0 :
            e.getBoundingClientRect().right))]; }""")
    assert max(wide) <= WIDTH, wide
    opened.tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = false)")
    opened.tab.emulate_media(media="print")  # closed runs unfold on paper
    hidden = opened.tab.evaluate("""() => Array.from(document.querySelectorAll(
        'details figure svg')).filter(s => s.getBoundingClientRect().height < 50).length""")
    assert hidden == 0
    pdf = opened.tab.pdf(format="A4")
    assert pdf.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page[^s]", pdf)) >= 2


def shoot(html: Path, png: Path, height: int = 1500) -> None:
    """A screenshot of the top of the page ``html`` as this module's browser shows it
    (docs/img/'s pictures of the page): ``python -c "import sys; sys.path.insert(0,
    'tests'); from test_page import shoot; shoot(...)"``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=_chromium(), headless=True,
                                         args=CHROMIUM_FLAGS)
        tab = browser.new_page(viewport={"width": WIDTH, "height": height})
        tab.goto(Path(html).absolute().as_uri())
        tab.screenshot(path=str(png))
        browser.close()

