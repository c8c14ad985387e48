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
where the side faster per image reaches the target later (not where neither reached it in
runs cut to a few steps by --max-steps: that says nothing). Where a configuration of either
side reached the target in every run, the comparison is about training: a configuration
that did not (a weak-scaled run, say) never stands for its side (the finding names it and
judges the fastest that did), and a side none of whose configurations reached it loses on
time to target; where none did, the line says the verdict rests on images/s alone. Where a
verdict is not the paper's (which confirms all four), the finding says so with the measured
reasons.
Each is also projected onto nodes of many cores (``Report.project``, ``--project``: 32-core
nodes joined by 10 Gbit/s by default) with the model of ``report.projection``, marked as a
projection: on a 2-core host every "node" shares the same two cores, and a verdict there
need not be the verdict on the paper's kind of machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.machine.sampler import IDENTITY, read_samples
from ddlstudy.records.runfolder import SAMPLES
from ddlstudy.report.formats import wrapped
from ddlstudy.report.projection import Hardware
from ddlstudy.report.runs import KEY, is_baseline
from ddlstudy.report.sides import Best, Side, cpu, local_cpu
from ddlstudy.report.tables import Report, interval, only_main, quotient_interval

log = logging.getLogger("ddlstudy")

PAPER = ("Lerat, Mahmoudi & Mahmoudi, \"Distributed Deep Learning: From Single-Node to "
         "Multi-Node Architecture\", Electronics 11(10):1525, 2022")
PAPER_USECASES = ("simple-big", "complex-small")


@dataclass
class Finding:
    letter: str
    claim: str
    verdict: str = "not measured"
    lines: list[str] = field(default_factory=list)
    """The evidence, one line per use case (or per comparison)."""
    differs: list[str] = field(default_factory=list)
    """Where the verdict is not the paper's: why, from what the runs measured."""
    projected: list[str] = field(default_factory=list)
    """The verdict projected onto ``hardware``, one line per use case (a model)."""
    hardware: Hardware | None = None
    verdicts: dict[str, str] = field(default_factory=dict)
    """Each use case's verdict, where the finding judges each on its own."""


COMPARISONS = {
    "a": ("CPU multi-process data parallelism is faster than one process",
          (lambda t: local_cpu(t) & (t.table == 1) & (t.processes > 1),
           "multi-process data-parallel run"),
          (lambda t: local_cpu(t) & (t.processes == 1), "one-process run")),
    "c": ("Spark is slower than local parallelism", (local_cpu, "local run"),
          (lambda t: (t.backend == "spark") & cpu(t), "Spark run")),
    "d": ("MPI gives the best speedup on CPU", (lambda t: (t.backend == "mpi") & cpu(t),
                                                "MPI run"),
          (lambda t: (t.backend != "mpi") & cpu(t), "CPU run without MPI")),
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
    best = Best(rows[~left_out], runs, rows[left_out], report.by_id)
    usecases = list(dict.fromkeys(report.table.usecase))
    out = [_compare(report, best, usecases, letter) for letter in COMPARISONS]
    if set(usecases) & set(PAPER_USECASES):
        out.insert(1, _gains(report, best, usecases))
    return out


def _compare(report: Report, best: Best, usecases: list[str], letter: str) -> Finding:
    """One of ``COMPARISONS`` judged on each use case."""
    claim, (claimed, what), (other, others) = COMPARISONS[letter]
    judged = {uc: _judged(best, uc, (claimed, what), (other, others)) for uc in usecases}
    sides = {uc: j[2] for uc, j in judged.items()}
    finding = _per_usecase(letter, claim, usecases, lambda uc: judged[uc][:2])
    for uc, verdict in finding.verdicts.items():
        if verdict not in ("confirmed", "not measured"):
            finding.differs.append(f"{uc}: " + "; ".join(_why(report, *sides[uc])))
    finding.hardware = report.project
    if report.project is not None:
        finding.projected = [_projection(best, uc, claimed, other, report.project)
                             for uc in usecases]
    return finding


def _projection(best: Best, uc: str, claimed, other, hardware: Hardware) -> str:
    """A comparison on ``uc`` projected onto ``hardware``: each side's best projected."""
    speeds = best.speeds(uc)
    if speeds is None:
        return f"{uc}: not projected: {best.why_no_speeds(uc)}"
    a, b = best.projected(uc, claimed, speeds, hardware), \
        best.projected(uc, other, speeds, hardware)
    if a is None or b is None:
        return f"{uc}: not projected: a side has no run to project"
    verdict = "confirmed" if a[1] > b[1] else "refuted"
    return (f"{uc}: {verdict}: {a[0]} {a[1]:.1f} img/s against {b[0]} {b[1]:.1f} img/s, "
            f"ratio {a[1] / b[1]:.2f} (serial share {speeds.serial:.2f})")


def _per_usecase(letter: str, claim: str, usecases: list[str], judge) -> Finding:
    finding = Finding(letter, claim)
    for uc in usecases:
        finding.verdicts[uc], line = judge(uc)
        finding.lines.append(f"{uc}: {line}")
    measured = [v for v in finding.verdicts.values() if v != "not measured"]
    if measured:
        finding.verdict = measured[0] if len(set(measured)) == 1 else \
            "mixed (" + ", ".join(f"{uc} {v}" for uc, v in finding.verdicts.items()) + ")"
    return finding


def _judged(best: Best, uc: str, claimed: tuple, other: tuple) -> tuple[str, str, tuple]:
    """A comparison on ``uc``: its verdict, its line, and the two sides it rests on. Where
    a configuration of either side reached the use case's target accuracy in every run,
    the claim is about training, so a side is its fastest configuration that did (one
    faster per image that did not is named, not judged on), and a side none of whose
    configurations reached it loses to one that did; else images/s alone judge it."""
    (mask, what), (other_mask, others) = claimed, other
    fast = best(uc, mask), best(uc, other_mask)
    if None in fast:
        return ("not measured", best.missing(uc, mask, what) if fast[0] is None
                else best.missing(uc, other_mask, others), fast)
    reached = best(uc, mask, reached=True), best(uc, other_mask, reached=True)
    if reached == (None, None):
        verdict, line = _claim(*fast)
        neither = fast[0].reached and not (fast[0].cut_short and fast[1].cut_short)
        return verdict, line + (" (neither side reached the target: this rests on images/s "
                                "alone)" if neither else ""), fast
    if None in reached:
        win, lose, nobody = (reached[0], fast[1], others) if reached[1] is None else \
            (reached[1], fast[0], what)
        verdict = "confirmed" if reached[1] is None else "refuted"
        return verdict, (
            f"{verdict} on time to the {win.goal} target: {win.label} reached it in "
            f"{win.tta_s:.2f} s ({win.images_per_s:.1f} img/s); no {nobody} reached it in "
            f"every run (the fastest, {lose.label}, {lose.images_per_s:.1f} img/s, in "
            f"{lose.reached} runs)"), (reached[0] or fast[0], reached[1] or fast[1])
    verdict, line = _claim(*reached)
    passed = [f for f, r in zip(fast, reached, strict=True) if f.label != r.label]
    return verdict, line + "".join(
        f"; not judged on {f.label}, faster per image ({f.images_per_s:.1f} img/s) but not "
        f"reaching the target in every run ({f.reached})" for f in passed), reached


def _claim(claimed: Side, other: Side) -> tuple[str, str]:
    """Whether ``claimed`` is faster than ``other`` per image, and the figures that say
    so (with both sides' time to target)."""
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
    return verdict, line + _accuracy(claimed, other)


def _accuracy(claimed: Side, other: Side) -> str:
    """The two sides' time to their use case's target accuracy, so that the side faster per
    image that learns slower (or not at all in its epochs) is seen as such; '' where the
    use case sets no target or the sides were held to different ones."""
    if not (claimed.reached and other.reached) or \
            (claimed.target, claimed.metric) != (other.target, other.metric):
        return ""
    if all(s.reached.startswith("0/") and s.cut_short for s in (claimed, other)):
        return ""  # runs of a few steps (--max-steps): not reaching it says nothing

    def one(side: Side) -> str:
        if side.tta_s is not None:
            return f"{side.label} {side.tta_s:.2f} s"
        if side.reached.startswith("0/"):
            return f"{side.label} not reached ({side.reached} runs)"
        return f"{side.label} reached in {side.reached} runs only"

    text = f"; time to the {claimed.goal} target: {one(claimed)}, {one(other)}"
    fast, slow = sorted((claimed, other), key=lambda side: -side.images_per_s)
    if slow.tta_s is not None and (fast.tta_s is None or fast.tta_s > slow.tta_s):
        text += (f" ({fast.label} is faster per image but "
                 + ("did not reach the target" if fast.tta_s is None else
                    f"reaches the target {fast.tta_s / slow.tta_s:.2f}x later") + ")")
    return text


def _gains(report: Report, best: Best, usecases: list[str]) -> Finding:
    """(b): the best CPU speedup of SimpleBig against that of ComplexSmall, with the 95 %
    interval of their ratio (each side's runs and its baseline's resampled)."""
    finding = Finding("b", "SimpleBig gains more from CPU parallelism than ComplexSmall",
                      hardware=report.project)
    quiet = set(best.rows[is_baseline(best.rows)].usecase)  # a noisy one's speedups are not
    parallel = lambda t: local_cpu(t) & ~is_baseline(t) & t.speedup.notna()  # noqa: E731
    sides = {uc: best(uc, parallel) if uc in quiet else None for uc in PAPER_USECASES}
    missing = [uc for uc, s in sides.items() if s is None]
    if missing:
        have = ", ".join(usecases) or "none"
        noisy = [f"{uc}: {best.missing(uc, lambda t: is_baseline(t) | parallel(t), 'run')}"
                 for uc in missing if uc in set(best.noisy.usecase)]
        finding.lines.append(f"needs a baseline and a local CPU parallel run of both "
                             f"{' and '.join(PAPER_USECASES)}; missing: {', '.join(missing)} "
                             f"(this folder has: {have})" + "".join(f"; {n}" for n in noisy))
        return finding
    big, small = sides["simple-big"], sides["complex-small"]
    bases = [best(uc, is_baseline).spread for uc in ("simple-big", "complex-small")]
    bounds = quotient_interval((big.spread, 1), (bases[0], -1), (small.spread, -1),
                               (bases[1], 1))  # (big / its baseline) / (small / its)
    ratio = big.speedup / small.speedup
    if bounds is None:
        finding.verdict = "confirmed" if ratio > 1 else "refuted"
        spread = "one measurement a side: no interval"
    else:
        finding.verdict = "confirmed" if bounds[0] > 1 else "refuted" if bounds[1] < 1 else \
            "inconclusive"
        spread = f"95 % interval {bounds[0]:.2f}-{bounds[1]:.2f}"
    finding.lines.append(f"{finding.verdict}: simple-big's best, {big.label}, "
                         f"{big.speedup:.2f}x against complex-small's best, {small.label}, "
                         f"{small.speedup:.2f}x: ratio {ratio:.2f} ({spread})")
    if finding.verdict != "confirmed":
        finding.differs.append(_serial_shares(best) + "; ".join(_why(report, big, small)))
    if report.project is not None:
        finding.projected.append(_gains_projected(best, parallel, report.project))
    return finding


def _serial_shares(best: Best) -> str:
    """How each paper use case's process speeds up with its threads (Amdahl)."""
    shares = {uc: best.speeds(uc) for uc in PAPER_USECASES}
    if None in shares.values():
        return ""
    return ("serial share of a process's step (Amdahl, from cpu-intraop): " + ", ".join(
        f"{uc} {s.serial:.2f}" for uc, s in shares.items()) + "; ")


def _gains_projected(best: Best, parallel, hardware: Hardware) -> str:
    """(b) projected: each paper use case's best projected speedup over its baseline."""
    gains = {}
    for uc in PAPER_USECASES:
        speeds = best.speeds(uc)
        side = speeds and best.projected(uc, parallel, speeds, hardware)
        if not side:
            why = best.why_no_speeds(uc) if speeds is None else "no run to project"
            return f"not projected: {uc}: {why}"
        gains[uc] = (side[0], side[1] / speeds.r1)
    (big, g_big), (small, g_small) = gains["simple-big"], gains["complex-small"]
    return (f"{'confirmed' if g_big > g_small else 'refuted'}: simple-big's best, {big}, "
            f"{g_big:.2f}x against complex-small's best, {small}, {g_small:.2f}x")


def _why(report: Report, claimed: Side, other: Side) -> list[str]:
    """What the runs measured that explains a refuted claim."""
    reasons = []
    for side in (claimed, other):
        m = _manifest(report, side)
        if m is None:
            continue
        exchange = ((m.get("backend") or {}).get("exchange") or {}).get("per_rank") or []
        per_step = [r["exchange_s"] / max(r["steps"], 1) for r in exchange]
        if per_step and max(per_step) >= 0.5e-3:  # Spark's allgather syncs between steps
            shares = [r["exchange_s"] / max(r["exchange_s"] + r["compute_s"], 1e-9)
                      for r in exchange]
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
        lines += [wrapped(f"  - not the paper's verdict (it confirms this), measured here: "
                          f"{line}", "    ") for line in f.differs]
        if f.projected:
            lines.append(wrapped(f"  - projected to {f.hardware} (a model fitted to these "
                                 "runs, not a measurement):", "    "))
            lines += [wrapped(f"    - {line}", "      ") for line in f.projected]
    return "\n".join(lines)
