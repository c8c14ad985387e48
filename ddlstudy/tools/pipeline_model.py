"""The pipeline's step, predicted from the costs a run measured before training (its
``strategy.piece_costs``: each piece's forward and backward on one micro-batch and its
optimizer step, alone on the threads a stage has).

Each process runs its stages' micro-batch passes in its schedule's order (GPipe: every
forward, then every backward; 1F1B: S - 1 - s forwards, then one forward and one backward
in turn; interleaved 1F1B: two stages a process, in torch's order, ``interleaved``). A
forward waits for the stage before it, a backward for the stage after it. The processes
share the host's cores: while more threads run than there are cores, each runs at
cores / threads of its speed (processor sharing), so a stage that waits gives its core to
the others, which is what a pipeline on a small host lives by. Once a process's last
backward is done its stages' optimizers step. A hybrid run's replicas then average each
stage's gradients, and an MPI run's nodes the whole model's: that exchange is added as the
run measured it (it is not modelled). The activations' sends (under 1 % of a simple-big
step) are left out.

Checked against every pipeline and hybrid run of a folder, local or MPI nodes of them (on
CPUs, in float32), by ``ddlstudy predict``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
"""The schedules the model knows."""

Pass = tuple[str, int, int]
"""A pass: ``"F"`` or ``"B"``, the stage, the micro-batch."""


def order(process: int, processes: int, micro: int, schedule: str,
          chunks: int = 1) -> list[Pass]:
    """The passes of pipeline process ``process`` of ``processes``, in the order it runs
    them (``chunks``: stages a process; stage q on process q mod ``processes``)."""
    if schedule == "interleaved-1f1b":
        return interleaved(process, processes, micro, chunks)
    s = process
    if schedule == "gpipe":
        return [("F", s, m) for m in range(micro)] + [("B", s, m) for m in range(micro)]
    warm = min(processes - 1 - s, micro)
    ops, forward = [("F", s, m) for m in range(warm)], warm
    for backward in range(micro):
        if forward < micro:
            ops.append(("F", s, forward))
            forward += 1
        ops.append(("B", s, backward))
    return ops


def interleaved(process: int, processes: int, micro: int, chunks: int) -> list[Pass]:
    """torch's ScheduleInterleaved1F1B order of one process (its ``pipeline_order`` without
    the idle slots): a warm-up of forwards, a forward and a backward in turn, then the
    last backwards; a round of micro-batches goes through one local stage, then the next."""
    rounds = max(1, micro // processes)
    per_round = micro // rounds
    total = chunks * micro
    warm = min((chunks - 1) * per_round + 2 * (processes - 1 - process), total)

    def forward_stage(op: int) -> int:
        return (op // per_round) % chunks * processes + process

    def backward_stage(op: int) -> int:
        return (chunks - 1 - (op - warm) // per_round % chunks) * processes + process

    ops: list[Pass] = []
    next_micro = {"F": [0] * (chunks * processes), "B": [0] * (chunks * processes)}

    def add(kind: str, stage: int) -> None:
        ops.append((kind, stage, next_micro[kind][stage]))
        next_micro[kind][stage] += 1

    for op in range(total + warm):
        if op < total:
            add("F", forward_stage(op))
        if op >= warm:
            add("B", backward_stage(op))
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
           threads: int = 1, cores: int = 1, chunks: int = 1) -> float:
    """Seconds of one step of ``replicas`` pipelines (each process ``threads`` threads and
    ``chunks`` stages) on ``cores`` cores, before the replicas' exchange."""
    count = len(stages.forward_s)
    procs = count // chunks
    ops = [order(p, procs, micro, schedule, chunks) for p in range(procs)]
    cost = {"F": stages.forward_s, "B": stages.backward_s}
    done: set[Pass] = set()
    position, left = [0] * procs, [None] * procs
    ended = [0.0] * procs
    now = 0.0
    while True:
        for p in range(procs):
            if left[p] is None and position[p] < len(ops[p]) and _ready(ops[p][position[p]],
                                                                        count, done):
                kind, stage, _ = ops[p][position[p]]
                left[p] = cost[kind][stage]
        running = [p for p in range(procs) if left[p] is not None]
        if not running:
            break
        speed = min(1.0, cores / (len(running) * replicas * threads))
        dt = min(left[p] for p in running) / speed
        now += dt
        for p in running:
            left[p] -= dt * speed
            if left[p] <= 1e-12:
                done.add(ops[p][position[p]])
                position[p] += 1
                left[p] = None
                if position[p] == len(ops[p]):
                    ended[p] = now
    if any(p < len(o) for p, o in zip(position, ops, strict=True)):
        raise ValueError(f"the {schedule} order deadlocks with {count} stages and {micro} "
                         "micro-batches")
    # The optimizer steps: each process's after its last backward, all sharing cores.
    speed = min(1.0, cores / (procs * replicas * threads))
    return max(e + sum(stages.optimizer_s[p::procs]) / speed for p, e in enumerate(ended))


def _ready(op: Pass, count: int, done: set) -> bool:
    kind, stage, m = op
    if kind == "F":
        return stage == 0 or ("F", stage - 1, m) in done
    return ("F", stage, m) in done if stage == count - 1 else ("B", stage + 1, m) in done


def validate(manifests: list[dict]) -> list[dict]:
    """Predicted against measured steady step seconds for every completed pipeline and
    hybrid run, local or MPI nodes of them, that recorded its piece costs (an MPI run's
    exchange between nodes as measured, like a hybrid's between replicas); each row also
    gives what the model predicts for the run under the other schedules."""
    rows = []
    for m in manifests:
        st, epochs = m.get("strategy") or {}, m.get("epochs") or []
        times = ((m.get("backend") or {}).get("stages_time") or {}).get("per_stage") or []
        # The piece costs are timed on the CPU in float32: GPU and half-precision runs
        # ran other passes than those.
        backend = m.get("backend") or {}
        if (m.get("status") != "completed" or st.get("name") not in ("pipeline", "hybrid")
                or backend.get("name") not in ("local", "mpi")
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
        chunks = len(st["stage_starts"]) // st["stages"]
        layout = {"replicas": st.get("replicas", 1) * _nodes_a_host(m),
                  "threads": st["threads_per_process"],
                  "cores": (m.get("host") or {}).get("usable_cores") or 1}
        # The other schedules of one stage a process, where they take these cuts.
        others = [] if chunks > 1 else [s for s in SCHEDULES[:2] if s != schedule and (
            s == "gpipe" or st["micro_batches"] >= st["stages"])]
        predicted = {s: step_s(stages, st["micro_batches"], s, chunks=chunks, **layout) +
                     exchange for s in [schedule, *others]}
        measured = batch / rate
        rows.append({"run": m["id"], "strategy": st["name"], "stages": st["stages"],
                     "replicas": st.get("replicas", 1), "nodes": backend.get("nodes") or 1,
                     "micro_batches": st["micro_batches"],
                     "schedule": schedule, "measured_step_s": round(measured, 3),
                     "predicted_step_s": round(predicted[schedule], 3),
                     "exchange_s": round(exchange, 3),
                     "error_percent": round(100 * (predicted[schedule] / measured - 1), 1),
                     "other_schedules": {s: round(v, 3) for s, v in predicted.items()
                                         if s != schedule}})
    return rows


def _nodes_a_host(m: dict) -> float:
    """How many of an MPI run's nodes of pipelines share one host's cores: all of them on
    one machine or on its emulated hosts, else nodes / hosts (1 for a local run)."""
    backend = m.get("backend") or {}
    nodes, hosts = backend.get("nodes") or 1, set(backend.get("hosts") or [])
    emulated = str((m.get("config") or {}).get("hosts") or "").startswith("emulated")
    return nodes if emulated or not hosts else nodes / len(hosts)


def markdown(rows: list[dict]) -> list[str]:
    """The pipeline rows as predict.md's table (nothing when the folder has none)."""
    if not rows:
        return []
    lines = ["", "pipelines: predicted against measured step (from each run's piece costs; "
             "a hybrid's replica exchange as measured):",
             "| run | layout | measured (s) | predicted (s) | error | other schedule |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        layout = (f"{r['nodes']} MPI nodes of " if r.get("nodes", 1) > 1 else "") + \
            (f"{r['replicas']} x " if r["replicas"] > 1 else "") + \
            f"{r['stages']} stages x {r['micro_batches']} mb, {r['schedule']}"
        other = ", ".join(f"{s} {v:.3f} s" for s, v in r["other_schedules"].items()) or "-"
        lines.append(f"| {r['run']} | {layout} | {r['measured_step_s']:.3f} | "
                     f"{r['predicted_step_s']:.3f} | {r['error_percent']:+.1f} % | {other} |")
    return lines
