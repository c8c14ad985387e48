"""Logging through `logging`; a line of one of several workers says the worker's rank."""

from __future__ import annotations

import logging
import os
import sys

from ddlstudy.redact import redact

log = logging.getLogger("ddlstudy")


class _RankFilter(logging.Filter):
    """``[rank N] `` before a worker's lines, so the logs of many workers can be told
    apart; nothing in a process that is no worker of several (a single-process run, the
    parent of its workers), where the rank would say nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = next((os.environ[v] for v in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
                     if v in os.environ), None)
        record.rank = "" if rank is None else f"[rank {rank}] "
        return True


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each line, not as it was at set-up: a caller
    that swapped it since (pytest's capture, closed after its test) would otherwise get
    "I/O operation on closed file" for every later line."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Redacting(logging.Formatter):
    """Every line (a warning that names a tracking URI, an error) without the secrets of
    the URIs in it (``ddlstudy.redact``)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(level: int = logging.INFO) -> None:
    handler = _Stderr()
    handler.addFilter(_RankFilter())
    handler.setFormatter(_Redacting("%(asctime)s %(rank)s%(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
