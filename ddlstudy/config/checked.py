"""What a check found, remembered on this machine under what it depends on: a check that a
process that does not train would otherwise pay for with imports (the model built on the
meta device, the optimizer made once: torchvision and torch's compiler front end, 1-2 s
of a start on 2 cores), done once. A record that cannot be read or written is as none:
the check runs again (it only saves time)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ddlstudy.config.paths import cache_dir
from ddlstudy.errors import UsageError
from ddlstudy.files import WriteFailed, atomic_write_text
from ddlstudy.reading import read_json


def _file(kind: str, key: Any):
    text = json.dumps(key, sort_keys=True, default=str)
    return cache_dir() / "checked" / kind / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def recalled(kind: str, key: Any) -> dict[str, Any]:
    """The record of ``key`` (any JSON: what the check's outcome depends on), {} if none."""
    path = _file(kind, key)
    try:
        found = read_json(path, f"{kind} record") if path.is_file() else {}
    except UsageError:
        return {}
    return found if isinstance(found, dict) else {}


def keep(kind: str, key: Any, **entries: Any) -> dict[str, Any]:
    """``key``'s record with ``entries`` added (a list's items appended once); returned."""
    record = recalled(kind, key)
    for name, value in entries.items():
        if isinstance(value, list):
            record[name] = [*record.get(name, []), *(v for v in value
                                                      if v not in record.get(name, []))]
        else:
            record[name] = value
    path = _file(kind, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record))
    except (OSError, WriteFailed):
        pass  # a read-only or full cache: checked again next time
    return record
