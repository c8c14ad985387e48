"""``ddlstudy bench advise``: how right advise is, on a fixed set of layouts. For each, the
advice (``advise``, its default budget) then its check (``study --from-advice``: rows
spread over the ranking, each a plain run of ``--check-epochs`` epochs), and one row of
figures: the images/s mean absolute error, a node's and a process's memory error (mean
and worst), the rank correlation, the first choice's measured rank, and what the advice took.

The layouts: tiny and tiny-resnet on one node; tiny on 2 and 3 emulated hosts at 1 Gbit/s
and at 100 Mbit/s (root); a use case of one's own (tiny's image folder and the tests'
model file, advised on --data-dir alone); and tiny-full under a memory budget that leaves
out data parallelism (where this host has the memory).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddlstudy import hosts
from ddlstudy.config import DEFAULT_DATASETS_DIR, REPO_ROOT, load_usecase
from ddlstudy.config.catalog import ADVICE_CHECK_EPOCHS
from ddlstudy.data.generate import make_dataset
from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_json, atomic_write_text
from ddlstudy.machine.environment import host, python_module
from ddlstudy.tools.advise.output import pct
from ddlstudy.tools.advise.probes import say

OWN_MODEL = REPO_ROOT / "tests" / "models" / "own_net.py"
MEMORY_LIMIT = int(2.9e9)
"""The memory layout's --memory: tiny-full's 2-process data-parallel node needs about
3.3 GB (a replica and AdamW's moments in each), sharded's and tensor's about 2.5 GB."""
PREFIX, SUBNET = "dbadv", "10.84.0"


@dataclass(frozen=True)
class Layout:
    """One layout of the benchmark: what is advised, on which nodes."""

    name: str
    usecase: str | None = "tiny"
    nodes: tuple[int, ...] = (1,)
    hosts: int = 0
    """Emulated hosts to bring up (0: this host)."""
    rate: str | None = None
    memory: int | None = None
    data: dict[str, str] = field(default_factory=dict)


LAYOUTS = (Layout("tiny"), Layout("tiny-resnet", "tiny-resnet"),
           Layout("tiny, 2 hosts, 1gbit", nodes=(1, 2), hosts=2, rate="1gbit"),
           Layout("tiny, 3 hosts, 1gbit", nodes=(1, 2, 3), hosts=3, rate="1gbit"),
           Layout("tiny, 2 hosts, 100mbit", nodes=(1, 2), hosts=2, rate="100mbit"),
           Layout("tiny, 3 hosts, 100mbit", nodes=(1, 2, 3), hosts=3, rate="100mbit"),
           Layout("own", None),
           Layout("tiny-full, --memory 2.9GB", "tiny-full", memory=MEMORY_LIMIT))
NAMES = {layout.name.split(",")[0].replace(" ", "") + (
    f"-{layout.hosts}h-{layout.rate}" if layout.hosts else ""): layout for layout in LAYOUTS}
"""``--only``'s names: tiny, tiny-resnet, tiny-2h-1gbit, ..., own, tiny-full."""


def bench_advise(only: list[str] | None, out: Path, check_rows: int = 6,
                 datasets_dir: Path | None = None, wait: bool = False,
                 rounds: int | None = None, include_noisy: bool = False,
                 check_epochs: int = ADVICE_CHECK_EPOCHS,
                 heap: str | None = None) -> dict[str, Any]:
    """Every layout (or ``only`` those named): advise (``rounds``: its --rounds, default
    its own; ``heap``: its --heap, which its check's runs take from it), then check
    ``check_rows`` of its rows, each a run of ``check_epochs`` (``include_noisy``: the
    runs marked noisy counted, marked); the figures a row a layout."""
    datasets_dir = datasets_dir or DEFAULT_DATASETS_DIR
    tiny = load_usecase("tiny")
    make_dataset(tiny.data, datasets_dir / tiny.data.name)
    result = {"host": host(), "at": time.strftime("%Y-%m-%d %H:%M"), "check_rows": check_rows,
              "check_epochs": check_epochs, "include_noisy": include_noisy,
              "heap": heap or "return"}
    rows: list[dict[str, Any]] = []
    for name, layout in NAMES.items():
        if only and name not in only:
            continue
        why = _cannot(layout)
        if why:
            rows.append({"layout": layout.name, "skipped": why})
            continue
        say(f"bench advise: {layout.name}")
        try:
            rows.append(_layout(layout, out / name, check_rows, datasets_dir, wait,
                                [*(["--rounds", str(rounds)] if rounds else []),
                                 *(["--heap", heap] if heap else [])],
                                include_noisy, check_epochs))
        except UsageError as exc:  # a layout that failed is a row that says why
            rows.append({"layout": layout.name, "skipped": f"failed: {exc}"})
        write(result | {"layouts": rows}, out)  # as it goes: an interrupted bench keeps
    return result | {"layouts": rows}


def _cannot(layout: Layout) -> str | None:
    """Why ``layout`` cannot run here (None: it can)."""
    if layout.hosts and hosts.can_emulate():
        return hosts.can_emulate()
    if layout.usecase is None and not OWN_MODEL.is_file():
        return f"the tests' model file {OWN_MODEL} is not here (a source checkout has it)"
    if layout.memory and psutil.virtual_memory().available < 2 * layout.memory:
        return (f"this host has {psutil.virtual_memory().available / 1e9:.1f} GB available; "
                f"the layout needs twice its --memory ({layout.memory / 1e9:.1f} GB)")
    return None


def _layout(layout: Layout, out: Path, check_rows: int, datasets_dir: Path,
            wait: bool, flags: list[str], include_noisy: bool,
            check_epochs: int) -> dict[str, Any]:
    """One layout: its advice (``flags``: advise's own, as --rounds), its check, its
    figures."""
    up = hosts.up(layout.hosts, prefix=PREFIX, subnet=SUBNET, rate=layout.rate) \
        if layout.hosts else None
    try:
        start = time.monotonic()
        advice = _advise(layout, out, datasets_dir, wait, flags)
        took = time.monotonic() - start
        _check(advice, out, check_rows, wait, include_noisy, check_epochs)
    finally:
        if up:
            hosts.down(PREFIX)
    result = json.loads(advice.read_text())
    check = json.loads((out / "check" / "report" / "advice-check.json").read_text())
    s = check["summary"]
    return {"layout": layout.name, "advise_s": round(took), "every_layout":
            result["every_layout"], "ranked": len(result["ranking"]), "checked": s["rows"],
            "noisy_probes": sum(len(p.get("noisy", [])) for p in result["probes"]),
            "noisy_left_out": check["noisy_left_out"], "mape": s["mape"],
            "node_memory_mape": s["node_memory_mape"],
            "node_memory_worst": s["node_memory_worst"],
            "process_memory_mape": s["process_memory_mape"], "spearman": s["spearman"],
            "first_measured_rank": s["first_measured_rank"],
            "first_over_best": s["first_over_best"], "by_basis": s["by_basis"]}


def _advise(layout: Layout, out: Path, datasets_dir: Path, wait: bool,
            flags: list[str]) -> Path:
    """``ddlstudy advise`` of ``layout`` at its default budget (its output in
    ``out``/advise.log); its advise.json."""
    what = ["--usecase", layout.usecase] if layout.usecase else [
        "--data-dir", str(datasets_dir / "synthetic-tiny"),
        "--model", f"{OWN_MODEL}:small_resnet"]
    argv = ["advise", *what, "--nodes", ",".join(map(str, layout.nodes)),
            "--datasets-dir", str(datasets_dir), "--out", str(out / "advice"),
            *(["--hosts", f"emulated:{PREFIX}"] if layout.hosts else []),
            *(["--memory", str(layout.memory)] if layout.memory else []),
            *flags, *(["--wait-quiet"] if wait else [])]
    _ddlstudy(argv, out / "advise.log")
    advice = out / "advice" / "advise.json"
    if not advice.is_file():
        raise UsageError(f"advise wrote no advise.json for {layout.name}; see "
                         f"{out / 'advise.log'}")
    return advice


def _ddlstudy(argv: list[str], log: Path) -> int:
    """``ddlstudy argv`` in a process of its own, its output into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        return subprocess.run(python_module("ddlstudy", *argv), stdout=f,
                              stderr=subprocess.STDOUT).returncode


def _check(advice: Path, out: Path, rows: int, wait: bool, include_noisy: bool,
           epochs: int) -> None:
    """``study --from-advice`` of ``rows`` of the advice spread over its ranking, each a
    plain run of ``epochs`` (its output in ``out``/check.log)."""
    argv = ["study", "--from-advice", str(advice), "--top", str(rows), "--spread",
            "--repeat", "1", "--epochs", str(epochs), "--runs-dir", str(out / "check"),
            *(["--wait-quiet"] if wait else []),
            *(["--include-noisy"] if include_noisy else [])]
    code = _ddlstudy(argv, out / "check.log")
    if not (out / "check" / "report" / "advice-check.json").is_file():
        raise UsageError(f"the check of {advice} wrote no advice-check.json (exit code "
                         f"{code}; see {out / 'check.log'})")


def markdown(result: dict) -> str:
    """The figures a row a layout."""
    counted = "; noisy runs counted (--include-noisy)" if result.get("include_noisy") else ""
    counted += "; --heap keep" if result.get("heap") == "keep" else ""
    lines = [f"bench advise, {result['at']} ({result['check_rows']} rows of each advice "
             f"checked, spread over its ranking, each a run of {result['check_epochs']} "
             "epochs; errors: "
             "(predicted - measured) / measured"
             f"{counted})", "",
             "| layout | every layout probed | advise s | checked | noisy left out | "
             "images/s MAPE | node memory: mean, worst | process memory | Spearman | "
             "first choice: measured rank, of best |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["layouts"]:
        if "skipped" in r:
            lines.append(f"| {r['layout']} | skipped: {r['skipped']} |||||||||")
            continue
        lines.append(
            f"| {r['layout']} | {'yes' if r['every_layout'] else 'no'} | {r['advise_s']} | "
            f"{r['checked']} | {r['noisy_left_out']} | {pct(r['mape'], False, 1)} | "
            f"{pct(r['node_memory_mape'], False, 1)}, {pct(r['node_memory_worst'], True, 1)} | "
            f"{pct(r['process_memory_mape'], False, 1)} | {_num(r['spearman'])} | "
            f"{r['first_measured_rank'] or '-'}, {pct(r['first_over_best'], False, 1)} |")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "bench.json", result)
    atomic_write_text(out / "bench.md", markdown(result) + "\n")
    return [out / "bench.json", out / "bench.md"]


def names(only: str | None) -> list[str] | None:
    """--only's layout names, checked (None: every layout)."""
    if only is None:
        return None
    given = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in given if n not in NAMES]
    if unknown or not given:
        raise UsageError(f"--only {only!r}: choose layouts from {', '.join(NAMES)}")
    return given
