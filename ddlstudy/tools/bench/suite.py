"""`ddlstudy bench all`: every performance figure in one command, as JSON and Markdown.

Each figure is a ratio of two settings measured side by side, the two alternating within
every repeat (A B, A B, ...) so that drift in the machine hits both; the ratio is taken
per repeat, then summarised as min / median / max:

- overhead:   ddlstudy's training loop / a hand-written torch loop (images/s)
- ceiling:    a real ``ddlstudy run`` (sequential at 1 thread, cpu-intraop at every core),
              data path and all / a hand-written torch loop on batches held in memory at
              the same threads: how near a run comes to what the model alone does here
- sampler:    step time with the resource sampler on / off
- loader:     the DataLoader reading the decoded cache, and decoding every JPEG in the
              loop, each / the same batches as in-memory tensors
- strategies: each local strategy / the sequential baseline (steady images/s of real
  ``ddlstudy run`` processes, a few steps each)
- pipeline:   pipeline (2 stages: GPipe and 1F1B at 4 micro-batches, 1F1B at 2,
              interleaved 1F1B at 4) and hybrid (2 x 2 stages: GPipe and 1F1B) / the
              sequential baseline (steady images/s), each one's step against the bound
              of its own stage times, and the pipeline model's prediction against it;
              1F1B's pipeline and hybrid through shared memory / the same through gloo
- sharding:   sharded and zero (2 processes) / cpu-processes (2), tensor (2) /
              cpu-intraop (2 threads): images/s, peak resident memory of a process, and
              the bytes its parameters, gradients and optimizer state hold
- reducers:   each reducer / MPI's own Allreduce on the use case's gradient (time)
- transport:  cpu-processes (2) averaging through this host's shared memory / the same
              over gloo's TCP (plain DDP), steady images/s
- mpi:        2 MPI nodes of one sequential process each (``--reduce auto``) / 2 local
              processes (cpu-processes), through shared memory and as plain DDP over gloo
              (steady images/s)
- spark:      2 Spark tasks / 2 MPI nodes (steady images/s)
- start:      with strategies and spark, the seconds from the command to the first
              training step (imports, data scan, spawning, set-up) of the same runs;
              alone (``--only start``), plain 12-step runs against the goals of fast
              starts and of sharded, zero and MPI at their bound (``start``)
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddlstudy.config.catalog import bench_groups
from ddlstudy.errors import ConfigError
from ddlstudy.machine.environment import usable_cores
from ddlstudy.records.plan import cell_flags
from ddlstudy.report import BASELINE
from ddlstudy.strategies import REGISTRY as STRATEGIES
from ddlstudy.tools import pipeline_model
from ddlstudy.tools.bench import start as bench_start
from ddlstudy.tools.bench.ratios import (
    Ratio,
    What,
    images_per_s,
    model_step,
    overhead,
    raw_loop,
    sampler,
)
from ddlstudy.tools.bench.start import run_plain, steady


def strategy_flags(cores: int) -> dict[str, list[str]]:
    """Each strategy's layout the strategies group times against the baseline: of its
    ``advise`` probes that fit this machine's cores (no GPU), the one on the most cores
    (the last of those: pipeline's 4 micro-batches rather than 2)."""
    out = {}
    for name, cls in STRATEGIES.loaded().items():
        fits = [p for p in cls().probes(cores, 0) if not p.gpus and p.cores <= cores]
        if name != BASELINE and fits:
            best = max(p.cores for p in fits)
            probe = [p for p in fits if p.cores == best][-1]
            out[name] = cell_flags(probe.flags)
    return out


def _side_by_side(speed: Ratio, start: Ratio, a: dict, b: dict) -> None:
    """Runs ``a`` and ``b``: their steady images/s into ``speed``, their seconds from the
    command to the first step into ``start``."""
    speed.a.append(steady(a))
    speed.b.append(steady(b))
    start.a.append(a["first_step_s"])
    start.b.append(b["first_step_s"])


def _held(loader, steps: int) -> list:
    """The loader's first WARMUP_STEPS + ``steps`` batches, held in memory; a ConfigError
    where an epoch has fewer."""
    from ddlstudy.training import WARMUP_STEPS

    n = WARMUP_STEPS + steps
    held = [b for _, b in zip(range(n), loader, strict=False)]
    if len(held) < n:
        raise ConfigError("--steps", f"the use case has {len(held)} batches an epoch; ask "
                          f"for at most {len(held) - WARMUP_STEPS} steps")
    return held


def loader(what: What, steps: int, repeats: int) -> list[Ratio]:
    """The same batches read by the DataLoader from the decoded cache, and decoded image by
    image in the loop, each against held in memory as tensors: what reading the data costs
    the training."""
    import dataclasses

    from ddlstudy.data import prepare_data
    from ddlstudy.training import make_loaders

    cfg = what.config()
    _, step = model_step(cfg.usecase)
    data = prepare_data(cfg)
    cached, _ = make_loaders(cfg, data, loader_workers=0)
    decoding, _ = make_loaders(dataclasses.replace(cfg, data_cache=False), data,
                               loader_workers=0)
    held = _held(cached, steps)
    ratios = {"cache": Ratio("loader", "DataLoader from the decoded cache / in-memory tensors",
                             "images/s"),
              "decode": Ratio("loader", "DataLoader decoding every image in the loop / "
                              "in-memory tensors", "images/s")}
    for _ in range(repeats):
        for name, batches in (("cache", cached), ("decode", decoding)):
            ratios[name].a.append(images_per_s(step, batches, steps))
            ratios[name].b.append(images_per_s(step, held, steps))
    return list(ratios.values())


def ceiling(what: What, steps: int, repeats: int, runs: Path) -> list[Ratio]:
    from ddlstudy.data import prepare_data
    from ddlstudy.models import build_model
    from ddlstudy.training import WARMUP_STEPS, make_loaders, seed_everything

    cfg = what.config()
    uc = cfg.usecase
    train, _ = make_loaders(cfg, prepare_data(cfg), loader_workers=0)
    held = _held(train, steps)
    cores = usable_cores()
    settings = {"sequential": (1, []), "cpu-intraop": (cores, ["--strategy", "cpu-intraop"])}
    ratios = {name: Ratio("ceiling", f"{name} run / raw torch loop on batches in memory, "
                          f"{threads} thread{'s' * (threads > 1)}", "images/s")
              for name, (threads, _) in settings.items()}
    for _ in range(repeats):
        for name, (threads, flags) in settings.items():
            ratios[name].a.append(steady(run_plain(runs, what, WARMUP_STEPS + steps, *flags)))
            torch.set_num_threads(threads)
            seed_everything(0)
            ratios[name].b.append(raw_loop(build_model(uc.model, len(uc.classes)), held,
                                           steps))
            torch.set_num_threads(1)
    return list(ratios.values())


def strategies(what: What, steps: int, repeats: int, runs: Path) -> list[Ratio]:
    """Each repeat runs the baseline once, then every strategy: each ratio's two sides
    come from the same repeat (one baseline a repeat, not one a strategy: 5 runs a repeat
    instead of 8 on 2 cores)."""
    layouts = strategy_flags(usable_cores())
    speed = {s: Ratio("strategies", f"{s} / sequential", "images/s") for s in layouts}
    start = {s: Ratio("start", f"{s} / sequential: seconds from the command to the first "
                      "step", "s") for s in layouts}
    for _ in range(repeats):
        baseline = run_plain(runs, what, steps)
        for name, flags in layouts.items():
            _side_by_side(speed[name], start[name], run_plain(runs, what, steps, *flags), baseline)
    return [*speed.values(), *start.values()]


_PIPE = ["--strategy", "pipeline", "--stages", "2"]
TWIN = ", gloo"
"""The suffix of a layout run with --transport gloo (its twin without runs through shared
memory)."""
_HYBRID = ["--strategy", "hybrid", "--replicas", "2", "--stages", "2"]
PIPELINES = {
    "pipeline 2 stages, 4 mb, gpipe": [*_PIPE, "--micro-batches", "4", "--schedule", "gpipe"],
    "pipeline 2 stages, 4 mb, 1f1b": [*_PIPE, "--micro-batches", "4", "--schedule", "1f1b"],
    "pipeline 2 stages, 2 mb, 1f1b": [*_PIPE, "--micro-batches", "2", "--schedule", "1f1b"],
    "pipeline 2 stages, 4 mb, interleaved-1f1b": [*_PIPE, "--micro-batches", "4",
                                                  "--schedule", "interleaved-1f1b"],
    "hybrid 2 x 2 stages, 4 mb, gpipe": [*_HYBRID, "--micro-batches", "4", "--schedule",
                                         "gpipe"],
    "hybrid 2 x 2 stages, 4 mb, 1f1b": [*_HYBRID, "--micro-batches", "4", "--schedule",
                                        "1f1b"]}
PIPELINES.update({f"{name}{TWIN}": [*PIPELINES[name], "--transport", "gloo"] for name in (
    "pipeline 2 stages, 4 mb, 1f1b", "hybrid 2 x 2 stages, 4 mb, 1f1b")})
"""The pipeline group's layouts: 2 stages under each schedule, hybrid's 2 replicas, and
two of them through gloo instead of this host's shared memory."""


def pipelines(what: What, steps: int, repeats: int, runs: Path) -> list[Ratio]:
    """Each repeat runs the baseline once, then every layout of PIPELINES: each one's
    images/s against the baseline's, its step against the step its own stage times allow
    (``of_bound``), the pipeline model's predicted step against the measured one, and a
    layout through shared memory against its twin through gloo."""
    ratios: dict[str, list[Ratio]] = {name: [
        Ratio("pipeline", f"{name} / sequential", "images/s"),
        Ratio("pipeline", f"{name}: the step its stage times allow / its step", "s")]
        for name in PIPELINES}
    predicted = {name: Ratio("pipeline", f"{name}: predicted step / measured step", "s")
                 for name in PIPELINES}
    twins = {name: Ratio("pipeline", f"{name[:-len(TWIN)]}: shared memory / gloo", "images/s")
             for name in PIPELINES if name.endswith(TWIN) and name[:-len(TWIN)] in PIPELINES}
    for _ in range(repeats):
        baseline = run_plain(runs, what, steps)
        done = {}
        for name, flags in PIPELINES.items():
            run = done[name] = run_plain(runs, what, steps, *flags)
            speed, bound = ratios[name]
            speed.a.append(steady(run))
            speed.b.append(steady(baseline))
            timed = run["backend"].get("stages_time") or {}
            if timed.get("of_bound"):  # none where no step but each process's first ran
                bound.a.append(timed["bound_step_s"])
                bound.b.append(timed["bound_step_s"] / timed["of_bound"])
            for row in pipeline_model.validate([run]) if name in predicted else []:  # GPU: none
                predicted[name].a.append(row["predicted_step_s"])
                predicted[name].b.append(row["measured_step_s"])
        for name, twin in twins.items():
            twin.a.append(steady(done[name[:-len(TWIN)]]))
            twin.b.append(steady(done[name]))
    return [r for pair in ratios.values() for r in pair if r.a] + \
        [r for r in predicted.values() if r.a] + list(twins.values())


def reducers(what: What, repeats: int, hosts: str | None) -> list[Ratio]:
    from ddlstudy.models import parameter_count
    from ddlstudy.tools.predict import measure_reducers

    uc = what.config().usecase
    floats = parameter_count(uc.model, len(uc.classes))
    ms = measure_reducers(floats, 2, repeats, hosts)
    return [Ratio("reducers", f"{name} / MPI Allreduce (2 ranks, {4 * floats / 1e6:.1f} MB)",
                  "ms", times, ms["allreduce"]) for name, times in ms.items()
            if name != "allreduce"]


MPI_2 = ["--backend", "mpi", "--nodes", "2"]
PROCESSES_2 = ["--strategy", "cpu-processes", "--workers", "2"]
PROCESSES_2_GLOO = [*PROCESSES_2, "--transport", "gloo"]
SHARED, GLOO, MPI = ("cpu-processes, 2, shared memory", "cpu-processes, 2 (DDP over gloo)",
                     "MPI, 2 nodes")
EXCHANGES = {"transport": [(SHARED, GLOO)], "mpi": [(MPI, GLOO), (MPI, SHARED)],
             "spark": [("Spark, 2 tasks", MPI)]}
"""Each group of 2-process settings and the pairs (A / B) it compares."""
FLAGS = {SHARED: PROCESSES_2, GLOO: PROCESSES_2_GLOO, MPI: MPI_2,
         "Spark, 2 tasks": ["--backend", "spark", "--nodes", "2"]}


def exchanges(groups: list[str], what: What, steps: int, repeats: int,
              runs: Path) -> list[Ratio]:
    """The pairs of ``groups`` (of EXCHANGES) from one run of each setting they name a
    repeat, the settings one after the other: transport and mpi together run 3 settings
    a repeat, not 6. Their images/s in the group, their seconds to the first step in
    ``start``."""
    pairs = [(g, a, b) for g in groups for a, b in EXCHANGES[g]]
    settings = list(dict.fromkeys(name for _, a, b in pairs for name in (a, b)))
    speed = {(a, b): Ratio(g, f"{a} / {b}", "images/s") for g, a, b in pairs}
    start = {(a, b): Ratio("start", f"{a} / {b}: seconds from the command to the first "
                           "step", "s") for _, a, b in pairs}
    for _ in range(repeats):
        done = {name: run_plain(runs, what, steps, *FLAGS[name]) for name in settings}
        for _, a, b in pairs:
            _side_by_side(speed[a, b], start[a, b], done[a], done[b])
    return [r for key in speed for r in (speed[key], start[key])]


SHARDING = {"sharded": "cpu-processes", "zero": "cpu-processes", "tensor": "cpu-intraop"}
"""The sharding group: each strategy (2 processes) and the layout it is measured against."""


def _memory(manifest: dict) -> tuple[float, float]:
    """A run's peak resident MiB of its largest process, and the MiB that process's own
    parameters, gradients and optimizer state hold."""
    rows = manifest["backend"]["memory"]["per_rank"]
    top = max(rows, key=lambda r: r["peak_rss_bytes"])
    held = top["held_bytes"]
    return top["peak_rss_bytes"] / 2**20, sum(held[k] for k in (
        "parameters", "gradients", "optimizer_state")) / 2**20


def sharding(what: What, steps: int, repeats: int, runs: Path) -> list[Ratio]:
    """Each repeat runs every layout of SHARDING once, alternating: each strategy's
    images/s, peak memory per process and bytes held per process against its twin's."""
    ratios = {(s, kind): Ratio("sharding", f"{s} / {twin}{label}", unit)
              for s, twin in SHARDING.items() for kind, label, unit in (
                  ("speed", "", "images/s"), ("peak", ": peak resident memory a process",
                                                  "MiB"),
                  ("held", ": parameters + gradients + optimizer state a process", "MiB"))}
    flags = {name: ["--strategy", name, "--workers", "2"] for name in
             (*SHARDING, *SHARDING.values())}
    for _ in range(repeats):
        done = {name: run_plain(runs, what, steps, *f) for name, f in flags.items()}
        for s, twin in SHARDING.items():
            for side, run in (("a", done[s]), ("b", done[twin])):
                peak, held = _memory(run)
                for kind, value in (("speed", steady(run)), ("peak", peak), ("held", held)):
                    getattr(ratios[s, kind], side).append(value)
    return list(ratios.values())


def bench_all(what: What, steps: int, repeats: int, groups: list[str],
              hosts: str | None = None) -> dict:
    from ddlstudy.machine import environment

    bench_groups(",".join(groups))
    uc = what.config().usecase  # refused before anything runs if it cannot train
    torch.set_num_threads(1)
    results: list[Ratio] = []
    skipped: dict[str, str] = {}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ddlstudy-bench-") as tmp:
        runs = Path(tmp)
        joined = [g for g in ("transport", "mpi") if g in groups]
        for group in groups:
            t0 = time.time()
            if group in joined[1:]:
                continue  # measured with the first of them
            if group == "overhead":
                results.append(overhead(what, steps, repeats))
            elif group == "ceiling":
                results += ceiling(what, steps, repeats, runs)
            elif group == "sampler":
                results.append(sampler(what, steps, repeats))
            elif group == "loader":
                results += loader(what, steps, repeats)
            elif group == "strategies":
                results += strategies(what, steps, repeats, runs)
            elif group == "pipeline":
                results += pipelines(what, steps, repeats, runs)
            elif group == "sharding":
                results += sharding(what, steps, repeats, runs)
            elif group == "start":
                results += bench_start.start(what, repeats, runs)
            elif group == "reducers":
                results += reducers(what, repeats, hosts)
            elif group in joined:
                results += exchanges(joined, what, steps, repeats, runs)
                group = ", ".join(joined)
            elif shutil.which("java") is None:
                skipped["spark"] = "no Java on this machine (Spark's JVM needs it)"
            else:
                results += exchanges(["spark"], what, steps, repeats, runs)
            print(f"  {group}: {time.time() - t0:.0f} s", file=sys.stderr)
    return {"usecase": uc.name, "model": str(uc.model.arch), "steps": steps,
            "repeats": repeats,
            "seconds": round(time.time() - started, 1), "host": environment.host(),
            "versions": environment.versions(), "skipped": skipped,
            "figures": [r.as_dict() for r in results]}


def markdown(result: dict) -> str:
    lines = [f"ddlstudy bench all on {result['usecase']}: {result['repeats']} repeats, "
             f"{result['steps']} steps each, {result['seconds']:.0f} s",
             "", "| group | ratio | A median | B median | unit | A/B min / median / max |",
             "|---|---|---|---|---|---|"]
    for f in result["figures"]:
        r = f["ratio"]
        lines.append(f"| {f['group']} | {f['name']} | {statistics.median(f['a']):.2f} | "
                     f"{statistics.median(f['b']):.2f} | {f['unit']} | {r['min']:.3f} / "
                     f"{r['median']:.3f} / {r['max']:.3f} |")
    lines += [f"| {group} | skipped: {why} | | | | |" for group, why in result["skipped"].items()]
    return "\n".join(lines + bench_start.phases_markdown(result))


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(markdown(result) + "\n")
    return paths
