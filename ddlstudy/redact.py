"""The one place a secret given inside a URI is taken out of what ddlstudy records, prints,
logs or uploads: a tracking URI's user info (``http://user:password@host`` reads
``http://host``) and the values of secret-looking query parameters (``?token=***``).

The URI as given is still what connects (it stays in memory, in the configuration); only
its copies that leave the process are redacted: every JSON record (a run's manifest.json,
a study's study.json, through ``files.atomic_write_json``), every log line and warning
(``logs.setup_logging``'s formatter) and every error and result the command line prints.
Credentials are better given to MLflow through ``MLFLOW_TRACKING_USERNAME`` and
``MLFLOW_TRACKING_PASSWORD``, which are never copied anywhere.
"""

from __future__ import annotations

import re
from typing import Any

HIDDEN = "***"
SECRET_WORDS = ("token", "password", "passwd", "pwd", "secret", "key", "auth", "credential",
                "signature", "sig", "session")
"""A query parameter whose name holds one of these is a secret (``access_token``,
``api_key``, ``X-Amz-Signature``)."""

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s\"'<>`]*@")
_WORDS = "|".join(SECRET_WORDS)
_QUERY = re.compile(rf"(?P<name>[?&;][A-Za-z0-9_.\-]*(?:{_WORDS})[A-Za-z0-9_.\-]*=)"
                    r"[^&#\s\"'<>`]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the user info and secret query values of every URI in it taken out."""
    if "@" in text:
        text = _USERINFO.sub(r"\g<scheme>", text)
    if "=" in text:
        text = _QUERY.sub(rf"\g<name>{HIDDEN}", text)
    return text


def redacted(value: Any) -> Any:
    """A JSON-able value with every string in it (keys included) ``redact``-ed."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redacted(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value
