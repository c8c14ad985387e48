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
from ddlstudy.plan import cell_config
from ddlstudy.report.runs import setting
from ddlstudy.runfolder import SNAPSHOT
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
    "sgd-nesterov-step": ("SGD", {"nesterov": True, "weight_decay": 1e-4}, "step", {"gamma": 0.5}),
    "adam-cosine": ("Adam", None, "cosine", None),
    "adamw-onecycle": ("AdamW", {"weight_decay": 0.05, "betas": [0.9, 0.95]}, "onecycle", None),
    "rmsprop-exponential": ("RMSprop", {"momentum": 0.5}, "ExponentialLR", {"gamma": 0.9}),
}


def _flags(optimizer: str, args: dict | None, schedule: str, schedule_args: dict | None
           ) -> list[str]:
    return ["--optimizer", optimizer, "--lr", "0.001", "--lr-schedule", schedule,
            *(["--optimizer-args", json.dumps(args)] if args else []),
            *(["--lr-schedule-args", json.dumps(schedule_args)] if schedule_args else [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_trains_alike_under_every_data_parallel_layout(name, tmp_path,
                                                                   datasets_dir):
    """Sequential learns with it; cpu-processes and zero (the optimizer's state sharded:
    ZeroRedundancyOptimizer over the declared class) average the same gradients and step
    the same optimizer: the same losses, epoch by epoch (float tolerance)."""
    flags = _flags(*RECIPES[name])
    alone = _run(tmp_path / "sequential", datasets_dir, *flags)
    losses = _losses(alone)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] * 1.5
    train = _manifest(alone)["config"]["usecase"]["train"]
    assert (train["optimizer"], train["lr_schedule"]) == RECIPES[name][::2]
    base = _losses(_run(tmp_path / "dp", datasets_dir, *flags, "--strategy", "cpu-processes",
                        "--workers", "2"))
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
    snapshot, and the weights end as an uninterrupted run's, bit for bit."""
    flags = ["run", "--usecase", "tiny", "--epochs", "4", "--max-steps", "5",
             "--snapshot-every", "2", "--datasets-dir", str(datasets_dir), "--sample-hz", "0",
             "--quiet", "--lr-warmup-epochs", "1", *_flags("AdamW", {"weight_decay": 0.05},
                                                           "cosine", None)]
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
