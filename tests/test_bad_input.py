"""Bad input across every subcommand: exit code 2, one line on stderr naming what was
wrong, no traceback, and nothing written (issue 16's table; each case was a defect or a
class of defect found by trying bad values as a user would)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddlstudy.cli import main

USECASE = """name = "probe"
[model]
arch = "alexnet"
width = 0.25
[data]
name = "synthetic-tiny"
images = 300
source_size = 64
[train]
image_size = 64
batch_size = 16
epochs = 1
"""


def _usecase(replace: dict[str, str] | None = None, prefix: str = "") -> str:
    text = USECASE
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    return prefix + text


PLAN = '[study]\nusecases = ["tiny"]\n'
OWN_NET = f"{Path(__file__).parent / 'models' / 'own_net.py'}:small_resnet"

ROW = '{"rank": 1, "label": "sequential", "images_per_s": 1.0, '
"""What advise.json's every ranking row holds (its flags aside)."""

FILES = {
    "afile": "not a folder",
    "secret-empty": "\n",
    "secret-two": "one two\n",
    "bad-json/manifest.json": "{not json",
    "list/manifest.json": "[1, 2]",
    "empty/manifest.json": "{}",
    "uc/nan-lr.toml": _usecase({"epochs = 1": "epochs = 1\nlr = nan"}),
    "uc/inf-lr.toml": _usecase({"epochs = 1": "epochs = 1\nlr = inf"}),
    "uc/classes-int.toml": _usecase(prefix="classes = 3\n"),
    "uc/classes-str.toml": _usecase(prefix='classes = "abc"\n'),
    "uc/classes-path.toml": _usecase(prefix='classes = ["fire", "../smoke", "nofire"]\n'),
    "uc/empty-name.toml": _usecase({'name = "probe"': 'name = ""'}),
    "uc/escape.toml": _usecase({'name = "probe"': 'name = "../../escape"'}),
    "uc/images.toml": _usecase({"images = 300": "images = 100000000000"}),
    "uc/source.toml": _usecase({"source_size = 64": "source_size = 1000000"}),
    "uc/width.toml": _usecase({"width = 0.25": 'width = "wide"'}),
    "uc/arch.toml": _usecase({'arch = "alexnet"': "arch = 3"}),
    "uc/arch-unknown.toml": _usecase({'arch = "alexnet"': 'arch = "nosuchnet"',
                                       "width = 0.25": ""}),
    "uc/arch-file.toml": _usecase({'arch = "alexnet"': 'arch = "net.py:make"',
                                    "width = 0.25": ""}),
    "uc/batch-list.toml": _usecase({"batch_size = 16": "batch_size = [1]"}),
    "uc/data-name.toml": _usecase({'name = "synthetic-tiny"': "name = 5"}),
    "uc/data-escape.toml": _usecase({'name = "synthetic-tiny"': 'name = "../up"'}),
    "uc/seed.toml": _usecase({"epochs = 1": "epochs = 1\nseed = 99999999999999999999"}),
    "uc/momentum.toml": _usecase({"epochs = 1": 'epochs = 1\nmomentum = "high"'}),
    "uc/target.toml": _usecase({"epochs = 1": 'epochs = 1\ntarget_accuracy = "90 %"'}),
    "uc/difficulty.toml": _usecase({"source_size = 64": "source_size = 64\ndifficulty = nan"}),
    "uc/not-toml.toml": "[model\n",
    "plan/epochs-str.toml": PLAN + '[[cells]]\nstrategy = "sequential"\nepochs = "x"\n',
    "plan/lr-str.toml": PLAN + '[settings]\nlr = "fast"\n[[cells]]\nstrategy = "sequential"\n',
    "plan/lr-nan.toml": PLAN + '[settings]\nlr = nan\n[[cells]]\nstrategy = "sequential"\n',
    "plan/usecase-int.toml": '[study]\nusecases = [3]\n[[cells]]\nstrategy = "sequential"\n',
    "plan/cells-table.toml": PLAN + '[cells]\nstrategy = "sequential"\n',
    "plan/name.toml": '[study]\nname = "../x"\nusecases = ["tiny"]\n[[cells]]\n'
                      'strategy = "sequential"\n',
    "plan/repeat.toml": PLAN.replace("\n", "\nrepeat = 100000000\n", 1)
    + '[[cells]]\nstrategy = "sequential"\n',
    "plan/workers-bool.toml": PLAN + '[[cells]]\nstrategy = "cpu-processes"\nworkers = true\n',
    "plan/table-value.toml": PLAN + '[[cells]]\nstrategy = "sequential"\nseed = {a = 1}\n',
    "plan/unknown-key.toml": PLAN + '[[cells]]\nstrategy = "sequential"\nspeed = 9\n',
    "plan/strategy.toml": PLAN + '[[cells]]\nstrategy = "magic"\n',
    "plan/mlflow-int.toml": PLAN + '[settings]\nmlflow = 5\n[[cells]]\nstrategy = "x"\n',
    "hostfile-bad": "node-a:x\n",
    # issue 37: the classes behind the probe's 117 defects
    "plan-runs5.toml": PLAN + 'runs_dir = 5\n[[cells]]\nstrategy = "sequential"\n',
    "plan-mem.toml": PLAN + 'mem_per_node = "lots"\n[[cells]]\nstrategy = "sequential"\n',
    "plan-newline.toml": '[study]\nname = "x\\n"\nusecases = ["tiny"]\n[[cells]]\n'
                         'strategy = "sequential"\n',
    "deep.toml": "a = " + "[" * 3000 + "]" * 3000 + "\n",
    "deep/manifest.json": "[" * 3000 + "]" * 3000,
    "uc/four.toml": _usecase(prefix='classes = ["a", "b", "c", "d"]\n'),
    "advise-moves.json": '{"usecase": "tiny", "ranking": [' + ROW + '"flags": {"strategy": '
                         '"sequential", "runs_dir": "/tmp/elsewhere"}}]}',
    "plan/too-many.toml": PLAN + '[[cells]]\nstrategy = "sequential"\n' * 2001,
    "uc/source-key.toml": _usecase(prefix='source = "elsewhere.toml"\n'),
    "uc/date.toml": _usecase({"epochs = 1": "epochs = 1979-05-27"}),
    "plan/lr-text.toml": PLAN + '[settings]\nlr = "0.01"\n[[cells]]\nstrategy = "sequential"\n',
    "plan/strategy-int.toml": PLAN + '[[cells]]\nstrategy = 5\n',
    "advise-int.json": '{"usecase": "tiny", "ranking": [' + ROW + '"flags": {"strategy": 5}}]}',
    "plan-data5.toml": PLAN + '[settings]\ndatasets_dir = 5\n[[cells]]\nstrategy = "x"\n',
    "null-start/manifest.json": '{"id": "n", "status": "completed", "started_at": null, '
                                '"config": {"usecase": {}}, "strategy": {"name": "x"}, '
                                '"epochs": []}',
    # probe 38's last ten: a refusal names where the value came from
    "imgs/a/.keep": "",
    "imgs/b/.keep": "",
    "uc/dir-file.toml": 'name = "u"\n[model]\narch = "alexnet"\n[data]\ndir = "../afile"\n',
}

R = ["run", "--runs-dir", "{tmp}/runs", "--datasets-dir", "{tmp}/datasets"]

CASES = [
    # probe 38's last ten: what was there, and where the value came from
    (["report", "{tmp}/afile"], "runs folder {tmp}/afile is a file, not a folder; give the"),
    (["predict", "{tmp}/afile"], "runs folder {tmp}/afile is a file, not a folder"),
    (["advise", "--runs", "{tmp}/afile", "--out", "{tmp}/adv"],
     "runs folder {tmp}/afile is a file, not a folder"),
    (R + ["--usecase", "{tmp}/uc/dir-file.toml"], "error: data.dir in {tmp}/uc/dir-file.toml: "
     "{tmp}/afile is not a folder (it is a file); give the root of an ImageFolder tree"),
    (R + ["--data-dir", "{tmp}/nothing"], "--data-dir: {tmp}/nothing is not a folder (it does "
     "not exist)"),
    (["usecase", "new", "--data-dir", "{tmp}/imgs", "--model", "x y", "--out", "{tmp}/u.toml"],
     "error: --model: must be a model's name (e.g. resnet18, or path/to/file.py:FUNCTION), "
     "got 'x y'"),
    (["usecase", "new", "--data-dir", "{tmp}/imgs", "--image-size", "0", "--out",
      "{tmp}/u.toml"], "error: --image-size: must be a positive int, got 0"),
    (["usecase", "new", "--data-dir", "{tmp}/imgs", "--name", "../up", "--out", "{tmp}/u.toml"],
     "error: --name: '../up': a use case's name"),
    # issue 37: one gate for every file read, every output path, every bound
    (["study", "{tmp}/plan-runs5.toml"], "study.runs_dir: must be a valid string (got 5)"),
    (["study", "{tmp}/plan-mem.toml"], "study.mem_per_node: 'lots'; give a size a node may use"),
    (["study", "{tmp}/plan-newline.toml"], "study.name: 'x\\n': a study's name is the folder"),
    (["study", "{tmp}/deep.toml"], "nests more than 48 levels deep"),
    (["replay", "{tmp}/deep"], "nests more than 48 levels deep"),
    (["compare", "{tmp}/null-start", "{tmp}/null-start"],
     "started_at: must be a valid string (got None)"),
    (["run", "--resume", "{tmp}/null-start"], "started_at: must be a valid string"),
    (["dataset", "make", "--usecase", "{tmp}/uc/four.toml"], "the synthetic set draws only"),
    (R + ["--usecase", "{tmp}/uc/four.toml"], "the synthetic set draws only fire, smoke"),
    (R + ["--usecase", "{tmp}/uc"], "is a folder; give a use case's TOML file"),
    (R + ["--lr", "1e308"], "--lr: 1e+308 is above the limit of 10000"),
    (R + ["--hostfile", "/dev/zero", "--backend", "mpi"], "/dev/zero: is a device"),
    (R + ["--hostfile", "/etc/passwd", "--backend", "mpi"], "/etc/passwd line 1 is not host"),
    (["bench", "reduce", "--nodes", "513"], "--nodes: 513 is above the limit of 512"),
    (["bench", "all", "--repeats", "100000"], "--repeats: 100000 is above the limit"),
    (["bench", "all", "--out", "{tmp}/afile"], "--out: {tmp}/afile is a file"),
    (["advise", "--out", "{tmp}/afile"], "--out: {tmp}/afile is a file"),
    (["predict", "{tmp}", "--out", "{tmp}/afile"], "--out: {tmp}/afile is a file"),
    (["predict", "{tmp}", "--nodes", "1,99999999"], "--nodes: '1,99999999'; every value"),
    (["study", "--from-advice", "{tmp}/advise-moves.json"],
     "ranking #1.runs_dir: unknown key"),
    # one mechanism (pydantic, from the declarations) for what a person writes too
    (R + ["--usecase", "{tmp}/uc/source-key.toml"], "source: unknown key in the use case"),
    (R + ["--usecase", "{tmp}/uc/date.toml"],
     "train.epochs: must be a valid integer (got '1979-05-27')"),
    (["study", "{tmp}/plan/lr-text.toml"], "[settings].lr: must be a valid number (got '0.01')"),
    (["study", "{tmp}/plan/strategy-int.toml"], "[[cells]] #1.strategy: must be a valid string"),
    (["study", "--from-advice", "{tmp}/advise-int.json"],
     "advise-int.json: ranking #1.strategy: must be a valid string (got 5)"),
    # the probe of stop 41: late checks, host lists, empty paths, plan size
    (["replay", "{tmp}/null-start", "--runs-dir", ""], "--runs-dir: give a path, not an empty"),
    (["advise", "--hosts", "a;b", "--out", "{tmp}/adv"], "--hosts: 'a;b'; give host names"),
    (["predict", "{tmp}", "--hosts", "a;b", "--out", "{tmp}/pred"], "--hosts: 'a;b'"),
    (["bench", "reduce", "--hosts", "a;b"], "--hosts: 'a;b'; give host names"),
    (["bench", "all", "--hosts", "a;b", "--only", "overhead", "--out", "{tmp}/b"],
     "--hosts: 'a;b'"),
    (["export", "mlflow", "{tmp}/null-start", "--experiment", "a\nb", "--tracking-uri",
      "sqlite:///{tmp}/x.db"], "--experiment: 'a\\nb': give a name of plain text"),
    (["study", "{tmp}/plan/too-many.toml"], "2001 cells x 1 use case(s) is above the limit"),
    (["advise", "--runs", "{tmp}/uc", "--nodes", "1", "--out", "{tmp}/adv"], "no runs in"),
    (["bench", "reduce", "--size", "1e308"], "--size: 1e308 floats: give a positive number"),
    (["bench", "reduce", "--size", "2.5"], "--size: 2.5: give a whole number of floats"),
    (["advise", "--link", "-5gbit"], "--link: '-5gbit'; a tc rate such as 100mbit"),
    (["bench", "all", "--usecase", "{tmp}/uc/four.toml"], "the synthetic set draws only"),
    (["study", "{tmp}/plan-data5.toml"], "[settings].datasets_dir: must be a valid string (got 5)"),
    (["report", "{tmp}", "--out", "/proc/x"], "--out: /proc/x cannot be made"),
    (["report", "{tmp}", "--out", "/sys/x"], "--out: /sys/x cannot be made"),
    (["report", "{tmp}", "--out", "{tmp}/null-start/rep"], "is inside run folder"),
    (["report", "{tmp}", "--out", "a\nb"], "holds a control character"),
    (["report", "{tmp}", "--out", "x" * 5000], "cannot be made: File name too long"),
    (["bench", "all", "--out", "/proc/x"], "--out: /proc/x cannot be made"),
    (["advise", "--out", "{tmp}/null-start/adv"], "is inside run folder"),
    (["export", "tensorboard", "{tmp}/null-start", "--out", "{tmp}/tb"],
     "started_at: must be a valid string"),
    (R + ["--max-steps", "1000000000000000"], "--max-steps: 1000000000000000 is above"),
    (["advise", "--budget", "1e308s"], "--budget: '1e308s' is above the limit"),
    # run: numbers that are not finite, or beyond any machine
    (R + ["--lr", "nan"], "--lr: must be a positive float, got nan"),
    (R + ["--lr", "inf"], "--lr: must be a positive float, got inf"),
    (R + ["--lr", "-inf"], "argument --lr: expected one argument"),
    (R + ["--sample-hz", "nan"], "--sample-hz: must be between 0"),
    (R + ["--sample-hz", "inf"], "--sample-hz: must be between 0"),
    (R + ["--seed", "99999999999999999999999"], "--seed: must be an integer from 0 to 2**63-1"),
    (R + ["--seed", "-1"], "--seed: must be an integer from 0"),
    (R + ["--target-accuracy", "1.5"], "--target-accuracy: must be a number in [0, 1]"),
    (R + ["--target-accuracy", "0"], "--target-accuracy: must be above 0: every epoch"),
    (R + ["--target-accuracy", "nan"], "--target-accuracy: must be a number in [0, 1]"),
    (R + ["--lr-warmup-epochs", "-1"], "--lr-warmup-epochs: must be a number in [0, "),
    (R + ["--lr-warmup-epochs", "1e9"], "--lr-warmup-epochs: must be a number in [0, "),
    (R + ["--lr-warmup-epochs", "nan"], "--lr-warmup-epochs: must be a number in [0, "),
    (R + ["--backend", "mpi", "--bucket-mb", "1e308"], "--bucket-mb: 1e+308 is above the limit"),
    (R + ["--backend", "mpi", "--bucket-mb", "nan"], "--bucket-mb: must be a positive float"),
    (R + ["--image-size", "100000"], "--image-size: 100000 is above the limit of 2048 px"),
    (R + ["--batch-size", "100000000"], "--batch-size: 100000000 is above the limit"),
    (R + ["--epochs", "100000000000"], "--epochs: 100000000000 is above the limit"),
    (R + ["--strategy", "cpu-processes", "--workers", "100000"], "--workers: 100000 is above"),
    (R + ["--transport", "gloo"], "--transport: chooses how a node's processes talk: it "
                                  "needs --strategy cpu-processes, sharded, zero, tensor "
                                  "(one node), pipeline"),
    (R + ["--strategy", "cpu-processes", "--transport", "tcp"], "--transport: unknown "
                                                                "transport 'tcp'; choose one "
                                                                "of: auto, gloo"),
    (R + ["--strategy", "pipeline", "--stages", "9999"], "--stages: 9999 is above the limit"),
    (R + ["--loader-workers", "10000"], "--loader-workers: must be 0 to 64 processes"),
    (R + ["--backend", "mpi", "--nodes", "100000"], "--nodes: 100000 is above the limit"),
    (R + ["--backend", "spark", "--nodes", "100000"], "--nodes: 100000 is above the limit"),
    (R + ["--backend", "spark", "--spark-master", "local-cluster[2,1,99999999999]"],
     "do not fit in this machine's"),
    (R + ["--backend", "spark", "--spark-secret-file", "{tmp}/afile"],
     "--spark-secret-file: authenticates to a Spark standalone cluster: it needs --spark-master"),
    (R + ["--backend", "spark", "--spark-master", "spark://h:7077", "--spark-secret-file",
          "{tmp}/none"], "--spark-secret-file: secret file {tmp}/none: does not exist"),
    (R + ["--backend", "spark", "--spark-master", "spark://h:7077", "--spark-secret-file",
          "{tmp}/secret-empty"], "--spark-secret-file: {tmp}/secret-empty must hold one secret"),
    (R + ["--backend", "spark", "--spark-master", "spark://h:7077", "--spark-secret-file",
          "{tmp}/secret-two"], "--spark-secret-file: {tmp}/secret-two must hold one secret"),
    (R + ["--spark-secret-file", "{tmp}/afile"], "--spark-secret-file: needs --backend spark"),
    (R + ["--micro-batches", "100000"], "--micro-batches: 100000 is above the limit"),
    (R + ["--strategy", "pipeline", "--schedule", "zigzag"], "--schedule: unknown schedule "
                                                            "'zigzag'"),
    (R + ["--strategy", "pipeline", "--stages", "2", "--schedule", "1f1b",
          "--micro-batches", "1"], "--micro-batches: 1f1b needs at least one micro-batch a "
                                   "stage: 1 for 2 stages"),
    (R + ["--strategy", "pipeline", "--schedule", "interleaved-1f1b", "--stage-starts",
          "0,16"], "--stage-starts: 2 starts make 1 process under interleaved-1f1b"),
    (R + ["--strategy", "pipeline", "--schedule", "interleaved-1f1b", "--stage-starts",
          "0,7,16"], "--stage-starts: 3 starts for 1 process(es) (2 a process under "
                    "interleaved-1f1b): give a multiple of 2"),
    (R + ["--strategy", "cpu-processes", "--schedule", "1f1b"], "--schedule: orders a "
                                                               "pipeline's micro-batches: "
                                                               "cpu-processes has none"),
    (R + ["--accumulate", "0"], "--accumulate: must be a positive int"),
    (R + ["--snapshot-every", "0"], "--snapshot-every: must be a positive int"),
    (R + ["--max-restarts", "-1"], "--max-restarts: must be 0 or more"),
    (R + ["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    (R + ["--strategy"], "argument --strategy: expected one argument"),
    (R + ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    # run: paths
    (["run", "--runs-dir", "{tmp}/afile"], "--runs-dir: {tmp}/afile is a file"),
    (["run", "--runs-dir", "{tmp}/afile/below"], "cannot be made: {tmp}/afile is a file"),
    (["run", "--runs-dir", "{tmp}/runs", "--datasets-dir", "{tmp}/afile"],
     "--datasets-dir: {tmp}/afile is a file"),
    (R + ["--data-dir", "{tmp}/afile"], "--data-dir: {tmp}/afile is not a folder"),
    # run: use cases
    (R + ["--usecase", "{tmp}/uc/nan-lr.toml"], "train.lr: must be a positive float, got nan"),
    (R + ["--usecase", "{tmp}/uc/inf-lr.toml"], "train.lr: must be a positive float, got inf"),
    (R + ["--usecase", "{tmp}/uc/classes-int.toml"], "classes: must be a list (got 3)"),
    (R + ["--usecase", "{tmp}/uc/classes-str.toml"], "classes: must be a list (got 'abc')"),
    (R + ["--usecase", "{tmp}/uc/classes-path.toml"], "classes: '../smoke' is not a class "
                                                      "folder's name: one path component"),
    (R + ["--usecase", "{tmp}/uc/empty-name.toml"], "name: '': a use case's name"),
    (R + ["--usecase", "{tmp}/uc/escape.toml"], "name: '../../escape': a use case's name"),
    (R + ["--usecase", "{tmp}/uc/images.toml"], "data.images: 100000000000 is above"),
    (R + ["--usecase", "{tmp}/uc/source.toml"], "data.source_size: 1000000 is above"),
    (R + ["--usecase", "{tmp}/uc/width.toml"], "model.width: must be a valid number (got 'wide')"),
    (R + ["--usecase", "{tmp}/uc/arch.toml"], "model.arch"),
    # a use case's model is refused by its key and file, not as a --model never given
    (R + ["--usecase", "{tmp}/uc/arch-unknown.toml"], "model.arch in {tmp}/uc/arch-unknown.toml"
     ": unknown model 'nosuchnet'"),
    (R + ["--usecase", "{tmp}/uc/arch-file.toml"], "model.arch in {tmp}/uc/arch-file.toml: "),
    (R + ["--usecase", "{tmp}/uc/batch-list.toml"], "train.batch_size: must be a valid integer"),
    (R + ["--usecase", "{tmp}/uc/data-name.toml"], "data.name: must be a valid string (got 5)"),
    (R + ["--usecase", "{tmp}/uc/data-escape.toml"], "data.name: must be a plain folder"),
    (R + ["--usecase", "{tmp}/uc/seed.toml"], "train.seed: must be an integer from 0"),
    (R + ["--usecase", "{tmp}/uc/momentum.toml"], "train.momentum: must be a valid number"),
    (R + ["--usecase", "{tmp}/uc/target.toml"], "train.target_accuracy: must be a valid number"),
    (R + ["--usecase", "{tmp}/uc/difficulty.toml"], "data.difficulty: must be a number"),
    (R + ["--usecase", "{tmp}/uc/not-toml.toml"], "is not valid TOML"),
    (R + ["--usecase", "{tmp}/afile"], "{tmp}/afile: is not valid TOML"),
    (R + ["--usecase", "{tmp}/nothing.toml"], "use-case file {tmp}/nothing.toml does not"),
    # run: hosts
    (R + ["--backend", "mpi", "--nodes", "2", "--hosts", "a;b"], "--hosts: 'a;b'"),
    (R + ["--backend", "mpi", "--nodes", "2", "--hosts", "a b"], "--hosts: 'a b'"),
    (R + ["--backend", "mpi", "--hostfile", "{tmp}/hostfile-bad"],
     "hostfile-bad line 1 is not host"),
    (R + ["--backend", "mpi", "--hostfile", "{tmp}/nothing"],
     "--hostfile: host file {tmp}/nothing: does not exist"),
    # dataset make
    (["dataset", "make", "--out", "{tmp}/afile"], "--out: {tmp}/afile is a file"),
    (["dataset", "make", "--out", "{tmp}/out", "--workers", "100000"],
     "--workers: must be 1 to 64"),
    (["dataset", "make", "--usecase", "{tmp}/uc/images.toml", "--out", "{tmp}/out"],
     "data.images: 100000000000 is above"),
    (["dataset", "make", "--out", "{tmp}/out", "--shard", "3/2"], "argument --shard"),
    # manifests: replay, compare, resume
    (["replay", "{tmp}/bad-json"], "is not valid JSON"),
    (["replay", "{tmp}/list"], "manifest.json: is not a run manifest (a JSON object"),
    (["replay", "{tmp}/empty"], "manifest.json: id: is required"),
    (["replay", "{tmp}/nothing"], "is neither a run folder nor a manifest.json"),
    (["compare", "{tmp}/bad-json", "{tmp}/empty"], "is not valid JSON"),
    (["compare", "{tmp}/list", "{tmp}/list"], "manifest.json: is not a run manifest"),
    (["run", "--resume", "{tmp}/empty"], "manifest.json: id: is required"),
    (["run", "--resume", "{tmp}/list", "--epochs", "2"], "--resume: continues a run with"),
    # report, export
    (["report", "{tmp}/nothing"], "runs folder {tmp}/nothing does not exist"),
    (["report", "{tmp}/bad-json", "--out", "{tmp}/afile"], "--out: {tmp}/afile is a file"),
    (["report", "{tmp}", "--format", "pdf"], "argument --format: invalid choice: 'pdf'"),
    (["export", "tensorboard", "{tmp}/nothing", "--out", "{tmp}/tb"], "is not a run folder"),
    (["export", "tensorboard", "{tmp}/bad-json", "--out", "{tmp}/afile"], "is a file"),
    # issue 36: MLflow, refused before its store is made
    (["export", "mlflow", "{tmp}/nothing"], "is not a run folder or a folder of runs"),
    (["export", "mlflow", "{tmp}/bad-json"], "manifest.json: is not valid JSON"),
    (["export", "mlflow", "{tmp}/null-start"], "started_at: must be a valid string"),
    (["export", "mlflow", "{tmp}/null-start", "--tracking-uri", "mongodb://x"],
     "--tracking-uri: 'mongodb://x' is not a tracking URI MLflow takes"),
    (["export", "mlflow", "{tmp}", "--tracking-uri", "sqlite:///{tmp}/afile/x.db"],
     "--tracking-uri: {tmp}/afile is a file"),
    (["export", "mlflow", "{tmp}", "--tracking-uri", "sqlite:///{tmp}/null-start/x.db"],
     "is inside run folder"),
    (R + ["--mlflow", "mongodb://x"], "--mlflow: 'mongodb://x' is not a tracking URI"),
    (R + ["--mlflow", "sqlite:///{tmp}/afile/x.db"], "--mlflow: {tmp}/afile is a file"),
    (["study", "{tmp}/plan/mlflow-int.toml"],
     "[settings].mlflow: must be true (the flag alone), false or a URI (got 5)"),
    # study plans
    (["study", "{tmp}/plan/missing.toml"], "study plan {tmp}/plan/missing.toml does not exist"),
    (["study", "{tmp}/plan/epochs-str.toml"], "[[cells]] #1.epochs: must be a valid integer"),
    (["study", "{tmp}/plan/lr-str.toml"], "[settings].lr: must be a valid number (got 'fast')"),
    (["study", "{tmp}/plan/lr-nan.toml"], "[settings].lr: must be a finite number (got nan)"),
    (["study", "{tmp}/plan/usecase-int.toml"], "study.usecases[0]: must be a valid string (got 3)"),
    (["study", "{tmp}/plan/cells-table.toml"], "[[cells]]"),
    (["study", "{tmp}/plan/name.toml"], "study.name: '../x'"),
    (["study", "{tmp}/plan/repeat.toml"], "--repeat: must be an integer from 1 to 1000"),
    (["study", "{tmp}/plan/workers-bool.toml"], "[[cells]] #1.workers: must be a valid "
     "integer (got True)"),
    (["study", "{tmp}/plan/table-value.toml"], "[[cells]] #1.seed: must be a valid integer"),
    (["study", "{tmp}/plan/unknown-key.toml"], "[[cells]] #1.speed: unknown key"),
    (["study", "{tmp}/plan/strategy.toml"], "unknown strategy 'magic'"),
    (["study", "{tmp}/uc/nan-lr.toml"], "is a use case, not a study plan"),
    # hosts, predict, bench
    (["hosts", "down", "--prefix", "../x"], "--prefix: '../x'"),
    (["hosts", "status", "--prefix", ""], "--prefix: ''"),
    (["hosts", "up", "--count", "100000"], "--count: 100000 hosts"),
    (["hosts", "up", "--rate", "fast"], "--rate: 'fast'"),
    (["hosts", "up", "--cpus", "x"], "--cpus: 'x'"),
    (["predict", "{tmp}/nothing"], "does not exist"),
    # advise, and a study of its advice
    (["advise", "--budget", "0"], "--budget: '0'; give seconds"),
    (["advise", "--budget", "soon"], "--budget: 'soon'; give seconds"),
    (["advise", "--budget", "nans"], "--budget: 'nans'"),
    (["advise", "--link", "fast"], "--link: 'fast'; a tc rate such as 100mbit"),
    (["advise", "--link", "1gbit", "--hosts", "a,b"], "--link: give --hosts"),
    (["advise", "--nodes", "0"], "--nodes: '0'; every value must be positive"),
    (["advise", "--nodes", "two"], "--nodes: 'two'"),
    (["advise", "--memory", "lots"], "--memory: 'lots'; give a size a node may use, e.g. 1GiB"),
    (["advise", "--memory", "1GiBs"], "--memory: '1GiBs'; give a size"),
    (["advise", "--memory", "0"], "--memory: '0'; give a size"),
    (["advise", "--strategies", "cpu-threads,warp"],
     "--strategies: unknown strategy 'warp'; choose one of: sequential, cpu-intraop"),
    (["advise", "--strategies", "cpu-threads,,pipeline"],
     "--strategies: 'cpu-threads,,pipeline'; give strategy names separated by commas"),
    (["advise", "--rounds", "0"], "--rounds: must be a positive integer"),
    (["advise", "--usecase", "nope"], "nope"),
    (["advise", "--runs", "{tmp}/nothing"], "does not exist"),
    (["advise", "--hosts", "emulated:nope"], "nope"),
    (["study"], "give a study plan"),
    (["study", "demo", "--from-advice", "{tmp}/afile"], "give a study plan"),
    (["study", "--from-advice", "{tmp}/nothing.json"], "does not exist; write one with"),
    (["study", "--from-advice", "{tmp}/afile"], "advise.json {tmp}/afile: is not valid JSON"),
    (["study", "--from-advice", "{tmp}/bad-json/manifest.json"],
     "manifest.json: is not valid JSON"),
    (["study", "--from-advice", "{tmp}/afile", "--top", "0"], "--top: must be a positive"),
    (["bench", "overhead", "--repeats", "0"], "--repeats: must be a positive integer"),
    (["bench", "sampler", "--hz", "nan"], "--hz: must be a rate above 0 and at most 100"),
    (["bench", "all", "--only", "nope"], "--only: unknown group(s) nope"),
    (["run", "--model", OWN_NET.replace("small_resnet", "fails_when_real")],
     "fails_when_real(num_classes=3) raised MemoryError: cannot allocate 54 GB"),
    (["run", "--model", OWN_NET.replace("small_resnet", "list_when_real")],
     "list_when_real(num_classes=3) returned list, not a torch.nn.Module"),
    (["run", "--model", OWN_NET.replace("small_resnet", "four_terabytes")],
     "of memory free; give a smaller model"),
    (["export", "mlflow", "{tmp}", "--experiment", "x" * 3000],
     "is 3,000 characters long; MLflow takes experiment names of at most 500 characters"),
    (["run", "--strategy", "tensor", "--model", OWN_NET],
     "tensor parallelism splits pairs of consecutive Linear layers"),
    (["run", "--strategy", "sharded", "--workers", "2", "--tensor", "3"],
     "--tensor: 3 does not divide the 2 processes"),
    (["run", "--strategy", "tensor", "--workers", "3"],  # tiny's classifier: 1024 features
     "--workers: 3 processes cannot split classifier.1's 1024 features evenly (tensor "
     "parallelism cuts each Linear pair's features among them); give --workers 2, 4, 8, 16, "
     "32 or 64"),
    (["run", "--strategy", "sharded", "--workers", "6", "--tensor", "3"],
     "--tensor: 3 processes cannot split classifier.1's 1024 features evenly"),
    (["run", "--strategy", "sharded", "--workers", "2", "--tensor", "2"],
     "--tensor: 2 of the 2 processes leaves none to shard over (the mesh would be 1 x 2): "
     "that is --strategy tensor --workers 2"),
    (["run", "--strategy", "cpu-processes", "--tensor", "2"],
     "--tensor: splits Linear pairs over processes inside a mesh: cpu-processes has none"),
    (["run", "--strategy", "pipeline", "--tensor", "2"],
     "--tensor: a pipeline's stages are not split over tensor-parallel processes yet (PP x TP)"),
    (["run", "--strategy", "hybrid", "--no-reshard-after-forward"],
     "--no-reshard-after-forward: a pipeline's stages are not sharded yet (PP x FSDP)"),
    (["run", "--strategy", "tensor", "--backend", "spark", "--nodes", "2", "--workers", "1"],
     "--backend: Spark's tasks would be one tensor-parallel group sharing each batch"),
    (["run", "--strategy", "sharded", "--backend", "spark", "--nodes", "2", "--workers", "2"],
     "--workers: a Spark barrier task is one process, and sharded --workers 2 asks for 2"),
    (["run", "--strategy", "zero", "--backend", "spark", "--nodes", "2", "--workers", "1",
      "--spark-sync", "allgather"],
     "--spark-sync: allgather averages whole weights between the tasks, and zero splits"),
    (["run", "--strategy", "tensor", "--workers", "2", "--precision", "fp16"],
     "--precision: tensor has no fp16 gradient scaler yet"),
    (["bench", "collectives", "--processes", "0"], "--processes: must be a positive integer"),
    (["bench", "collectives", "--size", "2.5"], "--size: 2.5: give a whole number of floats"),
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
]


@pytest.fixture
def bad_files(tmp_path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_table_has_enough_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize(("argv", "message"), CASES,
                         ids=[" ".join(a[:1] + a[5:] if a[:1] == ["run"] and a[1:2] ==
                                       ["--runs-dir"] else a)[:60] for a, _ in CASES])
def test_bad_input_is_refused_in_one_line(argv, message, bad_files, capsys, monkeypatch):
    monkeypatch.chdir(bad_files)  # a default runs/ or datasets/ would land here
    monkeypatch.setenv("DDLSTUDY_HOME", str(bad_files))
    before = _tree(bad_files)
    tmp = str(bad_files)
    code = main([a.replace("{tmp}", tmp) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("ddlstudy: error: ") and err.count("\n") == 1, err
    assert message.replace("{tmp}", tmp) in err
    assert "Traceback" not in err
    assert _tree(bad_files) == before  # nothing written, nothing deleted
    assert not Path(os.environ["DDLSTUDY_HOME"], "runs").exists()


def test_a_data_set_name_reused_with_other_settings_is_refused(datasets_dir, tiny, tmp_path,
                                                                capsys):
    """Two use cases naming one data set with different settings would silently regenerate
    each other's images; the second is refused, and the set is left as it was."""
    other = tmp_path / "other.toml"
    other.write_text(_usecase({"images = 300": "images = 600"}))
    sums = datasets_dir / tiny.data.name / "SHA256SUMS"
    before = sums.read_bytes()
    for argv in (["run", "--usecase", str(other), "--runs-dir", str(tmp_path / "runs"),
                  "--datasets-dir", str(datasets_dir)],
                 ["dataset", "make", "--usecase", str(other), "--out",
                  str(datasets_dir / tiny.data.name)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "holds a data set of the same name made with other settings (images 300 " \
               "there, 600 here" in err and err.count("\n") == 1
    assert sums.read_bytes() == before and not (tmp_path / "runs").exists()


def test_a_bad_run_id_is_refused_before_the_data_is_prepared(tmp_path, capsys, monkeypatch):
    """DDLSTUDY_RUN_ID names the run folder: one that would leave the runs folder is
    refused before the synthetic set is generated or its cache stamped."""
    monkeypatch.setenv("DDLSTUDY_RUN_ID", "../escape")
    code = main(["run", "--usecase", "tiny", "--runs-dir", str(tmp_path / "runs"),
                 "--datasets-dir", str(tmp_path / "datasets"), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "run id '../escape' is not a plain folder name" in err and "DDLSTUDY_RUN_ID" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["fifo-record", "deep-record", "fifo-sums", "list-record",
                                    "no-sums"])
def test_a_data_set_whose_record_is_damaged_is_refused_not_regenerated(damage, tmp_path,
                                                                        capsys):
    """A synthetic set's dataset.json or SHA256SUMS that cannot be read (a FIFO, nested
    3,000 deep, not a record) is refused in one line, and the folder, which may hold
    someone's files, is left as it was: nothing generated, nothing said before."""
    root = tmp_path / "datasets" / "synthetic-tiny"
    (root / "fire").mkdir(parents=True)
    (root / "fire" / "mine.jpg").write_bytes(b"someone's image")
    record, sums = root / "dataset.json", root / "SHA256SUMS"
    if damage == "fifo-record":
        os.mkfifo(record)
    elif damage == "deep-record":
        record.write_text("[" * 3000 + "]" * 3000)
    elif damage == "list-record":
        record.write_text("[1, 2]")
    elif damage == "no-sums":  # its images may have been changed or added to: not ours now
        record.write_text("{}")
    else:
        record.write_text("{}")
        os.mkfifo(sums)
    before = _tree(tmp_path)
    code = main(["run", "--usecase", "tiny", "--runs-dir", str(tmp_path / "runs"),
                 "--datasets-dir", str(tmp_path / "datasets"), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ddlstudy: error: ") and err.count("\n") == 1, err
    assert str(root) in err and "--force" in err, err
    assert _tree(tmp_path) == before
    assert (root / "fire" / "mine.jpg").read_bytes() == b"someone's image"


def test_a_run_id_already_taken_is_refused_before_the_data_is_prepared(tmp_path, capsys,
                                                                         monkeypatch):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "manifest.json").write_text("{}")
    monkeypatch.setenv("DDLSTUDY_RUN_ID", "taken")
    code = main(["run", "--usecase", "tiny", "--runs-dir", str(tmp_path / "runs"),
                 "--datasets-dir", str(tmp_path / "datasets"), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "runs/taken already exists; a new run needs a run id of its own" in err
    assert not (tmp_path / "datasets").exists()
    assert (tmp_path / "runs" / "taken" / "manifest.json").read_text() == "{}"


@pytest.mark.parametrize(("snap", "message"), [
    ("fifo", "is a FIFO, not a regular file"),
    ({"rng": [], "position": {}}, "it holds no 'epoch'"),
    ({"epoch": "1", "step": 0, "model": {}, "optimizer": {}, "position": {}, "rng": []},
     "its epoch and step must be counts"),
    ({"epoch": 1, "step": 0, "model": {}, "optimizer": {},
      "position": {"generator": 0, "sums": [{}]}, "rng": [{}, {}]},
     "1 ranks' positions"),
    ({"epoch": 1, "step": 0, "model": {}, "optimizer": {}, "scheduler": [0.1],
      "position": {"generator": 0, "sums": [{}]}, "rng": [{}]},
     "its learning-rate schedule is not a state dict"),
    ("wrong-weights", "its weights do not fit alexnet with 3 classes"),
])
def test_a_snapshot_is_checked_whole_before_the_run_is_touched(snap, message, tmp_path, tiny):
    """A resume reads the snapshot through the gate (a FIFO is refused, not waited on) and
    checks its shape and its weights against the use case's model, before the run folder
    is reopened: the refusal says what is wrong and leaves the file as it is."""
    import torch

    from ddlstudy.errors import UsageError
    from ddlstudy.models import build_model
    from ddlstudy.runner.snapshots import load_snapshot

    file = tmp_path / "snapshot.pt"
    if snap == "fifo":
        os.mkfifo(file)
    else:
        if snap == "wrong-weights":
            model = build_model(tiny.model, 4)  # 4 classes: the last layer does not fit
            snap = {"epoch": 1, "step": 3, "model": model.state_dict(), "optimizer": {},
                    "position": {"generator": 0, "sums": [{}]}, "rng": [{}]}
        torch.save(snap, file)
    before = _tree(tmp_path), file.stat().st_mtime_ns
    with pytest.raises(UsageError, match="") as err:
        load_snapshot(tmp_path, usecase=tiny)
    assert message in str(err.value) and "left as it is" in str(err.value), err.value
    assert (_tree(tmp_path), file.stat().st_mtime_ns) == before


def test_a_fifo_for_the_cache_lock_is_not_waited_on(tmp_path, monkeypatch, datasets_dir, tiny):
    """Another process's FIFO where the decoded cache's lock goes would block an open for
    ever: the cache is left unused, and the reason names the file."""
    from ddlstudy.data.cache import decoded

    monkeypatch.setenv("DDLSTUDY_CACHE", str(tmp_path))
    root = datasets_dir / tiny.data.name
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*.jpg"))[:4]
    found, why = decoded(root, rels, "f" * 64, 16)
    assert found is not None and why == ""
    lock = next(tmp_path.glob("*.lock"))
    for p in tmp_path.glob("ffff*"):
        p.unlink()
    os.mkfifo(lock)
    found, why = decoded(root, rels, "f" * 64, 16)
    assert found is None and f"{lock} is a FIFO, not a regular file" in why


def test_report_skips_and_names_malformed_manifests(quick_config, tmp_path, capsys):
    """One bad manifest among good runs: the report still has the good run's row, and
    says which files it skipped and why."""
    from ddlstudy.runner import run

    folder = run(quick_config(max_steps=2), show_progress=False)
    runs = folder.path.parent
    head = ('"status": "completed", "started_at": "t", "config": {"usecase": {}}, '
            '"strategy": {"name": "sequential"}')
    bad = {"unreadable": "{not json", "foreign": "[1, 2]",
           "no-times": '{"id": "x", ' + head + ', "epochs": [{"x": 1}]}',
           "text-times": '{"id": "y", ' + head + ', "epochs": [{"epoch": 1, "train_loss": '
                         '1.0, "epoch_time_s": "x", "steady_images_per_s": "y", '
                         '"val_accuracy": 0.3}]}',
           "null-start": '{"id": "z", ' + head.replace('"t"', "null") + ', "epochs": []}'}
    for name, text in bad.items():
        (runs / name).mkdir()
        (runs / name / "manifest.json").write_text(text)
    assert main(["report", str(runs)]) == 0
    out, err = capsys.readouterr()
    assert "| sequential |" in out
    skipped = {line.split("report: skipped ")[1].split("/")[-2]: line
               for line in err.splitlines() if "report: skipped" in line}
    assert set(skipped) == set(bad)
    assert "unreadable" in skipped["unreadable"]
    assert "is not a run manifest (a JSON object was expected" in skipped["foreign"]
    assert "epochs[0].epoch: is required" in skipped["no-times"]
    assert "steady_images_per_s: must be a valid number" in skipped["text-times"]
    assert "started_at: must be a valid string (got None)" in skipped["null-start"]


@pytest.mark.parametrize("field, value", [("name", "../../../escaped"),
                                          ("data", {"name": "../../up", "images": 300,
                                                    "source_size": 64})])
def test_a_replayed_manifest_cannot_write_outside_its_folders(quick_config, tmp_path, capsys,
                                                              monkeypatch, field, value):
    """A manifest whose use case (or data set) name climbs out of the runs or datasets
    folder: replay refuses it and nothing is written anywhere."""
    import json

    cfg = quick_config()
    config = json.loads(json.dumps(cfg.to_dict(), default=str))
    config["usecase"][field] = value if field == "name" else config["usecase"][field] | value
    run = tmp_path / "deep" / "er" / "run"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "id": "r", "status": "completed", "started_at": "t", "config": config, "epochs": [],
        "strategy": {"name": "sequential"}}))
    monkeypatch.chdir(run)
    before = _tree(tmp_path)
    assert main(["replay", str(run), "--runs-dir", str(tmp_path / "deep" / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlstudy: error: ") and err.count("\n") == 1, err
    assert "must be a plain folder name" in err or "a use case's name" in err, err
    assert "Traceback" not in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("argv", [["report"], ["predict"], ["advise", "--out", "{tmp}/adv",
                                                            "--runs"]])
def test_a_fifo_given_as_the_runs_folder_is_named_for_what_it_is(argv, tmp_path, capsys):
    """A FIFO (or any other thing that is not a folder) given as the runs folder is said to
    be one, not to be missing, and is never opened (a FIFO would block)."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv] + [str(fifo)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ddlstudy: error: ") and err.count("\n") == 1, err
    assert f"runs folder {fifo} is a FIFO, not a folder; give the folder the runs are in" \
        in err and "does not exist" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_an_unreadable_image_is_refused_before_the_decode_memo_is_written(imagefolder,
                                                                          tmp_path, capsys,
                                                                          monkeypatch):
    """The scan remembers which images of a tree decode only once the tree is accepted: a
    refusal (--on-bad-image fail) leaves the cache as it was; skip remembers the tree."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("DDLSTUDY_CACHE", str(cache))
    bad = imagefolder / "fire" / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    argv = ["run", "--data-dir", str(imagefolder), "--model", "alexnet", "--runs-dir",
            str(tmp_path / "runs"), "--max-steps", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddlstudy: error: unreadable image ") and str(bad) in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()
    assert not (cache / "checked" / "images").exists()  # the recipe's and model's checks passed

    from ddlstudy.config import BadImagePolicy
    from ddlstudy.data.folder import scan_imagefolder

    classes = tuple(sorted(p.name for p in imagefolder.iterdir() if p.is_dir()))
    scan_imagefolder(imagefolder, classes, BadImagePolicy.SKIP)
    memo, = (cache / "checked" / "images").iterdir()
    assert "fire/bad.jpg" in memo.read_text()
