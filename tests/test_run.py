"""The walking skeleton end to end on the tiny use case."""

import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from ddlstudy.config import RunConfig, with_overrides
from ddlstudy.errors import ConfigError
from ddlstudy.machine.sampler import COLUMNS
from ddlstudy.records.runfolder import MANIFEST, METRICS, SAMPLES, SNAPSHOT, STEPS, RunFolder
from ddlstudy.report import config_label
from ddlstudy.runner import resolve, run


def _metrics(folder):
    return pd.read_csv(folder.path / METRICS)


@pytest.mark.slow
def test_tiny_learns_and_writes_a_complete_run_folder(quick_config, tiny):
    folder = run(quick_config(epochs=tiny.train.epochs, sample_hz=10), show_progress=False)
    manifest = json.loads((folder.path / MANIFEST).read_text())
    metrics = _metrics(folder)
    assert len(metrics) == tiny.train.epochs
    # Three balanced classes: chance is 1/3. A fixed seed makes this exact run repeatable.
    assert metrics["val_accuracy"].max() >= 0.5
    assert metrics["train_loss"].iloc[-1] < metrics["train_loss"].iloc[0]
    assert (metrics["train_images"] == 240).all() and (metrics["images_per_s"] > 0).all()
    assert manifest["status"] == "completed" and manifest["exit_code"] == 0
    for key in ("command", "config", "seeds", "git", "versions", "host", "data", "started_at",
                "ended_at", "epochs", "summary", "strategy"):
        assert manifest[key] not in (None, "", {}), key
    assert manifest["strategy"] == {"name": "sequential", "processes": 1,
                                    "threads_per_process": 1, "loader_workers": 0}
    assert manifest["config"]["usecase"]["train"]["epochs"] == tiny.train.epochs
    assert manifest["versions"]["torch"].startswith("2.14.1")
    assert manifest["host"]["usable_cores"] >= 1
    data = manifest["data"]
    assert (data["images"], data["train_images"], data["val_images"]) == (300, 240, 60)
    assert data["fingerprint"] == data["sums_file_sha256"] and len(data["fingerprint"]) == 64
    assert manifest["epochs"][-1]["val_accuracy"] == pytest.approx(metrics["val_accuracy"].iloc[-1])
    samples = pd.read_parquet(folder.path / SAMPLES)
    assert list(samples.columns) == list(COLUMNS) and len(samples) >= 5
    assert manifest["samples"]["rows"] == len(samples)
    state = torch.load(folder.path / SNAPSHOT, weights_only=True)
    assert state["epoch"] == tiny.train.epochs and "features.0.weight" in state["model"]


@pytest.mark.slow
def test_same_seed_same_metrics_other_seed_differs(quick_config):
    runs = [run(quick_config(epochs=2, seed=s, snapshot=False), show_progress=False)
            for s in (4, 4, 5)]
    a, b, c = (_metrics(f) for f in runs)
    cols = ["train_loss", "train_accuracy", "val_loss", "val_accuracy"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert not a[cols].equals(c[cols])


def test_the_warm_up_raises_the_learning_rate_linearly_then_holds_it():
    from ddlstudy.config import TrainSpec
    from ddlstudy.training.recipe import schedule as made

    def warmup(optimizer, epochs, steps_per_epoch):
        return made(optimizer, TrainSpec(lr_warmup_epochs=epochs), steps_per_epoch)

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    schedule = warmup(optimizer, 1.5, 4)  # 6 steps
    seen = []
    for _ in range(9):
        seen.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(1)
        optimizer.step()
        schedule.step()
    assert seen == pytest.approx([0.1 * s / 6 for s in range(1, 7)] + [0.1] * 3)
    assert warmup(optimizer, 0, 4) is None and warmup(optimizer, 0.25, 4) is None


def test_a_warm_up_changes_the_first_epoch_and_is_recorded(quick_config):
    plain, warm = (run(quick_config(epochs=2, lr_warmup_epochs=w, max_steps=4, snapshot=False),
                       show_progress=False) for w in (0, 1))
    a, b = _metrics(plain), _metrics(warm)
    assert a["train_loss"][0] != b["train_loss"][0]
    train = json.loads((warm.path / MANIFEST).read_text())["config"]["usecase"]["train"]
    assert train["lr_warmup_epochs"] == 1


def test_max_steps_cuts_epochs_short(quick_config):
    folder = run(quick_config(epochs=1, max_steps=3, snapshot=False), show_progress=False)
    assert _metrics(folder)["steps"].tolist() == [3]
    assert _metrics(folder)["train_images"].tolist() == [48]


def test_a_failing_run_says_so_in_its_manifest(quick_config, imagefolder, monkeypatch):
    """An image that vanishes after the check makes training fail: recorded, not hidden."""
    import ddlstudy.runner.lifecycle as runner_module

    real_prepare = runner_module.prepare_data

    def prepare_then_lose_the_images(cfg):
        plan = real_prepare(cfg)
        for rel, _ in plan.train:
            (imagefolder / rel).unlink()
        return plan

    monkeypatch.setattr(runner_module, "prepare_data", prepare_then_lose_the_images)
    with pytest.raises(runner_module.RunFailed) as failed:  # (a decoded cache would not
        run(quick_config(data_dir=imagefolder, data_cache=False),  # need them)
            show_progress=False)
    folder = failed.value.folder
    manifest = json.loads((folder.path / MANIFEST).read_text())
    assert failed.value.exit_code == 1
    assert manifest["status"] == "failed" and manifest["exit_code"] == 1
    assert "FileNotFoundError" in manifest["error"] and manifest["epochs"] == []
    assert "Traceback" in (folder.path / "error.log").read_text()
    assert (folder.path / SAMPLES).exists()


def test_sigterm_leaves_an_interrupted_manifest(tmp_path, datasets_dir):
    runs = tmp_path / "runs"
    env = os.environ | {"PYTHONUNBUFFERED": "1", "DDLSTUDY_STARTED_AT": "0"}  # a stale one
    launched = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlstudy", "run", "--usecase", "tiny", "--epochs", "200",
         "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not list(runs.glob("*/metrics.csv")):
        time.sleep(0.2)
    first_epoch_seen = time.time() - launched
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out
    manifest = json.loads(next(runs.glob(f"*/{MANIFEST}")).read_text())
    assert manifest["status"] == "interrupted" and manifest["exit_code"] == 143
    assert 1 <= len(manifest["epochs"]) < 200
    assert 0 < manifest["first_step_s"] < first_epoch_seen  # from the command, not before
    # its start ran no full pass of the collector (at Python's thresholds: 6 over
    # simple-big's), only young ones
    passes = manifest["startup"]["collector"]["passes"]
    assert passes[0] > 0 and passes[2] == 0, passes
    assert "Traceback" not in out
    assert not list(runs.glob("*/.*tmp*"))  # no temporary file left
    torch.load(next(runs.glob(f"*/{SNAPSHOT}")), weights_only=True)  # last snapshot loads


def test_a_workers_copy_writes_nothing_over_a_run_its_process_closed(tmp_path):
    """A Spark task's rank 0 writes each epoch, its steps and its snapshot from its own copy
    of the run folder. Once the run's own process has closed the run (a Ctrl-C: status
    interrupted), a task still training writes none of them: the run reads as
    interrupted, with the epochs and snapshot it closed with. Until then the worker's
    records are written, and the run's own process writes whatever the status."""
    folder = RunFolder.create(tmp_path, "r1", {"usecase": "tiny"})
    worker = pickle.loads(pickle.dumps(folder))  # as a task receives it
    epoch = {"train_loss": 1.0, "epoch_time_s": 0.5}
    worker.record_epoch({"epoch": 1} | epoch)
    worker.record_steps([(1, 1, 1.0, 16, 0.2)])
    worker.save_snapshot({"epoch": 1})
    folder.reload_epochs()
    folder.finish("interrupted", 130, "interrupted by SIGINT (Ctrl-C)")
    worker.record_epoch({"epoch": 2} | epoch)
    worker.record_steps([(2, 1, 0.9, 16, 0.2)])
    worker.save_snapshot({"epoch": 2})
    worker.write_manifest()
    written = json.loads((folder.path / MANIFEST).read_text())
    assert written["status"] == "interrupted" and written["exit_code"] == 130
    assert [e["epoch"] for e in written["epochs"]] == [1]
    assert pd.read_csv(folder.path / METRICS)["epoch"].tolist() == [1]
    assert pd.read_csv(folder.path / STEPS)["epoch"].tolist() == [1]
    assert torch.load(folder.path / SNAPSHOT, weights_only=True) == {"epoch": 1}
    folder.manifest["note"] = "the run's own"
    folder.write_manifest()
    assert json.loads((folder.path / MANIFEST).read_text())["note"] == "the run's own"


def test_a_process_start_is_read_on_the_wall_clock():
    """first_step_s counts from the command's process start: psutil's create_time read it
    0.96 s early on a VM whose boot time had drifted."""
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import time; now = time.time(); "
         "from ddlstudy.machine.environment import process_start; print(process_start(), now)"],
        capture_output=True, text=True, check=True).stdout
    after = time.time()
    started, now = map(float, out.split())
    assert before - 0.05 <= started <= now <= after  # a clock tick is 10 ms


def test_the_collector_is_eased_through_a_start_only_and_then_left_out_what_it_made():
    """``collector.settled`` at the first step: where the process's own start called
    ``starting``, the start's objects frozen and Python's thresholds back; in a process
    that calls runs (this test session), nothing."""
    from ddlstudy.machine import collector

    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    collector.settled()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)
    assert collector.figures() is None
    code = ("import gc; from ddlstudy.machine import collector as c; d = gc.get_threshold(); "
            "c.starting(); raised = gc.get_threshold(); "
            "made = [[i] for i in range(300_000)]; gc.collect(0); c.settled(); "
            "import json; print(json.dumps([d == gc.get_threshold(), raised, "
            "gc.get_freeze_count(), c.figures()]))")
    back, raised, frozen, counted = json.loads(subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert back and raised == [20_000, 10, 10]
    assert frozen > 300_000  # the lists made, out of every later pass
    assert counted["passes"][0] >= 15 and counted["passes"][2] == 0, counted


def test_sigterm_between_an_epochs_record_and_its_snapshot_waits_for_the_snapshot(
        quick_config, monkeypatch):
    """The window CI once hit: the epoch is on record, the signal lands before its snapshot
    is written. The snapshot is written first, so every recorded epoch can be resumed."""
    import ddlstudy.records.runfolder as runfolder_module
    import ddlstudy.runner.lifecycle as runner_module

    real_record = runfolder_module.RunFolder.record_epoch

    def record_then_terminate(self, result, *rest):
        real_record(self, result, *rest)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here

    monkeypatch.setattr(runfolder_module.RunFolder, "record_epoch", record_then_terminate)
    with pytest.raises(runner_module.RunFailed) as stopped:
        run(quick_config(epochs=3), show_progress=False)
    path = stopped.value.folder.path
    assert stopped.value.exit_code == 143
    assert len(json.loads((path / MANIFEST).read_text())["epochs"]) == 1
    assert torch.load(path / SNAPSHOT, weights_only=True)["epoch"] == 1


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, datasets_dir, tiny):
    """cpu-processes on two ranks through shared memory (the default transport), 16
    images a step at lr 0.006 for 2 epochs, sampled at 20 Hz: run once for the tests that
    read it."""
    cfg = RunConfig(usecase=with_overrides(tiny, epochs=2, batch_size=16, lr=0.006),
                    datasets_dir=datasets_dir, runs_dir=tmp_path_factory.mktemp("ranks"),
                    sample_hz=20, snapshot=False, strategy="cpu-processes", workers=2)
    return run(cfg, show_progress=False)


def test_cpu_processes_through_shared_memory_train_as_over_gloo(quick_config, two_ranks):
    """Two ranks on one host average through /dev/shm by default, and learn what DDP over
    gloo learns: (a + b) / 2 and a / 2 + b / 2 are the same floats. The first run also
    merges every worker's samples into its own."""
    runs = [two_ranks, run(quick_config(strategy="cpu-processes", workers=2, epochs=2,
                                        batch_size=16, lr=0.006, snapshot=False,
                                        transport="gloo"), show_progress=False)]
    assert [r.manifest["transport"] for r in runs] == ["shared-memory", "gloo"]
    assert [r.manifest["config"]["transport"] for r in runs] == ["auto", "gloo"]
    assert [config_label(r.manifest) for r in runs] == [  # unlike runs: unlike rows
        "cpu-processes (2 processes)", "cpu-processes (2 processes) over gloo"]
    losses = [[e["train_loss"] for e in r.manifest["epochs"]] for r in runs]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert losses[0][1] < losses[0][0]
    _merges_every_workers_samples(runs[0])


def _merges_every_workers_samples(folder):
    samples = pd.read_parquet(folder.path / SAMPLES)
    workers = samples[samples["scope"] == "worker"]
    assert sorted(workers["rank"].unique()) == [0, 1]
    assert (workers["proc_count"] == 1).all()
    node = samples[samples["scope"] == "node"]
    assert len(node) and node["proc_count"].max() >= 3  # this process and its two ranks
    assert samples["time"].is_monotonic_increasing
    assert not list(folder.path.glob(".samples-rank*"))
    assert folder.manifest["samples"]["workers_sampled"] == 2


def test_cpu_intraop_records_its_threads(quick_config):
    folder = run(quick_config(strategy="cpu-intraop", workers=2, snapshot=False),
                 show_progress=False)
    assert folder.manifest["strategy"]["threads_per_process"] == 2
    assert folder.manifest["status"] == "completed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_data_trains_on_the_gpus(quick_config):
    folder = run(quick_config(strategy="gpu-data", epochs=2, snapshot=False),
                 show_progress=False)
    assert folder.manifest["status"] == "completed"
    assert folder.manifest["strategy"]["backend"] == "nccl"
    assert folder.manifest["epochs"][-1]["train_images"] >= 239


def test_run_generates_a_missing_synthetic_set(tmp_path, tiny):
    import dataclasses

    from ddlstudy.config import RunConfig, with_overrides

    small = dataclasses.replace(tiny, data=dataclasses.replace(tiny.data, images=30,
                                                               name="fresh"))
    cfg = RunConfig(usecase=with_overrides(small, epochs=1), datasets_dir=tmp_path / "ds",
                    runs_dir=tmp_path / "runs", sample_hz=0, snapshot=False)
    folder = run(cfg, show_progress=False)
    assert len(list((tmp_path / "ds" / "fresh").rglob("*.jpg"))) == 30
    assert folder.manifest["data"]["source"] == "synthetic"
    assert folder.manifest["data"]["images"] == 30
    assert folder.manifest["status"] == "completed"


def test_doctor_finds_the_venvs_mpiexec(capsys):
    from ddlstudy.cli import main

    assert main(["doctor"]) == 0
    lines = {line[4:13].strip(): line for line in capsys.readouterr().out.splitlines()
             if line[:3] in ("ok ", "-- ")}
    expected = {"cores", "memory", "torch", "GPUs", "mpiexec", "mpi4py", "java", "pyspark"}
    assert expected <= set(lines)
    assert lines["mpiexec"].startswith("ok ") and "Version" in lines["mpiexec"]


def test_sigterm_during_a_write_lands_after_it(tmp_path):
    """The signal arrives mid-write: the file is finished and renamed, then Terminated."""
    from ddlstudy import signals
    from ddlstudy.records.runfolder import atomic_write

    target = tmp_path / "snapshot.bin"

    def write(f):
        f.write(b"a" * 1000)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here and only takes note
        f.write(b"b" * 1000)

    with signals.handled(), pytest.raises(signals.Terminated):
        atomic_write(target, write)
    assert target.read_bytes() == b"a" * 1000 + b"b" * 1000
    assert list(tmp_path.iterdir()) == [target]


@pytest.mark.slow
def test_half_precision_trains_tiny_as_fp32_does(quick_config):
    """Three epochs of each precision from the same seed: 16-bit rounding changes every
    loss, but each epoch's stays within 10 % of fp32's while all fall by half (measured,
    AMD EPYC: fp32 2.71, 1.24, 1.14; bf16 2.69, 1.20, 1.13; fp16 within 4 %). Autocast
    that never ran leaves fp32's losses; a scaler that never steps stays near 2.7; one
    that steps with scaled gradients diverges. (Best accuracies over ten epochs and three
    seeds, measured once: fp32 0.678, bf16 0.655, fp16 0.672; one seed's moves by 0.17.)"""
    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        m = run(quick_config(epochs=3, lr=0.001, seed=0, precision=precision, snapshot=False),
                show_progress=False).manifest
        assert m["config"]["precision"] == precision
        losses[precision] = [e["train_loss"] for e in m["epochs"]]
    fp32 = losses.pop("fp32")
    assert fp32[-1] < 0.5 * fp32[0], fp32
    for half, mine in losses.items():
        assert mine != fp32, half  # autocast really ran in 16 bits
        assert mine == pytest.approx(fp32, rel=0.1), (half, mine, fp32)


def test_fp16_scaler_skips_an_overflowing_step_and_lowers_its_scale():
    """A loss scale of 2^40 overflows float16 in backward: the step leaves the weights as
    they were and halves the scale, and the learning-rate warm-up does not count it; at a
    sane scale the next step moves them and the warm-up."""
    from torch import nn

    from ddlstudy.config import TrainSpec
    from ddlstudy.training import plain_step
    from ddlstudy.training.job import advance
    from ddlstudy.training.recipe import schedule as made

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    step = plain_step(model, optimizer, nn.CrossEntropyLoss(), scaler=scaler)
    batch = (torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
    schedule = made(optimizer, TrainSpec(lr_warmup_epochs=1.5), 4)  # 6 steps from lr 0.1 / 6
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast("cpu", dtype=torch.float16):
        step(batch)
    advance(schedule, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0 ** 39
    # the skipped step is not one of the warm-up's: its learning rate is still the first
    assert optimizer.skipped_step and optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 6)
    scaler.update(2.0 ** 8)
    with torch.autocast("cpu", dtype=torch.float16):
        step(batch)
    advance(schedule, optimizer)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not optimizer.skipped_step
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2 / 6)


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": "cpu-threads", "workers": 2}, "cpu-threads has no fp16 gradient scaler"),
    ({"snapshot_every": 2}, "fp16 runs cannot be resumed exactly yet"),
])
def test_fp16_where_no_scaler_is_wired_is_refused_with_the_reason(quick_config, kwargs,
                                                                   message):
    from ddlstudy.runner import preflight

    with pytest.raises(ConfigError, match=message):
        preflight(quick_config(precision="fp16", **kwargs))


def test_weak_scaling_grows_the_global_batch_with_the_workers(quick_config, two_ranks):
    weak = run(quick_config(strategy="cpu-processes", workers=2, batch_size=8,
                            scaling="weak", lr_scaling="linear", epochs=2),
               show_progress=False).manifest
    strong = two_ranks.manifest  # 16 images a step at lr 0.006
    assert weak["effective"]["global_batch"] == 16
    assert weak["effective"]["lr"] == pytest.approx(0.006)  # linear: 0.003 x 16 / 8
    assert [e["steps"] for e in weak["epochs"]] == [15, 15]  # 240 images / 16
    # 2 workers x 8 images with the scaled lr is the strong run of 16 at lr 0.006.
    assert [e["train_loss"] for e in weak["epochs"]] == \
        [e["train_loss"] for e in strong["epochs"]]
    seq = resolve(quick_config(scaling="weak", batch_size=8))
    assert seq.global_batch == 8 and seq.lr == pytest.approx(0.003)  # one worker
