"""Your recipe (issue 49): the optimizer and learning-rate schedule a use case declares
train under every data-parallel layout, go into the snapshot and resume bit for bit, are
recorded in the run's setting, and a bad name or argument is refused in one line before
anything starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_bad_input import USECASE
from test_faults import _cli, _identical, _manifest, run_and_kill

from ddlstudy.cli import main
from ddlstudy.config import TrainSpec
from ddlstudy.errors import UsageError
from ddlstudy.models.trained import load
from ddlstudy.records.plan import cell_config
from ddlstudy.records.runfolder import SNAPSHOT
from ddlstudy.report.runs import setting
from ddlstudy.training import recipe


def _run(runs: Path, datasets_dir: Path, *extra: str) -> Path:
    out = _cli("run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir), "--runs-dir",
               str(runs), "--sample-hz", "0", "--quiet", "--epochs", "2", "--max-steps", "4",
               *extra)
    assert out.returncode == 0, out.stderr[-3000:]
    (folder,) = runs.glob("*/")
    return folder


def _losses(folder: Path) -> list[float]:
    return [e["train_loss"] for e in _manifest(folder)["epochs"]]


RECIPES = {
    "adamw-onecycle": ("AdamW", {"weight_decay": 0.05, "betas": [0.9, 0.95]}, "onecycle", None),
    "rmsprop-exponential": ("RMSprop", {"momentum": 0.5}, "ExponentialLR", {"gamma": 0.9}),
}


def _flags(optimizer: str, args: dict | None, schedule: str, schedule_args: dict | None
           ) -> list[str]:
    return ["--optimizer", optimizer, "--lr", "0.001", "--lr-schedule", schedule,
            *(["--optimizer-args", json.dumps(args)] if args else []),
            *(["--lr-schedule-args", json.dumps(schedule_args)] if schedule_args else [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw-onecycle", "rmsprop-exponential"])
def test_each_recipe_trains_alike_under_every_data_parallel_layout(name, tmp_path,
                                                                   datasets_dir):
    """cpu-processes learns with it (the step sequential takes on the whole batch: every
    strategy builds its optimizer in the one worker, and sequential with a recipe is the
    no-flip test's below); it and zero (the optimizer's state sharded:
    ZeroRedundancyOptimizer over the declared class) average the same gradients and step
    the same optimizer: the same losses, epoch by epoch (float tolerance). Two recipes:
    one of ddlstudy's names with arguments (AdamW's two moments, onecycle's cycled betas),
    one of torch's class names with a momentum buffer (SGD is every other test's; AdamW
    with cosine under the pipeline is the own recipe's test below)."""
    flags = _flags(*RECIPES[name])
    dp = _run(tmp_path / "dp", datasets_dir, *flags, "--strategy", "cpu-processes",
              "--workers", "2")
    base = _losses(dp)
    assert all(math.isfinite(x) for x in base) and base[-1] < base[0] * 1.5
    train = _manifest(dp)["config"]["usecase"]["train"]
    assert (train["optimizer"], train["lr_schedule"]) == RECIPES[name][::2]
    zero = _losses(_run(tmp_path / "zero", datasets_dir, *flags, "--strategy", "zero",
                        "--workers", "2"))
    assert zero == pytest.approx(base, rel=1e-5)


def test_the_optimizer_is_the_declared_one_with_its_arguments():
    weight = torch.nn.Parameter(torch.zeros(3))
    train = TrainSpec(optimizer="AdamW", optimizer_args={"weight_decay": 0.05,
                                                         "betas": [0.8, 0.9]})
    made = recipe.optimizer([weight], train, 0.01)
    assert type(made) is torch.optim.AdamW
    group = made.param_groups[0]
    assert (group["lr"], group["weight_decay"], tuple(group["betas"])) == (0.01, 0.05, (0.8, 0.9))
    sgd = recipe.optimizer([weight], TrainSpec(), 0.1).param_groups[0]
    assert (type(recipe.optimizer([weight], TrainSpec(), 0.1)), sgd["momentum"]) == \
        (torch.optim.SGD, 0.9)  # the paper's, as before
    assert recipe.states_per_weight(train) == 2 and recipe.states_per_weight(TrainSpec()) == 1


def _rates(train: TrainSpec, steps_per_epoch: int) -> list[float]:
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = recipe.optimizer([weight], train, 0.1)
    schedule = recipe.schedule(optimizer, train, steps_per_epoch)
    seen = []
    for _ in range(train.epochs * steps_per_epoch):
        seen.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(1)
        optimizer.step()
        schedule.step()
    return seen


def test_the_schedule_follows_the_warm_up_and_spans_the_run():
    """4 epochs of 5 steps: a warm-up of 1 epoch (lr x s / 5), then cosine over the other
    15 steps from lr down to eta_min; step: x gamma every step_size steps."""
    cosine = _rates(TrainSpec(epochs=4, lr_warmup_epochs=1, lr_schedule="cosine",
                              lr_schedule_args={"eta_min": 0.01}), 5)
    expected = [0.1 * s / 5 for s in range(1, 6)] + [
        0.01 + 0.09 * (1 + math.cos(math.pi * t / 15)) / 2 for t in range(15)]
    assert cosine == pytest.approx(expected)
    step = _rates(TrainSpec(epochs=2, lr_schedule="step", lr_schedule_args={"step_size": 4,
                                                                            "gamma": 0.5}), 5)
    assert step == pytest.approx([0.1] * 4 + [0.05] * 4 + [0.025] * 2)
    onecycle = _rates(TrainSpec(epochs=2, lr_schedule="onecycle"), 10)
    assert max(onecycle) == pytest.approx(0.1) and onecycle[0] < 0.01 and onecycle[-1] < 1e-3


@pytest.mark.slow
def test_adamw_and_cosine_resume_bit_for_bit(tmp_path, datasets_dir):
    """Killed mid-run, resumed: Adam's two moments and the schedule come back from the
    snapshot, and the weights end as an uninterrupted run's, bit for bit. Under zero, whose
    snapshot consolidates the moments each process steps on rank 0 and hands each its
    share back (ZeRO-1's resume: test_sharding resumes sharded and tensor)."""
    flags = ["run", "--usecase", "tiny", "--epochs", "4", "--max-steps", "5",
             "--snapshot-every", "2", "--datasets-dir", str(datasets_dir), "--sample-hz", "0",
             "--quiet", "--lr-warmup-epochs", "1", *_flags("AdamW", {"weight_decay": 0.05},
                                                           "cosine", None),
             "--strategy", "zero", "--workers", "2"]
    runs = tmp_path / "runs"
    code, _, folder = run_and_kill([*flags, "--runs-dir", str(runs)], runs, "run")
    assert code != 0
    snap = torch.load(folder / SNAPSHOT, weights_only=True)
    assert snap["epoch"] < 4 and snap["scheduler"] is not None
    assert {"exp_avg", "exp_avg_sq"} <= set(next(iter(snap["optimizer"]["state"].values())))
    resumed = _cli("run", "--resume", str(folder), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = _run(tmp_path / "reference", datasets_dir, *flags[3:7], *flags[11:])
    assert _identical(folder, reference)
    assert _losses(folder) == _losses(reference)


def test_the_setting_names_the_recipe_so_other_recipes_are_no_repeats():
    def manifest(**train) -> dict:
        return {"config": {"usecase": {"train": {"epochs": 2, "batch_size": 16, "lr": 0.01,
                                                 "image_size": 64, **train}}}}

    paper = setting(manifest(optimizer="SGD", momentum=0.9, lr_schedule="none"))
    assert paper == setting(manifest())  # runs from before the recipe keys: the same
    adamw = setting(manifest(optimizer="AdamW", optimizer_args={"weight_decay": 0.05},
                             lr_schedule="cosine"))
    assert "AdamW(weight_decay=0.05)" in adamw and "cosine schedule" in adamw
    assert adamw != paper
    digits = setting(manifest() | {"config": {"usecase": manifest()["config"]["usecase"] | {
        "data": {"flip": False, "normalize": "dataset"}}}})
    assert "no flip" in digits and "dataset normalisation" in digits


def test_a_study_cell_sets_the_recipe_with_its_tables(tmp_path):
    cfg = cell_config("tiny", {"optimizer": "AdamW", "optimizer_args": {"betas": [0.9, 0.99]},
                               "lr_schedule": "cosine"}, tmp_path)
    train = cfg.usecase.train
    assert (train.optimizer, train.optimizer_args, train.lr_schedule) == \
        ("AdamW", {"betas": [0.9, 0.99]}, "cosine")


REFUSED = [
    (["--optimizer", "Adamw"], "train.optimizer: unknown optimizer 'Adamw'; did you mean AdamW?"),
    (["--optimizer", "LBFGS"], "train.optimizer: LBFGS steps with a closure"),
    (["--optimizer", "Adam", "--optimizer-args", '{"wd": 1}'],
     "train.optimizer_args.wd: is not an argument of Adam, which takes: amsgrad, betas,"),
    (["--optimizer", "Adam", "--optimizer-args", '{"betas": [0.9, 1.5]}'],
     "train.optimizer_args: Adam refuses them: Invalid beta parameter"),
    (["--optimizer-args", '{"lr": 1}'], "--optimizer-args lr: is train.lr (--lr"),
    (["--optimizer-args", "{weight_decay: 1}"], "--optimizer-args: '{weight_decay: 1}' is not "
                                                "a JSON object"),
    (["--lr-schedule", "cosin"], "train.lr_schedule: unknown learning-rate schedule 'cosin'; "
                                 "did you mean cosine?"),
    (["--lr-schedule", "ExponentialLR"], "train.lr_schedule_args: ExponentialLR needs gamma"),
    (["--lr-schedule", "ReduceLROnPlateau"], "steps on a validation metric"),
    (["--lr-schedule", "step", "--lr-schedule-args", '{"gama": 0.5}'],
     "train.lr_schedule_args.gama: is not an argument of StepLR"),
    (["--lr-schedule", "onecycle", "--lr-warmup-epochs", "1"],
     "--lr-warmup-epochs: onecycle warms the learning rate up itself"),
    (["--usecase", "{tmp}/u.toml"], "train.momentum: is SGD's; Adam takes its own arguments "
                                    "from [train.optimizer_args]"),
    # issue 64: each checked against torch's own signature before anything starts
    (["--optimizer", "Adam", "--optimizer-args", '{"betas": [0.9]}'],
     "train.optimizer_args.betas: Adam takes a list of 2 numbers, got [0.9]"),
    (["--optimizer", "Adam", "--optimizer-args", '{"betas": [0.9, 0.99, 0.5]}'],
     "train.optimizer_args.betas: Adam takes a list of 2 numbers, got [0.9, 0.99, 0.5]"),
    (["--optimizer-args", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"],
     "nests its values more than 2 levels deep"),
    (["--optimizer-args", '{"weight_decay": [[0.1]]}'],
     "--optimizer-args weight_decay: nests lists in lists"),
    (["--lr-schedule", "step", "--lr-schedule-args", '{"step_size": 0}'],
     "train.lr_schedule_args.step_size: must be at least 1 (a period of no steps divides"),
    (["--lr-schedule", "step", "--lr-schedule-args", '{"step_size": 2.5}'],
     "train.lr_schedule_args.step_size: StepLR takes a whole number, got 2.5"),
    (["--lr-schedule", "cosine", "--lr-schedule-args", '{"T_max": 0}'],
     "train.lr_schedule_args.T_max: must be at least 1"),
    (["--lr-schedule", "onecycle", "--lr-schedule-args", '{"total_steps": 20}'],
     "train.lr_schedule_args.total_steps: OneCycleLR's cycle of 20 steps would end before "
     "the run's 150 (10 epochs of 15); give at least 150"),
    (["--lr-schedule", "PolynomialLR", "--lr-schedule-args", '{"power": -1}'],
     "train.lr_schedule_args.power: must be at least 0 (a negative power divides by zero"),
    (["--optimizer", "Adam", "--optimizer-args", '{"capturable": true}'],
     "train.optimizer_args.capturable: Adam refuses it on cpu: If capturable=True"),
    (["--optimizer", "Adam", "--optimizer-args", '{"weight_decay": Infinity}'],
     "--optimizer-args weight_decay: must be a finite number, got inf"),
    (["--lr-schedule", "step", "--lr-schedule-args", '{"gamma": NaN}'],
     "--lr-schedule-args gamma: must be a finite number, got nan"),
    (["--lr-schedule", "CyclicLR", "--lr-schedule-args",
      '{"base_lr": 0.001, "max_lr": 0.01, "mode": "tri"}'],
     "train.lr_schedule_args.mode: CyclicLR takes one of 'triangular', 'triangular2', "
     "'exp_range', got \"tri\""),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_a_bad_recipe_is_refused_in_one_line_before_anything_starts(argv, message, tmp_path,
                                                                     capsys):
    (tmp_path / "u.toml").write_text(USECASE + 'optimizer = "Adam"\nmomentum = 0.5\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main(["run", "--runs-dir", str(tmp_path / "runs"), "--datasets-dir",
                 str(tmp_path / "data"), *(["--usecase", "tiny"] if "--usecase" not in argv
                                           else []), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_the_use_cases_train_keys_and_a_plans_cells_go_through_the_same_checks(tmp_path,
                                                                              capsys):
    """A use case's [train] tables and a study plan's cells meet the flags' checks: a
    NaN in a TOML table is refused in one line; a plan one of whose cells carries a
    schedule's period of 0 is refused before any of its cells runs."""
    (tmp_path / "u.toml").write_text(USECASE + 'lr_schedule = "step"\n'
                                     "[train.lr_schedule_args]\ngamma = nan\n")
    runs = tmp_path / "runs"
    assert main(["run", "--usecase", str(tmp_path / "u.toml"), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "train.lr_schedule_args.gamma: must be a finite number, got nan" in err
    assert err.count("\n") == 1
    plan = tmp_path / "plan.toml"
    plan.write_text("[study]\nusecases = ['tiny']\nrepeat = 1\n[settings]\nmax_steps = 2\n"
                    "[[cells]]\nstrategy = 'sequential'\n[[cells]]\nstrategy = 'sequential'\n"
                    "lr_schedule = 'cosine'\nlr_schedule_args = {T_max = 0}\n")
    assert main(["study", str(plan), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "'strategy': 'sequential', 'lr_schedule': 'cosine'" in err, err
    assert "train.lr_schedule_args.T_max: must be at least 1" in err and err.count("\n") == 1
    assert not runs.exists()
    (tmp_path / "adam.toml").write_text(USECASE + 'optimizer = "Adam"\n'
                                        "[train.optimizer_args]\nbetas = [0.9]\n")
    assert main(["bench", "overhead", "--usecase", str(tmp_path / "adam.toml")]) == 2
    err = capsys.readouterr().err  # bench's baseline goes through a run's checks too
    assert "train.optimizer_args.betas: Adam takes a list of 2 numbers, got [0.9]" in err


def test_an_argument_is_checked_against_the_signature_of_its_class():
    """What each argument takes is read from torch's own annotations (or its default's
    type): lengths, whole numbers, literals, nulls."""
    from ddlstudy.training.signature import fits, hints, takes

    adam, cyclic = hints(torch.optim.Adam), hints(torch.optim.lr_scheduler.CyclicLR)
    assert takes(adam["betas"][0]) == "a list of 2 numbers"
    assert fits([0.9, 0.99], adam["betas"][0]) and not fits([0.9], adam["betas"][0])
    assert not fits([True, 0.9], adam["betas"][0])  # true is not a number
    assert fits(None, adam["foreach"][0]) and not fits(1, adam["foreach"][0])
    assert takes(cyclic["step_size_down"][0]) == "a whole number or null"
    assert fits(3, cyclic["step_size_up"][0]) and not fits(3.0, cyclic["step_size_up"][0])
    assert fits("exp_range", cyclic["mode"][0]) and not fits("tri", cyclic["mode"][0])
    assert takes(cyclic["scale_fn"][0]) == "null"  # a function: no table holds one


# --- augmentation and normalisation ----------------------------------------------------

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "predict_image.py"
ONNX_EXAMPLE = EXAMPLE.with_name("predict_onnx.py")
VALIDATED = Path(__file__).parent / "models" / "validated.py"
"""Prints the validation images of a use case and the classes a model gives them."""


def _own(tmp_path: Path, datasets_dir: Path, data: str, epochs: int = 2) -> Path:
    """A use case of the tiny images as a folder of one's own, with ``data``'s keys."""
    path = tmp_path / "own.toml"
    path.write_text(f'name = "own"\n[model]\narch = "alexnet"\nwidth = 0.25\n[data]\n'
                    f'dir = "{datasets_dir / "synthetic-tiny"}"\n{data}\n[train]\n'
                    f'image_size = 64\nbatch_size = 16\nepochs = {epochs}\nlr = 0.003\n')
    return path


def _dataset(tmp_path, datasets_dir, data: str, cache: bool, train: bool = True):
    from ddlstudy.config import RunConfig, load_usecase
    from ddlstudy.data import prepare_data
    from ddlstudy.runner import resolve
    from ddlstudy.training.loaders import image_dataset

    cfg = resolve(RunConfig(usecase=load_usecase(str(_own(tmp_path, datasets_dir, data))),
                            runs_dir=tmp_path / "runs", data_cache=cache, sample_hz=0))
    plan = prepare_data(cfg)
    return image_dataset(cfg, plan, plan.train if train else plan.val, train), plan


@pytest.mark.parametrize("data", ['crop_scale = 0.3', 'flip = false\nnormalize = "none"'])
def test_the_cache_and_the_decoded_images_give_the_same_batches(data, tmp_path,
                                                                datasets_dir):
    """Flips and crops are tensor operations on the batch: the decoded cache and decoding
    in the loop give the same tensors and draw the same random numbers."""
    batches = []
    for cache in (True, False):
        dataset, _ = _dataset(tmp_path, datasets_dir, data, cache)
        torch.manual_seed(3)
        batches.append(dataset.__getitems__(list(range(8)))[0])
    assert torch.equal(*batches)


def test_without_the_flip_a_batch_is_the_same_whatever_the_random_state(tmp_path,
                                                                        datasets_dir):
    def batch(data: str, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return _dataset(tmp_path, datasets_dir, data, True)[0].__getitems__(list(range(16)))[0]

    assert torch.equal(batch("flip = false", 1), batch("flip = false", 2))
    assert not torch.equal(batch("", 1), batch("", 2))  # the paper's sets: flipped
    cropped = batch("flip = false\ncrop_scale = 0.5", 1)
    assert cropped.shape == batch("flip = false", 1).shape == (16, 3, 64, 64)
    assert not torch.equal(cropped, batch("flip = false", 1))


def test_the_data_sets_own_normalisation_centres_its_images(tmp_path, datasets_dir):
    dataset, plan = _dataset(tmp_path, datasets_dir, 'normalize = "dataset"', True, False)
    assert plan.stats["fingerprint"] == plan.images.fingerprint and plan.stats["size"] == 64
    everything, _ = _dataset(tmp_path, datasets_dir, 'normalize = "dataset"', False, False)
    everything.items = list(plan.images.items)  # every image the stats were taken over
    images = everything.__getitems__(list(range(len(everything.items))))[0]
    assert images.mean((0, 2, 3)).abs().max() < 1e-4
    assert (images.std((0, 2, 3)) - 1).abs().max() < 1e-3
    imagenet, _ = _dataset(tmp_path, datasets_dir, "", False, False)  # today's default
    imagenet.items = everything.items
    means = imagenet.__getitems__(list(range(len(imagenet.items))))[0].mean((0, 2, 3))
    expected = [(m - i) / s for m, i, s in zip(plan.stats["mean"], (0.485, 0.456, 0.406),
                                               (0.229, 0.224, 0.225), strict=True)]
    assert means.tolist() == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_a_no_flip_use_case_learns_and_its_exported_model_predicts_as_it_validated(
        tmp_path, datasets_dir):
    """Digits-like: no flip, its own normalisation, AdamW and cosine; it learns, records
    its preprocessing, and the docs' inference examples, on the exported model (a state dict
    in PyTorch; an ONNX file in onnxruntime, with numpy and Pillow) and the image files, give
    the predictions the run's validation gave."""
    usecase = _own(tmp_path, datasets_dir, 'flip = false\nnormalize = "dataset"', epochs=6)
    folder = _run(tmp_path / "runs", datasets_dir, "--usecase", str(usecase), "--epochs", "6",
                  "--max-steps", "15", "--optimizer", "AdamW", "--lr", "0.001",
                  "--lr-schedule", "cosine")
    manifest = _manifest(folder)
    assert max(e["val_accuracy"] for e in manifest["epochs"]) >= 0.5  # chance: 1/3
    pre = manifest["preprocessing"]
    assert pre["training"]["flip"] is False and pre["mean"] == manifest["data"]["stats"]["mean"]
    model_file, onnx_file = tmp_path / "model.pt", tmp_path / "onnx" / "model.onnx"
    assert main(["export", "model", str(folder), "--out", str(model_file)]) == 0
    assert main(["export", "model", str(folder), "--out", str(onnx_file), "--format",
                 "onnx"]) == 0  # the same weights as an ONNX file, its own sidecar beside
    with pytest.raises(UsageError, match="is an ONNX file .* run it with onnxruntime"):
        load(onnx_file)
    # The run's validation of the exported model, in a process of its own (one thread, as
    # the example's): in the suite's process a state left by earlier tests (not found yet)
    # once flipped one near tie's argmax, and this test is about the example.
    validated = json.loads(_cli_script(VALIDATED, str(usecase), str(tmp_path / "x"),
                                       str(model_file)))
    for example, exported in ((EXAMPLE, model_file), (ONNX_EXAMPLE, onnx_file)):
        assert json.loads(exported.with_suffix(".usecase.json").read_text())[
            "preprocessing"] == pre
        out = _cli_script(example, str(exported), *validated["files"])
        assert [line.rsplit(" ", 1)[1] for line in out.splitlines()] == validated["classes"], \
            example.name


def _cli_script(script: Path, *args: str) -> str:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_default_preprocessing_is_torchvisions_own(tmp_path, datasets_dir):
    """ImageNet's normalisation as tensor operations: torchvision's Resize, CenterCrop,
    ToTensor and Normalize of each file, bit for bit (what the exported model's users do)."""
    from PIL import Image
    from torchvision import transforms

    dataset, plan = _dataset(tmp_path, datasets_dir, "", False, False)
    ours = dataset.__getitems__(list(range(4)))[0]
    pipeline = transforms.Compose([transforms.Resize(64), transforms.CenterCrop(64),
                                   transforms.ToTensor(),
                                   transforms.Normalize((0.485, 0.456, 0.406),
                                                        (0.229, 0.224, 0.225))])
    for i, (rel, _) in enumerate(plan.val[:4]):
        with Image.open(plan.images.root / rel) as image:
            assert torch.equal(ours[i], pipeline(image.convert("RGB")))


@pytest.mark.slow
def test_an_own_recipe_trains_under_processes_the_pipeline_and_two_mpi_nodes(tmp_path,
                                                                              datasets_dir):
    """The issue's "done when": an image folder of one's own with AdamW, cosine, no flip,
    its own normalisation and macro-F1 as the target metric, under cpu-processes, the
    pipeline and 2 MPI nodes. MPI's two ranks take DDP's steps (the same losses); each
    pipeline stage builds the declared optimizer and schedule for its own layers (and its
    later stages read labels alone, collated by torch); the report reads the metric and
    draws each run's confusion matrix."""
    import pandas as pd

    usecase = _own(tmp_path, datasets_dir, 'flip = false\nnormalize = "dataset"')
    runs = tmp_path / "runs"
    recipe_flags = ("--usecase", str(usecase), "--datasets-dir", str(datasets_dir),
                    "--runs-dir", str(runs), "--sample-hz", "0", "--quiet", "--no-snapshot",
                    "--max-steps", "4", "--optimizer", "AdamW", "--lr-schedule", "cosine",
                    "--target-metric", "macro_f1", "--target-accuracy", "0.5")
    for layout in (["--strategy", "cpu-processes", "--workers", "2"],
                   ["--strategy", "pipeline", "--stages", "2", "--micro-batches", "2"],
                   ["--backend", "mpi", "--nodes", "2"]):
        out = _cli("run", *recipe_flags, *layout)
        assert out.returncode == 0, out.stderr[-3000:]
    made = {m["strategy"]["name"] if m["backend"]["name"] == "local" else "mpi": m
            for m in map(_manifest, runs.glob("*/"))}
    assert sorted(made) == ["cpu-processes", "mpi", "pipeline"]
    for m in made.values():
        train = m["config"]["usecase"]["train"]
        assert (train["optimizer"], train["lr_schedule"], train["target_metric"]) == \
            ("AdamW", "cosine", "macro_f1")
        assert m["preprocessing"]["training"]["flip"] is False
        assert m["time_to_target"]["metric"] == "macro_f1"
        assert 0 <= m["epochs"][-1]["val_macro_f1"] <= 1
        assert len(m["epochs"]) == 2 and all(math.isfinite(e["train_loss"]) for e in m["epochs"])
    assert [e["train_loss"] for e in made["mpi"]["epochs"]] == pytest.approx(
        [e["train_loss"] for e in made["cpu-processes"]["epochs"]], rel=1e-4)
    report = tmp_path / "report"
    out = _cli("report", str(runs), "--out", str(report), "--project", "none")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = pd.read_csv(report / "runs.csv")
    assert len(rows) == 3 and set(rows["target_metric"]) == {"macro_f1"}
    assert sorted(rows["val_macro_f1"]) == sorted(m["epochs"][-1]["val_macro_f1"]
                                                  for m in made.values())
    assert len(list((report / "figures").glob("confusion-*.png"))) == 3
