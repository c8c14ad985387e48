"""When each probe runs and for how long: every layout once first, the MPI nodes of the
fastest next, then the contenders again until their figures settle, within the budget.

A probe is a real ``ddlstudy run``: its start-up (interpreter, torch, data, the group),
its warm-up steps, and its steady steps, time-boxed (``--steady-seconds``): as many as
fill the box at the warm-up's pace, whatever a step costs. What a probe costs is learnt
as they run (``Pace``): the baseline's step time, and each process count's start-up.
With a budget that cannot probe every layout at the full box, the boxes shrink (to
MIN_BOX); what still does not fit is named with the budget that would.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlstudy.config import UseCase
from ddlstudy.machine.sampler import NOISY_CORES, wait_quiet_at_most
from ddlstudy.tools.advise.probes import (
    CONTENDER,
    PROBE_SECONDS,
    Candidate,
    probe,
    probe_settings,
    say,
    settle_noisy,
    train_images,
)
from ddlstudy.training import WARMUP_STEPS

MIN_BOX = 0.5
"""The shortest time box a short budget shrinks a probe's steady steps to (at least
``loop.MIN_PACED`` steps all the same)."""
SETTLED = 0.05
"""A contender's figure is settled once two of its quiet probes agree within this: it is
not probed again."""
MORE = 0.5
"""Without a budget (``--budget auto``): after every layout and node count has been probed
once, the contenders are probed again for at most this share of the time that took."""
SLOW_STEP_S = 1.0
"""A step slower than this needs one warm-up step, not WARMUP_STEPS (VGG16's on a CPU)."""


@dataclass
class Pace:
    """What a probe costs on this host for this use case, learnt from the probes so far."""

    uc: UseCase
    box: float = PROBE_SECONDS
    base_step: float | None = None
    """The baseline's steady seconds a step, once probed."""
    started: float = field(default_factory=time.monotonic)

    @property
    def per_epoch(self) -> int:
        return max(1, math.ceil(train_images(self.uc) / self.uc.train.batch_size))

    @property
    def warmup(self) -> int:
        return 1 if self.base_step and self.base_step > SLOW_STEP_S else WARMUP_STEPS

    def epochs(self, box: float) -> int:
        """Epochs a probe times: one where an epoch's steady steps fill ``box`` at the
        baseline's pace, else up to 3 (tiny's epoch of 15 steps lasts 0.3 s)."""
        if not self.base_step:
            return 1
        steady = max(1, self.per_epoch - self.warmup) * self.base_step
        return min(3, max(1, math.ceil(box / steady)))

    def settings(self, box: float) -> dict[str, Any]:
        return probe_settings(self.uc, box / self.epochs(box), self.warmup, self.epochs(box))

    def startup(self, c: Candidate, cands: list[Candidate]) -> float:
        """Seconds ``c``'s probe spends before its first epoch: that of the last probe of
        as many processes, else twice the longest seen for more than one (each spawned
        process imports torch again), else the longest seen (none yet: 10 s)."""
        seen = [(o.cores * o.nodes, s - t) for o in cands
                for s, t in zip(o.seconds, o.trained_s, strict=False)]
        same = [s for n, s in seen if n == c.cores * c.nodes]
        if same:
            return same[-1]
        longest = max((s for _, s in seen), default=10.0)
        return longest * (2 if c.cores * c.nodes > 1 else 1)

    def seconds(self, c: Candidate, cands: list[Candidate], box: float) -> float:
        """About how long a probe of ``c`` with a time box of ``box`` takes."""
        step = self.base_step or 1.0
        epoch = (self.warmup + max(3, min(box / self.epochs(box) / step,
                                          self.per_epoch))) * step
        return self.startup(c, cands) + self.epochs(box) * epoch

    def learn(self, c: Candidate) -> None:
        if c.label == "sequential" and c.step_s and self.base_step is None:
            self.base_step = c.step_s[-1]


def probe_all(cands: list[Candidate], usecase: str | None, given: dict[str, Any],
              runs_dir: Path, pace: Pace, deadline: float | None, rounds: int,
              grow: Callable[[list[Candidate]], list[Candidate]] = lambda done: [],
              wait: bool = False,
              fits: Callable[[list[Candidate]], None] = lambda cands: None
              ) -> dict[str, Any]:
    """Probe in rounds: the first probes every candidate once (the baseline first: what
    fits in memory is predicted from it); the second the MPI nodes ``grow`` adds (of the
    fastest local strategies) and those whose probes were all noisy; later rounds the
    contenders (within ``CONTENDER`` of the leader) whose figures have not settled,
    fastest first. ``deadline`` None (--budget auto): every probe of the first two rounds,
    then more for at most MORE of the time they took. Before each probe ``fits`` leaves
    out what would not fit in memory; with ``wait``, each waits for a quiet host first,
    not charged to the budget. Returns how it went: rounds, seconds waited, and where the
    budget ran out, what budget would have probed every layout."""
    state = {"rounds": 0, "waited_s": 0.0, "every_layout": True}
    try:
        for r in range(rounds):
            order = _order(cands, r, grow)
            if r == 2 and deadline is None:  # auto: more probes for a while
                deadline = time.monotonic() + MORE * (time.monotonic() - pace.started)
            for i, c in enumerate(order):
                fits(cands)
                if c.skip or len(c.speeds) + len(c.noisy) > r:
                    continue
                if wait:
                    w = _wait_quiet()
                    state["waited_s"] += w
                    deadline = deadline + w if deadline is not None else None
                box = _box(c, order[i:], cands, pace, deadline, r)
                if box is None:
                    _out_of_budget(cands, pace, state, r)
                    return state
                _probe(c, usecase, given, runs_dir, pace, box, deadline, r)
                state["rounds"] = r + 1
        return state
    finally:
        fits(cands)
        settle_noisy(cands)


def _order(cands: list[Candidate], r: int, grow) -> list[Candidate]:
    """Round ``r``'s candidates, in the order they are probed."""
    if r == 0:
        return sorted((c for c in cands if not c.skip), key=lambda c: c.label != "sequential")
    more = grow(cands) if r == 1 else []
    cands += more
    ran = [c for c in cands if c.speeds and not c.skip]
    lead = max((c.speed for c in ran), default=0.0)
    again = [c for c in cands if c.noisy and not c.speeds and not c.skip and r == 1]
    contenders = sorted((c for c in ran if max(c.speeds) >= CONTENDER * lead
                         and not settled(c)), key=lambda c: -c.speed)
    return more + again + (contenders if r > 1 or not more else [])


def settled(c: Candidate) -> bool:
    """Whether ``c``'s figure needs no more probes: two quiet ones within SETTLED."""
    if len(c.speeds) < 2:
        return False
    top = sorted(c.speeds)[-2:]
    return (top[1] - top[0]) / top[1] <= SETTLED


def _box(c: Candidate, rest: list[Candidate], cands: list[Candidate], pace: Pace,
         deadline: float | None, r: int) -> float | None:
    """``c``'s time box: the full one, or in the first round what leaves every candidate
    after it (``rest``) a share of the time left, at least MIN_BOX; None where even that
    does not fit (the baseline always runs: speedups are against it)."""
    if deadline is None or c.label == "sequential" and not c.seconds:
        return pace.box
    left = deadline - time.monotonic()
    if r == 0:
        todo = [o for o in rest if not o.skip and not o.speeds and not o.noisy]
        fixed = sum(pace.seconds(o, cands, 0.0) for o in todo)
        share = (left - fixed) / max(1, len(todo))
        box = min(pace.box, max(MIN_BOX, share))
    else:
        box = pace.box
    return box if pace.seconds(c, cands, box) <= left else None


def _out_of_budget(cands: list[Candidate], pace: Pace, state: dict, r: int) -> None:
    """Mark what was not probed, with the budget that would have probed every layout."""
    todo = [o for o in cands if not o.speeds and not o.noisy and not o.skip]
    if not todo:
        return
    spent = time.monotonic() - pace.started
    needed = math.ceil(spent + sum(pace.seconds(o, cands, pace.box) for o in todo))
    needed = 10 * math.ceil(needed / 10)
    state |= {"every_layout": r > 0 or not any(o.nodes == 1 for o in todo),
              "budget_needed_s": needed}
    for o in todo:
        o.skip = (f"not probed: the time budget ran out (--budget {needed}s, or auto, "
                  "would probe every layout)")
    say(f"  budget: {len(todo)} configuration(s) not probed; --budget {needed}s (or auto) "
        "would probe them all")


def _probe(c: Candidate, usecase: str | None, given: dict[str, Any], runs_dir: Path,
           pace: Pace, box: float, deadline: float | None, r: int) -> None:
    """Probe ``c`` with a time box of ``box`` and say how it went."""
    quiet = len(c.speeds)
    probe(c, usecase, pace.settings(box) | given, runs_dir)
    pace.learn(c)
    if c.skip:
        got = c.skip
    elif len(c.speeds) > quiet:
        got = f"{c.speeds[-1]:.1f} images/s"
    else:
        n = c.noisy[-1]
        got = (f"{n['images_per_s']:.1f} images/s, noisy: other processes used "
               f"{n['others_cores']:.2f} cores (not counted; --wait-quiet waits)")
    left = "" if deadline is None else \
        f"; {max(deadline - time.monotonic(), 0):.0f} s of the budget left"
    say(f"  [round {r + 1}] {c.label}: {got} ({c.seconds[-1]:.1f} s, steady box "
        f"{box:.1f} s{left})")


def _wait_quiet() -> float:
    """Wait for a quiet host (at most WAIT_MOST_S); the seconds waited."""
    start = time.monotonic()
    busy = wait_quiet_at_most()
    if busy > NOISY_CORES:
        say(f"  the host stayed busy ({busy:.2f} cores): probing anyway")
    return time.monotonic() - start
