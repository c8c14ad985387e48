"""Bad input to the commands that take one's own model, data and files: one sentence,
exit 2, no traceback, and nothing written or overwritten."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from ddlstudy.cli import main


def _folder(root, classes, images=3):
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(images):
            Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(root / name / f"{i}.png")
    return root


def _refused(capsys, *args) -> str:
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("ddlstudy: error:"), err
    return err


def _run_folder(tmp_path):
    """A finished run's folder: its manifest (its use case) and a snapshot of weights."""
    from ddlstudy.config import ModelSpec, load_usecase
    from ddlstudy.models import build_model

    run = tmp_path / "runs" / "r1"
    (run / "tensorboard").mkdir(parents=True)
    uc = load_usecase("tiny")
    usecase = {"name": uc.name, "classes": list(uc.classes),
               "model": {"arch": "alexnet", "width": 0.25},
               "data": {"name": "synthetic-tiny", "images": 300, "source_size": 64},
               "train": {"image_size": 64}}
    (run / "manifest.json").write_text(json.dumps({
        "id": "r1", "status": "completed", "started_at": "t", "config": {"usecase": usecase},
        "strategy": {"name": "sequential"}, "epochs": []}))
    state = build_model(ModelSpec(arch="alexnet", width=0.25), 3).state_dict()
    torch.save({"model": state}, run / "snapshot.pt")
    return run


def test_an_output_file_is_never_overwritten_nor_written_into_a_run(tmp_path, capsys):
    run = _run_folder(tmp_path)
    keep = tmp_path / "keep.pt"
    keep.write_text("mine")
    err = _refused(capsys, "export", "model", str(run), "--out", str(keep))
    assert "exists; give another path, or --force" in err and keep.read_text() == "mine"
    (tmp_path / "pair.usecase.json").write_text("mine")  # half of a pair is there
    _refused(capsys, "export", "model", str(run), "--out", str(tmp_path / "pair.pt"))
    assert not (tmp_path / "pair.pt").exists()
    err = _refused(capsys, "export", "model", str(run), "--out",
                   str(run / "tensorboard" / "m.pt"))
    assert "inside run folder" in err and not (run / "tensorboard" / "m.pt").exists()
    (tmp_path / "afile").write_text("x")
    _refused(capsys, "export", "model", str(run), "--out", str(tmp_path / "afile" / "m.pt"))
    assert main(["export", "model", str(run), "--out", str(tmp_path / "new" / "m.pt")]) == 0
    assert main(["export", "model", str(run), "--out", str(keep), "--force"]) == 0
    assert keep.read_bytes()[:2] == b"PK"  # replaced, as asked, by the weights


BRANCHY = """from torch import nn


class Net(nn.Module):  # its forward branches on the values, which torch.export cannot follow
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, x):
        x = x.mean((2, 3))
        return self.fc(x if x.sum() > 0 else -x)


def make(num_classes):
    return Net(num_classes)
"""


def test_an_onnx_export_torch_cannot_make_is_refused_and_writes_nothing(tmp_path, capsys):
    from ddlstudy.config import ModelSpec
    from ddlstudy.models.sources import made

    run = _run_folder(tmp_path)
    keep = tmp_path / "keep.onnx"
    keep.write_text("mine")
    err = _refused(capsys, "export", "model", str(run), "--out", str(keep), "--format", "onnx")
    assert "exists; give another path, or --force" in err and keep.read_text() == "mine"
    (tmp_path / "branchy.py").write_text(BRANCHY)
    arch = f"{tmp_path / 'branchy.py'}:make"
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["usecase"]["model"] = {"arch": arch}
    (run / "manifest.json").write_text(json.dumps(manifest))
    torch.save({"model": made(ModelSpec(arch=arch), 3).state_dict()}, run / "snapshot.pt")
    err = _refused(capsys, "export", "model", str(run), "--out", str(tmp_path / "m.onnx"),
                   "--format", "onnx")
    assert f"torch.onnx cannot export {arch}: GuardOnDataDependentSymNode: Could not guard " \
        "on data-dependent expression" in err and "nothing written" in err, err
    assert not list(tmp_path.glob("m.*"))  # neither the ONNX file nor its sidecar


def test_a_damaged_run_is_refused_and_left_as_it_is(tmp_path, capsys):
    run = _run_folder(tmp_path)
    (run / "snapshot.pt").write_bytes(b"broken")
    err = _refused(capsys, "export", "model", str(run), "--out", str(tmp_path / "m.pt"))
    assert "snapshot.pt is damaged or not ddlstudy's; it is left as it is" in err
    (run / "manifest.json").write_text("{not json")
    err = _refused(capsys, "export", "model", str(run), "--out", str(tmp_path / "m.pt"))
    assert "manifest.json: is not valid JSON" in err and (run / "manifest.json").read_text() == \
        "{not json"


def test_a_use_case_of_any_folder_names_is_written_as_valid_toml(tmp_path, capsys):
    from ddlstudy.config import load_usecase

    pets = _folder(tmp_path / 'we"ird\\dir', ["golden retriever", "chat noir", "été"])
    out = tmp_path / "uc" / "pets.toml"
    assert main(["usecase", "new", "--data-dir", str(pets), "--model", "alexnet",
                 "--image-size", "64", "--out", str(out)]) == 0
    uc = load_usecase(str(out))
    assert uc.data.dir == pets.resolve() and uc.classes is None
    err = _refused(capsys, "usecase", "new", "--data-dir", str(pets), "--out", str(out))
    assert "exists" in err
    err = _refused(capsys, "usecase", "new", "--data-dir", "", "--out", str(tmp_path / "x.toml"))
    assert "--data-dir: give a path, not an empty string" in err


def test_a_folder_too_small_to_validate_is_refused_before_any_run(tmp_path, capsys):
    one = _folder(tmp_path / "one", ["a", "b"], images=1)
    runs = tmp_path / "runs"
    err = _refused(capsys, "run", "--data-dir", str(one), "--model", "alexnet",
                   "--image-size", "64", "--runs-dir", str(runs))
    assert "too few images of a, b (1, 1); a run needs at least 2 a class" in err
    assert not runs.exists()


@pytest.mark.parametrize("size, message", [
    ("²", "unknown model '²'"), ("0", "give a positive number of floats"),
    ("-3", "give a positive number of floats"),
    ("99999999999999999", "give a positive number of floats that 2 ranks' buffers can hold"),
])
def test_bench_reduce_refuses_a_size_before_measuring_anything(size, message, capsys):
    err = _refused(capsys, "bench", "reduce", "--size", size)
    assert message in err and "host" not in err
