"""Tables from a folder of runs: each configuration against its use case's baseline.

Speedup is the ratio of steady-state images per second to the sequential baseline's on the
same use case (so runs cut short with --max-steps still compare); parallel efficiency is
the speedup divided by the cores (or GPUs) the configuration used. Three views:

- ``runs_frame``: one row per run (the long, tidy table for your own analysis);
- ``speedup_table``: one row per configuration, medians and spread over repeats;
- ``paper_tables``: the paper's Tables 1-3 (data parallelism; model and hybrid
  parallelism; multi-node), a row per configuration and, per use case, the time per epoch
  and the speedup.

Cells a study planned but could not run (no GPU, a backend not available) come from the
study's ``study.json`` and are shown with the reason, never dropped.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import pandas as pd

from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_text
from ddlstudy.runfolder import MANIFEST

log = logging.getLogger("ddlstudy")

BASELINE = "sequential"
STUDY_FILE = "study.json"
FORMATS = {"markdown": "md", "csv": "csv", "latex": "tex"}
TABLES = {
    1: "Table 1: data parallelism (CPU and GPU)",
    2: "Table 2: model and hybrid parallelism",
    3: "Table 3: several nodes (MPI and Spark)",
}
STRATEGY_ORDER = ("sequential", "cpu-intraop", "cpu-threads", "cpu-processes", "gpu-data",
                  "pipeline", "hybrid")
KEY = ["usecase", "config", "strategy", "backend", "nodes", "reduce", "precision", "cores",
       "gpus"]


def runs_folder(runs_dir: Path) -> Path:
    """``runs_dir`` if it is a folder, else a UsageError."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise UsageError(f"runs folder {runs_dir} does not exist")
    return runs_dir


def load_runs(runs_dir: Path) -> list[dict]:
    """Every manifest under ``runs_dir`` (any depth), oldest first."""
    runs_dir = runs_folder(runs_dir)
    manifests = []
    for path in sorted(runs_dir.rglob(MANIFEST)):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("report: skipped %s: unreadable (%s)", path, exc)
            continue
        reason = _unusable(manifest)
        if reason:  # a foreign or damaged file is not a run: the others are still reported
            log.warning("report: skipped %s: %s", path, reason)
            continue
        manifest["path"] = str(path.parent)
        manifests.append(manifest)
    if not manifests and not (runs_dir / STUDY_FILE).is_file():
        raise UsageError(f"no runs in {runs_dir}; train some with `ddlstudy run` first")
    return sorted(manifests, key=lambda m: m.get("started_at", ""))


def _unusable(manifest) -> str | None:
    """Why a manifest cannot be a row of the tables (None: it can)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("strategy"), dict):
        return "not a ddlstudy run manifest"
    try:
        row = _run_row(manifest)
    except Exception as exc:  # noqa: BLE001 - any malformed field
        return f"malformed ({type(exc).__name__}: {exc})"
    for key in _MEASURED:  # the tables divide and compare these
        if row[key] is not None and (isinstance(row[key], bool) or
                                     not isinstance(row[key], int | float)):
            return f"malformed ({key} is {row[key]!r}, not a number)"
    return None


_MEASURED = ("epoch_s", "images_per_s", "val_accuracy", "best_val_accuracy", "train_time_s")


def load_planned(runs_dir: Path) -> list[dict]:
    """Cells of the studies under ``runs_dir`` that have no run: skipped, or not reached."""
    planned = []
    for path in sorted(Path(runs_dir).rglob(STUDY_FILE)):
        try:
            study = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        planned += [c for c in study.get("cells", []) if not c.get("run")]
    return planned


def _gpus(manifest: dict) -> int:
    s = manifest.get("strategy", {})
    if s.get("device") == "cuda":
        return int(s.get("processes", 1)) * int(manifest.get("backend", {}).get("nodes", 1))
    return int(s.get("devices", 0)) * int(manifest.get("backend", {}).get("nodes", 1))


def cores_used(manifest: dict) -> int:
    """Cores the run kept busy: processes x threads, at most the cores it had, per node."""
    s = manifest.get("strategy", {})
    per_node = max(1, int(s.get("processes", 1)) * int(s.get("threads_per_process", 1)))
    per_node = min(per_node, manifest.get("host", {}).get("usable_cores") or per_node)
    return per_node * int(manifest.get("backend", {}).get("nodes", 1))


def config_label(manifest: dict) -> str:
    """A short readable name of what ran: strategy, its degrees, and the backend."""
    s = manifest.get("strategy", {})
    name = s.get("name", "?")
    parts = {
        "cpu-intraop": lambda: f"{s.get('threads_per_process', '?')} threads",
        "cpu-threads": lambda: f"{s.get('replicas', '?')} replicas",
        "cpu-processes": lambda: f"{s.get('processes', '?')} processes",
        "gpu-data": lambda: f"{s.get('devices') or 'all'} GPUs",
        "pipeline": lambda: f"{s.get('stages', '?')} stages x {s.get('micro_batches', '?')} mb",
        "hybrid": lambda: f"{s.get('replicas', '?')} x {s.get('stages', '?')} stages",
    }
    label = f"{name} ({parts[name]()})" if name in parts else name
    config = manifest.get("config", {})
    if config.get("precision", "fp32") != "fp32":
        label += f" {config['precision']}"
    if config.get("accumulate", 1) > 1:
        label += f" accumulate {config['accumulate']}"
    if config.get("scaling", "strong") == "weak":
        batch = manifest.get("effective", {}).get("global_batch", "?")
        label += f" weak (batch {batch})"
    if config.get("lr_scaling", "none") != "none":
        label += f" lr {config['lr_scaling']}"
    backend = manifest.get("backend", {})
    if backend.get("name", "local") != "local":
        how = backend.get("reduce") or backend.get("sync")
        if config.get("compress", "none") != "none":  # replaces the reducer
            how = f"{config['compress']} allgather"
        how = f", {how}" if how else ""
        if backend.get("sync") == "allgather":
            how += f" every {backend.get('sync_every', '?')}"
        if config.get("bucket_mb"):
            how += f" in {config['bucket_mb']:g} MiB buckets"
        if config.get("balance", "equal") != "equal":
            how += f", balance {config['balance']}"
        if config.get("hosts"):
            how += f", hosts {config['hosts']}"
        label = f"{backend['name']} {backend.get('nodes', '?')} nodes{how}: {label}"
    return label


def table_number(strategy: str, backend: str) -> int:
    """Which of the paper's three tables a configuration belongs to."""
    if backend != "local":
        return 3
    return 2 if strategy in ("pipeline", "hybrid") else 1


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _run_row(m: dict) -> dict:
    """A run's row of ``runs_frame`` (raises on a malformed manifest)."""
    epochs = m.get("epochs") or []
    backend = m.get("backend", {})
    strategy = m.get("strategy", {}).get("name", "?")
    backend_name = backend.get("name", "local")
    return {
        "usecase": m.get("usecase", "?"), "config": config_label(m), "strategy": strategy,
        "backend": backend_name, "nodes": int(backend.get("nodes", 1)),
        "reduce": backend.get("reduce") or backend.get("sync") or "",
        "precision": m.get("config", {}).get("precision", "fp32"),
        "scaling": m.get("config", {}).get("scaling", "strong"),
        "global_batch": m.get("effective", {}).get(
            "global_batch", m.get("config", {}).get("usecase", {}).get("train", {})
            .get("batch_size")),
        "cores": cores_used(m), "gpus": _gpus(m),
        "table": table_number(strategy, backend_name),
        "repeat": m.get("study", {}).get("repeat", 0), "status": m.get("status", "?"),
        "reason": m.get("error") or "", "epochs": len(epochs),
        "epoch_s": _median([e["epoch_time_s"] for e in epochs]),
        "images_per_s": _median([e["steady_images_per_s"] for e in epochs]),
        "val_accuracy": epochs[-1]["val_accuracy"] if epochs else None,
        "best_val_accuracy": max(e["val_accuracy"] for e in epochs) if epochs else None,
        "train_time_s": sum(e.get("train_time_s", 0.0) for e in epochs) if epochs else None,
        "run": m.get("id", ""), "path": m.get("path", ""),
    }


def runs_frame(manifests: list[dict], planned: list[dict] = ()) -> pd.DataFrame:
    """One row per run (and per planned cell that has no run), in a long tidy layout."""
    rows = [_run_row(m) for m in manifests]
    for c in planned:
        backend = c.get("backend", "local")
        rows.append({
            "usecase": c["usecase"], "config": c["label"], "strategy": c["strategy"],
            "backend": backend, "nodes": c.get("nodes", 1), "reduce": "",
            "precision": c.get("flags", {}).get("precision", "fp32"),
            "scaling": c.get("flags", {}).get("scaling", "strong"), "global_batch": None,
            "cores": c.get("cores", 0),
            "gpus": 0, "table": table_number(c["strategy"], backend),
            "repeat": c.get("repeat", 0), "status": c["status"],
            "reason": c.get("reason", ""), "epochs": 0, "epoch_s": None,
            "images_per_s": None, "val_accuracy": None, "best_val_accuracy": None,
            "train_time_s": None, "run": "", "path": "",
        })
    frame = pd.DataFrame(rows, columns=[*KEY, "scaling", "global_batch", "table", "repeat",
                                        "status", "reason", "epochs", "epoch_s",
                                        "images_per_s", "val_accuracy", "best_val_accuracy",
                                        "train_time_s", "run", "path"])
    baseline = frame[is_baseline(frame) & (frame.status == "completed")]
    base = {uc: _median(list(g.images_per_s.dropna())) for uc, g in baseline.groupby("usecase")}
    frame["speedup"] = [r / base[uc] if base.get(uc) and r is not None and r == r else None
                        for uc, r in zip(frame.usecase, frame.images_per_s, strict=True)]
    units = frame.gpus.where(frame.gpus > 0, frame.cores).clip(lower=1)
    frame["efficiency"] = frame.speedup / units
    return frame


def is_baseline(frame: pd.DataFrame) -> pd.Series:
    """The sequential baseline: one process on one node, nothing varied (not sequential
    ranks under MPI or Spark, not bf16, not accumulating)."""
    return (frame.config == BASELINE) & (frame.backend == "local")


def short_reason(reason: str) -> str:
    """A skip reason without the flag it names and the advice after the semicolon."""
    reason = reason.split(": ", 1)[1] if reason.startswith("--") and ": " in reason else reason
    return reason.split(";")[0]


def _status(statuses: list[str], reasons: list[str]) -> str:
    done = statuses.count("completed")
    if done == len(statuses):
        return "ok"
    if done == 0 and statuses[0] == "skipped":
        return f"skipped: {short_reason(reasons[0])}"
    others = [s for s in statuses if s != "completed"]
    return ", ".join(f"{others.count(s)} {s}" for s in dict.fromkeys(others))


def speedup_table(manifests: list[dict], planned: list[dict] = ()) -> pd.DataFrame:
    """One row per configuration: medians over the completed repeats, epoch-time spread."""
    frame = runs_frame(manifests, planned)
    rows = []
    for key, g in frame.groupby(KEY, sort=True, dropna=False):
        ok = g[g.status == "completed"]
        times = list(ok.epoch_s.dropna())
        rows.append({
            **dict(zip(KEY, key, strict=True)), "table": int(g.table.iloc[0]),
            "scaling": g.scaling.iloc[0], "runs": len(ok),
            "status": _status(list(g.status), list(g.reason)),
            "epoch_s": _median(times),
            "epoch_s_spread": f"{min(times):.2f}-{max(times):.2f}" if times else "",
            "images_per_s": _median(list(ok.images_per_s.dropna())),
            "speedup": _median(list(ok.speedup.dropna())),
            "efficiency": _median(list(ok.efficiency.dropna())),
            "val_accuracy": _median(list(ok.val_accuracy.dropna())),
        })
    columns = [*KEY, "table", "scaling", "runs", "status", "epoch_s", "epoch_s_spread",
               "images_per_s", "speedup", "efficiency", "val_accuracy"]
    table = pd.DataFrame(rows, columns=columns)
    # Baseline first, then by table and speed within each use case.
    rank = {name: i for i, name in enumerate(STRATEGY_ORDER)}
    order = table.assign(_base=~is_baseline(table),
                         _strategy=table.strategy.map(lambda n: rank.get(n, len(rank))))
    order = order.sort_values(["usecase", "_base", "table", "nodes", "_strategy", "config"],
                              kind="stable")
    return order.drop(columns=["_base", "_strategy"]).reset_index(drop=True)


def paper_tables(table: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """The paper's layout: per table, a row per configuration and per use case the time
    per epoch and the speedup (or why the cell is empty)."""
    out = {}
    usecases = list(dict.fromkeys(table.usecase))
    for number in TABLES:
        part = table[(table.table == number) | is_baseline(table)]
        if number != 1 and not (part.table == number).any():
            continue
        rows = {}
        for r in part.itertuples(index=False):
            row = rows.setdefault(r.config, {"configuration": r.config})
            row[f"{r.usecase} epoch s"] = (_fmt(r.epoch_s) if r.status == "ok"
                                           else r.status)
            row[f"{r.usecase} speedup"] = _fmt(r.speedup) if r.status == "ok" else ""
        columns = ["configuration", *(f"{u} {c}" for u in usecases
                                      for c in ("epoch s", "speedup"))]
        out[number] = pd.DataFrame(list(rows.values()), columns=columns).fillna("-")
    return out


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values shown as '-'."""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |"
            for row in frame.astype(object).itertuples(index=False)]
    return "\n".join([header, rule, *body])


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#",
          "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def to_latex(frame: pd.DataFrame, caption: str = "") -> str:
    """A booktabs table (\\usepackage{booktabs}) with the values as shown in Markdown."""
    cols = "l" + "r" * (len(frame.columns) - 1)
    lines = [r"\begin{table}[ht]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
              " & ".join(_latex_escape(str(c)) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(_fmt(v)) for v in row) + r" \\"
              for row in frame.astype(object).itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


SUMMARY_COLUMNS = ["usecase", "config", "scaling", "cores", "runs", "status", "epoch_s",
                   "epoch_s_spread", "images_per_s", "speedup", "efficiency", "val_accuracy"]


def render(frame: pd.DataFrame, fmt: str, caption: str = "") -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "latex":
        return to_latex(frame, caption)
    return (f"**{caption}**\n\n" if caption else "") + to_markdown(frame)


class Report:
    """Everything ``ddlstudy report`` shows, computed once from a runs folder."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.manifests = load_runs(self.runs_dir)
        self.by_id = {m.get("id"): m for m in self.manifests}
        self.planned = load_planned(self.runs_dir)
        self.runs = runs_frame(self.manifests, self.planned)
        self.table = speedup_table(self.manifests, self.planned)
        self.paper = paper_tables(self.table)

    def text(self, fmt: str = "markdown") -> str:
        """The summary table, then the paper's tables, in one format."""
        parts = [render(self.table[SUMMARY_COLUMNS], fmt, "Speedup against the sequential "
                        "baseline (medians over repeats)")]
        if fmt != "csv":
            parts += [render(t, fmt, TABLES[n]) for n, t in self.paper.items()]
        return "\n\n".join(parts)

    def write_tables(self, out: Path, fmt: str = "markdown") -> list[Path]:
        """Tables in ``fmt`` (plus the tidy runs.csv)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        ext = FORMATS[fmt]
        written = {out / f"speedup.{ext}": render(self.table, fmt),
                   out / "runs.csv": self.runs.to_csv(index=False)}
        for n, t in self.paper.items():
            written[out / f"table{n}.{ext}"] = render(t, fmt, TABLES[n])
        for path, text in written.items():
            atomic_write_text(path, text.rstrip("\n") + "\n")
        return list(written)
