"""Every file ddlstudy reads, under arbitrary content (hypothesis, in process): the gate
(``ddlstudy.reading``) and each format's schema (``ddlstudy.records.formats``) let through a valid
document or refuse it with a one-line UsageError naming the file; nothing else escapes,
and the readers built on them (report, replay, compare, resume, export, --from-advice, a
hostfile, a secret file, a cache index) never raise anything else either."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlstudy import reading
from ddlstudy.config.mpi import read_hostfile
from ddlstudy.config.spark import read_secret
from ddlstudy.errors import UsageError
from ddlstudy.reading import MAX_DEPTH, BadFile
from ddlstudy.records import formats
from ddlstudy.records.advised import advice_plan
from ddlstudy.records.manifests import compare, config_from_manifest, read_manifest
from ddlstudy.records.runfolder import MANIFEST, load_manifest
from ddlstudy.report import Report

FUZZ = settings(max_examples=int(os.environ.get("DDLSTUDY_EXAMPLES", 120)), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
ODD = st.sampled_from([None, True, -1, 0, 2**70, 1e308, float("nan"), float("inf"), "", "x",
                       "../..", [], {}, [1, "a"], {"a": None}])


def _one_line(exc: BaseException) -> None:
    assert isinstance(exc, UsageError), repr(exc)
    assert "\n" not in str(exc).strip() and str(exc), repr(exc)


# --- the gate ----------------------------------------------------------------------------

def test_the_gate_refuses_what_is_no_regular_file(tmp_path):
    """A FIFO (which would block), a device (which never ends), a folder, a symlink loop,
    a file over its cap, text that is not UTF-8, a document nested too deep: each one line
    naming the file, at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (reading.CAPS["text"] + 1))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"name = 'caf\xe9'\n")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 3000 + "]" * 3000)
    deep_toml = tmp_path / "deep.toml"
    deep_toml.write_text("a = " + "[" * 3000 + "]" * 3000)
    cases = {fifo: "is a FIFO, not a regular file", Path("/dev/zero"): "is a device",
             tmp_path: "is a folder", loop: "is a loop of symbolic links",
             big: "more than the 4 MiB such a file can be",
             latin: "is not UTF-8 text (byte 11 is 0xe9)",
             deep: f"nests more than {MAX_DEPTH} levels", tmp_path / "none": "does not exist",
             deep_toml: f"nests more than {MAX_DEPTH} levels"}
    for path, said in cases.items():
        reader = reading.read_toml if path.suffix == ".toml" else reading.read_json
        with pytest.raises(BadFile) as caught:
            reader(path, "thing")
        assert said in str(caught.value) and str(path) in str(caught.value), caught.value
        _one_line(caught.value)


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_through_the_json_and_toml_readers(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "fuzz.bin"
    path.write_bytes(data)
    for reader in (reading.read_json, reading.read_toml):
        try:
            reader(path, "thing")
        except UsageError as exc:
            _one_line(exc)


# --- manifests: every reader of one ------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory, datasets_dir, tiny):
    """One real run's manifest (2 steps), as the template the fuzz damages."""
    from ddlstudy.config import RunConfig, with_overrides
    from ddlstudy.runner import run

    runs = tmp_path_factory.mktemp("finished")
    cfg = RunConfig(usecase=with_overrides(tiny, epochs=1), datasets_dir=datasets_dir,
                    runs_dir=runs, sample_hz=0, max_steps=2, max_val_steps=1)
    folder = run(cfg, show_progress=False)
    return json.loads((folder.path / MANIFEST).read_text())


def _paths(value, prefix=()):
    """Every key path of a JSON document (lists by index)."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


def _damaged(manifest, where, value, delete):
    doc = copy.deepcopy(manifest)
    if not where:
        return value
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    if delete and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return doc


@FUZZ
@given(data=st.data(), value=ODD | JSON, delete=st.booleans())
def test_a_damaged_manifest_is_read_or_refused_by_every_reader(finished, tmp_path_factory,
                                                                 data, value, delete):
    """One field of a real manifest replaced by anything (or deleted): load, replay's
    config, compare, resume's reading and the report either work or refuse in one line;
    the report of a folder with that run and a good one still shows the good one."""
    where = data.draw(st.sampled_from(list(_paths(finished))))
    doc = _damaged(finished, where, value, delete)
    root = tmp_path_factory.mktemp("damaged")
    for name, m in (("good", finished), ("bad", doc)):
        (root / name).mkdir()
        (root / name / MANIFEST).write_text(json.dumps(m))
    try:
        m = read_manifest(root / "bad")
        config_from_manifest(m)
        compare(m, finished)
    except UsageError as exc:
        _one_line(exc)
    report = Report(root)  # never dies of one run
    assert finished["id"] in set(report.runs.run)


@FUZZ
@given(data=st.data(), value=ODD | JSON, delete=st.booleans())
def test_a_damaged_study_record_or_advice_is_refused_in_one_line(tmp_path_factory, data,
                                                                   value, delete):
    study = {"name": "s", "plan": "p.toml", "repeat": 1, "started_at": "t", "cells": [
        {"id": "c", "usecase": "tiny", "label": "sequential", "strategy": "sequential",
         "backend": "local", "flags": {"epochs": 1}, "repeat": 1, "status": "completed",
         "reason": "", "run": "r1", "seconds": 1.0}]}
    advice = {"usecase": "tiny", "link": "loopback", "ranking": [
        {"flags": {"strategy": "cpu-intraop", "threads": 2}, "runnable": True}]}
    root = tmp_path_factory.mktemp("records")
    for name, doc, model in (("study.json", study, formats.Study),
                             ("advise.json", advice, formats.Advice)):
        where = data.draw(st.sampled_from(list(_paths(doc))))
        (root / name).write_text(json.dumps(_damaged(doc, where, value, delete)))
        try:
            formats.load(root / name, model, name)
            if name == "advise.json":
                advice_plan(root / name, top=1)
        except UsageError as exc:
            _one_line(exc)


# --- small files --------------------------------------------------------------------------

@FUZZ
@given(text=st.text(max_size=120))
def test_any_hostfile_or_secret_file(tmp_path_factory, text):
    path = tmp_path_factory.getbasetemp() / "small"
    path.write_text(text)
    for reader in (read_hostfile, read_secret):
        try:
            reader(path)
        except UsageError as exc:
            _one_line(exc)
            assert "/etc" not in str(exc) or str(path) in str(exc)


def test_a_hostfile_never_echoes_a_foreign_file(tmp_path):
    """A hostfile of /etc/passwd is refused without printing a line of it."""
    with pytest.raises(UsageError) as caught:
        read_hostfile(Path("/etc/passwd"))
    first = Path("/etc/passwd").read_text().splitlines()[0]
    assert first not in str(caught.value) and "line 1" in str(caught.value)


@FUZZ
@given(doc=JSON)
def test_any_cache_index_is_used_or_ignored(tmp_path_factory, doc):
    """A damaged cache index means decoding again, never a crash."""
    from ddlstudy.data.cache import _complete

    index = tmp_path_factory.getbasetemp() / "index.json"
    index.write_text(json.dumps(doc))
    assert _complete(index, index.with_suffix(".npy"), ["a/b.png"], 64) is None


@FUZZ
@given(data=st.binary(max_size=300))
def test_any_samples_file_is_read_or_refused(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "samples.parquet"
    path.write_bytes(data)
    try:
        reading.read_parquet(path, "samples")
    except UsageError as exc:
        _one_line(exc)


def test_a_manifest_without_epochs_is_refused_by_resume(finished, tmp_path, capsys):
    from ddlstudy.cli import main

    doc = {k: v for k, v in finished.items() if k != "epochs"} | {"status": "interrupted"}
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(doc))
    assert main(["run", "--resume", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "epochs: is required" in err and "Traceback" not in err
    assert load_manifest.__name__ and json.loads((tmp_path / "r" / MANIFEST).read_text()) == doc


# --- through the command line -------------------------------------------------------------

def test_a_fifo_or_latin_1_file_is_refused_at_once_by_every_command(tmp_path, capsys):
    """A FIFO would block a reader for ever; a file saved as Latin-1 would raise
    UnicodeDecodeError. Each is one line, exit 2, for each kind of file a user gives."""
    from ddlstudy.cli import main

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[study]\nname = 'caf\xe9'\n")
    runs = ["--runs-dir", str(tmp_path / "runs")]
    weights = tmp_path / "weights.pt"
    os.mkfifo(weights)
    assert main(["run", "--init-weights", str(weights), *runs]) == 2
    assert "weights.pt: is a FIFO" in capsys.readouterr().err
    for path, said in ((fifo, "is a FIFO"), (latin, "is not UTF-8 text")):
        for argv in (["run", "--usecase", str(path), *runs], ["study", str(path)],
                     ["run", "--backend", "mpi", "--hostfile", str(path), *runs],
                     ["run", "--backend", "spark", "--spark-master", "spark://h:7077",
                      "--spark-secret-file", str(path), *runs]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert said in err and err.count("\n") == 1 and str(path) in err, err
    assert not (tmp_path / "runs").exists()


def test_an_image_name_that_is_not_utf8_is_refused_naming_it(imagefolder, tmp_path, capsys):
    from ddlstudy.cli import main

    first = next((imagefolder / "fire").iterdir())
    os.rename(bytes(first), bytes(first.parent) + b"/caf\xe9.png")
    code = main(["run", "--data-dir", str(imagefolder), "--runs-dir", str(tmp_path / "r"),
                 "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "caf\\udce9.png" in err and "is not UTF-8 text" in err, err


def test_a_home_of_no_user_is_refused_but_help_still_works(tmp_path):
    import subprocess
    import sys

    env = os.environ | {"DDLSTUDY_HOME": "~nosuchuser-ddlstudy/x"}
    ddlstudy = [sys.executable, "-m", "ddlstudy"]
    assert subprocess.run([*ddlstudy, "--help"], env=env, capture_output=True).returncode == 0
    out = subprocess.run([*ddlstudy, "report", str(tmp_path)], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 2 and "names no user's home" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_single_process_run_logs_no_rank(tmp_path, capsys, monkeypatch):
    import logging

    from ddlstudy.logs import setup_logging

    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    setup_logging()
    logging.getLogger("ddlstudy").info("hello")
    monkeypatch.setenv("RANK", "3")
    logging.getLogger("ddlstudy").info("worker")
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(" hello") and "[rank" not in err[0]
    assert err[1].endswith(" [rank 3] worker")


def test_target_accuracy_none_measures_no_time_to_accuracy(cli):
    code, err, runs = cli("run", "--target-accuracy", "none", "--max-steps", "2",
                          "--no-snapshot", "--quiet")
    assert code == 0, err
    manifest = json.loads(next(runs.glob("*/manifest.json")).read_text())
    assert manifest["config"]["usecase"]["train"]["target_accuracy"] is None
    assert manifest["time_to_target"]["reached"] is None


def test_the_formats_reference_is_generated_from_the_schemas():
    """docs/formats.md is what `python -m ddlstudy.records.formats` writes: the reference cannot
    drift from the checks (regenerate it when a schema changes)."""
    written = (Path(__file__).parents[1] / "docs" / "formats.md").read_text()
    assert written == formats.reference() + "\n"
    assert "| `epochs[].steady_images_per_s` | number >= 0 | yes |" in written


def test_a_replay_never_writes_at_a_recorded_data_path(finished, datasets_dir, tmp_path,
                                                       monkeypatch, capsys):
    """A manifest from another machine records its datasets folder; the replay makes the
    set where this user keeps data sets (here, the tests' own), never at that path."""
    import ddlstudy.config
    from ddlstudy.cli import main

    elsewhere = tmp_path / "alice" / "datasets"
    doc = copy.deepcopy(finished)
    doc["config"]["datasets_dir"] = str(elsewhere)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / MANIFEST).write_text(json.dumps(doc))
    monkeypatch.setattr(ddlstudy.config, "DEFAULT_DATASETS_DIR", datasets_dir)
    assert main(["replay", str(tmp_path / "run"), "--runs-dir", str(tmp_path / "r")]) == 0
    assert f"replay: {elsewhere} holds no synthetic-tiny" in capsys.readouterr().err
    assert not (tmp_path / "alice").exists()
    replayed = json.loads(next((tmp_path / "r").glob(f"*/{MANIFEST}")).read_text())
    assert replayed["config"]["datasets_dir"] == str(datasets_dir)


def test_the_manifest_schema_version_is_the_one_written():
    from ddlstudy.records.runfolder import SCHEMA_VERSION

    assert formats.SCHEMA_VERSION == SCHEMA_VERSION


def test_a_damaged_samples_file_is_kept_aside_not_lost(finished, tmp_path):
    """Resuming a run whose samples.parquet was damaged: the file is kept as
    samples.parquet.damaged (never overwritten), the new samples are written."""
    from ddlstudy.records.runfolder import RunFolder

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(finished))
    (tmp_path / "r" / "samples.parquet").write_bytes(b"PAR1 not parquet PAR1")
    folder = RunFolder.open(tmp_path / "r")
    frame = folder.write_samples([{"time": 1.0, "scope": "node", "rank": 0}])
    assert len(frame) == 1
    assert (tmp_path / "r" / "samples.parquet.damaged").read_bytes() == \
        b"PAR1 not parquet PAR1"


def test_a_samples_file_without_its_time_column_is_kept_aside(finished, tmp_path):
    """A readable samples.parquet of other columns cannot be merged by time: it is kept
    as samples.parquet.damaged, not overwritten by the new samples."""
    import pandas as pd

    from ddlstudy.records.runfolder import RunFolder

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(finished))
    pd.DataFrame({"other": [1.0, 2.0]}).to_parquet(tmp_path / "r" / "samples.parquet")
    frame = RunFolder.open(tmp_path / "r").write_samples([{"time": 1.0, "scope": "node",
                                                           "rank": 0}])
    assert list(frame.time) == [1.0]
    kept = pd.read_parquet(tmp_path / "r" / "samples.parquet.damaged")
    assert list(kept.other) == [1.0, 2.0]


# --- fields every reader relies on (probe 38) ----------------------------------------------

def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("pid, said", [
    ("abc", "pid: must be a valid integer (got 'abc')"),
    (10**30, "pid: must be less than 2147483648"),
    (True, "pid: must be a valid integer (got True)"),
    (0, "pid: must be greater than or equal to 1")])
def test_a_recorded_pid_that_is_no_process_id_is_refused_by_resume(finished, tmp_path, capsys,
                                                                   pid, said):
    """``run --resume`` asks whether the recorded PID still runs: a PID of text, beyond any
    kernel's, or a boolean is refused in one line (not a TypeError, an OverflowError or
    'still running (PID True)'), and the run folder is left as it was."""
    from ddlstudy.cli import main

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(finished | {"status": "running",
                                                                  "pid": pid}))
    before = _files(tmp_path)
    assert main(["run", "--resume", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlstudy: error: run manifest ") and err.count("\n") == 1, err
    assert said in err and str(tmp_path / "r" / MANIFEST) in err, err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("weights, said", [
    ({"file": 5, "sha256": "ab"}, "model.init_weights.file: must be a valid string (got 5)"),
    ({"file": "w.pt", "sha256": "ab"}, "model.init_weights.sha256: string should match "
                                       "pattern '^[0-9a-f]{64}$' (got 'ab')"),
    ({"sha256": "0" * 64}, "model.init_weights.file: is required")])
def test_recorded_initial_weights_of_another_shape_are_refused_by_replay(finished, tmp_path,
                                                                        capsys, weights, said):
    """replay compares the initial weights' file with its recorded sha256: a recorded file
    that is no path, or a sha256 that is no hash, is refused in one line before anything
    is prepared or written."""
    from ddlstudy.cli import main

    (tmp_path / "r").mkdir()
    doc = finished | {"model": (finished.get("model") or {}) | {"init_weights": weights}}
    (tmp_path / "r" / MANIFEST).write_text(json.dumps(doc))
    before = _files(tmp_path)
    assert main(["replay", str(tmp_path / "r"), "--runs-dir", str(tmp_path / "out"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlstudy: error: run manifest ") and err.count("\n") == 1, err
    assert said in err, err
    assert _files(tmp_path) == before and not (tmp_path / "out").exists()


@FUZZ
@given(columns=st.dictionaries(st.sampled_from(["time", "rank", "host", "scope", "t_s",
                                                "proc_cpu_percent", "proc_threads", "x"]),
                               st.sampled_from([[1.0, 2.0], [0, 1], ["a", "b"], [True, False],
                                                [None, None], [1.5, float("nan")],
                                                [float("inf"), 1.0], [1e12, 0.0],
                                                [-1.0, 1.0], ["a", 1]]),
                               max_size=6))
def test_any_samples_table_is_read_valid_or_refused(tmp_path_factory, columns):
    """Any table as samples.parquet: ``read_samples`` gives one whose ddlstudy columns
    hold what the schema says, or refuses it in one line naming the file and the column."""
    import pandas as pd

    from ddlstudy.machine.sampler import KINDS, read_samples

    path = tmp_path_factory.getbasetemp() / "samples-table.parquet"
    try:
        pd.DataFrame(columns).to_parquet(path)
    except Exception:  # noqa: BLE001 - pyarrow refuses mixed columns: not a table
        return
    try:
        frame = read_samples(path)
    except UsageError as exc:
        _one_line(exc)
        assert str(path) in str(exc)
        return
    for column in set(frame) & {"host", "scope"}:
        assert all(isinstance(v, str) for v in frame[column].dropna())
    for column in set(frame) & {"time", "rank", "t_s", "proc_cpu_percent", "proc_threads"}:
        values = frame[column].dropna().astype(float)
        assert values.abs().lt(float("inf")).all()
        assert KINDS.get(column) != "integer" or (values % 1 == 0).all()


# --- the probe of stop 38's last ten: one place for each class -----------------------------

def _hosts_record(folder: Path, complete: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ddl.json").write_text(json.dumps({
        "hosts": {"prefix": "ddl", "count": 2, "subnet": "10.77.0", "delay": None,
                  "rate": None, "cpus": None},
        "complete": complete,
        "made": {k: [] for k in ("namespaces", "veths", "bridges", "etc", "cgroups", "files")}}))


@pytest.mark.parametrize("complete, said", [
    (False, "emulated hosts 'ddl' were not fully made (an interrupted hosts up"),
    (True, "emulated host(s) ddl-h1, ddl-h2 of 'ddl' are gone (a reboot?)")])
def test_hosts_status_of_a_set_half_made_or_gone_is_an_answer(tmp_path, capsys, monkeypatch,
                                                              complete, said):
    """`hosts status` answers what state the set is in, with the command that mends it
    (exit 0, no flag it does not have); a run given --hosts emulated still refuses it,
    naming --hosts."""
    from ddlstudy import hosts
    from ddlstudy.cli import main
    from ddlstudy.errors import ConfigError
    from ddlstudy.hosts import namespaces, spec

    monkeypatch.setattr(spec, "STATE_DIR", tmp_path / "hosts")
    monkeypatch.setattr(namespaces, "_namespaces", lambda: set())  # none here: all gone
    _hosts_record(tmp_path / "hosts", complete)
    assert main(["hosts", "status"]) == 0
    out, err = capsys.readouterr()
    assert said in out and "run: ddlstudy hosts down --prefix ddl && ddlstudy hosts up " \
        "--count 2 --prefix ddl" in out, out
    assert err == "" and "--hosts" not in out
    with pytest.raises(ConfigError, match="^--hosts: ") as refused:
        hosts.load("ddl")
    assert said in str(refused.value)


def _run_copy(finished, tmp_path: Path) -> Path:
    """A copy of the finished run's folder."""
    import shutil

    source = Path(finished["config"]["runs_dir"]) / finished["id"]
    return Path(shutil.copytree(source, tmp_path / "runs" / finished["id"]))


def test_a_model_name_is_refused_naming_where_it_came_from(finished, tmp_path, capsys):
    """A model name that no longer builds is refused naming where it was written: a run's
    manifest (export model has no --model), a use case's [model] arch (``named``, which
    renames every refusal of the model, ddlstudy.models' too), or --model itself."""
    from ddlstudy.cli import main
    from ddlstudy.config import ModelSpec
    from ddlstudy.errors import ConfigError
    from ddlstudy.models import check
    from ddlstudy.models.sources import named

    run = _run_copy(finished, tmp_path)
    doc = copy.deepcopy(finished)
    doc["config"]["usecase"]["model"] = {"arch": "nosuchnet"}
    (run / MANIFEST).write_text(json.dumps(doc))
    assert main(["export", "model", str(run), "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ddlstudy: error: run manifest {run / MANIFEST}: config.usecase."
                          f"model.arch: unknown model 'nosuchnet'") and "--model" not in err, err
    assert err.count("\n") == 1 and not (tmp_path / "m.pt").exists()
    for spec, said in ((ModelSpec(arch="nosuchnet"), "unknown model 'nosuchnet'"),
                       (ModelSpec(arch="alexnet", width=0.25), "is too small")):
        with pytest.raises(ConfigError) as refused, named("model.arch in /x/u.toml"):
            check(spec, 3, 8 if spec.arch == "alexnet" else 64)
        assert refused.value.field in ("model.arch in /x/u.toml", "train.image_size")
        assert said in str(refused.value), refused.value
    with pytest.raises(ConfigError, match="^--model: unknown model"), named("--model"):
        check(ModelSpec(arch="nosuchnet"), 3, 64)


def test_a_folder_tracking_store_is_checked_in_ddlstudys_words(tmp_path):
    """A file: URI's folder is checked as any folder ddlstudy writes into, before MLflow
    sees it; one that can be made is a store MLflow keeps (not its 'maintenance mode')."""
    pytest.importorskip("mlflow")
    from ddlstudy.errors import ConfigError
    from ddlstudy.exports.mlflow import store

    (tmp_path / "afile").write_text("x")
    for uri, said in (("file:///sys/x", "/sys/x cannot be"),
                      (f"file://{tmp_path}/afile/store", f"{tmp_path}/afile/store cannot be "
                                                          f"made: {tmp_path}/afile is a file")):
        with pytest.raises(ConfigError) as refused:
            store.client(uri)
        assert str(refused.value).startswith(f"tracking URI {uri}: {said}"), refused.value
        assert "MLflow" not in str(refused.value)
    assert store.client(f"file://{tmp_path}/store").search_experiments() is not None
    assert (tmp_path / "store").is_dir()


def test_every_reader_of_samples_refuses_a_bad_file_alike(finished, tmp_path, capsys):
    """samples.parquet is read by sampler.read_samples alone: export tensorboard, export
    mlflow and a resumed run's merge refuse (or keep aside) a column of the wrong kind with
    the same words."""
    from importlib.util import find_spec

    import pandas as pd

    from ddlstudy.cli import main
    from ddlstudy.records.runfolder import RunFolder

    run = _run_copy(finished, tmp_path)
    said = "column proc_cpu_percent must hold numbers, not str 'busy'"
    pd.DataFrame({"time": [1.7e9], "t_s": [0.5], "rank": [0], "scope": ["node"], "host": ["h"],
                  "proc_cpu_percent": ["busy"]}).to_parquet(run / "samples.parquet")
    exports = [["export", "tensorboard", str(run), "--out", str(tmp_path / "tb")]]
    if find_spec("mlflow") is not None:
        exports.append(["export", "mlflow", str(run), "--tracking-uri",
                        f"sqlite:///{tmp_path}/mlflow.db"])
    for argv in exports:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and str(run / "samples.parquet") in err, err
    frame = RunFolder.open(run).write_samples([{"time": 1.7e9, "scope": "node", "rank": 0}])
    assert len(frame) == 1 and (run / "samples.parquet.damaged").exists()
    assert said in capsys.readouterr().err


def test_a_manifest_s_memory_record_is_checked_against_its_schema(finished, tmp_path):
    """backend.memory (what each process held) is in the manifest's schema: a real run
    records it; a damaged figure is refused naming its field."""
    memory = finished["backend"]["memory"]
    assert memory["per_rank"][0]["peak_rss_bytes"] > 0 and memory["per_host_bytes"]
    doc = copy.deepcopy(finished)
    doc["backend"]["memory"]["per_rank"][0]["peak_rss_bytes"] = "big"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"backend\.memory\.per_rank\[0\]\.peak_rss_bytes: "
                                         "must be a valid integer"):
        read_manifest(tmp_path / "bad")
