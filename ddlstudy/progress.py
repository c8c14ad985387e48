"""Progress: a tqdm bar on a terminal, plain log lines (at most every 10 s) otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("ddlstudy")
LOG_EVERY_S = 10.0


def on_terminal() -> bool:
    return sys.stderr.isatty()


def progress(items: Iterable[T], *, total: int | None, desc: str, unit: str = "it",
             enabled: bool = True, initial: int = 0) -> Iterator[T]:
    if not enabled:
        yield from items
        return
    if on_terminal():
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                        initial=initial)
        return
    start = last = time.perf_counter()
    step = max(1, (total or 0) // 10)
    for done, item in enumerate(items, initial + 1):
        yield item
        now = time.perf_counter()
        # Every ~10 % but no more than one line in LOG_EVERY_S: short loops stay quiet.
        if total and done % step == 0 and done < total and now - last >= LOG_EVERY_S:
            last = now
            rate = done / max(now - start, 1e-9)
            log.info("%s: %d/%d %s (%.1f %s/s)", desc, done, total, unit, rate, unit)
