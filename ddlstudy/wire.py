"""What a run's processes send each other (MPI ranks, a node's processes, Spark tasks), as
bytes that carry data and never code.

Python's pickle, which mpi4py's lowercase calls, ``torch.distributed``'s ``*_object`` calls
and a plain ``pickle.loads`` use, runs whatever a peer put in the message; ranks on several
hosts exchange these over the network. So control data (data plans, sample rows, hosts,
cuts) travels as JSON, and what holds tensors (a snapshot, random states) in torch's
weights-only format, the one snapshots are stored in: it loads tensors and plain
containers only.

A refusal raised where the run is prepared (a UsageError on node 0) travels as data too,
``{"refused": class name, "message": ...}``, and is raised again on every node.
"""

from __future__ import annotations

import io
import json
from typing import Any

from ddlstudy import errors

_REFUSALS = {cls.__name__: cls for cls in (errors.UsageError, errors.ConfigError,
                                            errors.DataError, errors.Unavailable)}


def to_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def from_json(data: bytes) -> Any:
    return json.loads(data)


def to_tensors(obj: Any) -> bytes:
    """``obj`` (tensors in dicts, lists and plain values) in torch's format."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_tensors(data: bytes) -> Any:
    """What ``to_tensors`` wrote, on the CPU; anything beyond tensors and plain values is
    refused by torch's weights-only loader."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def refusal(exc: errors.UsageError) -> dict:
    return {"refused": type(exc).__name__, "message": str(exc),
            "field": getattr(exc, "field", None)}


def raise_if_refused(message: Any) -> None:
    """Raise the UsageError that ``refusal`` described, if ``message`` is one."""
    if not (isinstance(message, dict) and "refused" in message):
        return
    cls = _REFUSALS.get(message["refused"], errors.UsageError)
    exc = cls.__new__(cls)
    errors.UsageError.__init__(exc, message["message"])  # the text as it was raised
    if message.get("field") is not None:
        exc.field = message["field"]
    raise exc
