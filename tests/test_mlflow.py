"""Runs in MLflow and in TensorBoard's HParams dashboard (issue 36): a small study with the
``mlflow`` setting, read back through MlflowClient, a real tracking server's REST API and
TensorBoard's own event reader."""

from __future__ import annotations

import base64
import csv
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from ddlstudy.cli import main
from ddlstudy.exports.mlflow.store import PARENT_TAG, RUN_TAG
from ddlstudy.report import Report, load_runs, runs_frame
from ddlstudy.report.runs import KEY

PLAN = """
[study]
name = "mlf"
usecases = ["tiny"]
repeat = 2

[settings]
epochs = 2
max_steps = 2
sample_hz = 20
no_snapshot = true
datasets_dir = "{datasets}"
mlflow = true

[[cells]]
strategy = "sequential"

[[cells]]
strategy = "cpu-intraop"
workers = 2
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory, datasets_dir) -> Path:
    """A real study of 4 runs (the baseline and cpu-intraop, 2 repeats each) whose plan
    sets ``mlflow = true``: every cell logs itself into runs/mlflow.db as it trains."""
    root = tmp_path_factory.mktemp("mlflow-study")
    plan = root / "plan.toml"
    plan.write_text(PLAN.format(datasets=datasets_dir))
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "study", str(plan), "--runs-dir",
                          str(root / "runs")], capture_output=True, text=True, timeout=900,
                         cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MLflow (" not in out.stderr, out.stderr[-3000:]  # no failure to log, said
    assert sorted(p.name for p in root.iterdir()) == ["plan.toml", "runs"]
    return root / "runs"


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _logged(client, experiment: str) -> tuple[dict, list]:
    """The experiment's runs by ddlstudy run id, and its study parent runs."""
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    tagged = [r for r in runs if RUN_TAG in r.data.tags]
    by_id = {r.data.tags[RUN_TAG]: r for r in tagged}
    assert len(by_id) == len(tagged)  # one MLflow run per run folder, never two
    return by_id, [r for r in runs if PARENT_TAG in r.data.tags]


def _folders(runs: Path) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in runs.glob("*/manifest.json")}


def _metrics_csv(folder: Path) -> list[dict[str, str]]:
    with open(folder / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_study_with_the_mlflow_setting_logs_every_cell_as_it_trains(study):
    """Each cell opened its MLflow run when its folder was made (the manifest says which),
    nested under the study's parent run, and filled it in when it ended; the study's end
    put the report into the parent run."""
    folders = _folders(study)
    assert len(folders) == 4
    client = _client(f"sqlite:///{study / 'mlflow.db'}")
    by_id, parents = _logged(client, "mlf")
    assert set(by_id) == set(folders)
    (parent,) = parents
    assert parent.info.status == "FINISHED"
    for run_id, folder in folders.items():
        manifest = json.loads((folder / "manifest.json").read_text())
        run = by_id[run_id]
        assert manifest["mlflow"]["run_id"] == run.info.run_id
        assert "error" not in manifest["mlflow"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["repeat"] == str(manifest["study"]["repeat"])
        assert run.data.tags["cell"] == manifest["study"]["cell"]
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"
        losses = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in losses] == [1, 2]  # logged live, not again at the end
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/speedup.md", "report/findings.md", "report/figures"} <= report
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "study-record.json" in top
    # The copies MLflow keeps beside the store are never taken for runs.
    assert len(Report(study).runs) == 4 and not list((study / "mlartifacts").rglob(
        "manifest.json"))


def test_export_is_read_back_through_the_client_and_exporting_again_adds_nothing(
        study, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    assert main(["export", "mlflow", str(study), "--tracking-uri", uri]) == 0
    said = capsys.readouterr().out
    assert "4 run(s) exported" in said and f"`mlflow ui --backend-store-uri {uri}`" in said
    client = _client(uri)
    by_id, parents = _logged(client, "mlf")
    folders = _folders(study)
    assert set(by_id) == set(folders) and len(parents) == 1
    rows = {r["run"]: r for r in runs_frame(load_runs(study)).to_dict("records")}
    histories = {}
    for run_id, folder in folders.items():
        run = by_id[run_id]
        assert run.data.params == {k: str(rows[run_id][k]) for k in KEY}
        assert run.info.run_name == f"{rows[run_id]['config']} #{rows[run_id]['repeat']}"
        table = _metrics_csv(folder)
        for column in table[0]:
            if column == "epoch":
                continue
            history = sorted(client.get_metric_history(run.info.run_id, column),
                             key=lambda m: m.step)
            assert [m.step for m in history] == [int(r["epoch"]) for r in table], column
            assert [m.value for m in history] == pytest.approx(
                [float(r[column]) for r in table], rel=1e-9), column
        cpu = client.get_metric_history(run.info.run_id,
                                        "system/node-rank0/cpu_utilization_percentage")
        manifest = json.loads((folder / "manifest.json").read_text())
        assert len(cpu) >= 2 and all(0 <= m.value <= 100 for m in cpu)
        start = manifest["started_at"]
        assert min(m.timestamp for m in cpu) >= _ms(start) - 60_000
        assert run.data.metrics["median_images_per_s"] == pytest.approx(
            rows[run_id]["images_per_s"])
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"run-manifest.json", "metrics.csv", "steps.csv", "samples.parquet"} <= files
        assert _models(client, run) == []  # kept with --no-snapshot: no model to log
        histories[run_id] = {k: len(client.get_metric_history(run.info.run_id, k))
                             for k in run.data.metrics}
    base = [by_id[r] for r, row in rows.items() if row["config"] == "sequential"]
    assert all(r.data.metrics["speedup"] == pytest.approx(rows[r.data.tags[RUN_TAG]]
                                                          ["speedup"]) for r in base)
    before = len(client.search_runs([client.get_experiment_by_name("mlf").experiment_id]))
    assert main(["export", "mlflow", str(study), "--tracking-uri", uri]) == 0
    again, _ = _logged(client, "mlf")
    assert len(client.search_runs([client.get_experiment_by_name("mlf").experiment_id])) \
        == before == 5
    for run_id, run in again.items():
        assert {k: len(client.get_metric_history(run.info.run_id, k))
                for k in run.data.metrics} == histories[run_id]


def _ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


USER, PASSWORD = "admin", "S3cr3t Pw/'\"@63"
"""The server's user and password, typed into the URI as they are: a space, a slash, both
quotes and an @ (issue 64's spellings), and long enough for MLflow's admin (12)."""
SECRETS = (PASSWORD, quote(PASSWORD), base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
"""The password as typed, percent-encoded, and as an Authorization header carries it."""


AUTH_INI = """[mlflow]
default_permission = READ
database_uri = sqlite:///basic_auth.db
admin_username = admin
auth_cache_ttl_seconds = 600
"""
"""MLflow's basic-auth settings, a password checked once per 10 minutes, not at every
request (a PBKDF2 hash each: an export of 2 runs took 78.7 s without, 18.8 s with, on the
busy 2-core host)."""
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
"""No job runner (it starts 8 more Python processes, for GenAI jobs) and no telemetry."""


@dataclass
class Server:
    """A real `mlflow server` on 127.0.0.1, with basic auth where MLflow's auth app can
    run (Flask-WTF, in the dev extra); its store, artifacts and log all in ``folder``."""

    port: int
    folder: Path
    auth: bool

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def typed(self) -> str:
        """The URI as a user types it, the password in it."""
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{self.port}"

    def request(self, path: str, body: dict | None = None) -> dict:
        """The REST API's answer, as the user (POST where there is a body)."""
        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{path}", None if body is None else
            json.dumps(body).encode(), {"Content-Type": "application/json",
                                        "Authorization": f"Basic {SECRETS[2]}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The one tracking server of the session (it takes a while to start on a busy
    host)."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    auth = importlib.util.find_spec("flask_wtf") is not None
    (folder / "basic_auth.ini").write_text(AUTH_INI)
    port = _free_port()
    log = open(folder / "server.log", "w")  # noqa: SIM115 - open while the server runs
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{folder / 'store.db'}", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", *(["--app-name", "basic-auth"] if auth else [])],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=os.environ | SERVER_ENV | {"MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
                                       "MLFLOW_AUTH_CONFIG_PATH": str(folder / "basic_auth.ini"),
                                       "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex()})
    try:
        for _ in range(1200):  # it starts in seconds; a wait, not a measurement
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert process.poll() is None, (folder / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        yield Server(port, folder, auth)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def ddlstudy(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real command line, in an environment without MLflow's credential variables:
    the URI is all it is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    return subprocess.run([sys.executable, "-m", "ddlstudy", *args], capture_output=True,
                          text=True, timeout=900, cwd=cwd, env=env)


def _clean(*outs: subprocess.CompletedProcess, folders: tuple[Path, ...] = ()) -> None:
    """No secret on the terminal, and none in any file under ``folders``; MLflow's own
    "View run ... at: URL" lines nowhere (they held the password, 4 times for a run)."""
    for out in outs:
        assert not any(s in out.stdout + out.stderr for s in SECRETS), out.stderr[-3000:]
        assert "View run" not in out.stdout + out.stderr
    for folder in folders:
        held = [p for p in folder.rglob("*") if p.is_file() and
                any(s.encode() in p.read_bytes() for s in SECRETS)]
        assert held == [], held


def test_the_tracking_server_finds_the_exported_runs_through_its_rest_api(study, server,
                                                                        tmp_path):
    """`export mlflow` of the study into a real server, the password typed into the URI:
    its REST API lists every run folder as a run of the study's experiment; the export
    said one line of its own on stdout, and the password is on neither stream, in no
    file of the runs and not in the server's store. Without the password the server
    refuses (so it is the password that let the export in)."""
    out = ddlstudy("export", "mlflow", str(study), "--tracking-uri", server.typed, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == (f"4 run(s) exported to {server.uri}, experiment(s) mlf; open "
                          f"{server.uri}\n")
    _clean(out, folders=(study, server.folder))
    experiment = server.request("experiments/get-by-name?experiment_name=mlf")
    experiment = experiment["experiment"]["experiment_id"]
    found = server.request("runs/search", {"experiment_ids": [experiment], "max_results": 100,
                                           "filter": f"tags.{RUN_TAG} != ''"})["runs"]
    ids = {t["value"] for r in found for t in r["data"]["tags"] if t["key"] == RUN_TAG}
    assert ids == set(_folders(study)) and len(found) == 4
    one = next(iter(ids))
    (run,) = server.request("runs/search", {"experiment_ids": [experiment],
                                            "filter": f"tags.{RUN_TAG} = '{one}'"})["runs"]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["usecase"] == "tiny" and set(params) == set(KEY)
    if server.auth:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"{server.uri}/api/2.0/mlflow/experiments/search?"
                                   "max_results=1", timeout=30)


def _signed_in(monkeypatch) -> None:
    """This test process reads the server back as the user."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)


@pytest.mark.slow
def test_run_with_the_password_in_the_uri_prints_json_alone_and_keeps_it_nowhere(
        server, datasets_dir, tmp_path, monkeypatch):
    """Issue 63: `run --mlflow URI --format json` against a live server: stdout is the
    JSON alone (MLflow's "View run" lines came first), and the password is on neither
    stream, in no file of the run and not in the server's store; the run is in the
    server, epochs, params and its model, logged as the user."""
    runs = tmp_path / "runs"
    out = ddlstudy("run", "--usecase", "tiny", "--epochs", "2", "--max-steps", "2",
                   "--sample-hz", "20", "--format", "json", "--mlflow", server.typed,
                   "--runs-dir", str(runs), "--datasets-dir", str(datasets_dir), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["status"] == "completed" and result["epochs"] == 2
    _clean(out, folders=(runs, server.folder))
    manifest = json.loads((Path(result["run"]) / "manifest.json").read_text())
    assert manifest["mlflow"]["tracking_uri"] == server.uri and "error" not in \
        manifest["mlflow"]
    _signed_in(monkeypatch)
    client = _client(server.uri)
    run = client.get_run(manifest["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags[RUN_TAG] == result["id"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] \
        == [1, 2] and set(run.data.params) == set(KEY)
    assert [str(m.status) for m in _models(client, run)] == ["READY"]


@pytest.mark.slow
def test_a_study_logging_to_a_server_keeps_the_password_out_of_its_cell_logs(
        server, datasets_dir, tmp_path):
    """Issue 63: a study whose plan gives the URI with the password: each cell's log under
    <study>/logs/ (where MLflow's lines were kept), the study's output, every file of its
    runs and the server's store hold none of it; its parent run and cell are logged."""
    plan, runs = tmp_path / "plan.toml", tmp_path / "runs"
    plan.write_text(f'[study]\nname = "secret"\nusecases = ["tiny"]\nrepeat = 1\n'
                    f'[settings]\nepochs = 1\nmax_steps = 2\nno_snapshot = true\n'
                    f'sample_hz = 0\ndatasets_dir = "{datasets_dir}"\n'
                    f'mlflow = {json.dumps(server.typed)}\n[[cells]]\nstrategy = "sequential"\n')
    out = ddlstudy("study", str(plan), "--runs-dir", str(runs), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MLflow (" not in out.stderr and len(list((runs / "logs").glob("*.log"))) == 1
    _clean(out, folders=(runs, server.folder))
    experiment = server.request("experiments/get-by-name?experiment_name=secret")
    found = server.request("runs/search", {"experiment_ids": [
        experiment["experiment"]["experiment_id"]]})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"]["tags"]} for r in found]
    assert sorted(PARENT_TAG in t for t in tags) == [False, True]


@pytest.mark.slow
def test_two_exports_at_once_into_a_new_store_both_succeed(study, server, tmp_path,
                                                         monkeypatch):
    """Issue 64: two `export mlflow` into a new SQLite store and two into a server's new
    experiment, four processes at once: each exits 0, and each store holds one MLflow
    run per run folder and one parent run (into a server, both made every run twice,
    and one of them could fail)."""
    store = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    folder = sorted(_folders(study).values())[0]  # one run of the study: it has a parent
    argvs = 2 * [["--tracking-uri", store]] + \
        2 * [["--tracking-uri", server.typed, "--experiment", "twice"]]
    processes = [subprocess.Popen([sys.executable, "-m", "ddlstudy", "export", "mlflow",
                                   str(folder), *argv], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
                 for argv in argvs]
    said = [p.communicate(timeout=900) for p in processes]
    outs = [subprocess.CompletedProcess(p.args, p.returncode, *o)
            for p, o in zip(processes, said, strict=True)]
    assert [o.returncode for o in outs] == [0] * 4, [o.stderr[-2000:] for o in outs]
    _clean(*outs, folders=(server.folder,))
    _signed_in(monkeypatch)
    for uri, experiment in ((store, "mlf"), (server.uri, "twice")):
        by_id, parents = _logged(_client(uri), experiment)
        assert list(by_id) == [folder.name] and len(parents) == 1, uri


def test_the_hparams_summary_holds_every_configuration_with_its_metrics(study, tmp_path,
                                                                         capsys):
    """`export tensorboard` writes the HParams experiment and a session per configuration,
    read back with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    out = tmp_path / "tb"
    assert main(["export", "tensorboard", str(study), "--out", str(out)]) == 0
    assert "and 2 configuration(s) for the HParams dashboard" in capsys.readouterr().out

    def events(folder: Path) -> EventAccumulator:
        found = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        found.Reload()
        return found

    experiment = metadata.parse_experiment_plugin_data(
        events(out / "hparams").PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG])
    assert [h.name for h in experiment.hparam_infos] == KEY
    assert {m.name.tag for m in experiment.metric_infos} == {
        "hparams/images_per_s", "hparams/speedup", "hparams/time_to_target_s",
        "hparams/val_accuracy"}
    table = Report(study).table
    sessions = {}
    for folder in (p for p in (out / "hparams").iterdir() if p.is_dir()):
        found = events(folder)
        start = metadata.parse_session_start_info_plugin_data(
            found.PluginTagToContent("hparams")[metadata.SESSION_START_INFO_TAG])
        hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
        sessions[hparams["config"]] = (hparams, {t: found.Scalars(t)[-1].value
                                                 for t in found.Tags()["scalars"]})
    assert set(sessions) == set(table.config) == {"sequential", "cpu-intraop (2 threads)"}
    for row in table.to_dict("records"):
        hparams, metrics = sessions[row["config"]]
        assert hparams == {k: row[k] for k in KEY}
        assert metrics["hparams/images_per_s"] == pytest.approx(row["images_per_s"], rel=1e-6)
        assert metrics["hparams/speedup"] == pytest.approx(row["speedup"], rel=1e-6)
        assert metrics["hparams/val_accuracy"] == pytest.approx(row["val_accuracy"], rel=1e-6)


def test_run_mlflow_logs_each_epoch_as_it_ends_and_export_completes_that_run(
        quick_config, tmp_path, capsys):
    """In-process: the MLflow run holds the epochs and the status when training returns
    (nothing else has logged it); `export mlflow` then fills in the same run (params,
    samples, files), adding no second one and no second point of any epoch."""
    from ddlstudy.runner import run

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    folder = run(quick_config(epochs=2, max_steps=2, mlflow=uri, sample_hz=20),
                 show_progress=False)
    logged = folder.manifest["mlflow"]
    client = _client(uri)
    live = client.get_run(logged["run_id"])
    assert live.data.tags[RUN_TAG] == folder.path.name and live.data.params == {}
    assert live.info.status == "FINISHED" and live.data.tags["status"] == "completed"
    table = _metrics_csv(folder.path)
    history = client.get_metric_history(logged["run_id"], "val_accuracy")
    assert [m.step for m in history] == [int(r["epoch"]) for r in table]
    assert [m.value for m in history] == pytest.approx([float(r["val_accuracy"])
                                                        for r in table])
    assert main(["export", "mlflow", str(folder.path), "--tracking-uri", uri]) == 0
    capsys.readouterr()
    by_id, parents = _logged(client, "runs")
    assert list(by_id) == [folder.path.name] and parents == []
    done = by_id[folder.path.name]
    assert done.info.run_id == logged["run_id"] and done.info.status == "FINISHED"
    assert set(done.data.params) == set(KEY)
    assert len(client.get_metric_history(done.info.run_id, "val_accuracy")) == 2
    model_id = _the_model_loads_in_a_fresh_process(client, uri, done, folder.path, tmp_path)
    assert main(["export", "mlflow", str(folder.path), "--tracking-uri", uri]) == 0
    assert [m.model_id for m in _models(client, done)] == [model_id]  # not logged twice
    _a_damaged_snapshot_logs_the_run_without_its_model(client, uri, done, folder.path,
                                                       tmp_path, capsys)


def _models(client, run) -> list:
    """The models that MLflow run ``run`` logged."""
    return client.search_logged_models([run.info.experiment_id],
                                       filter_string=f"source_run_id = '{run.info.run_id}'")


FRESH = """
import json, sys, mlflow.artifacts, mlflow.pytorch, torch
uri, run_id, out = sys.argv[1:]
mlflow.set_tracking_uri(uri)
model = mlflow.pytorch.load_model(f"runs:/{run_id}/model")
with torch.no_grad():
    torch.save(model(torch.load(out + "/batch.pt")), out + "/logits.pt")
found = mlflow.artifacts.load_dict(f"runs:/{run_id}/model/usecase.json")
open(out + "/usecase.json", "w").write(json.dumps(found))
"""


def _the_model_loads_in_a_fresh_process(client, uri: str, run, folder: Path,
                                        tmp_path: Path) -> str:
    """The logged model, loaded by MLflow alone in a new Python process, gives the logits
    of the run's exported weights on a fixed batch; its usecase.json is the sidecar's."""
    import torch

    from ddlstudy.models.trained import load

    (model,) = _models(client, run)
    assert model.name == "model" and str(model.status) == "READY"
    assert main(["export", "model", str(folder), "--out", str(tmp_path / "w.pt")]) == 0
    torch.manual_seed(0)
    batch = torch.randn(5, 3, 64, 64)  # another batch size than the traced example's
    torch.save(batch, tmp_path / "batch.pt")
    out = subprocess.run([sys.executable, "-c", FRESH, uri, run.info.run_id, str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-3000:]
    logits = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        expected = load(tmp_path / "w.pt").eval()(batch)
    assert logits.shape == (5, 3)
    assert torch.equal(logits.argmax(1), expected.argmax(1))
    assert torch.allclose(logits, expected, atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "usecase.json").read_text()) == json.loads(
        (tmp_path / "w.usecase.json").read_text())
    return model.model_id


def _a_damaged_snapshot_logs_the_run_without_its_model(client, uri: str, run, folder: Path,
                                                       tmp_path: Path, capsys) -> None:
    """A model that cannot be logged (the run's snapshot damaged since) is a warning: the
    run is logged all the same, and the model logged before stays."""
    before = [m.model_id for m in _models(client, run)]
    copy = tmp_path / "copy" / folder.name
    shutil.copytree(folder, copy)
    (copy / "snapshot.pt").write_bytes(b"not a snapshot")
    assert main(["export", "mlflow", str(copy), "--tracking-uri", uri, "--experiment",
                 "runs"]) == 0
    said = capsys.readouterr()
    assert "1 run(s) exported" in said.out
    assert f"the model of run {folder.name} is not logged" in said.err, said.err
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert [m.model_id for m in _models(client, run)] == before


def test_a_tracking_store_that_fails_never_fails_the_run(quick_config, capsys):
    """A server that does not answer: the run trains to the end, says so in a warning and
    records it in its manifest."""
    from ddlstudy.runner import run

    uri = f"http://127.0.0.1:{_free_port()}"
    folder = run(quick_config(max_steps=1, mlflow=uri), show_progress=False)
    assert folder.manifest["status"] == "completed"
    assert "MLflow cannot use tracking URI" in folder.manifest["mlflow"]["error"]
    assert "the run goes on without it" in capsys.readouterr().err


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_store_that_cannot_be_used_or_no_mlflow_is_refused_in_one_line(
        quick_config, tmp_path, capsys, monkeypatch):
    from ddlstudy.runner import run

    folder = run(quick_config(max_steps=1), show_progress=False)
    runs = folder.path.parent
    before = _tree(tmp_path)
    capsys.readouterr()
    refusals = {f"http://127.0.0.1:{_free_port()}": "MLflow cannot use tracking URI http",
                "mongodb://x": "is not a tracking URI MLflow takes",
                f"sqlite:///{folder.path / 'metrics.csv'}/x.db": "is a file, not a folder"}
    for uri, said in refusals.items():
        assert main(["export", "mlflow", str(runs), "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ddlstudy: error: ") and err.count("\n") == 1, err
        assert said in err
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    for argv in (["export", "mlflow", str(runs)],
                 ["run", "--mlflow", "--runs-dir", str(runs), "--max-steps", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'ddlstudy[mlflow]'" in err, err
    assert _tree(tmp_path) == before  # nothing written
