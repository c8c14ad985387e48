"""What a new user hit (issue 48), each through the command line: advice on one's own use
case checked by a study and reported, from a working directory that holds a ``ddlstudy/``
folder; the last tracebacks and writes before a refusal; ``usecase new``'s commented
defaults; the host load of runs without samples."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import ddlstudy
from ddlstudy.cli import main
from ddlstudy.config import usecase_from_dict
from ddlstudy.config.folders import with_classes
from ddlstudy.records.advised import advice_plan
from ddlstudy.records.runfolder import MANIFEST
from ddlstudy.report.formats import cell_text, fitted_markdown
from ddlstudy.report.tables import SUMMARY_COLUMNS
from ddlstudy.tools.advise import markdown

PACKAGE = Path(ddlstudy.__file__).resolve().parent
NET = """\
import torch.nn as nn


def make(num_classes):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, num_classes))
"""


def _own_work(folder: Path) -> Path:
    """A new user's folder: 2 classes of 24 small images, an own nn.Module in a .py file,
    and a ``ddlstudy/`` package of its own that fails whoever imports it."""
    rng = np.random.default_rng(0)
    for name, shade in (("dark", 40), ("light", 200)):
        (folder / "digits" / name).mkdir(parents=True)
        for i in range(24):
            pixels = np.clip(rng.normal(shade, 30, (12, 12, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(folder / "digits" / name / f"{i}.png")
    (folder / "mynet.py").write_text(NET)
    (folder / "ddlstudy").mkdir()
    (folder / "ddlstudy" / "__init__.py").write_text(
        "raise ImportError('this folder\'s ddlstudy/ was imported')\n")
    return folder


def test_advice_on_ones_own_use_case_is_studied_and_reported(tmp_path, monkeypatch, capsys):
    """The new user's path end to end, from a folder whose ``ddlstudy/`` would hide the
    package from any child started with the working directory first on its path (the
    probes and the study's cells): usecase new, advise, study --from-advice, report."""
    work = _own_work(tmp_path / "work")
    monkeypatch.chdir(work)
    assert main(["usecase", "new", "--data-dir", "digits", "--model", "mynet.py:make",
                 "--image-size", "12", "--name", "digits-mynet"]) == 0
    capsys.readouterr()
    assert main(["advise", "--usecase", "digits-mynet.toml", "--nodes", "1", "--strategies",
                 "cpu-intraop", "--budget", "20", "--rounds", "1", "--probe-seconds", "0.5",
                 "--out", "adv", "--quiet"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 100, printed  # was 325
    assert "| scaling eff. |" in printed
    assert "scaling efficiency: images/s / (nodes x" in " ".join(printed.split())
    advice = json.loads((work / "adv" / "advise.json").read_text())
    assert advice["usecase"] == "digits-mynet"
    fastest = max(r["images_per_s"] for r in advice["ranking"] if r["nodes"] == 1)
    for r in advice["ranking"]:  # one name, one meaning: not the report's efficiency
        assert "efficiency" not in r
        assert r["scaling_efficiency"] == pytest.approx(r["images_per_s"] / fastest)
    own = str(work / "digits-mynet.toml")
    assert advice["origin"]["usecase"] == own and advice["origin"]["file"] == own
    base = next(p for p in advice["probes"] if p["label"] == "sequential")
    assert "skipped" not in base, base  # the probe imported the package, not ./ddlstudy
    assert advice["ranking"][0]["command"].startswith(f"ddlstudy run --usecase {own} ")

    capsys.readouterr()
    assert main(["study", "--from-advice", "adv/advise.json", "--top", "1", "--repeat", "1",
                 "--epochs", "1", "--max-steps", "2", "--quiet"]) == 0
    confirm = work / "adv" / "confirm"
    study = json.loads((confirm / "study.json").read_text())
    assert study["name"] == "advice-digits-mynet"
    assert {c["status"] for c in study["cells"]} == {"completed"}
    run = json.loads(next(confirm.glob(f"*/{MANIFEST}")).read_text())
    assert run["study"]["name"] == "advice-digits-mynet"
    assert run["config"]["usecase"]["source"] == own

    # advise.json naming its use case by the file (written in by hand): the same study
    edited = advice | {"usecase": own}
    del edited["origin"]
    (work / "adv" / "edited.json").write_text(json.dumps(edited))
    assert main(["study", "--from-advice", "adv/edited.json", "--top", "1", "--repeat", "1",
                 "--epochs", "1", "--max-steps", "2", "--resume", "--quiet"]) == 0
    assert json.loads((confirm / "study.json").read_text())["name"] == "advice-digits-mynet"
    # an advise.json of before issue 48 (its rows' "efficiency"): still read and shown
    older = edited | {"ranking": [{("efficiency" if k == "scaling_efficiency" else k): v
                                   for k, v in r.items()} for r in advice["ranking"]]}
    (work / "adv" / "older.json").write_text(json.dumps(older))
    assert advice_plan(work / "adv" / "older.json", 1).cells == [advice["ranking"][0]["flags"]]
    assert "| 100% |" in markdown(older)

    assert main(["report", "adv/confirm", "--out", "rep"]) == 0
    assert (work / "rep" / "speedup.md").is_file()
    (confirm / "study.json").write_text('{"name": 3')  # damaged: its cells are left out
    run_file = next(confirm.glob(f"*/{MANIFEST}"))
    broken = json.loads(run_file.read_text())
    broken["study"]["name"] = "advice-/tmp/x.toml"  # a run that fails validation
    run_file.write_text(json.dumps(broken))
    capsys.readouterr()
    assert main(["report", "adv/confirm", "--out", "rep2"]) == 0
    err = capsys.readouterr().err
    assert "left out the cells of study record" in err and "skipped run manifest" in err


def test_python_m_from_a_folder_holding_a_clone_says_what_hides_the_package(tmp_path):
    """``python -m ddlstudy`` beside a clone's root, with the package installed editable
    (setuptools' own finder, which Python asks after the working directory's folder):
    one line and exit 2, not ``ImportError: cannot import name '__version__'``."""
    from setuptools.command.editable_wheel import _finder_template

    (tmp_path / "finder").mkdir()
    (tmp_path / "finder" / "ddlstudy_test_finder.py").write_text(
        _finder_template("ddlstudy_test_finder", {"ddlstudy": str(PACKAGE)}, {}))
    (tmp_path / "ddlstudy" / "ddlstudy").mkdir(parents=True)  # the clone's root
    start = textwrap.dedent(f"""\
        import runpy, sys
        sys.path.append({str(tmp_path / 'finder')!r})
        import ddlstudy_test_finder
        ddlstudy_test_finder.install()
        ours = sys.meta_path.pop()  # asked before any other editable install's finder
        sys.meta_path.insert(next((i for i, f in enumerate(sys.meta_path)
                                   if "editable" in getattr(f, "__module__", "")),
                                  len(sys.meta_path)), ours)
        runpy.run_module("ddlstudy", run_name="__main__", alter_sys=True)
        """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", start, "--version"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert f"the folder {tmp_path / 'ddlstudy'} hides the installed ddlstudy" in out.stderr
    elsewhere = subprocess.run([sys.executable, "-c", start, "--version"], cwd=tmp_path / "finder",
                               env=env, capture_output=True, text=True)
    assert elsewhere.returncode == 0 and elsewhere.stdout.startswith("ddlstudy ")


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, datasets_dir) -> Path:
    """A folder of one short run of tiny."""
    runs = tmp_path_factory.mktemp("runs")
    assert main(["run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir",
                 str(runs), "--epochs", "1", "--max-steps", "2", "--max-val-steps", "1",
                 "--no-snapshot", "--sample-hz", "0", "--quiet"]) == 0
    return runs


@pytest.fixture(scope="module")
def tiny_run(tiny_runs) -> dict:
    """One short run of tiny: its manifest."""
    return json.loads(next(tiny_runs.glob(f"*/{MANIFEST}")).read_text())


def test_replay_of_other_data_refuses_before_anything_is_left_in_datasets(
        tiny_run, tmp_path, monkeypatch, capsys):
    import ddlstudy.config

    doc = json.loads(json.dumps(tiny_run))
    doc["config"]["datasets_dir"] = str(tmp_path / "alice" / "datasets")
    doc["data"]["fingerprint"] = "0" * 64
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / MANIFEST).write_text(json.dumps(doc))
    home = tmp_path / "home" / "datasets"
    monkeypatch.setattr(ddlstudy.config, "DEFAULT_DATASETS_DIR", home)
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "run"), "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the run being replayed used 0000000000000000" in err and "Traceback" not in err
    assert not home.exists() or list(home.iterdir()) == []  # no set, no partial one
    assert not list((tmp_path / "r").glob(f"*/{MANIFEST}"))


def test_a_complete_data_set_on_a_read_only_mount_is_read(datasets_dir, tmp_path):
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no mount namespace to mount a folder read-only in")
    shutil.copytree(datasets_dir, tmp_path / "src")
    (tmp_path / "ro").mkdir()
    run = [sys.executable, "-P", "-m", "ddlstudy", "run", "--usecase", "tiny", "--datasets-dir",
           str(tmp_path / "ro"), "--runs-dir", str(tmp_path / "runs"), "--epochs", "1",
           "--max-steps", "2", "--max-val-steps", "1", "--no-snapshot", "--sample-hz", "0",
           "--quiet"]
    script = (f"mount --bind {tmp_path / 'src'} {tmp_path / 'ro'} && mount -o remount,bind,ro "
              f"{tmp_path / 'ro'} && touch {tmp_path / 'ro' / 'x'} 2>/dev/null; "
              f"test ! -e {tmp_path / 'ro' / 'x'} && exec \"$@\"")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *run],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    manifest = json.loads(next((tmp_path / "runs").glob(f"*/{MANIFEST}")).read_text())
    assert manifest["status"] == "completed"
    assert manifest["data"]["root"] == str(tmp_path / "ro" / "synthetic-tiny")


def test_an_empty_use_case_name_is_refused_not_the_default(capsys):
    for argv in (["run", "--usecase", ""], ["advise", "--usecase", ""]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--usecase: '' is empty; give a use case's name" in err, err


def test_a_hosts_dir_that_is_a_file_is_named_for_what_it_is(tmp_path):
    (tmp_path / "hosts").write_text("a file")
    out = subprocess.run([sys.executable, "-P", "-m", "ddlstudy", "hosts", "status"],
                         env=os.environ | {"DDLSTUDY_HOSTS_DIR": str(tmp_path / "hosts")},
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert f"DDLSTUDY_HOSTS_DIR: {tmp_path / 'hosts'} is a file, not a folder" in out.stderr
    assert "no emulated hosts are up" not in out.stdout + out.stderr


def test_usecase_new_comments_only_true_defaults(imagefolder, tmp_path, monkeypatch):
    """Every key ``usecase new`` writes commented out, uncommented, changes nothing: the
    use case reads the same (target_accuracy, whose default is none, is not one of them)."""
    monkeypatch.chdir(tmp_path)
    assert main(["usecase", "new", "--data-dir", str(imagefolder), "--model", "resnet18",
                 "--image-size", "32", "--out", "mine.toml"]) == 0
    text = (tmp_path / "mine.toml").read_text()
    commented = re.compile(r"^# (\w+) = (.+?)(  #.*)?$")
    keys = [commented.match(line)[1] for line in text.splitlines() if commented.match(line)]
    assert {"classes", "width", "name", "batch_size", "epochs", "lr", "lr_warmup_epochs",
            "momentum", "seed", "val_fraction", "optimizer", "lr_schedule", "flip", "crop_scale",
            "normalize"} <= set(keys)
    assert "target_accuracy" not in keys
    uncommented = "\n".join(re.sub(r"^# (\w+ = )", r"\1", line) if commented.match(line)
                            else line for line in text.splitlines())
    source = str(tmp_path / "mine.toml")
    as_written = usecase_from_dict(tomllib.loads(text), source=source)
    assert usecase_from_dict(tomllib.loads(uncommented), source=source) == \
        with_classes(as_written, as_written.data.dir)
    assert as_written.train.target_accuracy is None


def _run_beside_a_busy_process(argv: list[str]) -> dict:
    """A run (a process tree of its own) while another process keeps a core busy."""
    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = subprocess.run([sys.executable, "-P", "-m", "ddlstudy", "run", *argv],
                             capture_output=True, text=True)
    finally:
        burn.kill()
        burn.wait()
    assert out.returncode == 0, out.stderr
    return out


def test_a_run_without_samples_on_a_busy_host_is_marked_noisy(datasets_dir, tmp_path):
    runs = tmp_path / "runs"
    out = _run_beside_a_busy_process(
        ["--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
         "--strategy", "sequential", "--epochs", "1", "--max-steps", "2",
         "--max-val-steps", "1", "--no-snapshot", "--sample-hz", "0"])
    load = json.loads(next(runs.glob(f"*/{MANIFEST}")).read_text())["host_load"]
    assert load["noisy"] is True, load
    assert 0.5 <= max(load["others_cores"].values()) <= (os.cpu_count() or 1)
    assert "marked noisy" in out.stderr


# --- issue 48's misleading items: one name a figure, labels, names, formats for scripts ----


def test_the_two_efficiencies_have_two_names_each_defined():
    """The report's efficiency (speedup / cores) and advise's scaling efficiency (images/s
    / (nodes x the best one node's)), each in the concepts and the formats' reference."""
    root = PACKAGE.parent / "docs"
    concepts, formats = (root / "concepts.md").read_text(), (root / "formats.md").read_text()
    assert "Its **efficiency** (the report's" in concepts and "**Scaling efficiency**" in concepts
    row = next(line for line in formats.splitlines() if "`ranking[].scaling_efficiency`" in line)
    assert "images/s / (its nodes x the fastest one-node probe's" in row
    assert "the report's `efficiency` (its tables' and runs.csv's: speedup / the cores" in row


@pytest.mark.parametrize("fmt, flags", [("csv", ["--strategies", "cpu-intraop"]),
                                        ("json", ["--memory", "64MiB"])], ids=["csv", "json"])
def test_advise_prints_csv_or_json_for_scripts(fmt, flags, datasets_dir, tmp_path, capsys):
    """CSV's rows follow the ranking's (two probes: two rows to order); JSON is
    advise.json's content whatever it ranks (the baseline's probe alone: --memory 64MiB
    leaves out every other layout, predicted from it, and names each with its need)."""
    assert main(["advise", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--nodes",
                 "1", *flags, "--budget", "20", "--rounds", "1", "--probe-seconds", "0.5",
                 "--out",
                 str(tmp_path / "adv"), "--quiet", "--format", fmt]) == 0
    out, err = capsys.readouterr()
    advice = json.loads((tmp_path / "adv" / "advise.json").read_text())
    assert f"wrote {tmp_path / 'adv' / 'advise.json'}" in err  # not in what a script reads
    if fmt == "json":
        assert json.loads(out) == advice
        _left_out_for_memory(advice, (tmp_path / "adv" / "advise.md").read_text())
        return
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["label"] for r in rows] == [r["label"] for r in advice["ranking"]]
    for row, ranked in zip(rows, advice["ranking"], strict=True):
        assert int(row["rank"]) == ranked["rank"] and row["command"] == ranked["command"]
        assert float(row["scaling_efficiency"]) == pytest.approx(ranked["scaling_efficiency"])
        assert float(row["images_per_s"]) == pytest.approx(ranked["images_per_s"])


def _left_out_for_memory(advice: dict, text: str) -> None:
    """Every layout but the baseline left out for --memory 64MiB, never probed, named in
    advise.md's 'not ranked' with its predicted need; the baseline ranked as the reference
    (it measured more: a note says so), its prediction its own probe's figure."""
    base = next(p for p in advice["probes"] if p["label"] == "sequential")
    assert base["predicted_need_node_bytes"] == base["measured_peak_node_bytes"] > 64 * 2**20
    left = [p for p in advice["probes"] if "--memory" in p.get("skipped", "")]
    assert {p["label"] for p in left} >= {"cpu-intraop (2 threads)", "cpu-processes (2 "
                                          "processes)", "sharded (2 processes)"}
    for p in left:
        assert "images_per_s" not in p and p["skipped"] == (
            f"needs about {p['predicted_need_node_bytes'] / 2**30:.2f} GiB a node, and "
            "--memory is 0.06 GiB")
        assert f"- {p['label']}: needs about " in text
    assert [r["label"] for r in advice["ranking"]] == ["sequential"]
    assert "\nnot ranked:\n" in text and "over --memory 0.06 GiB" in " ".join(text.split())


def test_labels_are_cut_between_words_not_inside_one():
    """`gpu-d...PUs) [1]` was a label cut in mid-word: a cut keeps whole words, the first
    (the strategy's or backend's name) always, and the note gives the label in full."""
    labels = ["gpu-data (2 GPUs) over nccl fp16 accumulate 4 weak (batch 64)",
              "cpu-processes (2 processes) x 2 MPI nodes, ring-allreduce weak (batch 32)",
              "mpi 2 nodes, topk:0.01 allgather in 4 MiB buckets: cpu-intraop (2 threads)"]
    notes: dict[str, int] = {}
    table = fitted_markdown(pd.DataFrame({"configuration": labels, "figure": ["1.00"] * 3,
                                          "pad": ["x" * 60] * 3}), ["configuration"], notes)
    for line, label in zip(table.splitlines()[2:], labels, strict=True):
        assert len(line) <= 100
        cut = line.split(" | ")[0].removeprefix("| ")
        head, _, tail = cut.rsplit(" [", 1)[0].partition(" ...")
        assert label.startswith(head + " ") and label.endswith(tail), cut
        assert tail == "" or tail.startswith(" ") and label.endswith(tail), cut
        assert head.split(" ")[0] == label.split(" ")[0] and notes[label]


def test_an_mpi_run_is_named_by_its_backend_and_says_how_it_ended_in_json(
        datasets_dir, tmp_path, capsys):
    """Its folder and its TensorBoard run were `...-tiny-sequential-...`: an MPI run is
    `...-tiny-mpi-sequential-...`; `run --format json` prints what a script needs."""
    runs = tmp_path / "runs"
    capsys.readouterr()
    assert main(["run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir",
                 str(runs), "--backend", "mpi", "--nodes", "2", "--epochs", "1", "--max-steps",
                 "2", "--max-val-steps", "1", "--no-snapshot", "--sample-hz", "0", "--quiet",
                 "--format", "json"]) == 0
    ended = json.loads(capsys.readouterr().out)
    (folder,) = runs.iterdir()
    assert ended["run"] == str(folder) and ended["id"] == folder.name
    assert re.fullmatch(r"\d{8}-\d{6}-tiny-mpi-sequential-[0-9a-f]{4}", folder.name)
    m = json.loads((folder / MANIFEST).read_text())
    assert ended["status"] == "completed" == m["status"] and ended["epochs"] == 1
    assert ended["images_per_s"] == m["summary"]["median_images_per_s"] > 0
    assert ended["val_accuracy"] == m["summary"]["final_val_accuracy"]
    assert ended["time_to_target"] == m["time_to_target"]
    assert main(["export", "tensorboard", str(runs), "--out", str(tmp_path / "tb")]) == 0
    assert (tmp_path / "tb" / folder.name).is_dir()


def test_the_notebook_shows_figures_rounded_as_the_report_does(tiny_runs, monkeypatch):
    """Its tables printed `1155.183598`: its first cell sets pandas' float format to the
    report's, so a figure shows as the report prints it."""
    nb = json.loads((PACKAGE.parent / "analysis" / "study.ipynb").read_text())
    setup = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    monkeypatch.setenv("DDLSTUDY_RUNS", str(tiny_runs))
    scope: dict = {}
    try:
        exec(setup, scope)
        html = scope["report"].table[SUMMARY_COLUMNS].to_html()
    finally:
        pd.reset_option("display.float_format")
    speed = scope["report"].table.images_per_s.iloc[0]
    assert f">{cell_text(speed)}<" in html and cell_text(speed) != str(speed)
    assert not re.search(r"\d\.\d{3,}", html), html


def test_the_mlflow_guide_says_where_the_installed_ui_shows_the_runs():
    """MLflow 3's UI opens on its GenAI view; the guide says where the runs are, as the
    installed package's UI offers it (read from its bundle, not guessed)."""
    mlflow = pytest.importorskip("mlflow")
    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    ui = "".join(p.read_text(errors="replace") for p in bundle.glob("main.*.js"))
    assert 'defaultMessage:"GenAI"' in ui and 'defaultMessage:"Model training"' in ui
    assert 'MACHINE_LEARNING="machine_learning"' in ui and '"mlflow.workflowType"' in ui
    default = re.search(r'const (\w)=\w+\.GENAI,\w=\(0,\w+\.createContext\)\(\{workflowType:'
                        r'\1,', ui)
    assert default, "the UI's default view is no longer GenAI: check docs/guides/mlflow.md"
    assert "classic-ml.runs" in ui  # the Model training view's Runs
    guide = " ".join((PACKAGE.parent / "docs" / "guides" / "mlflow.md").read_text().split())
    assert "opens on its *GenAI* view" in guide and "*Model training*" in guide
    assert "?workflowType=machine_learning" in guide and "*Runs*" in guide
