"""A trained model as an ONNX file: ``ddlstudy export model RUN --out model.onnx --format
onnx``. torch.onnx's exporter (torch.export, then onnxscript) writes the network with its
batch dimension free: input ``images`` (N x 3 x size x size float32, preprocessed as the
``preprocessing`` of the ``model.usecase.json`` beside it says), output ``logits`` (N x
classes). onnxruntime runs it without PyTorch (``docs/examples/predict_onnx.py``).

onnx, onnxscript (the exporter's) and onnxruntime are an optional extra:
``pip install 'ddlstudy[onnx]'``.
"""

from __future__ import annotations

import importlib.util
import io
import re
import warnings
from contextlib import redirect_stderr, redirect_stdout

import torch
from torch import nn

from ddlstudy.errors import ConfigError, UsageError

INPUT, OUTPUT = "images", "logits"
EXPORTER = ("onnx", "onnxscript")
"""What torch.onnx needs to write an ONNX file (onnxruntime only runs one)."""
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def check_installed() -> None:
    """Refuse ``--format onnx`` (before anything is read) where the exporter's packages
    are not installed."""
    missing = [name for name in EXPORTER if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError("--format", f"onnx needs {' and '.join(missing)}, not installed "
                          f"here: pip install 'ddlstudy[onnx]'")


def onnx_bytes(model: nn.Module, size: int, name: str) -> bytes:
    """``model`` (on the CPU) in eval mode as the bytes of an ONNX file, for images of
    ``size`` px and any batch size. torch's progress lines and warnings are kept off the
    terminal; a model it cannot export is refused naming ``name`` and torch's reason."""
    example = torch.zeros(2, 3, size, size)  # 2: a batch of 1 would be fixed at 1
    quiet = io.StringIO()
    try:
        with redirect_stdout(quiet), redirect_stderr(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model.eval(), (example,), dynamo=True, verbose=False, report=False,
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                input_names=[INPUT], output_names=[OUTPUT])
            return program.model_proto.SerializeToString()
    except Exception as exc:  # noqa: BLE001 - any model of one's own, any reason
        raise UsageError(f"torch.onnx cannot export {name}: {_first_line(exc)}; nothing "
                         f"written (export it with --format pt)") from None


def _first_line(exc: BaseException) -> str:
    """The first line of the deepest cause's message (torch's wrappers only say which
    step failed), without its colours."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in _COLOUR.sub("", str(exc)).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
