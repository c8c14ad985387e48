"""What ``bench all --only`` takes: named here, without importing the bench (and torch),
so the command line can refuse an unknown group at once."""

from __future__ import annotations

from ddlstudy.errors import ConfigError

BENCH_GROUPS = ("overhead", "ceiling", "sampler", "loader", "strategies", "pipeline",
                "sharding", "reducers", "transport", "mpi", "spark", "start")
"""What ``bench all --only`` takes."""

ADVICE_CHECK_EPOCHS = 6
"""``bench advise --check-epochs``' default: the epochs of each check run, whose images/s
is the median of its epochs'. Two were too few on tiny, whose epoch trains 0.3 s: the
two epochs of one run differed by up to 20 % (761 and 612 images/s), more than the
errors the check is there to find."""


def bench_groups(only: str | None) -> list[str]:
    """The groups ``--only`` names (every group without it), or a ConfigError."""
    groups = [g for g in only.split(",") if g.strip()] if only else list(BENCH_GROUPS)
    if not groups:
        raise ConfigError("--only", f"{only!r} names no group; choose from: "
                          f"{', '.join(BENCH_GROUPS)}")
    unknown = [g for g in groups if g not in BENCH_GROUPS]
    if unknown:
        raise ConfigError("--only", f"unknown group(s) {', '.join(unknown)}; choose from: "
                          f"{', '.join(BENCH_GROUPS)}")
    return groups
