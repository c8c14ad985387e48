"""`ddlstudy bench`: performance figures as ratios measured side by side in one process.

Repeats alternate the two settings (A B A B ...) so drift in the machine's state hits both;
each repeat skips warm-up steps before reading the clock.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ddlstudy.config import RunConfig, load_usecase
from ddlstudy.data import prepare_data
from ddlstudy.models import build_model
from ddlstudy.sampler import ResourceSampler
from ddlstudy.training import WARMUP_STEPS, Trainer, make_loaders, plain_step, seed_everything


def _timed_steps(step, batch, steps: int) -> float:
    for _ in range(WARMUP_STEPS):
        step(batch)
    start = time.perf_counter()
    for _ in range(steps):
        step(batch)
    return (time.perf_counter() - start) / steps


def _spread(xs: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(scale * v) for v in (min(xs), statistics.median(xs), max(xs)))


def _raw_loop(model, loader, steps: int) -> float:
    """The hand-written torch loop: images per second after the warm-up steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    seen, start = 0, 0.0
    for i, (images, labels) in enumerate(loader):
        if i == WARMUP_STEPS:
            seen, start = 0, time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()
        seen += labels.numel()
        if i + 1 == WARMUP_STEPS + steps:
            break
    return seen / (time.perf_counter() - start)


def _framework_loop(model, loader, steps: int) -> float:
    """The same steps through ddlstudy's Trainer (sequential strategy's step function)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    trainer = Trainer(model, plain_step(model, optimizer, nn.CrossEntropyLoss()), loader, [],
                      max_steps=WARMUP_STEPS + steps, show_progress=False)
    return trainer.train_epoch(1).steady_images_per_s


def bench_overhead(usecase: str, steps: int = 20, repeats: int = 3, threads: int = 1) -> str:
    """ddlstudy's training loop against a raw torch loop on the same data and model."""
    uc = load_usecase(usecase)
    torch.set_num_threads(threads)
    cfg = RunConfig(usecase=uc, sample_hz=0)
    loader, _ = make_loaders(cfg, prepare_data(cfg), loader_workers=0)
    raw, ours = [], []
    for _ in range(repeats):  # alternate, so drift hits both
        for fn, out in ((_raw_loop, raw), (_framework_loop, ours)):
            seed_everything(0)
            out.append(fn(build_model(uc.model, len(uc.classes)), loader, steps))
    ratio = [o / r for o, r in zip(ours, raw, strict=True)]
    return "\n".join([
        f"framework overhead on {uc.name} ({uc.model.arch}, batch {uc.train.batch_size}, "
        f"{threads} thread(s), data decoded in the loop, {repeats} repeats x {steps} steps)",
        f"  raw torch loop  min/median/max img/s: {_spread(raw)}",
        f"  ddlstudy loop   min/median/max img/s: {_spread(ours)}",
        f"  ddlstudy / raw  min/median/max: {_spread(ratio, fmt='{:.3f}')} "
        f"(overhead {100 * (1 - statistics.median(ratio)):+.2f} %)",
    ])


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
    return "\n".join([
        f"sampler overhead on {uc.name} ({uc.model.arch}, batch {bs}, {size} px, "
        f"{threads} thread(s), {hz:g} Hz, {repeats} repeats x {steps} steps)",
        f"  step time off  min/median/max ms: {_spread(off, 1e3)}",
        f"  step time on   min/median/max ms: {_spread(on, 1e3)}",
        f"  overhead median {100 * statistics.median(overhead):+.2f} % "
        f"(min {100 * min(overhead):+.2f} %, max {100 * max(overhead):+.2f} %), "
        f"{rows} samples taken",
    ])


GRADIENT_FLOATS = {"alexnet": 57_016_131, "vgg16": 134_272_835}
"""Parameters of the 3-class torchvision models: the gradient each step averages."""


def bench_reduce(size: str, nodes: int, repeats: int = 5, hosts: str | None = None) -> str:
    """Every reducer on a gradient-sized buffer between ``nodes`` MPI ranks (on this host,
    or placed on ``hosts``)."""
    from ddlstudy.errors import ConfigError
    from ddlstudy.predict import measure_reducers

    floats = GRADIENT_FLOATS.get(size) or (int(size) if size.isdigit() else 0)
    if floats <= 0:
        raise ConfigError("--size", f"give alexnet, vgg16 or a number of floats, got {size!r}")
    result = {"ms": measure_reducers(floats, nodes, repeats, hosts)}
    mib = 4 * floats / 2**20
    reference = statistics.median(result["ms"]["allreduce"])
    lines = [f"reducers on {size} ({floats:,} floats, {mib:.0f} MiB) between {nodes} MPI ranks "
             f"on {hosts or 'this host'}, {repeats} repeats",
             "| reducer | ms min / median / max | GB/s (size / median) | x allreduce |",
             "|---|---|---|---|"]
    for name, ms in result["ms"].items():
        median = statistics.median(ms)
        lines.append(f"| {name} | {_spread(ms, fmt='{:.1f}')} | {4 * floats / median / 1e6:.2f} "
                     f"| {median / reference:.2f} |")
    return "\n".join(lines)
