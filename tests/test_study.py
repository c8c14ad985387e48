"""The study runner, its report (tables, figures), the notebook, replay and compare."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddlstudy.cli import main
from ddlstudy.config import REPO_ROOT
from ddlstudy.report import Report, to_latex
from ddlstudy.study.matrix import expand, load_plan

PLAN = """
[study]
name = "t"
usecases = ["tiny"]
repeat = 1

[settings]
epochs = 1
max_steps = 3
datasets_dir = "{datasets}"
sample_hz = 20

[[cells]]
strategy = "cpu-intraop"
workers = 2

[[cells]]
strategy = "gpu-data"

[[cells]]
strategy = "sequential"
data_dir = "{broken}"
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, datasets_dir):
    """One real study: the baseline (added by the runner), cpu-intraop, a GPU cell this
    machine skips and a cell whose data folder has a wrong class name (it fails). Run by
    ``ddlstudy study`` in this process (each cell is a process of its own): its exit code
    and what it printed."""
    root = tmp_path_factory.mktemp("study")
    broken = root / "broken"
    for name in ("fire", "smoke", "Nofire"):
        (broken / name).mkdir(parents=True)
    plan = root / "plan.toml"
    plan.write_text(PLAN.format(datasets=datasets_dir, broken=broken))
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["study", str(plan), "--runs-dir", str(root / "runs")])
    out = SimpleNamespace(returncode=code, stdout=stdout.getvalue(), stderr=stderr.getvalue())
    return plan, root / "runs", out


def test_a_study_runs_every_cell_and_records_each_outcome(study_dir):
    plan, runs, out = study_dir
    assert out.returncode == 1, out.stderr  # one cell failed: the study says so at the end
    study = json.loads((runs / "study.json").read_text())
    by_strategy = {(c["strategy"], bool(c["flags"].get("data_dir"))): c for c in study["cells"]}
    assert by_strategy[("sequential", False)]["status"] == "completed"  # the added baseline
    assert by_strategy[("cpu-intraop", False)]["status"] == "completed"
    gpu = by_strategy[("gpu-data", False)]
    assert gpu["status"] == "skipped" and "needs CUDA GPUs" in gpu["reason"]
    failed = by_strategy[("sequential", True)]
    assert failed["status"] == "failed" and "Nofire" in failed["reason"]
    manifests = [json.loads(p.read_text()) for p in runs.glob("*/manifest.json")]
    assert sorted(m["strategy"]["name"] for m in manifests) == ["cpu-intraop", "sequential"]
    assert all(m["study"]["name"] == "t" and m["status"] == "completed" for m in manifests)
    # The printed tables show the skipped and the failed cell, not just the good ones.
    assert "skipped: gpu-data needs CUDA GPUs" in out.stdout
    assert "1 failed" in out.stdout
    assert "Table 1: data parallelism" in out.stdout


def test_the_study_writes_tables_and_figures(study_dir):
    _, runs, _ = study_dir
    report = runs / "report"
    for name in ("speedup.md", "table1.md", "runs.csv"):
        assert (report / name).stat().st_size > 100
    for name in ("resources", "accuracy"):
        for ext in ("png", "svg"):
            assert (report / "figures" / f"{name}.{ext}").stat().st_size > 5000
    assert not (report / "figures" / "scaling.png").exists()  # no multi-node run to show
    # Runs that other processes disturbed are left out of speedups (the bars too): on a
    # busy machine there may be none to draw.
    speedups = Report(runs).table.speedup.notna().any()
    assert (report / "figures" / "speedup.png").is_file() == speedups
    table = Report(runs, include_noisy=True).table.set_index("strategy")
    assert table.loc["sequential", "speedup"] == pytest.approx(1.0)
    intraop = table.loc["cpu-intraop"]
    assert intraop["cores"] == 2 and intraop["efficiency"] == pytest.approx(
        intraop["speedup"] / 2)


def test_resume_reuses_finished_cells_and_retries_failed_ones(study_dir, capsys):
    """In this process (each cell runs in a process of its own either way)."""
    plan, runs, _ = study_dir
    before = sorted(p.name for p in runs.iterdir())
    assert main(["study", str(plan), "--runs-dir", str(runs)]) == 2
    assert "--resume" in capsys.readouterr().err  # nothing overwritten
    assert sorted(p.name for p in runs.iterdir()) == before
    # the broken cell was tried again and failed again
    assert main(["study", str(plan), "--runs-dir", str(runs), "--resume"]) == 1
    study = json.loads((runs / "study.json").read_text())
    statuses = sorted(c["status"] for c in study["cells"])
    assert statuses == ["failed", "reused", "reused", "skipped"]
    assert len(list(runs.glob("*/manifest.json"))) == 2  # no new runs


def test_a_changed_setting_is_not_taken_for_a_finished_cell(study_dir):
    plan_path, runs, _ = study_dir
    plan = load_plan(plan_path, runs_dir=runs)
    same = {c.id for c in expand(plan, {})}
    other = {c.id for c in expand(plan, {"max_steps": 4})}
    assert len(same) == 4 and not same & other


def test_the_notebook_runs_on_a_study(study_dir, tmp_path):
    """Executed headless as `make notebook-run` does (jupyter nbconvert --execute)."""
    import nbformat

    _, runs, _ = study_dir
    jupyter = Path(sys.executable).with_name("jupyter")
    done = subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute",
                           str(REPO_ROOT / "analysis" / "study.ipynb"), "--output-dir",
                           str(tmp_path)], env=os.environ | {"DDLSTUDY_RUNS": str(runs)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]  # a failing cell fails nbconvert
    nb = nbformat.read(tmp_path / "study.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert "2 runs in" in outputs[0]["text"]
    html = " ".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "cpu-intraop (2 threads)" in html and "skipped" in html
    speedups = Report(runs).table.speedup.notna().any()  # none if every run was disturbed
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2 + speedups


@pytest.mark.parametrize("plan, message", [
    ("[study]\nusecases = ['tiny']\n", "at least one [[cells]]"),
    ("[study]\nusecases = ['tiny']\n[[cells]]\nstrategy = 'nope'\n", "unknown strategy 'nope'"),
    ("[study]\nusecases = ['tiny']\n[[cells]]\nstrategy = 'sequential'\nwokers = 2\n",
     "wokers: unknown key"),
    ("[study]\nusecases = ['nope']\n[[cells]]\nstrategy = 'sequential'\n",
     "unknown use case 'nope'"),
    ("[study]\nusecases = ['tiny']\n[[cells]]\nstrategy = 'cpu-processes'\nworkers = 0\n",
     "--workers: must be a positive"),
    ("[study\n", "is not valid TOML"),
    ("[study]\nusecases = []\n[[cells]]\nstrategy = 'sequential'\n", "at least one use case"),
    ("[study]\nusecases = ['tiny']\n[settings.tinny]\nmax_steps = 2\n[[cells]]\n"
     "strategy = 'sequential'\n", "[settings.tinny]: 'tinny' is not one of this plan's use"),
    ("[study]\nusecases = ['tiny']\n[settings.tiny]\nmax_step = 2\n[[cells]]\n"
     "strategy = 'sequential'\n", "[settings.tiny].max_step: unknown key"),
    ("[study]\nusecases = ['tiny']\ncells_from = 'nope'\n", "study.cells_from: study plan nope"),
    ("[study]\nusecases = ['tiny']\ncells_from = 'paper-quick'\n",
     "paper-quick.toml lists no [[cells]] of its own"),
    ("[study]\nusecases = ['tiny']\ncells_from = 'demo'\n[[cells]]\nstrategy = 'sequential'\n",
     "lists [[cells]] too"),
])
def test_a_bad_plan_is_refused_before_anything_runs(tmp_path, capsys, plan, message):
    path = tmp_path / "plan.toml"
    path.write_text(plan)
    assert main(["study", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_use_case_is_not_a_plan_and_a_plan_is_not_a_use_case(capsys):
    assert main(["study", str(REPO_ROOT / "usecases" / "tiny.toml")]) == 2
    assert "is a use case, not a study plan" in capsys.readouterr().err
    assert main(["run", "--usecase", "demo"]) == 2
    assert "is a study plan, not a use case" in capsys.readouterr().err


def test_the_shipped_plans_are_valid():
    cells = {}
    for name in ("demo", "efficiency", "paper", "paper-quick"):
        plan = load_plan(REPO_ROOT / "usecases" / f"{name}.toml")
        cells[name] = expand(plan, {})
        assert all(c.cfg is not None for c in cells[name])
    paper = {(c.usecase, c.cfg.strategy, c.cfg.backend) for c in cells["paper"]}
    assert ("simple-big", "hybrid", "local") in paper and ("complex-small", "sequential",
                                                           "spark") in paper
    # paper-quick: the paper's cells (cells_from), on both use cases, each with its steps.
    quick = cells["paper-quick"]
    assert [c.label for c in quick if c.repeat == 1] == [c.label for c in cells["paper"]]
    assert {c.repeat for c in quick} == {1, 2}
    steps = {(c.usecase, c.cfg.max_steps, c.cfg.warmup_steps, c.cfg.max_val_steps)
             for c in quick}
    assert steps == {("complex-small", 2, 1, 1), ("simple-big", 8, 1, 1)}
    assert all(c.cfg.usecase.train.epochs == 10 for c in cells["paper"])


def test_latex_tables_escape_what_latex_would_misread():
    import pandas as pd

    text = to_latex(pd.DataFrame({"config": ["a_b 50%"], "speedup": [1.234]}), "T & U")
    assert r"a\_b 50\%" in text and r"\caption{T \& U}" in text and "1.23" in text


# --- replay and compare -----------------------------------------------------------------

def _one_run(tmp_path, datasets_dir, *extra: str) -> Path:
    runs = tmp_path / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    assert main(["run", "--usecase", "tiny", "--epochs", "2", "--max-steps", "3",
                 "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
                 "--sample-hz", "0", "--quiet", *extra]) == 0
    (new,) = set(runs.glob("*")) - before
    return new


def test_replay_repeats_a_run_exactly_and_compare_says_so(tmp_path, datasets_dir, capsys):
    first = _one_run(tmp_path, datasets_dir)
    assert main(["replay", str(first / "manifest.json"), "--quiet"]) == 0
    (second,) = set((tmp_path / "runs").glob("*")) - {first}
    a = json.loads((first / "manifest.json").read_text())
    b = json.loads((second / "manifest.json").read_text())
    assert b["config"]["replay_of"] == a["id"]
    assert [e["train_loss"] for e in b["epochs"]] == [e["train_loss"] for e in a["epochs"]]
    capsys.readouterr()
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "config: identical" in out and "data: identical" in out
    assert "train_loss per epoch: identical over 2 epoch(s)" in out


def test_compare_names_what_differs(tmp_path, datasets_dir, capsys):
    a = _one_run(tmp_path, datasets_dir)
    b = _one_run(tmp_path, datasets_dir, "--lr", "0.01")
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "config: 1 differ" in out and "usecase.train.lr: 0.003 -> 0.01" in out
    assert "train_loss per epoch: largest difference" in out


def test_replay_refuses_data_that_changed(tmp_path, datasets_dir, imagefolder, capsys):
    run = _one_run(tmp_path, datasets_dir, "--data-dir", str(imagefolder))
    victim = sorted((imagefolder / "fire").iterdir())[0]
    other = sorted((imagefolder / "smoke").iterdir())[0]
    victim.write_bytes(other.read_bytes())  # still a valid image, but not the same one
    runs_before = sorted((tmp_path / "runs").iterdir())
    assert main(["replay", str(run)]) == 2
    err = capsys.readouterr().err
    assert "the images changed" in err and "Traceback" not in err
    assert sorted((tmp_path / "runs").iterdir()) == runs_before


def test_replay_and_compare_refuse_what_is_not_a_manifest(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{not json")
    assert main(["replay", str(tmp_path / "x.json")]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "neither a run folder nor a manifest.json" in capsys.readouterr().err


def test_runs_recorded_before_a_setting_existed_still_match(quick_config):
    from ddlstudy.study.matrix import config_key

    config = quick_config().to_dict()
    older = {k: v for k, v in config.items() if k not in ("spark_sync", "sync_every")}
    assert config_key(older) == config_key(config)  # a later version's defaults
    train = {k: v for k, v in config["usecase"]["train"].items() if k != "lr_warmup_epochs"}
    older = config | {"usecase": config["usecase"] | {"train": train}}
    assert config_key(older) == config_key(config)  # ... in the use case's task too
    usecase = config["usecase"]
    before = {k: v for k, v in usecase["train"].items() if k not in (
        "optimizer", "optimizer_args", "lr_schedule", "lr_schedule_args")}
    data = {k: v for k, v in usecase["data"].items() if k not in ("flip", "crop_scale",
                                                                    "normalize")}
    older = config | {"usecase": usecase | {"train": before, "data": data}}
    assert config_key(older) == config_key(config)  # runs from before the recipe keys
    adamw = config | {"usecase": usecase | {"train": usecase["train"] | {"optimizer": "AdamW"}}}
    assert config_key(adamw) != config_key(config)
    warm = config | {"usecase": config["usecase"] | {"train": train | {"lr_warmup_epochs": 1}}}
    assert config_key(warm) != config_key(config)
    assert config_key(config | {"workers": 2}) != config_key(config)
    assert config_key(config | {"runs_dir": "/elsewhere"}) == config_key(config)


def test_time_left_counts_each_cell_as_its_earlier_repeat_or_its_use_cases_cells():
    from ddlstudy.study.matrix import Cell, time_left

    def cell(usecase: str, id: str, seconds: float = 0.0) -> Cell:
        return Cell(usecase=usecase, flags={}, repeat=1, id=id, seconds=seconds)

    done = [cell("complex-small", "a", 100.0), cell("complex-small", "b", 60.0),
            cell("simple-big", "c", 10.0)]
    rest = [cell("simple-big", "d"), cell("complex-small", "a"), cell("tiny", "e")]
    # d: simple-big's mean (10); a: its first repeat (100); e: the mean of all (170 / 3)
    assert time_left(done, rest) == pytest.approx(10 + 100 + 170 / 3)



def test_the_baseline_a_study_adds_is_local_whatever_the_plan_s_backend(tmp_path,
                                                                        datasets_dir):
    """A plan whose [settings] put every cell on 2 MPI nodes (usecases/memory.toml does):
    the sequential baseline the study adds runs here, one local process, so that the MPI
    cell has a speedup (before, the baseline ran under MPI too and every speedup was -)."""
    plan = tmp_path / "plan.toml"
    plan.write_text(f"""[study]
name = "mpi-settings"
usecases = ["tiny"]
repeat = 1

[settings]
backend = "mpi"
nodes = 2
epochs = 1
max_steps = 3
datasets_dir = "{datasets_dir}"
sample_hz = 0
no_snapshot = true

[[cells]]
strategy = "cpu-intraop"
workers = 1
""")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["study", str(plan), "--runs-dir", str(tmp_path / "runs")]) == 0
    cells = json.loads((tmp_path / "runs" / "study.json").read_text())["cells"]
    assert [(c["strategy"], c["backend"], c["nodes"]) for c in cells] == [
        ("sequential", "local", 1), ("cpu-intraop", "mpi", 2)]
    assert cells[0]["flags"] == {"strategy": "sequential", "epochs": 1, "max_steps": 3,
                                 "datasets_dir": str(datasets_dir), "sample_hz": 0,
                                 "no_snapshot": True}
    base = json.loads((tmp_path / "runs" / cells[0]["run"] / "manifest.json").read_text())
    assert base["backend"]["name"] == "local" and base["status"] == "completed"
    table = Report(tmp_path / "runs", include_noisy=True).table
    mpi = table[table.backend == "mpi"]
    assert len(mpi) == 1 and mpi.speedup.notna().all(), table
