"""The schedule timeline of a pipeline run, drawn from its manifest (the picture of the GPipe
paper, from a real run): one row per stage, each micro-batch's forward and backward on it
as a box over the time of one step, labelled with the micro-batch's number; where a row
has no box, the stage waited (the bubble) or sent and received.

The boxes are the record ``backend.stages_time.timeline`` (``strategies.pipeline``: the
first pipeline's last step, on the host's clock its stages share), and each row's label
says where that stage's steps went on average (``per_stage``), in milliseconds a step.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

SHADES = {"forward": "#9ecae1", "backward": "#3182bd"}
"""One shade a phase: forward light, backward dark, as in the GPipe paper."""
TEXT = {"forward": "black", "backward": "white"}
PARTS = (("forward_s", "fwd"), ("backward_s", "bwd"), ("comm_s", "comm"),
         ("wait_s", "wait"), ("exchange_s", "exch"), ("optimizer_s", "opt"))
"""The parts of a stage's step its row names, in the record's words and the figure's."""


def stages_time(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The run's record of its stages' time, None where it has none (not a pipeline, or
    recorded by a ddlstudy before it)."""
    record = (manifest.get("backend") or {}).get("stages_time") or {}
    return record if record.get("timeline") else None


def split_ms(stage: dict[str, Any]) -> dict[str, float]:
    """A stage's mean milliseconds a step in each part (``PARTS``), and of the step."""
    steps = max(stage.get("steps") or 0, 1)
    return {key: 1e3 * (stage.get(key) or 0.0) / steps for key, _ in
            (*PARTS, ("step_s", "step"))}


def _row_label(stage: int, per_stage: list[dict[str, Any]]) -> str:
    """'stage i', and its split a step where the record has it (the first pipeline's)."""
    mine = [s for s in per_stage if s.get("stage") == stage and not s.get("pipeline")]
    if not mine or not mine[0].get("steps"):
        return f"stage {stage}"
    ms = split_ms(mine[0])
    parts = " ".join(f"{word} {ms[key]:.1f}" for key, word in PARTS
                     if key != "exchange_s" or ms[key] >= 0.05)  # replicas' only
    held = mine[0].get("peak_activation_bytes")
    memory = (f"; activations held at most {held / 2**20:.1f} MiB "
              f"({'+'.join(map(str, mine[0]['peak_micro_batches_held']))} micro-batches)"
              if held else "")
    name = (f"rank {stage} ({mine[0]['chunks']} stages)" if mine[0].get("chunks", 1) > 1
            else f"stage {stage}")
    return f"{name}\n{parts}\nms of its {ms['step_s']:.1f} ms steps (means){memory}"


def plot_timeline(manifest: dict[str, Any], title: str) -> Figure | None:
    """``manifest``'s schedule timeline (None without the record): boxes in milliseconds
    from the step's start, stage 0 on top."""
    record = stages_time(manifest)
    if record is None:
        return None
    boxes = record["timeline"]
    stages = sorted({b["stage"] for b in boxes})
    fig = Figure(figsize=(11, 1.1 * len(stages) + 1.6), layout="constrained")
    ax = fig.subplots()
    span = 1e3 * max(b["end_s"] for b in boxes)
    for b in boxes:
        start, width = 1e3 * b["start_s"], 1e3 * (b["end_s"] - b["start_s"])
        ax.barh(b["stage"], width, left=start, height=0.7, color=SHADES[b["phase"]],
                edgecolor="black", linewidth=0.6, hatch="//" if b.get("chunk") else None)
        inside = width > 0.025 * span  # else its number above it
        ax.text(start + width / 2, b["stage"] - (0 if inside else 0.37), str(b["micro_batch"]),
                ha="center", va="center" if inside else "bottom", fontsize=8,
                color=TEXT[b["phase"]] if inside else "black")
    ax.set_yticks(stages, [_row_label(s, record.get("per_stage") or []) for s in stages],
                  fontsize=8)
    ax.set_ylim(max(stages) + 0.6, min(stages) - 0.6)  # stage 0 on top
    ax.set_xlim(0, span * 1.02)
    ax.set_xlabel("milliseconds since the step started (the first stage to start it)")
    ax.grid(axis="y", visible=False)
    ax.set_axisbelow(True)
    chunked = any(b.get("chunk") for b in boxes)
    fig.legend([*(Patch(facecolor=SHADES[p], edgecolor="black") for p in SHADES),
                Patch(facecolor="white", edgecolor="black"),
                *([Patch(facecolor="white", edgecolor="black", hatch="//")] if chunked
                  else [])],
               [*(f"{p} of micro-batch n" for p in SHADES), "no box: waiting for a\n"
                "neighbour, or sending"]
               + (["hatched: the process's\nsecond stage"] if chunked else []),
               loc="outside right upper", fontsize=8)
    if record.get("bound_step_s"):
        title += (f"\nits stage times allow a {1e3 * record['bound_step_s']:.0f} ms step "
                  f"(compute + bubble): its steps reach {100 * record['of_bound']:.0f} % of it")
    fig.suptitle(title, fontsize=11)
    return fig
