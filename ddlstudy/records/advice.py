"""The formats of what ``ddlstudy advise`` writes: advise.json, the ranked configurations,
and a study's advice-check.json, the advice against the runs that measured it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ddlstudy.records.kinds import (
    Bytes,
    Count,
    Error,
    Positive,
    Ratio,
    Record,
    Seconds,
)


class Recommendation(Record):
    flags: dict[str, Any]
    """Its ``ddlstudy run`` flags (``command``: the command line)."""
    rank: Positive
    """Its place, 1 the best."""
    label: str
    """The configuration in words."""
    runnable: bool = True
    """False: predicted for ``--link``'s machines, not runnable here."""
    images_per_s: Ratio
    """Predicted (or probed) training images per second, the fastest of its probes'."""
    speedup: Ratio | None = None
    """Its images/s / the sequential baseline probe's."""
    scaling_efficiency: Ratio | None = None
    """Its images/s / (its nodes x the fastest one-node probe's images/s): 1.0 when N nodes
    train N times as fast as the best one. Not the report's ``efficiency`` (its tables' and
    runs.csv's: speedup / the cores kept busy). Older advise.json files call it efficiency."""
    time_to_target_s: Seconds | None = None
    """Predicted training seconds to the target (ranked by time to target; null: never)."""
    predicted_need_node_bytes: Bytes | None = None
    """A node's memory as predicted: what it is held to (concepts: a node's memory)."""
    predicted_peak_process_bytes: Bytes | None = None
    """Its largest process's resident peak as predicted."""
    memory_basis: Literal["probe", "model"] | None = None
    """Where both memory figures come from: probe, its own probe's measured peaks, raised
    by what writing a snapshot adds (a probe writes none); model, the baseline's probe
    scaled by its strategy's footprint (a configuration not probed)."""
    not_predicted: list[str] | None = None
    """What its figures leave out, in words."""


class Origin(Record):
    """Where what advise trained came from, as a run's manifest records it: ``study
    --from-advice`` trains it again from any folder."""
    usecase: str | None = None
    """The use case as given: a name, or its file as an absolute path (null: --data-dir's
    folder alone)."""
    file: str | None = None
    """The use case's file, absolute (null: a shipped use case has none)."""
    data_dir: str | None = None
    """--data-dir, absolute."""
    model: str | None = None
    """--model, a file's path made absolute (FILE.py:FUNC)."""
    datasets_dir: str | None = None
    """--datasets-dir."""


class Refaults(Record):
    """A VM that hands freed memory back to its hypervisor (free page reporting), and a
    model whose largest weight glibc maps afresh every step (--heap return)."""
    largest_bytes: Bytes
    """The model's largest weight."""
    order: int
    """The free blocks the balloon reports: 2^order pages (-1: not said)."""


class Advice(Record):
    """advise.json: the ranked configurations of ``ddlstudy advise``."""
    usecase: str
    """The use case's name."""
    budget_s: Seconds | None = None
    """--budget in seconds (null: auto, every layout and node count once, then the
    contenders for at most half as long again)."""
    every_layout: bool | None = None
    """Whether every layout that could run here was probed (older files: null)."""
    budget_needed_s: Seconds | None = None
    """Where not: the budget that would have probed them all."""
    last_check: str | None = None
    """How the last check of an advice on this host did, as advise printed it."""
    origin: Origin | None = None
    """Where its use case, data and model came from (older files have none)."""
    ranking: list[Recommendation]
    """Best first: ``list`` ``same convergence`` before ``changes convergence``."""
    probe_settings: dict[str, Any] | None = None
    """The ``ddlstudy run`` flags every probe had (its data flags: ``study --from-advice``
    trains those)."""
    refaults: Refaults | None = None
    """Set where this host makes a run's images/s vary from its probe's (notes: why)."""


class CheckedRow(Record):
    """One configuration of the advice, predicted and measured."""
    rank: Positive
    label: str
    predicted: Ratio | None = None
    """Images/s (or seconds to the target) as advised."""
    measured: Ratio | None = None
    """Its best run's (null: never reached the target)."""
    error: Error | None = None
    predicted_node_bytes: Bytes | None = None
    measured_node_bytes: Bytes | None = None
    node_error: Error | None = None
    """A node's memory: what it is held to (concepts: a node's memory)."""
    predicted_process_bytes: Bytes | None = None
    measured_process_bytes: Bytes | None = None
    process_error: Error | None = None
    runs: Positive
    busy: bool | None = None
    """Measured while other processes kept the host busy (counted with --include-noisy)."""


class CheckSummary(Record):
    """What the rows add up to."""
    rows: Count
    mape: Ratio | None = None
    """The mean absolute error of the images/s (or time to target)."""
    spearman: Annotated[float, Field(ge=-1, le=1)] | None = None
    """The rank correlation between predicted and measured (3 rows or more)."""
    first_measured_rank: Positive | None = None
    """Where the advice's first choice came among the measured."""
    confirmed: bool | None = None
    """The first choice within 10 % of the best measured."""
    node_memory_mape: Ratio | None = None
    node_memory_worst: Error | None = None
    process_memory_mape: Ratio | None = None


class AdviceCheck(Record):
    """advice-check.json: an advice against the runs that measured it (a study's report)."""
    criterion: Literal["images/s", "time to target (s)"]
    rows: list[CheckedRow]
    summary: CheckSummary
    noisy_left_out: Count = 0
    """Runs left out: other processes kept the host busy."""
    figure: str | None = None
    """The figure beside it (predicted against measured), e.g. advice-check.svg."""
    refaults: Refaults | None = None
    """The advice's: where set, a run's images/s varies on this host (see Advice)."""
