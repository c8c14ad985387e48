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
            log.info("%s: %d/%d %s (%s)", desc, done, total, unit,
                     pace(done - initial, now - start, total - done, unit))


def pace(done: int, seconds: float, left: int, unit: str) -> str:
    """'12.5 batch/s, 40 s left', or '23.0 s/batch, 6.5 min left' where one takes longer
    than a second (a VGG16 step on a CPU), so that a slow loop does not read 0.0/s."""
    if done <= 0 or seconds <= 0:
        return "starting"
    rate = done / seconds
    speed = f"{rate:.1f} {unit}/s" if rate >= 1 else f"{seconds / done:.1f} s/{unit}"
    eta = left / rate
    return f"{speed}, {eta:.0f} s left" if eta < 120 else f"{speed}, {eta / 60:.1f} min left"
