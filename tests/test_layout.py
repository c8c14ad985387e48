"""The architecture's seams: each run option declared once, backends found by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ddlstudy.config import RunConfig
from ddlstudy.config.options import cell_keys, key, run_parser, train_options
from ddlstudy.config.run import options
from ddlstudy.errors import ConfigError
from ddlstudy.runner import preflight, resolve

RUN_FLAGS = [
    "--accumulate", "--backend", "--balance", "--batch-size", "--bucket-mb",
    "--checkpoint-activations", "--compress",
    "--data-dir", "--datasets-dir", "--devices", "--epochs", "--heap", "--hostfile", "--hosts",
    "--image-size", "--init-weights",
    "--loader-workers", "--lr", "--lr-scaling", "--lr-schedule", "--lr-schedule-args",
    "--lr-warmup-epochs", "--max-steps",
    "--max-val-steps",
    "--micro-batches", "--mlflow", "--model", "--no-data-cache",
    "--no-reshard-after-forward", "--no-shared-buffers", "--no-snapshot", "--nodes",
    "--on-bad-image", "--optimizer",
    "--optimizer-args",
    "--precision", "--reduce", "--replicas",
    "--runs-dir", "--sample-hz", "--scaling", "--schedule", "--seed", "--snapshot-every",
    "--spark-master",
    "--spark-secret-file", "--spark-sync", "--spark-ui", "--stage-starts", "--stages",
    "--steady-seconds",
    "--strategy", "--sync-every", "--target-accuracy", "--target-metric", "--tensor",
    "--tensorboard", "--transport", "--usecase", "--warmup-steps", "--workers",
]


def test_the_run_flags_are_frozen():
    """A new flag (or a lost one) is a deliberate change: update RUN_FLAGS with it."""
    parser = run_parser()
    flags = sorted(o for a in parser._actions for o in a.option_strings
                   if o not in ("-h", "--help"))
    assert flags == RUN_FLAGS


def test_each_option_is_a_flag_a_study_key_and_a_manifest_entry(tiny):
    recorded = RunConfig(usecase=tiny).to_dict()
    keys = cell_keys()
    for f in options():
        assert f.name in recorded
        assert "--" + key(f).replace("_", "-") in RUN_FLAGS
        assert key(f) in keys or f.name == "runs_dir"  # the study sets the runs folder
    assert {f.name for f in train_options()} <= keys
    assert "effective" not in recorded  # the manifest has a block of its own for it


def test_a_study_key_and_its_flag_give_the_same_config(tiny):
    flags = run_parser().parse_args(["--strategy", "hybrid", "--stage-starts", "0,9",
                                     "--no-snapshot", "--spark-ui", "--backend", "spark",
                                     "--epochs", "3"])
    from ddlstudy.config.options import config_from_args

    cfg = config_from_args(flags)
    assert (cfg.strategy, cfg.stage_starts, cfg.snapshot, cfg.spark_ui) == \
        ("hybrid", (0, 9), False, True)
    assert cfg.usecase.train.epochs == 3


def test_the_effective_parallelism_is_computed_once_by_preflight(quick_config):
    cfg = quick_config(strategy="cpu-threads", workers=3, batch_size=4, scaling="weak",
                       lr_scaling="linear", lr=0.001)
    with pytest.raises(RuntimeError, match="has not been through preflight"):
        cfg.global_batch  # noqa: B018
    done = preflight(cfg)
    assert done.effective.as_dict() == {"scaling": "weak", "global_batch": 12,
                                        "lr": pytest.approx(0.003),
                                        "data_parallel_workers": 3}
    assert resolve(done) is done


def test_an_unknown_backend_lists_the_registered_ones(quick_config):
    with pytest.raises(ConfigError, match="unknown backend 'slurm'; choose one of: local, "
                                          "mpi, spark"):
        preflight(quick_config(backend="slurm"))


PACKAGE = Path(__file__).parents[1] / "ddlstudy"
LONGEST_FUNCTION, LONGEST_MODULE = 60, 400


def test_no_function_over_60_lines_and_no_module_over_400():
    """Functions short enough to read at once, modules of one idea (STYLE.md)."""
    long_functions, long_modules = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > LONGEST_MODULE:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} "
                                          f"{node.name}: {lines}")
    assert long_modules == [] and long_functions == []


def test_no_backend_asks_which_strategy_it_runs():
    """Backends run the strategy's worker; none looks at its class or its name."""
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in (PACKAGE / "backends").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "isinstance(strategy" in line or "cfg.strategy ==" in line]
    assert found == []


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", ".hidden", "", "x" * 65])
def test_a_use_case_name_that_is_not_a_plain_name_is_refused(name):
    from ddlstudy.config import usecase_from_dict

    raw = {"name": name, "model": {"arch": "alexnet"},
           "data": {"name": "d", "images": 30, "source_size": 64}, "train": {"image_size": 64}}
    with pytest.raises(ConfigError, match="name"):
        usecase_from_dict(raw)


def test_a_run_id_cannot_leave_the_runs_folder(tmp_path):
    from ddlstudy.errors import UsageError
    from ddlstudy.records.runfolder import RunFolder

    runs = tmp_path / "runs"
    with pytest.raises(UsageError, match="not a plain folder name"):
        RunFolder.create(runs, "../outside", {})
    assert not (tmp_path / "outside").exists() and not runs.exists()


@pytest.mark.parametrize("prefix", ["../../somewhere/victim", "", "br", "Ab"])
def test_hosts_refuse_a_prefix_that_is_not_a_set_name(prefix):
    from ddlstudy import hosts

    if prefix == "br":  # a valid name: nothing is up under it, and nothing is deleted
        with pytest.raises(ConfigError, match="no emulated hosts named 'br' are up"):
            hosts.load(prefix)
        return
    for call in (hosts.load, hosts.down):
        with pytest.raises(ConfigError, match="--prefix"):
            call(prefix)


def test_torchrun_gets_the_reason_instead_of_two_unrelated_runs(tmp_path):
    """torchrun starts the command twice; a copy is refused (exit 2) with the reason, and
    no run folder is made."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    ddlstudy = shutil.which("ddlstudy", path=str(Path(sys.executable).parent))
    out = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--no-python", ddlstudy,
                          "run", "--usecase", "tiny", "--epochs", "1", "--runs-dir",
                          str(tmp_path / "runs")], capture_output=True, text=True,
                         timeout=300)
    # torchrun ends the other copy once one has failed: how many got to say why depends
    # on timing, but every one that did says the same, and none trained.
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("ddlstudy: error:")]
    assert errors and all("started by torchrun as rank" in e and "--strategy cpu-processes "
                          "--workers 2" in e for e in errors)
    assert "exitcode  : 2" in out.stderr and out.returncode != 0
    assert not (tmp_path / "runs").exists()


def test_the_cli_parser_needs_no_torch():
    """`ddlstudy --help` and every refusal made by the parser answer without importing
    torch (seconds on this machine): the config layer must not pull it in."""
    import subprocess
    import sys

    code = ("import sys; from ddlstudy.cli import build_parser; "
            "build_parser().parse_args(['run', '--strategy', 'hybrid']); "
            "print(sorted(m for m in ('torch', 'torchvision', 'mpi4py', 'pyspark') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_version_and_a_description_for_every_subcommand(capsys):
    import argparse

    from ddlstudy import __version__
    from ddlstudy.cli import build_parser, main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ddlstudy {__version__}"

    def parsers(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield name, sub
                    yield from parsers(sub)

    undescribed = [name for name, sub in parsers(build_parser()) if not sub.description]
    assert undescribed == []
