"""`ddlstudy bench`: performance figures as ratios measured side by side in one process.

Repeats alternate the two settings (A B A B ...) so drift in the machine's state hits both;
each repeat skips warm-up steps before reading the clock.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import torch
from torch import nn

from ddlstudy.config import DEFAULT_RUNS_DIR, ModelSpec, RunConfig
from ddlstudy.data import prepare_data
from ddlstudy.errors import ConfigError
from ddlstudy.machine.sampler import ResourceSampler
from ddlstudy.models import build_model, parameter_count
from ddlstudy.records.plan import cell_config, cell_flags
from ddlstudy.runner import preflight
from ddlstudy.training import (
    WARMUP_STEPS,
    Trainer,
    make_loaders,
    plain_step,
    recipe,
    seed_everything,
)


@dataclass
class Ratio:
    """One figure: settings A and B measured alternately, one value each per repeat."""

    group: str
    name: str
    """What over what, e.g. 'cpu-processes / sequential'."""
    unit: str
    """What A and B are in (images/s, ms)."""
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def ratios(self) -> list[float]:
        return [x / y for x, y in zip(self.a, self.b, strict=True) if y]

    def summary(self) -> dict:
        r = self.ratios
        return {"min": min(r), "median": statistics.median(r), "max": max(r)} if r else {}

    def as_dict(self) -> dict:
        return asdict(self) | {"ratio": self.summary(), "repeats": len(self.ratios)}


def _timed_steps(step, batch, steps: int) -> float:
    for _ in range(WARMUP_STEPS):
        step(batch)
    start = time.perf_counter()
    for _ in range(steps):
        step(batch)
    return (time.perf_counter() - start) / steps


def images_per_s(step, batches, steps: int) -> float:
    """``step`` over the first WARMUP_STEPS + ``steps`` of ``batches``: images per second
    after the warm-up steps."""
    seen, start = 0, 0.0
    for i, batch in enumerate(batches):
        if i == WARMUP_STEPS:
            seen, start = 0, time.perf_counter()
        step(batch)
        seen += batch[1].numel()
        if i + 1 == WARMUP_STEPS + steps:
            break
    return seen / (time.perf_counter() - start)


def _spread(xs: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(scale * v) for v in (min(xs), statistics.median(xs), max(xs)))


def raw_loop(model, loader, steps: int) -> float:
    """The hand-written torch loop: images per second after the warm-up steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()

    def step(batch) -> None:
        images, labels = batch
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()

    return images_per_s(step, loader, steps)


def _framework_loop(model, loader, steps: int) -> float:
    """The same steps through ddlstudy's Trainer (sequential strategy's step function)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    trainer = Trainer(model, plain_step(model, optimizer, nn.CrossEntropyLoss()), loader, [],
                      max_steps=WARMUP_STEPS + steps, show_progress=False)
    return trainer.train_epoch(1).steady_images_per_s


@dataclass(frozen=True)
class What:
    """What a bench trains: a use case (a name or a file; None: the folder's alone), a
    folder of one's own images instead of its data, another model, where synthetic sets
    are."""

    usecase: str | None = "tiny"
    data_dir: Path | None = None
    model: str | None = None
    datasets_dir: Path | None = None

    def given(self) -> dict[str, str]:
        """Its run options other than the use case, as a study cell's keys."""
        return {k: str(v) for k, v in (("data_dir", self.data_dir), ("model", self.model),
                                       ("datasets_dir", self.datasets_dir)) if v}

    def flags(self) -> list[str]:
        """The ``ddlstudy run`` flags that say it."""
        named = ["--usecase", self.usecase] if self.usecase else []
        return [*named, *cell_flags(self.given())]

    def config(self) -> RunConfig:
        """The sequential baseline's config of it, through a run's checks (refused here if
        it cannot train: its model, its recipe's arguments)."""
        return preflight(cell_config(self.usecase, self.given() | {"sample_hz": 0},
                                     DEFAULT_RUNS_DIR))


def overhead(what: What, steps: int, repeats: int) -> Ratio:
    """ddlstudy's training loop against a raw torch loop on the same data and model."""
    cfg = what.config()
    uc = cfg.usecase
    loader, _ = make_loaders(cfg, prepare_data(cfg), loader_workers=0)
    ratio = Ratio("overhead", "ddlstudy loop / raw torch loop", "images/s")
    for _ in range(repeats):  # alternate, so drift hits both
        for fn, out in ((raw_loop, ratio.b), (_framework_loop, ratio.a)):
            seed_everything(0)
            out.append(fn(build_model(uc.model, len(uc.classes)), loader, steps))
    return ratio


def model_step(uc):
    """The use case's model (seed 0) and the baseline's step on it."""
    seed_everything(0)
    model = build_model(uc.model, len(uc.classes))
    opt = recipe.optimizer(model.parameters(), uc.train, uc.train.lr)
    return model, plain_step(model, opt, nn.CrossEntropyLoss())


def sampler(what: What, steps: int, repeats: int, hz: float = 10.0) -> Ratio:
    """Step time of the use case's model with the sampler at ``hz`` against without it
    (``extra['samples']``: the rows the sampler took)."""
    uc = what.config().usecase
    _, step = model_step(uc)
    size, bs = uc.train.image_size, uc.train.batch_size
    batch = (torch.randn(bs, 3, size, size), torch.randint(0, len(uc.classes), (bs,)))
    ratio = Ratio("sampler", f"step time, sampler on ({hz:g} Hz) / off", "ms",
                  extra={"samples": 0})
    for _ in range(repeats):
        ratio.b.append(1e3 * _timed_steps(step, batch, steps))
        with ResourceSampler(hz) as running:
            ratio.a.append(1e3 * _timed_steps(step, batch, steps))
        ratio.extra["samples"] += len(running.rows)
    return ratio


def bench_overhead(what: What, steps: int = 20, repeats: int = 3, threads: int = 1) -> str:
    torch.set_num_threads(threads)
    r = overhead(what, steps, repeats)
    uc = what.config().usecase
    return "\n".join([
        f"framework overhead on {uc.name} ({uc.model.arch}, batch {uc.train.batch_size}, "
        f"{threads} thread(s), data decoded in the loop, {repeats} repeats x {steps} steps)",
        f"  raw torch loop  min/median/max img/s: {_spread(r.b)}",
        f"  ddlstudy loop   min/median/max img/s: {_spread(r.a)}",
        f"  ddlstudy / raw  min/median/max: {_spread(r.ratios, fmt='{:.3f}')} "
        f"(overhead {100 * (1 - r.summary()['median']):+.2f} %)",
    ])


def bench_sampler(what: What, steps: int = 30, repeats: int = 5, hz: float = 10.0,
                  threads: int = 1) -> str:
    torch.set_num_threads(threads)
    r = sampler(what, steps, repeats, hz)
    uc = what.config().usecase
    overhead_ = [x - 1 for x in r.ratios]
    return "\n".join([
        f"sampler overhead on {uc.name} ({uc.model.arch}, batch {uc.train.batch_size}, "
        f"{uc.train.image_size} px, {threads} thread(s), {hz:g} Hz, {repeats} repeats x "
        f"{steps} steps)",
        f"  step time off  min/median/max ms: {_spread(r.b)}",
        f"  step time on   min/median/max ms: {_spread(r.a)}",
        f"  overhead median {100 * statistics.median(overhead_):+.2f} % "
        f"(min {100 * min(overhead_):+.2f} %, max {100 * max(overhead_):+.2f} %), "
        f"{r.extra['samples']} samples taken",
    ])


def gradient_floats(size: str, classes: int = 3) -> int:
    """The floats of ``size``: a number, or the gradient of a model by name (``ddlstudy
    models``) with ``classes`` outputs, counted from its shapes."""
    try:
        number = float(size)  # 1000000, 1e6, 1e308, nan: a count, not a model's name
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number) or number != int(number):
            raise ConfigError("--size", f"{size}: give a whole number of floats (e.g. "
                              f"1000000 or 1e6) or a model's name")
        floats = int(number)
        most = psutil.virtual_memory().available // 4 // 8  # 2 ranks x 2 buffers, room
        if not 0 < floats <= most:
            raise ConfigError("--size", f"{size} floats: give a positive number of floats "
                              f"that 2 ranks' buffers can hold here (at most {most:,}), or a "
                              f"model's name")
        return floats
    try:
        return parameter_count(ModelSpec(arch=size), classes)
    except ConfigError as exc:
        raise ConfigError("--size", f"give a number of floats or a model's name; "
                          f"{str(exc).split(': ', 1)[-1]}") from None


def bench_reduce(size: str, nodes: int, repeats: int = 5, hosts: str | None = None) -> str:
    """Every reducer on a gradient-sized buffer between ``nodes`` MPI ranks (on this host,
    or placed on ``hosts``)."""
    from ddlstudy.tools.predict import measure_reducers

    floats = gradient_floats(size)
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
