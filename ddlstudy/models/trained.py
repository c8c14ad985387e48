"""A trained model out of a run, and weights of one's own into one.

``ddlstudy export model RUN --out model.pt`` writes the run's final weights as a plain state
dict (loadable with ``torch.load(weights_only=True)``: no pickle) and, beside it,
``model.usecase.json``: the use case it was trained on (the model's name, the classes in
label order, the image size). Loading it back takes three lines::

    from ddlstudy.models.trained import load
    model = load("model.pt")  # the network with the run's weights
    model.eval()

``--format onnx`` writes the network as an ONNX file instead (``onnx_export``), with the
same ``model.usecase.json`` beside it.

``--init-weights FILE`` starts a run from a state dict of one's own (fine-tuning; never a
download): it must fit the model, parameter for parameter (``check_weights``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddlstudy.config import ModelSpec, UseCase, usecase_from_dict
from ddlstudy.config.recipe import MEAN, STD
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.files import check_output, write_outputs
from ddlstudy.models import shapes_only
from ddlstudy.models.onnx_export import check_installed, onnx_bytes
from ddlstudy.models.sources import made, named, sha256_of
from ddlstudy.reading import BadFile, check_regular, read_json
from ddlstudy.records.runfolder import load_manifest

SIDECAR = ".usecase.json"


def sidecar(weights: Path) -> Path:
    """The use case's file beside exported weights: model.pt -> model.usecase.json."""
    return Path(weights).with_suffix(SIDECAR)


def read_weights(path: Path, flag: str) -> dict[str, torch.Tensor]:
    """A state dict from ``path`` (tensors only: nothing in it runs), or a ConfigError."""
    try:
        check_regular(path, "weights file")  # a FIFO would block torch.load for ever
    except BadFile as exc:
        raise ConfigError(flag, str(exc)) from None
    try:
        with warnings.catch_warnings():  # torch's notes on a foreign pickle: we refuse it
            warnings.simplefilter("ignore")
            state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ConfigError(flag, f"{path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file
        raise ConfigError(flag, f"{path} is not a file of weights torch.load can read "
                          f"safely ({type(exc).__name__}); give a state dict saved with "
                          f"torch.save(model.state_dict(), FILE)") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a ddlstudy snapshot
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise ConfigError(flag, f"{path} holds no state dict (names to tensors)")
    return state


def misfit(spec: ModelSpec, num_classes: int, state: dict) -> str | None:
    """Which model the weights ``state`` do not fit and how ("alexnet with 3 classes:
    ..."), name for name and shape for shape (the model built without its weights'
    memory); None where they fit."""
    model, _ = shapes_only(spec, num_classes)
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(wanted) - set(state))
    extra = sorted(set(state) - set(wanted))
    shape = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    wrong = [k for k in wanted if k in state and shape[k] != wanted[k]]
    if not (missing or extra or wrong):
        return None
    what = (f"{wrong[0]} is {shape[wrong[0]]} there, {wanted[wrong[0]]} in the model"
            if wrong else f"{(missing or extra)[0]} is "
            f"{'missing there' if missing else 'not in the model'}")
    return f"{spec.arch} with {num_classes} classes: {what}"


def check_weights(spec: ModelSpec, num_classes: int, path: Path) -> str:
    """Refuse weights that do not fit ``spec``'s model name for name and shape (before
    anything starts); returns their sha256."""
    problem = misfit(spec, num_classes, read_weights(path, "--init-weights"))
    if problem:
        raise ConfigError("--init-weights", f"{path} does not fit {problem}")
    return sha256_of(Path(path))


def load_initial(model: nn.Module, path: Path) -> None:
    """``model`` starts from the weights in ``path`` (checked at preflight)."""
    model.load_state_dict(read_weights(path, "--init-weights"))


def export(run: Path, out: Path, force: bool = False, fmt: str = "pt") -> list[Path]:
    """The final weights of ``run`` (its snapshot's model) into ``out``, its use case
    beside them (``force``: replacing what is there): a state dict (``fmt`` "pt") or the
    network as an ONNX file ("onnx")."""
    out = Path(out)
    for path in (out, sidecar(out)):
        check_output("--out", path, force)
    if fmt == "onnx":
        check_installed()
    model, state, described = trained(run, fmt)
    text = json.dumps(described, indent=2)
    data = None if fmt != "onnx" else onnx_bytes(model, described["preprocessing"]["size"],
                                                 described["usecase"]["model"]["arch"])
    write_outputs("--out", {out: lambda f: torch.save(state, f) if data is None else f.write(data),
                            sidecar(out): lambda f: f.write(text.encode())})
    return [out, sidecar(out)]


def trained(run: Path, fmt: str = "pt") -> tuple[nn.Module, dict[str, torch.Tensor],
                                                 dict[str, Any]]:
    """The network ``run`` trained (its snapshot's weights in the model its manifest
    records), those weights, and what ``model.usecase.json`` says of them (the use case,
    the run, the classes, ``fmt`` and the preprocessing a new image needs)."""
    run = Path(run)
    manifest_file = run / "manifest.json"
    if not manifest_file.exists():
        raise UsageError(f"{run} is not a run folder (it has no manifest.json)")
    manifest = load_manifest(manifest_file)
    snapshot = run / "snapshot.pt"
    if not snapshot.exists() and not snapshot.is_symlink():
        raise UsageError(f"run {run.name} kept no weights (it ran with --no-snapshot, or "
                         f"ended before its first epoch); run it again without --no-snapshot")
    try:
        state = read_weights(snapshot, "RUN")
    except ConfigError:
        raise UsageError(f"{snapshot} is damaged or not ddlstudy's; it is left as it "
                         f"is") from None
    usecase = usecase_from_dict(_usecase_dict(manifest))
    with named(f"run manifest {manifest_file}: config.usecase.model.arch"):
        model = _fits(state, usecase, snapshot)  # a name it records that no longer builds
    return model, state, {
        "usecase": _usecase_dict(manifest), "run": manifest.get("id"),
        "epochs": len(manifest.get("epochs", [])), "model": manifest.get("model"),
        "classes": list(usecase.classes or ()), "format": fmt,
        "preprocessing": _preprocessing(manifest, usecase)}


def _preprocessing(manifest: dict[str, Any], usecase: UseCase) -> dict[str, Any]:
    """What the model needs done to a new image (size, mean, std, class names), as the run
    recorded it; a run from before it recorded that was normalised by ImageNet's."""
    recorded = manifest.get("preprocessing")
    if isinstance(recorded, dict):
        return recorded
    return {"size": usecase.train.image_size, "resize": "the shorter side to size, then the "
            "centre size x size crop", "scale": "RGB values / 255", "mean": list(MEAN),
            "std": list(STD), "classes": list(usecase.classes or ())}


def _fits(state: dict, usecase: UseCase, snapshot: Path) -> nn.Module:
    """The use case's model (as the manifest records it) with the weights ``state``;
    weights it cannot take are refused: the export would write a model.pt that ``load``
    fails on."""
    model = made(usecase.model, len(usecase.classes))
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc)
        raise UsageError(f"{snapshot} does not fit the model its manifest records "
                         f"({usecase.model.arch}): {first}; nothing written") from None
    return model


def _usecase_dict(manifest: dict[str, Any]) -> dict[str, Any]:
    try:
        raw = dict(manifest["config"]["usecase"])
    except (KeyError, TypeError):
        raise UsageError("the run's manifest records no use case") from None
    raw.pop("source", None)
    return raw


def load(weights: Path) -> nn.Module:
    """The model ``ddlstudy export model`` wrote, with its weights."""
    side = sidecar(weights)
    if not side.is_file():
        raise UsageError(f"{side} is missing: export the weights with `ddlstudy export model "
                         f"RUN --out {weights}`")
    described = read_json(side, "model description")
    if not isinstance(described, dict) or not isinstance(described.get("usecase"), dict):
        raise BadFile("model description", side, "records no use case; export the weights "
                      "again with `ddlstudy export model RUN --out FILE`")
    if described.get("format") == "onnx":
        raise UsageError(f"{weights} is an ONNX file (exported with --format onnx): run it with "
                         f"onnxruntime (docs/examples/predict_onnx.py), or export the run "
                         f"again with --format pt for PyTorch")
    usecase: UseCase = usecase_from_dict(described["usecase"])
    with named(f"model description {side}: usecase.model.arch"):
        model = made(usecase.model, len(usecase.classes))
    model.load_state_dict(read_weights(Path(weights), "weights"))
    return model
