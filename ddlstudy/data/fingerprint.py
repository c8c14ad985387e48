"""sha256 lists of data sets and the fingerprint a manifest records."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

SUMS_FILE = "SHA256SUMS"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sums_text(sums: Iterable[tuple[str, str]]) -> str:
    """``sha256sum``-compatible text: one '<hash>  <relative path>' line per file, sorted."""
    return "".join(f"{digest}  {rel}\n" for rel, digest in sorted(sums))


def write_sums(root: Path, sums: Iterable[tuple[str, str]]) -> None:
    (root / SUMS_FILE).write_text(sums_text(sums))


def fingerprint(sums: Iterable[tuple[str, str]]) -> str:
    """The data set's fingerprint: the sha256 of its sha256 list (as ``sha256sum`` writes it)."""
    return sha256_bytes(sums_text(sums).encode())
