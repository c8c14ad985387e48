"""Logging through `logging`, every line prefixed with the rank of the worker."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("ddlstudy")


class _RankFilter(logging.Filter):
    """Prefix every line with the rank so the logs of many workers can be told apart."""

    def __init__(self) -> None:
        super().__init__()
        self.rank = next((os.environ[v] for v in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
                          if v in os.environ), "0")

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RankFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s [rank %(rank)s] %(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
