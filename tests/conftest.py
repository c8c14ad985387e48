"""Shared fixtures: one tiny synthetic data set per session, and a quick run config."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ddlstudy.cli import main
from ddlstudy.config import RunConfig, load_usecase, with_overrides
from ddlstudy.config.paths import ADVICE_CHECKS_ENV
from ddlstudy.data.cache import CACHE_ENV
from ddlstudy.data.generate import make_dataset

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tests assert behaviour, not speed


def pytest_configure(config) -> None:
    """The suite tests the CPU paths, equal to the bit or to float tolerance, even on a GPU
    machine, where pipeline, sharded, zero and tensor would otherwise choose its GPUs;
    ``pytest -m gpu`` (``make gpu-check``) keeps them for the GPU tests. Before torch
    first asks CUDA, in this process and in every run it starts."""
    if "gpu" not in (config.option.markexpr or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


SERIAL = {
    "test_advise": "advise's probes measure speeds, and a test holds its ranking to runs",
    "test_advice_check": "the checks of advice hold predicted speeds to measured ones",
    "test_findings": "a process that loads the host on purpose",
    "test_hosts": "emulated hosts' shaped links, and a slower link's slower training",
    "test_host_memory": "emulated hosts of a memory size, and the kernel's kills in them",
    "test_predict": "predictions held to the speeds of runs",
    "test_sampler": "the samples' rate and the load of other processes",
}
"""Test files marked ``serial``: ``make test`` runs them alone, after the others have run
two files at a time (pytest-xdist), since the other tests' processes would change what
they measure."""

LONGEST_FIRST = ("test_slurm", "test_spark", "test_safety", "test_mpi", "test_your_model",
                 "test_faults", "test_mlflow", "test_extend", "test_recipe", "test_sharding",
                 "test_strategies", "test_study")
"""The files that take longest, collected first, so that ``make test``'s workers (given
files in collection order: ``--no-loadscope-reorder``) do not end with one of them alone;
the rest in their usual order."""


def pytest_collection_modifyitems(config, items) -> None:
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.stem, len(first)))  # stable
    for item in items:
        if item.path.stem in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory) -> Path:
    """The decoded-image cache of this session (runs in subprocesses inherit it), not the
    user's ~/.cache."""
    folder = tmp_path_factory.mktemp("cache")
    os.environ[CACHE_ENV] = str(folder)
    # and its own history of advice checks, not the working directory's runs/advise/
    os.environ[ADVICE_CHECKS_ENV] = str(folder / "advice-checks.jsonl")
    return folder


@pytest.fixture(scope="session")
def tiny():
    return load_usecase("tiny")


@pytest.fixture(scope="session")
def datasets_dir(tmp_path_factory, tiny) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    make_dataset(tiny.data, root / tiny.data.name, workers=2)
    return root


@pytest.fixture
def imagefolder(tmp_path, datasets_dir, tiny) -> Path:
    """A private copy of the tiny set that a test may damage."""
    dest = tmp_path / "images"
    shutil.copytree(datasets_dir / tiny.data.name, dest)
    return dest


@pytest.fixture
def quick_config(tmp_path, datasets_dir, tiny):
    def make(**kwargs) -> RunConfig:
        train = {k: kwargs.pop(k) for k in ("epochs", "batch_size", "seed", "lr",
                                            "lr_warmup_epochs") if k in kwargs}
        usecase = with_overrides(tiny, **({"epochs": 1} | train))
        base = {"usecase": usecase, "datasets_dir": datasets_dir, "runs_dir": tmp_path / "runs",
                "sample_hz": 0}
        return RunConfig(**(base | kwargs))

    return make


@pytest.fixture(scope="session")
def tiny_20(tmp_path_factory, datasets_dir, tiny):
    """Twenty epochs of tiny with a strategy and its flags, run on first use and shared by
    every test that compares against it (the manifest's run folder)."""
    from ddlstudy.runner import run

    made = {}

    def get(strategy: str = "sequential", **flags):
        key = (strategy, tuple(sorted(flags.items())))
        if key not in made:
            cfg = RunConfig(usecase=with_overrides(tiny, epochs=20), datasets_dir=datasets_dir,
                            runs_dir=tmp_path_factory.mktemp("runs20"), sample_hz=0,
                            snapshot=False, strategy=strategy, **flags)
            made[key] = run(cfg, show_progress=False)
        return made[key]

    return get


@pytest.fixture
def cli(tmp_path, datasets_dir, capsys):
    """``ddlstudy`` in this process: (exit code, stderr, the runs folder)."""
    runs = tmp_path / "runs"

    def call(*args, runs_dir=True):
        extra = ["--datasets-dir", str(datasets_dir)] + (["--runs-dir", str(runs)] if runs_dir
                                                          else [])
        argv = list(args) + (extra if args[0] == "run" else [])
        code = main(argv)
        err = capsys.readouterr().err
        return code, err, runs

    return call
