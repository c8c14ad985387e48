"""A strategy and a backend of one's own (tests/plugin/ddlstudy_example.py, which
docs/extending.md shows), installed as a plugin through entry points, through the real command
line: listed, run locally, in MPI nodes and Spark tasks, studied, reported and advised."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ddlstudy.config import REPO_ROOT
from ddlstudy.records.runfolder import MANIFEST

PLUGIN = Path(__file__).parent / "plugin"
QUICK = ("--usecase", "tiny", "--epochs", "2", "--max-steps", "4", "--no-snapshot",
         "--sample-hz", "0")


def entry_points(extra: str = "") -> str:
    """The plugin's entry points as an installed package lists them (entry_points.txt),
    from its pyproject.toml, with ``extra`` lines in the strategies group."""
    groups = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    text = ""
    for group, points in groups.items():
        text += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
        if group == "ddlstudy.strategies":
            text += extra
        text += "\n"
    return text


def install(folder: Path, extra: str = "") -> Path:
    """The plugin installed into ``folder`` as pip would leave it: its module and its
    dist-info (metadata and entry points)."""
    shutil.copy(PLUGIN / "ddlstudy_example.py", folder)
    info = folder / "ddlstudy_example-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddlstudy-example\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(entry_points(extra))
    return folder


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("site"))


def cli(site: Path, *args: str, python: str = sys.executable, timeout: int = 600,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([python, "-m", "ddlstudy", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def manifest_in(runs: Path) -> dict:
    (path,) = runs.glob(f"*/{MANIFEST}")
    return json.loads(path.read_text())


def losses(m: dict) -> list[float]:
    return [e["train_loss"] for e in m["epochs"]]


def test_a_plugin_is_listed_with_ddlstudys_own(plugin):
    strategies = cli(plugin, "strategies")
    assert strategies.returncode == 0, strategies.stderr
    names = [line.split()[0] for line in strategies.stdout.splitlines() if line[:1] != " "]
    assert names[0] == "sequential" and names[-1] == "cpu-loaders" and len(names) == 11
    backends = cli(plugin, "backends")
    assert [line.split()[0] for line in backends.stdout.splitlines()] == [
        "local", "mpi", "spark", "local-nodes"]


def test_a_broken_plugin_is_named_in_one_warning_and_the_rest_works(tmp_path):
    site = install(tmp_path, extra="broken = no_such_module:Nothing\n")
    out = cli(site, "strategies")
    assert out.returncode == 0
    warnings = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and "broken = no_such_module:Nothing" in warnings[0]
    assert "ModuleNotFoundError" in warnings[0] and "left out" in warnings[0]
    assert "cpu-loaders" in out.stdout and "sequential" in out.stdout


STUDY = """[study]
usecases = ["tiny"]
repeat = 1
runs_dir = "{runs}"
[settings]
epochs = 2
max_steps = 4
max_val_steps = 1
no_snapshot = true
sample_hz = 0
datasets_dir = "{data}"
[[cells]]
strategy = "cpu-loaders"
[[cells]]
backend = "local-nodes"
nodes = 2
"""


@pytest.fixture(scope="module")
def studied(plugin, tmp_path_factory, datasets_dir) -> dict[str, dict]:
    """One study, with QUICK's settings, of the plugin's strategy (a local run), its
    backend (two local-nodes of sequential) and the baseline, made once for the module:
    the tests below read its runs (each run's manifest by its cell's label) instead of
    training their own."""
    root = tmp_path_factory.mktemp("studied")
    plan = root / "plan.toml"
    plan.write_text(STUDY.format(runs=root / "study", data=datasets_dir))
    study = cli(plugin, "study", str(plan), "--quiet")
    assert study.returncode == 0, study.stderr[-2000:]
    cells = json.loads((root / "study" / "study.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["completed"] * 3, cells
    return {"folder": root / "study"} | {
        c["label"]: json.loads((root / "study" / c["run"] / MANIFEST).read_text())
        for c in cells}


def _trained(m: dict, backend: str) -> None:
    """A cpu-loaders run of QUICK that ``backend`` ran."""
    assert m["status"] == "completed" and m["strategy"]["name"] == "cpu-loaders"
    assert m["strategy"]["loader_workers"] == m["strategy"]["threads_per_process"] == 1
    assert m["backend"]["name"] == backend
    assert m["effective"]["data_parallel_workers"] == (1 if backend == "local" else 2)
    assert losses(m)[-1] < losses(m)[0] or backend != "local"  # 8 steps: it learns
    assert m["epochs"][-1]["train_images"] == 4 * 16


@pytest.mark.slow
def test_a_plugin_strategy_trains_locally_in_mpi_nodes_and_in_spark_tasks(plugin, tmp_path,
                                                                            datasets_dir,
                                                                            studied):
    """Locally: the study's cell; in MPI nodes and Spark tasks: a run of its own."""
    _trained(studied["cpu-loaders (1 threads)"], "local")
    data = ("--datasets-dir", str(datasets_dir))
    for backend in ("mpi", "spark"):
        if backend == "spark" and shutil.which("java") is None:
            continue
        runs = tmp_path / backend
        out = cli(plugin, "run", *QUICK, *data, "--strategy", "cpu-loaders", "--backend",
                  backend, "--nodes", "2", "--runs-dir", str(runs))
        assert out.returncode == 0, out.stderr[-2000:]
        _trained(manifest_in(runs), backend)


@pytest.mark.slow
def test_a_plugin_backend_runs_the_strategys_worker(plugin, tmp_path, datasets_dir, studied):
    """Two local-nodes of sequential (the study's cell) are two processes in one group,
    each the baseline's worker on its slice: what cpu-processes computes, to the bit."""
    data = ("--datasets-dir", str(datasets_dir))
    local = cli(plugin, "run", *QUICK, *data, "--max-val-steps", "1", "--strategy",
                "cpu-processes", "--workers", "2", "--runs-dir", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-2000:]
    mine, theirs = studied["local-nodes 2 nodes: sequential"], manifest_in(tmp_path / "local")
    assert mine["backend"] == {"name": "local-nodes", "nodes": 2, **{
        k: v for k, v in mine["backend"].items() if k not in ("name", "nodes")}}
    assert mine["effective"]["data_parallel_workers"] == 2
    assert len(losses(mine)) == 2 and losses(mine) == losses(theirs)
    refused = cli(plugin, "run", *QUICK, *data, "--backend", "local-nodes", "--strategy",
                  "pipeline", "--stages", "2", "--runs-dir", str(tmp_path / "no"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "a local-nodes node is one process, and a pipeline node runs several" in \
        refused.stderr
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_a_plugin_is_studied_reported_and_advised(plugin, tmp_path, datasets_dir, studied):
    report = cli(plugin, "report", str(studied["folder"]))
    assert report.returncode == 0, report.stderr[-2000:]
    def table(n: int) -> str:  # its rows: from its title's line to the next title
        return report.stdout.split(f"**Table {n}")[1].split("\n", 1)[1].split("\n**")[0]

    table_1, table_3 = table(1), table(3)
    assert "| cpu-loaders (1 threads) |" in table_1
    assert "| local-nodes 2 nodes: sequential |" in table_3
    out = tmp_path / "advise"
    advice = cli(plugin, "advise", "--usecase", "tiny", "--nodes", "1", "--rounds", "1",
                 "--probe-seconds", "0.5", "--budget", "10m", "--strategies", "cpu-loaders",
                 "--datasets-dir", str(datasets_dir), "--out", str(out), "--quiet")
    assert advice.returncode == 0, advice.stderr[-2000:]
    probed = {c["label"]: c for c in json.loads((out / "advise.json").read_text())["probes"]}
    assert probed["cpu-loaders"]["images_per_s"][0] > 0
    assert probed["sequential"]["images_per_s"][0] > 0  # the baseline, always
    # the others were not asked for: named, never run
    others = [c for label, c in probed.items() if label not in ("cpu-loaders", "sequential")]
    assert others and all("images_per_s" not in c for c in others)
    processes = next(c for c in others if c["flags"].get("strategy") == "cpu-processes")
    assert "cpu-processes is not among --strategies cpu-loaders" in processes["skipped"]


@pytest.mark.slow
def test_a_plugin_installed_by_pip_into_a_venv_of_its_own(tmp_path, datasets_dir):
    """The plugin as a real package: pip installs it into a new virtual environment (which
    sees this one's packages, ddlstudy, torch and pip itself, through a .pth file)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]  # pip and setuptools too
    (site / "ddlstudy-venv.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n"
                                                    for p in ours))
    source = shutil.copytree(PLUGIN, tmp_path / "plugin")
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--no-deps", "--no-build-isolation", "--no-index", str(source)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    python = str(venv / "bin" / "python")
    listed = cli(tmp_path / "none", "strategies", python=python, cwd=REPO_ROOT)
    assert "cpu-loaders" in listed.stdout, listed.stderr[-2000:]
    runs = tmp_path / "runs"
    out = cli(tmp_path / "none", "run", *QUICK, "--datasets-dir", str(datasets_dir),
              "--strategy", "cpu-loaders", "--backend", "local-nodes", "--nodes", "2",
              "--runs-dir", str(runs), python=python)
    assert out.returncode == 0, out.stderr[-2000:]
    m = manifest_in(runs)
    assert (m["strategy"]["name"], m["backend"]["name"], m["status"]) == (
        "cpu-loaders", "local-nodes", "completed")


def test_a_plugin_cannot_take_a_name_already_taken(caplog):
    """A plugin's strategy named like one of ddlstudy's is left out, named in a warning;
    ddlstudy's keeps its name."""
    from ddlstudy.registry import Registry
    from ddlstudy.strategies import REGISTRY

    class Shadow:
        name = "sequential"

    class Point:
        name, value = "sequential", "someones:Shadow"

        def load(self):
            return Shadow

    mine = Registry("--strategy", "strategy")
    mine.update(REGISTRY)
    mine._load(Point())
    assert mine["sequential"] is REGISTRY["sequential"]
    assert "'sequential' is another strategy's name already" in caplog.text
