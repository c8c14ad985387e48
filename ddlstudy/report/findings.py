"""The paper's four conclusions, checked against a folder of runs.

Lerat et al. (2022) conclude that (a) CPU multi-process data parallelism beats one process,
(b) SimpleBig gains more from CPU parallelism than ComplexSmall, (c) Spark is slower than
local parallelism and (d) MPI gives the best speedup on CPU. Each is judged on the rows of
each use case's main setting (like for like, as in the tables) by a ratio of images per
second, the best configuration of one side against the best of the other, with the 95 %
bootstrap interval of that ratio (the spreads the tables use):

- confirmed: the interval lies above 1 (with no interval, one measurement a side: the
  ratio is above 1, and the finding says there was no interval);
- refuted: it lies below 1, with the measured reason where the runs hold one (the share of
  a step MPI ranks spent in the exchange, the hosts the ranks shared, the CPU each side
  kept busy);
- inconclusive: the interval includes 1;
- not measured: a side has no completed run (the finding says which, and how many noisy
  runs it left out).

Runs marked noisy (other processes used their host) are left out of every verdict unless
the report counts them (``--include-noisy``): a busy host's speed says little of a
strategy's. (b) compares the paper's own use cases, so it is judged only on a folder that
holds one of them; (a), (c) and (d) are judged on each use case of the folder.

Each comparison also gives both sides' time to the use case's target accuracy, and says so
where the side faster per image reaches the target later, or not at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddlstudy.errors import UsageError
from ddlstudy.report.formats import wrapped
from ddlstudy.report.runs import KEY, LOCAL, is_baseline
from ddlstudy.report.tables import Report, interval, only_main, spread_of
from ddlstudy.runfolder import SAMPLES
from ddlstudy.sampler import IDENTITY, read_samples

log = logging.getLogger("ddlstudy")

PAPER = ("Lerat, Mahmoudi & Mahmoudi, \"Distributed Deep Learning: From Single-Node to "
         "Multi-Node Architecture\", Electronics 11(10):1525, 2022")
PAPER_USECASES = ("simple-big", "complex-small")


@dataclass(frozen=True)
class Side:
    """The best configuration of one side of a comparison."""

    label: str
    images_per_s: float
    speedup: float | None
    spread: list[float]
    runs: pd.DataFrame  # its counted runs (rows of Report.runs)
    target: float | None = None  # its use case's target validation accuracy
    reached: str = ""  # how many of its runs reached it ('1/2'), '' without a target
    tta_s: float | None = None  # the median time to it, when every run reached it


@dataclass
class Finding:
    letter: str
    claim: str
    verdict: str = "not measured"
    lines: list[str] = field(default_factory=list)
    """The evidence, one line per use case (or per comparison)."""


def _cpu(t: pd.DataFrame) -> pd.Series:
    return t.gpus == 0


def _local_cpu(t: pd.DataFrame) -> pd.Series:
    return (t.backend == LOCAL) & (t.gpus == 0)


COMPARISONS = {
    "a": ("CPU multi-process data parallelism is faster than one process",
          (lambda t: _local_cpu(t) & (t.table == 1) & (t.processes > 1),
           "multi-process data-parallel run"),
          (lambda t: _local_cpu(t) & (t.processes == 1), "one-process run")),
    "c": ("Spark is slower than local parallelism", (_local_cpu, "local run"),
          (lambda t: (t.backend == "spark") & _cpu(t), "Spark run")),
    "d": ("MPI gives the best speedup on CPU", (lambda t: (t.backend == "mpi") & _cpu(t),
                                                "MPI run"),
          (lambda t: (t.backend != "mpi") & _cpu(t), "CPU run without MPI")),
}
"""(a), (c), (d): the claim, then its claimed side and the other, each a mask of the
summary's rows and what a run of it is called."""


def findings(report: Report) -> list[Finding]:
    """The paper's conclusions (a)-(d), each with a verdict and its figures; (b) only where
    the folder holds one of the paper's use cases."""
    rows = only_main(report.table)
    rows = rows[(rows.status.str.startswith("ok") | rows.noisy) & rows.images_per_s.notna()]
    left_out = rows.noisy & (not report.include_noisy)
    runs = {k: g[g.counted] for k, g in report.runs.groupby(KEY, dropna=False)}
    best = _Best(rows[~left_out], runs, rows[left_out])
    usecases = list(dict.fromkeys(report.table.usecase))
    out = [_compare(report, best, usecases, letter) for letter in COMPARISONS]
    if set(usecases) & set(PAPER_USECASES):
        out.insert(1, _gains(best, usecases))
    return out


def _compare(report: Report, best: _Best, usecases: list[str], letter: str) -> Finding:
    """One of ``COMPARISONS`` judged on each use case."""
    claim, (claimed, what), (other, others) = COMPARISONS[letter]
    return _per_usecase(letter, claim, usecases, lambda uc: _claim(
        report, best(uc, claimed), best(uc, other), best.missing(uc, claimed, what),
        best.missing(uc, other, others)))


class _Best:
    """The fastest configuration of a use case among the rows a mask picks (``noisy``:
    the rows left out for their noisy runs, to say so where a side has no other)."""

    def __init__(self, rows: pd.DataFrame, runs: dict, noisy: pd.DataFrame) -> None:
        self.rows, self.runs, self.noisy = rows, runs, noisy

    def __call__(self, usecase: str, mask) -> Side | None:
        t = self.rows[self.rows.usecase == usecase]
        t = t[mask(t)]
        if t.empty:
            return None
        r = t.loc[t.images_per_s.idxmax()]
        mine = self.runs.get(tuple(r[k] for k in KEY), pd.DataFrame())
        return Side(r.config, float(r.images_per_s),
                    None if pd.isna(r.speedup) else float(r.speedup), spread_of(mine), mine,
                    _number(r.target), r.reached or "", _number(r.time_to_target_s))

    def missing(self, usecase: str, mask, what: str) -> str:
        """Why a side of ``usecase`` has no figures: no completed run, or only noisy ones."""
        t = self.noisy[self.noisy.usecase == usecase]
        noisy = int(t[mask(t)].runs.sum())
        return f"no completed {what}" + (f" on a quiet host ({noisy} noisy left out)"
                                         if noisy else "")


def _per_usecase(letter: str, claim: str, usecases: list[str], judge) -> Finding:
    finding = Finding(letter, claim)
    verdicts = []
    for uc in usecases:
        verdict, line = judge(uc)
        verdicts.append(verdict)
        finding.lines.append(f"{uc}: {line}")
    measured = [v for v in verdicts if v != "not measured"]
    if measured:
        finding.verdict = measured[0] if len(set(measured)) == 1 else \
            "mixed (" + ", ".join(f"{uc} {v}" for uc, v in zip(usecases, verdicts,
                                                                strict=True)) + ")"
    return finding


def _claim(report: Report, claimed: Side | None, other: Side | None, no_claimed: str,
           no_other: str) -> tuple[str, str]:
    """Whether ``claimed`` is faster than ``other``, and the figures that say so."""
    if claimed is None or other is None:
        return "not measured", no_claimed if claimed is None else no_other
    ratio = claimed.images_per_s / other.images_per_s
    bounds = interval(claimed.spread, other.spread)
    if bounds is None:
        verdict = "confirmed" if ratio > 1 else "refuted"
        spread = " (one measurement a side: no interval)"
    else:
        verdict = "confirmed" if bounds[0] > 1 else "refuted" if bounds[1] < 1 else \
            "inconclusive"
        spread = f" (95 % interval {bounds[0]:.2f}-{bounds[1]:.2f})"
    line = (f"{verdict}: {claimed.label} {claimed.images_per_s:.1f} img/s against "
            f"{other.label} {other.images_per_s:.1f} img/s, ratio {ratio:.2f}{spread}")
    line += _accuracy(claimed, other)
    if verdict == "refuted":
        line += "; " + "; ".join(_why(report, claimed, other))
    return verdict, line


def _accuracy(claimed: Side, other: Side) -> str:
    """The two sides' time to their use case's target accuracy, so that the side faster per
    image that learns slower (or not at all in its epochs) is seen as such; '' where the
    use case sets no target or the sides were held to different ones."""
    if not (claimed.reached and other.reached) or claimed.target != other.target:
        return ""

    def one(side: Side) -> str:
        if side.tta_s is not None:
            return f"{side.label} {side.tta_s:.2f} s"
        if side.reached.startswith("0/"):
            return f"{side.label} not reached ({side.reached} runs)"
        return f"{side.label} reached in {side.reached} runs only"

    text = f"; time to the {claimed.target:.2f} target: {one(claimed)}, {one(other)}"
    fast, slow = sorted((claimed, other), key=lambda side: -side.images_per_s)
    if slow.tta_s is not None and (fast.tta_s is None or fast.tta_s > slow.tta_s):
        text += (f" ({fast.label} is faster per image but "
                 + ("did not reach the target" if fast.tta_s is None else
                    f"reaches the target {fast.tta_s / slow.tta_s:.2f}x later") + ")")
    return text


def _number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _gains(best: _Best, usecases: list[str]) -> Finding:
    """(b): the best CPU speedup of SimpleBig against that of ComplexSmall."""
    finding = Finding("b", "SimpleBig gains more from CPU parallelism than ComplexSmall")
    quiet = set(best.rows[is_baseline(best.rows)].usecase)  # a noisy one's speedups are not
    sides = {uc: best(uc, lambda t: _local_cpu(t) & ~is_baseline(t) & t.speedup.notna())
             if uc in quiet else None for uc in PAPER_USECASES}
    missing = [uc for uc, s in sides.items() if s is None]
    if missing:
        have = ", ".join(usecases) or "none"
        finding.lines.append(f"needs a baseline and a local CPU parallel run of both "
                             f"{' and '.join(PAPER_USECASES)}; missing: {', '.join(missing)} "
                             f"(this folder has: {have})")
        return finding
    big, small = sides["simple-big"], sides["complex-small"]
    finding.verdict = "confirmed" if big.speedup > small.speedup else "refuted"
    finding.lines.append(f"{finding.verdict}: simple-big's best, {big.label}, "
                         f"{big.speedup:.2f}x against complex-small's best, {small.label}, "
                         f"{small.speedup:.2f}x")
    return finding


def _why(report: Report, claimed: Side, other: Side) -> list[str]:
    """What the runs measured that explains a refuted claim."""
    reasons = []
    for side in (claimed, other):
        m = _manifest(report, side)
        if m is None:
            continue
        exchange = ((m.get("backend") or {}).get("exchange") or {}).get("per_rank") or []
        if exchange:
            shares = [r["exchange_s"] / max(r["exchange_s"] + r["compute_s"], 1e-9)
                      for r in exchange]
            per_step = [r["exchange_s"] / max(r["steps"], 1) for r in exchange]
            reasons.append(f"{side.label}'s ranks spent {min(shares):.0%}-{max(shares):.0%} "
                           f"of each step in the gradient exchange "
                           f"({min(per_step) * 1e3:.0f}-{max(per_step) * 1e3:.0f} ms a step)")
        hosts = (m.get("backend") or {}).get("hosts") or []
        if len(hosts) > 1 and len(set(hosts)) == 1:
            cores = (m.get("host") or {}).get("usable_cores", "?")
            reasons.append(f"{side.label}'s {len(hosts)} ranks all ran on {hosts[0]}, "
                           f"sharing its {cores} cores instead of adding any")
    busy = {s.label: _cpu_busy(report, s) for s in (claimed, other)}
    if all(v is not None for v in busy.values()):
        reasons.append("CPU kept busy: " + ", ".join(f"{k} {v:.0%} of the host"
                                                      for k, v in busy.items()))
    return reasons or ["the runs hold no measurement that explains it"]


def _manifest(report: Report, side: Side) -> dict | None:
    return report.by_id.get(side.runs.run.iloc[0]) if len(side.runs) else None


def _cpu_busy(report: Report, side: Side) -> float | None:
    """The median share of the host's CPU the side's first run used (all its processes)."""
    m = _manifest(report, side)
    path = Path(side.runs.path.iloc[0]) / SAMPLES if len(side.runs) else None
    if m is None or path is None or not path.is_file():
        return None
    try:
        s = read_samples(path, (*IDENTITY, "proc_cpu_percent"))
    except UsageError as exc:
        log.warning("findings: left out %s", exc)
        return None
    s = s[s.scope == "node"]
    if s.empty:
        return None
    cores = (m.get("host") or {}).get("usable_cores") or 1
    hosts = max(len(set((m.get("backend") or {}).get("hosts") or [])), 1)
    per_rank = s.groupby("rank").proc_cpu_percent.median()
    return float(per_rank.sum()) / 100 / (cores * hosts)


def findings_notes(report: Report) -> list[str]:
    """What the findings left out and why: the noisy runs (and how to count them), and (b)
    on a folder without the paper's use cases."""
    out = []
    usecases = list(dict.fromkeys(report.table.usecase))
    if not set(usecases) & set(PAPER_USECASES):
        out.append(f"Judged on this folder's use case(s): {', '.join(usecases)}. (b) compares "
                   f"the paper's own two, {' and '.join(PAPER_USECASES)}: left out here.")
    noisy = report.runs[(report.runs.status == "completed") & report.runs.noisy]
    if len(noisy) and report.include_noisy:
        out.append(f"{len(noisy)} noisy run(s) counted (--include-noisy): other processes "
                   "used their host while they ran.")
    elif len(noisy):
        out.append(f"{len(noisy)} run(s) marked noisy (other processes used their host while "
                   "they ran) are left out of these verdicts; `ddlstudy report "
                   "--include-noisy` counts them.")
    return out


def render_findings(found: list[Finding], notes: list[str] = ()) -> str:
    """The findings section as Markdown, in lines that fit a terminal; ``notes``: what was
    left out (``findings_notes``), after the heading."""
    lines = [wrapped(f"**Findings: the paper's conclusions on these runs** ({PAPER}; its own "
                     "figures came from its cluster's CPUs and GPUs, these from this "
                     "folder's hosts)"), ""]
    lines += [wrapped(note) + "\n" for note in notes]
    for f in found:
        lines.append(wrapped(f"- ({f.letter}) {f.claim}: **{f.verdict}**", "  "))
        lines += [wrapped(f"  - {line}", "    ") for line in f.lines]
    return "\n".join(lines)
