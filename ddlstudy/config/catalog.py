"""The names ``--strategy`` and ``--backend`` take, what each strategy does and the flags
that lay it out: what the command line shows (``--help``, ``ddlstudy strategies``) without
importing torch. The classes that implement them (``ddlstudy.strategies``,
``ddlstudy.backends``) register under these names; a test holds both to the same names,
in the same order."""

from __future__ import annotations

from dataclasses import dataclass

from ddlstudy.errors import ConfigError


@dataclass(frozen=True)
class Described:
    summary: str
    """One line: what it does and why one would pick it."""
    flags: str = ""
    """The flags that lay it out, with their defaults."""


STRATEGIES = {
    "sequential": Described(
        "the baseline: one process, one intra-op thread, data loaded in that process; every "
        "speedup is measured against it"),
    "cpu-intraop": Described(
        "one process, one model, torch's intra-op threads over all cores (the paper's CPU "
        "single-process)",
        "--workers N (threads, default: all usable cores), --loader-workers"),
    "cpu-threads": Described(
        "one process, k model replicas each trained by its own Python thread on n/k of every "
        "batch, gradients averaged before the step",
        "--workers K (replicas, default: usable cores)"),
    "cpu-processes": Described(
        "k processes, each a replica with its slice of every batch, gradients averaged "
        "every step through this host's shared memory (else DDP over gloo); the paper's "
        "fastest CPU strategy",
        "--workers K (processes, default: usable cores), --loader-workers, --transport"),
    "gpu-data": Described(
        "one process per GPU, DistributedDataParallel over NCCL, CPU loader workers decoding "
        "ahead so each GPU stays busy",
        "--devices N (GPUs, default: all), --loader-workers (default: cores per GPU - 1)"),
    "pipeline": Described(
        "model parallel: the network cut into --stages processes balanced by measured cost, "
        "each batch run as --micro-batches GPipe micro-batches",
        "--stages S (default: usable cores), --micro-batches M (default 4), --stage-starts"),
    "hybrid": Described(
        "data parallel replicas of a pipeline: --replicas R pipelines of --stages S, each "
        "stage's gradients all-reduced over the replicas; R x S processes",
        "--replicas R (default 2), --stages S (default 2), --micro-batches M (default 4), "
        "--stage-starts"),
}

BACKENDS = ("local", "mpi", "spark")

BENCH_GROUPS = ("overhead", "ceiling", "sampler", "loader", "strategies", "reducers",
                "transport", "mpi", "spark")
"""What ``bench all --only`` takes."""


def bench_groups(only: str | None) -> list[str]:
    """The groups ``--only`` names (every group without it), or a ConfigError."""
    groups = only.split(",") if only else list(BENCH_GROUPS)
    unknown = [g for g in groups if g not in BENCH_GROUPS]
    if unknown:
        raise ConfigError("--only", f"unknown group(s) {', '.join(unknown)}; choose from: "
                          f"{', '.join(BENCH_GROUPS)}")
    return groups
