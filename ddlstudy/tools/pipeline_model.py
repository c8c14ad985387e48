"""The pipeline's step, predicted from the costs a run measured before training (its
``strategy.piece_costs``: each piece's forward and backward on one micro-batch and its
optimizer step, alone on the threads a stage has).

Each stage runs its micro-batches' forward and backward passes in its schedule's order
(GPipe: every forward, then every backward; 1F1B: S - 1 - s forwards, then one forward and
one backward in turn). A forward waits for the stage before it, a backward for the stage
after it. The processes share the host's cores: while more threads run than there are
cores, each runs at cores / threads of its speed (processor sharing), so a stage that
waits gives its core to the others, which is what a pipeline on a small host lives by.
Once a stage's last backward is done its optimizer steps. A hybrid run's replicas then
average each stage's gradients: that exchange is added as the run measured it (it is not
modelled). The activations' sends (under 1 % of a simple-big step) are left out.

Checked against every local pipeline and hybrid run of a folder (on CPUs, in float32) by
``ddlstudy predict``; the interleaved schedule (two stages a process) is not modelled.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")
"""The schedules the model knows (interleaved-1f1b is not modelled)."""


def order(stage: int, stages: int, micro: int, schedule: str) -> list[tuple[str, int]]:
    """The passes (``"F"`` or ``"B"``, micro-batch) of ``stage`` in the order it runs them."""
    if schedule == "gpipe":
        return [("F", m) for m in range(micro)] + [("B", m) for m in range(micro)]
    warm = min(stages - 1 - stage, micro)
    ops, forward = [("F", m) for m in range(warm)], warm
    for backward in range(micro):
        if forward < micro:
            ops.append(("F", forward))
            forward += 1
        ops.append(("B", backward))
    return ops


@dataclass(frozen=True)
class Stages:
    """Per stage: one micro-batch's forward and backward seconds, and the optimizer's."""

    forward_s: list[float]
    backward_s: list[float]
    optimizer_s: list[float]

    @classmethod
    def of(cls, piece_costs: list[dict], starts: list[int]) -> Stages:
        """The pieces' costs summed over each stage (``starts``: its first piece)."""
        ends = [*starts[1:], float("inf")]

        def summed(key: str) -> list[float]:
            return [sum(p[key] for p in piece_costs if a <= p["start"] < b)
                    for a, b in zip(starts, ends, strict=True)]

        return cls(summed("forward_s"), summed("backward_s"), summed("optimizer_s"))


def step_s(stages: Stages, micro: int, schedule: str, *, replicas: int = 1,
           threads: int = 1, cores: int = 1) -> float:
    """Seconds of one step of ``replicas`` pipelines (each stage ``threads`` threads) on
    ``cores`` cores, before the replicas' exchange."""
    count = len(stages.forward_s)
    ops = [order(s, count, micro, schedule) for s in range(count)]
    cost = {"F": stages.forward_s, "B": stages.backward_s}
    done: set[tuple[str, int, int]] = set()
    position, left = [0] * count, [None] * count
    ended = [0.0] * count
    now = 0.0
    while True:
        for s in range(count):
            if left[s] is None and position[s] < len(ops[s]) and _ready(s, ops[s][position[s]],
                                                                        count, done):
                left[s] = cost[ops[s][position[s]][0]][s]
        running = [s for s in range(count) if left[s] is not None]
        if not running:
            break
        speed = min(1.0, cores / (len(running) * replicas * threads))
        dt = min(left[s] for s in running) / speed
        now += dt
        for s in running:
            left[s] -= dt * speed
            if left[s] <= 1e-12:
                kind, m = ops[s][position[s]]
                done.add((kind, s, m))
                position[s] += 1
                left[s] = None
                if position[s] == len(ops[s]):
                    ended[s] = now
    if any(p < len(o) for p, o in zip(position, ops, strict=True)):
        raise ValueError(f"the {schedule} order deadlocks with {count} stages and {micro} "
                         "micro-batches")
    # The optimizer steps: each stage's after its last backward, all of them sharing cores.
    speed = min(1.0, cores / (count * replicas * threads))
    return max(e + o / speed for e, o in zip(ended, stages.optimizer_s, strict=True))


def _ready(stage: int, op: tuple[str, int], count: int, done: set) -> bool:
    kind, m = op
    if kind == "F":
        return stage == 0 or ("F", stage - 1, m) in done
    return ("F", stage, m) in done if stage == count - 1 else ("B", stage + 1, m) in done


def validate(manifests: list[dict]) -> list[dict]:
    """Predicted against measured steady step seconds for every completed local pipeline
    and hybrid run that recorded its piece costs; each row also gives what the model
    predicts for the run under the other schedule."""
    rows = []
    for m in manifests:
        st, epochs = m.get("strategy") or {}, m.get("epochs") or []
        times = ((m.get("backend") or {}).get("stages_time") or {}).get("per_stage") or []
        # The piece costs are timed on the CPU in float32: GPU and half-precision runs
        # ran other passes than those.
        if (m.get("status") != "completed" or st.get("name") not in ("pipeline", "hybrid")
                or (m.get("backend") or {}).get("name") != "local"
                or st.get("device", "cpu") != "cpu"
                or (m.get("config") or {}).get("precision", "fp32") != "fp32"
                or not st.get("piece_costs") or not epochs or not times):
            continue
        schedule = st.get("schedule", "gpipe")
        rate = statistics.median(e["steady_images_per_s"] for e in epochs)
        batch = (m.get("effective") or {}).get("global_batch")
        if schedule not in SCHEDULES or not rate > 0 or not batch:
            continue
        stages = Stages.of(st["piece_costs"], st["stage_starts"])
        exchange = max(t.get("exchange_s", 0.0) / max(t["steps"], 1) for t in times)
        layout = {"replicas": st.get("replicas", 1), "threads": st["threads_per_process"],
                  "cores": (m.get("host") or {}).get("usable_cores") or 1}
        predicted = {s: step_s(stages, st["micro_batches"], s, **layout) + exchange
                     for s in SCHEDULES if s == schedule or st["micro_batches"] >= len(
                         st["stage_starts"])}
        measured = batch / rate
        rows.append({"run": m["id"], "strategy": st["name"], "stages": st["stages"],
                     "replicas": layout["replicas"], "micro_batches": st["micro_batches"],
                     "schedule": schedule, "measured_step_s": round(measured, 3),
                     "predicted_step_s": round(predicted[schedule], 3),
                     "exchange_s": round(exchange, 3),
                     "error_percent": round(100 * (predicted[schedule] / measured - 1), 1),
                     "other_schedules": {s: round(v, 3) for s, v in predicted.items()
                                         if s != schedule}})
    return rows


def markdown(rows: list[dict]) -> list[str]:
    """The pipeline rows as predict.md's table (nothing when the folder has none)."""
    if not rows:
        return []
    lines = ["", "pipelines: predicted against measured step (from each run's piece costs; "
             "a hybrid's replica exchange as measured):",
             "| run | layout | measured (s) | predicted (s) | error | other schedule |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        layout = (f"{r['replicas']} x " if r["replicas"] > 1 else "") + \
            f"{r['stages']} stages x {r['micro_batches']} mb, {r['schedule']}"
        other = ", ".join(f"{s} {v:.3f} s" for s, v in r["other_schedules"].items()) or "-"
        lines.append(f"| {r['run']} | {layout} | {r['measured_step_s']:.3f} | "
                     f"{r['predicted_step_s']:.3f} | {r['error_percent']:+.1f} % | {other} |")
    return lines
