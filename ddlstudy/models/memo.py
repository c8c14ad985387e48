"""What a model is (``Facts``' numbers) and the image sizes it passed the checks at,
remembered on this machine (``config.checked``) for the models whose code is a library's
or ddlstudy's own: the paper's and torchvision's. A process that does not train, the
command that starts a run's worker processes or MPI's launcher, then builds none to check
it again, and imports neither torchvision nor torch's compiler front end, which its
initialisation on the meta device loads (1-2 s of a start, measured on 2 cores).

A record is named by the model (name, width, classes) and the code that builds it: torch's
and torchvision's versions, and the paper's networks' source."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path
from typing import Any

from ddlstudy.config import ModelSpec, checked

KINDS = ("paper", "torchvision")
"""The models whose code is versioned with a library, or is ddlstudy's own."""
PAPER = Path(__file__).with_name("paper.py")


def _key(spec: ModelSpec, num_classes: int) -> list | None:
    """What ``spec``'s record depends on; None for a model of one's own (its code may
    change under the same name)."""
    if spec.kind not in KINDS:
        return None
    try:
        code = {name: metadata.version(name) for name in ("torch", "torchvision")}
    except metadata.PackageNotFoundError:
        return None
    code["paper"] = hashlib.sha256(PAPER.read_bytes()).hexdigest()
    return [str(spec.arch), spec.width, num_classes, code]


def recalled(spec: ModelSpec, num_classes: int) -> dict[str, Any]:
    """``spec``'s record: ``facts`` (parameters, buffers, min_image_size, largest) and ``checked``
    ([image size, checkpointed] pairs), or {} where there is none."""
    key = _key(spec, num_classes)
    return {} if key is None else checked.recalled("models", key)


def keep(spec: ModelSpec, num_classes: int, facts: dict[str, Any] | None = None,
         sizes: tuple[int, bool] | None = None) -> None:
    """Add ``facts``, or a size that passed the checks, to ``spec``'s record."""
    key = _key(spec, num_classes)
    if key is not None:
        checked.keep("models", key, **({"facts": facts} if facts else {}),
                     **({"checked": [list(sizes)]} if sizes else {}))
