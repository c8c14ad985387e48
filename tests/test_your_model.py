"""Your model, your data: torchvision networks and a network of one's own (with BatchNorm)
under every strategy and backend, and a new user's folder of images end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ddlstudy.records.runfolder import MANIFEST

OWN_NET = f"{Path(__file__).parent / 'models' / 'own_net.py'}:small_resnet"
SETUPS = {
    "sequential": [],
    "cpu-threads": ["--strategy", "cpu-threads", "--workers", "2"],
    "cpu-processes": ["--strategy", "cpu-processes", "--workers", "2"],
    "pipeline": ["--strategy", "pipeline", "--stages", "2"],
    "hybrid": ["--strategy", "hybrid", "--replicas", "2", "--stages", "2"],
    "mpi": ["--backend", "mpi", "--nodes", "2"],
    "spark": ["--backend", "spark", "--nodes", "2"],
    "spark-allgather": ["--backend", "spark", "--nodes", "2", "--spark-sync", "allgather",
                        "--sync-every", "2"],
}
# A network under every setup, the one of one's own under all but hybrid. MPI nodes and
# Spark tasks run the strategy's own worker, so what a torchvision network adds is where it
# is cut into stages: each one under the strategy that cuts it (hybrid's the one of its
# setup; the own network's stages are the pipeline's). Spark's gloo sync is MPI's path in a
# barrier task (the same worker, DDP over gloo: test_spark holds it to cpu-processes'
# bits); its allgather mode, which averages the weights and the BatchNorm buffers, is the
# Spark case here. One run a setup: the setups whose BatchNorm statistics are checked train
# the own network with the recipe in that test (checked for both), the replay test's run
# is sequential's.
BATCHNORM_SETUPS = ["cpu-threads", "cpu-processes", "pipeline", "mpi"]
CASES = [(OWN_NET, "spark-allgather"), ("resnet18", "pipeline"), ("mobilenet_v3_small", "hybrid")]
assert {s for _, s in CASES} | {"sequential", "spark", *BATCHNORM_SETUPS} == set(SETUPS)
RECIPE = ("--optimizer", "AdamW", "--optimizer-args", '{"weight_decay": 0.05}',
          "--lr-schedule", "cosine")
"""Every network trains with a recipe of one's own under every setup (each strategy and
backend builds the declared optimizer and schedule)."""


def ddlstudy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlstudy", *args], capture_output=True,
                          text=True, timeout=900, cwd=cwd)


def manifest_in(runs: Path) -> dict:
    (path,) = runs.glob(f"*/{MANIFEST}")
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("model, setup", CASES, ids=[f"{Path(m).name}-{s}" for m, s in CASES])
def test_any_model_trains_under_every_strategy_and_backend(model, setup, tmp_path,
                                                           datasets_dir):
    if setup.startswith("spark") and shutil.which("java") is None:
        pytest.skip("Spark needs Java")
    runs = tmp_path / "runs"
    out = ddlstudy("run", "--usecase", "tiny", "--model", model, "--epochs", "1",
                   "--max-steps", "3", "--no-snapshot", "--sample-hz", "0", "--quiet",
                   "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
                   *SETUPS[setup], *RECIPE)
    assert out.returncode == 0, out.stderr[-3000:]
    _trained_as_declared(manifest_in(runs), model, steps=3)


def _trained_as_declared(m: dict, model: str, steps: int) -> None:
    """The run completed ``steps`` steps of 16 images a epoch with ``model`` and the
    recipe (AdamW, cosine)."""
    assert m["status"] == "completed" and m["model"]["name"] == model
    train = m["config"]["usecase"]["train"]
    assert (train["optimizer"], train["lr_schedule"]) == ("AdamW", "cosine")
    assert m["model"]["buffers"] > 0  # all three have BatchNorm
    for epoch in m["epochs"]:
        assert epoch["train_images"] == 16 * steps and np.isfinite(epoch["train_loss"])
        assert 0 <= epoch["val_accuracy"] <= 1


@pytest.mark.slow
def test_a_model_of_ones_own_learns(quick_config):
    """Six epochs of the small residual network on tiny: here the loss went 1.09 -> 0.69
    and validation accuracy 0.32 -> 0.68 (chance 0.33)."""
    from ddlstudy.runner import run

    m = run(quick_config(model=OWN_NET, epochs=6, snapshot=False, lr=0.03),
            show_progress=False).manifest
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < 0.85 * losses[0], losses
    assert max(e["val_accuracy"] for e in m["epochs"]) >= 0.5


def _evaluated(cfg, state: dict) -> float:
    """The validation loss of ``state`` in this process, over the whole validation set."""
    from torch import nn

    from ddlstudy.data import prepare_data
    from ddlstudy.models import build_model
    from ddlstudy.runner import resolve
    from ddlstudy.training import evaluate, val_loader

    cfg = resolve(cfg)
    model = build_model(cfg.usecase.model, len(cfg.usecase.classes))
    model.load_state_dict(state)
    loss, _, seen = evaluate(model, val_loader(cfg, prepare_data(cfg)), nn.CrossEntropyLoss())
    return loss / seen


@pytest.mark.slow
@pytest.mark.parametrize("setup", BATCHNORM_SETUPS)
def test_batchnorm_statistics_follow_ddps_rule(setup, quick_config, tmp_path, datasets_dir):
    """Worker 0's running statistics are the model's (each pipeline stage its own): after
    the run they have moved from their initial values, every worker validated with them
    (the run's validation loss is worker 0's model's on the whole set), and the final
    model holds them (a stage's that were not gathered would still be initial). The run
    is also this setup's case of the network of one's own with its recipe (AdamW, cosine)
    under every strategy and backend."""
    cfg = quick_config(model=OWN_NET, epochs=2, max_steps=4, sample_hz=0)
    runs = tmp_path / "runs"
    flags = ["--usecase", "tiny", "--model", OWN_NET, "--epochs", "2", "--max-steps", "4",
             "--sample-hz", "0", "--quiet", "--datasets-dir", str(datasets_dir),
             "--runs-dir", str(runs), *SETUPS[setup], *RECIPE]
    out = ddlstudy("run", *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    m = manifest_in(runs)
    _trained_as_declared(m, OWN_NET, steps=4)
    state = torch.load(runs / m["id"] / "snapshot.pt", weights_only=True)["model"]
    means = [v for k, v in state.items() if k.endswith("running_mean")]
    variances = [v for k, v in state.items() if k.endswith("running_var")]
    assert len(means) == 4 and all(v.abs().sum() > 0 for v in means)  # moved from zeros
    assert all(not torch.allclose(v, torch.ones_like(v)) for v in variances)
    assert _evaluated(cfg, state) == pytest.approx(m["epochs"][-1]["val_loss"], rel=1e-4)


def _pets(root: Path) -> Path:
    """A folder of one's own: three classes of 64 px images, each class its own colour."""
    rng = np.random.default_rng(0)
    for name, colour in {"birds": (200, 60, 40), "cats": (40, 180, 70),
                         "dogs": (50, 70, 210)}.items():
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(20):
            pixels = np.clip(rng.normal(colour, 40, (64, 64, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{name}{i:02d}.png")
    return root


@pytest.mark.slow
def test_a_new_users_folder_end_to_end(tmp_path):
    """A folder of three classes of one's own names: refused with a hint under the fire
    use case, a use case from the flags alone, one written by `usecase new` (naming the
    folder), advise on it, a study plan naming it by path, the report, the trained model
    exported and loaded back."""
    pets = _pets(tmp_path / "pets")
    quick = ["--epochs", "1", "--max-steps", "2", "--sample-hz", "0", "--quiet"]
    wrong = ddlstudy("run", "--usecase", "tiny", "--data-dir", str(pets), *quick,
                     "--runs-dir", str(tmp_path / "no"))
    assert wrong.returncode == 2 and "its class folders are birds, cats, dogs" in wrong.stderr
    assert not (tmp_path / "no").exists()
    alone = ddlstudy("run", "--data-dir", str(pets), "--model", "resnet18", "--image-size",
                     "64", "--batch-size", "8", *quick, "--runs-dir", str(tmp_path / "alone"))
    assert alone.returncode == 0, alone.stderr[-3000:]
    m = manifest_in(tmp_path / "alone")
    assert m["config"]["usecase"]["classes"] == ["birds", "cats", "dogs"]
    assert m["usecase"] == "pets" and m["data"]["source"] == "imagefolder"

    mine = tmp_path / "mydata"
    mine.mkdir()
    made = ddlstudy("usecase", "new", "--data-dir", str(pets), "--model", OWN_NET,
                    "--image-size", "64", "--out", str(mine / "pets.toml"))
    assert made.returncode == 0, made.stderr
    text = (mine / "pets.toml").read_text()
    assert 'dir = "../pets"' in text and '# classes = ["birds", "cats", "dogs"]' in text
    assert "# batch_size = 32" in text

    # 2 nodes of this host's 2 cores: the baseline is the one local probe (a node's)
    advice = ddlstudy("advise", "--usecase", str(mine / "pets.toml"), "--nodes", "2",
                      "--rounds", "1", "--probe-seconds", "0.5", "--budget", "10m", "--out",
                      str(tmp_path / "advice"), "--quiet")
    assert advice.returncode == 0, advice.stderr[-3000:]
    advised = json.loads((tmp_path / "advice" / "advise.json").read_text())
    assert next(p for p in advised["probes"] if p["label"] == "sequential")[
        "images_per_s"][0] > 0
    assert {r["nodes"] for r in advised["ranking"]} == {2}

    plan = tmp_path / "plan.toml"
    plan.write_text(f"""[study]
usecases = ["mydata/pets.toml"]
repeat = 1
runs_dir = "{tmp_path / 'study'}"
[settings]
epochs = 2
max_steps = 3
sample_hz = 0
[[cells]]
strategy = "cpu-processes"
workers = 2
""")
    study = ddlstudy("study", str(plan), "--quiet", cwd=tmp_path / "advice")
    assert study.returncode == 0, study.stderr[-3000:]
    report = ddlstudy("report", str(tmp_path / "study"))
    assert report.returncode == 0 and "*pets*" in report.stdout
    assert "\n| cpu-processes (2 processes) |" in report.stdout

    (run,) = [p.parent for p in (tmp_path / "study").glob(f"*/{MANIFEST}")
              if json.loads(p.read_text())["strategy"]["name"] == "sequential"]
    exported = ddlstudy("export", "model", str(run), "--out", str(tmp_path / "pets.pt"))
    assert exported.returncode == 0, exported.stderr
    from ddlstudy.models.trained import load

    model = load(tmp_path / "pets.pt")
    snapshot = torch.load(run / "snapshot.pt", weights_only=True)["model"]
    assert all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())
    assert model.eval()(torch.zeros(2, 3, 64, 64)).shape == (2, 3)


def test_a_run_of_ones_own_model_replays_to_the_same_losses(tmp_path, datasets_dir):
    """The network of one's own with its recipe, sequential (its case of every strategy
    and backend), and its replay."""
    from ddlstudy.cli import main

    runs = tmp_path / "runs"
    assert main(["run", "--usecase", "tiny", "--model", OWN_NET, "--epochs", "2",
                 "--max-steps", "3", "--no-snapshot", "--sample-hz", "0", "--quiet",
                 "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs), *RECIPE]) == 0
    first = manifest_in(runs)
    _trained_as_declared(first, OWN_NET, steps=3)
    assert main(["replay", str(runs / first["id"]), "--runs-dir", str(tmp_path / "again"),
                 "--quiet"]) == 0
    again = manifest_in(tmp_path / "again")
    assert again["model"]["sha256"] == first["model"]["sha256"]
    assert [e["train_loss"] for e in again["epochs"]] == \
        [e["train_loss"] for e in first["epochs"]]
