"""`ddlstudy bench all --only start`: what a user measures with plain `ddlstudy run`s, held
against the goals of fast starts and of strategies at their bound (issue 61).

Each repeat runs every setting once, one after the other (alternated, so that drift in the
machine hits them all), as a user would: ``ddlstudy run --epochs 1 --max-steps 12
--no-snapshot --sample-hz 0`` in a process of its own (a cold start: the command's own
imports and its ranks' included), validating on one batch (after the steps: no figure
here depends on it). Figures, each min / median / max over the repeats:

- the seconds from the command to the first training step (the manifest's
  ``first_step_s``) of one process, of 2 processes (cpu-processes) and of 2 MPI nodes,
  each over its goal (at most 1.0 meets it), with the median seconds of each phase of
  the start (the manifest's ``startup``) in ``extra``;
- sharded and zero (2 processes) / cpu-processes (2), and 2 MPI nodes / cpu-processes
  (2) as plain DDP over gloo and through shared memory: steady images/s (warm-up steps
  left out, as every run's are), against their goals.
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.machine.environment import python_module
from ddlstudy.records.runfolder import load_manifest
from ddlstudy.tools.bench.ratios import Ratio, What

PLAIN_STEPS = 12
"""The steps of the plain runs the goals are set on."""
PROCESSES_2 = ["--strategy", "cpu-processes", "--workers", "2"]
SETTINGS = {"sequential": [], "cpu-processes, 2": PROCESSES_2,
            "sharded, 2": ["--strategy", "sharded", "--workers", "2"],
            "zero, 2": ["--strategy", "zero", "--workers", "2"],
            "MPI, 2 nodes": ["--backend", "mpi", "--nodes", "2"],
            "cpu-processes, 2 (DDP over gloo)": [*PROCESSES_2, "--transport", "gloo"]}
"""The plain runs of a repeat, in the order they run."""
FIRST_STEP_GOALS = {"sequential": 3.0, "cpu-processes, 2": 4.0, "MPI, 2 nodes": 4.0}
"""At most this many seconds from the command to the first step."""
SPEED_GOALS = {("sharded, 2", "cpu-processes, 2"): 0.85, ("zero, 2", "cpu-processes, 2"): 0.95,
               ("MPI, 2 nodes", "cpu-processes, 2 (DDP over gloo)"): 1.10,
               ("MPI, 2 nodes", "cpu-processes, 2"): 0.97}
"""At least this ratio of steady images/s."""


def steady(manifest: dict) -> float:
    """A run's steady images/s: the median of its epochs'."""
    return statistics.median(e["steady_images_per_s"] for e in manifest["epochs"])


def run_plain(runs: Path, what: What, steps: int, *flags: str) -> dict:
    """One real ``ddlstudy run`` of ``steps`` steps in a process of its own (validating on
    one batch); its manifest."""
    before = set(runs.glob("*/manifest.json"))
    out = subprocess.run([*python_module("ddlstudy", "run"), *what.flags(),
                          "--runs-dir", str(runs), "--epochs", "1", "--max-steps",
                          str(steps), "--max-val-steps", "1", "--no-snapshot", "--sample-hz",
                          "0", "--quiet", *flags],
                         capture_output=True, text=True)
    if out.returncode:
        raise UsageError(f"ddlstudy run {' '.join(flags)} failed ({out.returncode}): "
                         f"{out.stderr.strip()[-400:]}")
    (path,) = set(runs.glob("*/manifest.json")) - before
    return load_manifest(path)


def phases(manifests: list[dict]) -> list[list]:
    """The median seconds of each phase of the start, over runs whose starts went through
    the same phases (those of the first run): [process, phase, seconds]."""
    rows = [[(p["process"], p["phase"], p["s"]) for p in m.get("startup", {}).get("phases", [])]
            for m in manifests]
    shape = [r[:2] for r in rows[0]] if rows else []
    same = [r for r in rows if [x[:2] for x in r] == shape]
    return [[*key, round(statistics.median(r[i][2] for r in same), 3)]
            for i, key in enumerate(shape)]


def start(what: What, repeats: int, runs: Path) -> list[Ratio]:
    """The start group's figures (the module's docstring), from ``repeats`` repeats."""
    done: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for name, flags in SETTINGS.items():
            done[name].append(run_plain(runs, what, PLAIN_STEPS, *flags))
    figures = []
    for name, goal in FIRST_STEP_GOALS.items():
        seconds = [m["first_step_s"] for m in done[name]]
        figures.append(Ratio("start", f"{name}: seconds from the command to the first step / "
                             f"the goal, {goal:g} s (at most 1)", "s", seconds,
                             [goal] * len(seconds), {"phases": phases(done[name])}))
    for (a, b), goal in SPEED_GOALS.items():
        figures.append(Ratio("start", f"{a} / {b}, {PLAIN_STEPS}-step plain runs (goal: at "
                             f"least {goal:.2f})", "images/s", [steady(m) for m in done[a]],
                             [steady(m) for m in done[b]]))
    return figures


def phases_markdown(result: dict) -> list[str]:
    """The start's phases of each figure that has them, a line each, for ``bench.md``."""
    lines = []
    for f in result["figures"]:
        if f.get("extra", {}).get("phases"):
            where = ", ".join(f"{process} {phase} {s:.2f}" for process, phase, s in
                              f["extra"]["phases"])
            lines.append(f"- {f['name'].split(':')[0]}, median seconds a phase: {where}")
    return ["", "Where the start's seconds go:", "", *lines] if lines else []
