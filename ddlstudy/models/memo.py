"""What a model is (``Facts``' numbers) and the image sizes it passed the checks at,
remembered on this machine for the models whose code is a library's or ddlstudy's own:
the paper's and torchvision's. A process that does not train, the command that starts a
run's worker processes or MPI's launcher, then builds none to check it again, and imports
neither torchvision nor torch's compiler front end, which its initialisation on the meta
device loads (1-2 s of a start, measured on 2 cores).

A record is named by the model (name, width, classes) and the code that builds it: torch's
and torchvision's versions, and the paper's networks' source. Another version is another
record; one that cannot be read is computed again (never an error: it only saves time).
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from ddlstudy.config import ModelSpec
from ddlstudy.config.paths import cache_dir
from ddlstudy.errors import UsageError
from ddlstudy.files import WriteFailed, atomic_write_text
from ddlstudy.reading import read_json

KINDS = ("paper", "torchvision")
"""The models whose code is versioned with a library, or is ddlstudy's own."""


def _file(spec: ModelSpec, num_classes: int) -> Path | None:
    """Where ``spec``'s record is kept; None for a model of one's own (its code may change
    under the same name)."""
    if spec.kind not in KINDS:
        return None
    try:
        code = {name: metadata.version(name) for name in ("torch", "torchvision")}
    except metadata.PackageNotFoundError:
        return None
    code["paper"] = hashlib.sha256(Path(__file__).with_name("paper.py").read_bytes()).hexdigest()
    key = json.dumps([str(spec.arch), spec.width, num_classes, code], sort_keys=True)
    return cache_dir() / "models" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def recalled(spec: ModelSpec, num_classes: int) -> dict[str, Any]:
    """``spec``'s record: ``facts`` (parameters, buffers, min_image_size) and ``checked``
    ([image size, checkpointed] pairs), or {} where there is none."""
    path = _file(spec, num_classes)
    try:
        found = read_json(path, "model record") if path is not None and path.is_file() else {}
    except UsageError:
        return {}
    return found if isinstance(found, dict) else {}


def keep(spec: ModelSpec, num_classes: int, facts: dict[str, Any] | None = None,
         checked: tuple[int, bool] | None = None) -> None:
    """Add ``facts`` or a size that passed the checks to ``spec``'s record."""
    path = _file(spec, num_classes)
    if path is None:
        return
    record = recalled(spec, num_classes)
    if facts is not None:
        record["facts"] = facts
    if checked is not None and list(checked) not in record.setdefault("checked", []):
        record["checked"].append(list(checked))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record))
    except (OSError, WriteFailed):
        pass  # a read-only or full cache: checked again next time
