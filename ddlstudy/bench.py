"""`ddlstudy bench`: performance figures as ratios measured side by side in one process.

Repeats alternate the two settings (A B A B ...) so drift in the machine's state hits both;
each repeat skips warm-up steps before reading the clock.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ddlstudy.config import load_usecase
from ddlstudy.models import build_model
from ddlstudy.sampler import ResourceSampler
from ddlstudy.training import WARMUP_STEPS, plain_step, seed_everything


def _timed_steps(step, batch, steps: int) -> float:
    for _ in range(WARMUP_STEPS):
        step(batch)
    start = time.perf_counter()
    for _ in range(steps):
        step(batch)
    return (time.perf_counter() - start) / steps


def bench_sampler(usecase: str, steps: int = 30, repeats: int = 5, hz: float = 10.0,
                  threads: int = 1) -> str:
    """Step time of the use case's model with the sampler at ``hz`` against without it."""
    uc = load_usecase(usecase)
    torch.set_num_threads(threads)
    seed_everything(0)
    model = build_model(uc.model, len(uc.classes))
    opt = torch.optim.SGD(model.parameters(), lr=uc.train.lr, momentum=uc.train.momentum)
    step = plain_step(model, opt, nn.CrossEntropyLoss())
    size, bs = uc.train.image_size, uc.train.batch_size
    batch = (torch.randn(bs, 3, size, size), torch.randint(0, len(uc.classes), (bs,)))
    off, on, rows = [], [], 0
    for _ in range(repeats):
        off.append(_timed_steps(step, batch, steps))
        with ResourceSampler(hz) as sampler:
            on.append(_timed_steps(step, batch, steps))
        rows += len(sampler.rows)
    overhead = [b / a - 1 for a, b in zip(off, on, strict=True)]
    ms = lambda xs: f"{1e3 * min(xs):.2f} / {1e3 * statistics.median(xs):.2f} / {1e3 * max(xs):.2f}"  # noqa: E731
    return "\n".join([
        f"sampler overhead on {uc.name} ({uc.model.arch}, batch {bs}, {size} px, "
        f"{threads} thread(s), {hz:g} Hz, {repeats} repeats x {steps} steps)",
        f"  step time off  min/median/max ms: {ms(off)}",
        f"  step time on   min/median/max ms: {ms(on)}",
        f"  overhead median {100 * statistics.median(overhead):+.2f} % "
        f"(min {100 * min(overhead):+.2f} %, max {100 * max(overhead):+.2f} %), "
        f"{rows} samples taken",
    ])
