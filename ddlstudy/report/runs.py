"""The runs of a folder as rows: reading its manifests (and, from its ``study.json``, the
cells its studies planned but could not run, no GPU, ..., with why), and what a row holds
(``runs_frame``: one row per run, the long tidy table for your own analysis, with each
run's speedup against its use case's baseline)."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import pandas as pd

from ddlstudy.config import WARMUP_STEPS
from ddlstudy.errors import UsageError
from ddlstudy.reading import what_is
from ddlstudy.records.formats import Cell, Study, check, load
from ddlstudy.records.memory import GIB, MEMORY, memory_of
from ddlstudy.records.runfolder import MANIFEST, load_manifest
from ddlstudy.strategies import REGISTRY as STRATEGIES
from ddlstudy.strategies import Strategy

log = logging.getLogger("ddlstudy")

BASELINE = "sequential"
STUDY_FILE = "study.json"
LOCAL = "local"
"""The backend of one node: any other's runs go in Table 3."""
KEY = ["usecase", "setting", "config", "strategy", "backend", "nodes", "reduce", "precision",
       "cores", "gpus"]
"""A configuration: runs with the same key are repeats of one another. ``setting`` is what
changes the measured figures apart from the parallelism (``setting``); ``config`` and the
rest are the parallelism itself."""


def runs_folder(runs_dir: Path) -> Path:
    """``runs_dir`` if it is a folder, else a UsageError saying what is there instead
    (found without opening it: a FIFO would block)."""
    runs_dir = Path(runs_dir)
    if runs_dir.is_dir():
        return runs_dir
    there = what_is(runs_dir)
    if not there:
        raise UsageError(f"runs folder {runs_dir} does not exist")
    raise UsageError(f"runs folder {runs_dir} is {there}, not a folder; give the folder "
                     f"the runs are in (where `ddlstudy run --runs-dir` put them)")


def load_runs(runs_dir: Path) -> list[dict]:
    """Every manifest under ``runs_dir`` (any depth), oldest first."""
    runs_dir = runs_folder(runs_dir)
    manifests = []
    for path in sorted(runs_dir.rglob(MANIFEST)):
        try:
            manifest = load_manifest(path)
        except UsageError as exc:  # one bad run never hides the others
            log.warning("report: skipped %s", exc)
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


_MEASURED = ("epoch_s", "images_per_s", "val_accuracy", "best_val_accuracy", "train_time_s",
             "tta_s")


def load_planned(runs_dir: Path) -> list[dict]:
    """Cells of the studies under ``runs_dir`` that have no run: skipped, or not reached."""
    planned = []
    for path in sorted(Path(runs_dir).rglob(STUDY_FILE)):
        try:
            study = load(path, Study, "study record")
        except UsageError as exc:
            log.warning("report: left out the cells of %s", exc)
            continue
        planned += [c for c in study["cells"] if not c.get("run")]
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


def _strategy(name: str) -> Strategy | None:
    """The strategy a run names, or None where it is not installed here (a plugin's)."""
    cls = STRATEGIES.get(name) or STRATEGIES.loaded().get(name)
    return cls() if cls is not None else None


def config_label(manifest: dict) -> str:
    """What ran, named short: strategy, degrees (its ``label`` of the layout), backend."""
    s = manifest.get("strategy", {})
    strategy = _strategy(name := s.get("name", "?"))
    label = strategy.label(s) if strategy is not None else name
    config = manifest.get("config", {})
    if config.get("transport", "auto") != "auto":
        label += f" over {config['transport']}"
    if config.get("precision", "fp32") != "fp32":
        label += f" {config['precision']}"
    if config.get("accumulate", 1) > 1:
        label += f" accumulate {config['accumulate']}"
    label += " checkpointed" * bool(config.get("checkpoint_activations"))  # memory for time
    label += " ZeRO-2" * (config.get("reshard_after_forward") is False)  # sharded's, not ZeRO-3
    label += " own buffers" * (config.get("shared_buffers") is False)  # sharded's, allocated
    if config.get("scaling", "strong") == "weak":
        batch = manifest.get("effective", {}).get("global_batch", "?")
        label += f" weak (batch {batch})"
    if config.get("lr_scaling", "none") != "none":
        label += f" lr {config['lr_scaling']}"
    backend = manifest.get("backend", {})
    if backend.get("name", LOCAL) != LOCAL:
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
        launcher = (manifest.get("launch") or {}).get("launcher")
        if launcher in ("your mpiexec", "srun"):  # not ddlstudy's own: say whose
            how += f", under {launcher}"
        label = f"{backend['name']} {backend.get('nodes', '?')} nodes{how}: {label}"
    return label


def setting(manifest: dict) -> str:
    """What a run measured apart from its parallelism: epochs (and --max-steps), the per-run
    batch, the learning rate given (and its warm-up), the optimizer and schedule where not the
    paper's, the image size, the data (its fingerprint) and the host (a Slurm job's partition,
    of alike nodes). Runs of different settings never repeat each other; a speedup divides by
    the baseline of the same setting."""
    config, host = manifest.get("config") or {}, manifest.get("host") or {}
    train = (config.get("usecase") or {}).get("train") or {}
    parts = [f"{train.get('epochs', '?')} epochs"]
    if config.get("max_steps"):
        parts.append(f"{config['max_steps']} steps")
    if config.get("warmup_steps", WARMUP_STEPS) != WARMUP_STEPS:  # what images/s leave out
        parts.append(f"{config['warmup_steps']} warm-up")
    parts.append(f"batch {train.get('batch_size', '?')}")
    if "lr" in train:  # a learning rate changes the accuracy, not the speed
        parts.append(f"lr {train['lr']:g}")
    if train.get("lr_warmup_epochs"):
        parts.append(f"lr warm-up {train['lr_warmup_epochs']:g} epochs")
    parts += recipe_parts(train, (config.get("usecase") or {}).get("data") or {})
    if train.get("target_metric", "accuracy") != "accuracy":  # what time to target measures
        parts.append(f"target {train['target_metric']}")
    parts += [f"{train.get('image_size', '?')} px",
              f"data {str((manifest.get('data') or {}).get('fingerprint') or '?')[:8]}",
              f"host {host.get('slurm_partition') or host.get('hostname', '?')}"]
    return ", ".join(parts)


def _call(name: str, args: dict | None) -> str:
    return name + (f"({', '.join(f'{k}={v}' for k, v in args.items())})" if args else "")


def recipe_parts(train: dict, data: dict) -> list[str]:
    """The optimizer, the schedule and the augmentation of a run's [train] and [data]
    tables where they are not the paper's (SGD with momentum 0.9, no schedule, flips,
    ImageNet's normalisation): ``AdamW(weight_decay=0.05)``, ``cosine schedule``,
    ``no flip``, ``dataset normalisation``."""
    parts = []
    optimizer, args = train.get("optimizer", "SGD"), train.get("optimizer_args")
    if optimizer != "SGD" or args:
        parts.append(_call(optimizer, args))
    if train.get("momentum", 0.9) != 0.9:
        parts.append(f"momentum {train['momentum']:g}")
    if train.get("lr_schedule", "none") != "none":
        parts.append(_call(train["lr_schedule"], train.get("lr_schedule_args")) + " schedule")
    if data.get("flip") is False:
        parts.append("no flip")
    if data.get("crop_scale", 1) != 1:
        parts.append(f"crops of {data['crop_scale']:g}-1")
    if data.get("normalize", "imagenet") != "imagenet":
        parts.append(f"{data['normalize']} normalisation")
    return parts


def table_number(strategy: str, backend: str) -> int:
    """Which of the paper's three tables a configuration belongs to: 3 for several nodes,
    else the strategy's own (1 where it is not installed here)."""
    if backend != LOCAL:
        return 3
    found = _strategy(strategy)
    return found.table if found is not None else 1


def short_reason(reason: str) -> str:
    """A skip reason without the flag it names and the advice after the semicolon."""
    reason = reason.split(": ", 1)[1] if reason.startswith("--") and ": " in reason else reason
    return reason.split(";")[0]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _time_to_target(m: dict) -> tuple[float | None, bool | None, float | None, str | None]:
    """(target, reached, seconds, metric) of a run's time to target; all None for a run
    without a target (or from before time to accuracy was measured)."""
    tta = m.get("time_to_target") or {}
    reached, target = tta.get("reached"), tta.get("target")
    return (target, reached, tta.get("seconds") if reached else None,
            tta.get("metric", "accuracy") if target is not None else None)


def usecase_label(name: str, model: str | None) -> str:
    """A use case's name in the tables: with the model when a run trained another than
    the use case's own (--model), so two models on one data set are two rows."""
    if not model:
        return name
    where, _, function = model.rpartition(":")
    return f"{name} ({Path(where).name}:{function})" if where else f"{name} ({model})"


def _run_row(m: dict) -> dict:
    """A run's row of ``runs_frame`` (raises on a malformed manifest)."""
    epochs = m.get("epochs") or []
    target, reached, tta, metric = _time_to_target(m)
    backend = m.get("backend") or {}
    strategy = m.get("strategy", {}).get("name", "?")
    backend_name = backend.get("name", LOCAL)
    config = m.get("config") or {}
    accuracies = [e["val_accuracy"] for e in epochs if e["val_accuracy"] is not None]
    return {
        "usecase": usecase_label(m.get("usecase", "?"), config.get("model")),
        "setting": setting(m), "config": config_label(m),
        "strategy": strategy,
        "backend": backend_name, "nodes": int(backend.get("nodes", 1)),
        "reduce": backend.get("reduce") or backend.get("sync") or "",
        "precision": config.get("precision") or "fp32",
        "scaling": config.get("scaling") or "strong",
        "global_batch": (m.get("effective") or {}).get(
            "global_batch", ((config.get("usecase") or {}).get("train") or {})
            .get("batch_size")),
        "cores": cores_used(m), "gpus": _gpus(m),
        "processes": int(m.get("strategy", {}).get("processes", 1)),
        "table": table_number(strategy, backend_name),
        "repeat": (m.get("study") or {}).get("repeat", 0), "status": m.get("status", "?"),
        "noisy": (m.get("host_load") or {}).get("noisy") is True,
        "reason": m.get("error") or "", "epochs": len(epochs),
        "epoch_s": _median([e["epoch_time_s"] for e in epochs]),
        "images_per_s": _median([e["steady_images_per_s"] for e in epochs]),
        "epoch_rates": [e["steady_images_per_s"] for e in epochs],  # checked by _unusable
        "val_accuracy": epochs[-1]["val_accuracy"] if epochs else None,
        "best_val_accuracy": max(accuracies, default=None),
        "val_macro_f1": epochs[-1].get("val_macro_f1") if epochs else None,
        "train_time_s": sum(e.get("train_time_s") or 0.0 for e in epochs) if epochs else None,
        "target": target, "target_metric": metric, "reached": reached, "tta_s": tta,
        **memory_of(m),
        "run": m.get("id", ""), "path": m.get("path", ""),
    }


def runs_frame(manifests: list[dict], planned: list[dict] = (),
               include_noisy: bool = False) -> pd.DataFrame:
    """One row per run (and per planned cell that has no run), in a long tidy layout.
    ``counted``: whether the run enters medians and speedups (completed, and not noisy
    unless ``include_noisy``)."""
    rows = [_run_row(m) for m in manifests]
    rows += [_planned_row(c) for c in planned if _valid_cell(c)]
    frame = pd.DataFrame(rows, columns=[*KEY, "scaling", "global_batch", "processes", "table",
                                        "repeat", "status", "noisy", "reason", "epochs", "epoch_s",
                                        "images_per_s", "epoch_rates", "val_accuracy",
                                        "best_val_accuracy", "val_macro_f1", "train_time_s",
                                        "target", "target_metric", "reached", "tta_s",
                                        *MEMORY, "run", "path"])
    # A planned cell that has no run belongs to its use case's usual setting.
    usual = {uc: g.setting.mode().iloc[0] for uc, g in frame.dropna(subset=["setting"])
             .groupby("usecase")}
    frame["setting"] = [s if isinstance(s, str) else usual.get(uc, "")
                        for uc, s in zip(frame.usecase, frame.setting, strict=True)]
    frame["counted"] = (frame.status == "completed") & (include_noisy | ~frame.noisy)
    base = {k: _median(list(shown(g).images_per_s.dropna()))
            for k, g in frame[is_baseline(frame)].groupby(["usecase", "setting"])}
    frame["speedup"] = [r / base[k] if base.get(k) and r is not None and r == r else None
                        for k, r in zip(zip(frame.usecase, frame.setting, strict=True),
                                        frame.images_per_s, strict=True)]
    units = frame.gpus.where(frame.gpus > 0, frame.cores).clip(lower=1)
    frame["efficiency"] = frame.speedup / units
    return frame


def _valid_cell(cell) -> bool:
    """Whether a planned cell is one ``formats.Cell`` describes (``load_planned`` gave only
    such, from study.json files it checked); another is left out, named."""
    try:
        check(cell, Cell, cell.get("id", "?") if isinstance(cell, dict) else "?",
              "study cell")
    except UsageError as exc:
        log.warning("report: left out %s", exc)
        return False
    return True


def _planned_row(c: dict) -> dict:
    """A row of ``runs_frame`` for a study's cell that has no run (skipped, not reached)."""
    backend = c.get("backend", LOCAL)
    flags = c.get("flags") or {}
    return {
        "usecase": usecase_label(c["usecase"], flags.get("model")),
        "setting": None, "config": c["label"],
        "strategy": c["strategy"],
        "backend": backend, "nodes": c.get("nodes", 1), "reduce": "",
        "precision": flags.get("precision", "fp32"),
        "scaling": flags.get("scaling", "strong"), "global_batch": None,
        "cores": c.get("cores", 0),
        "gpus": 0, "processes": 1, "table": table_number(c["strategy"], backend),
        "repeat": c.get("repeat", 0), "status": c["status"], "noisy": False,
        "reason": c.get("reason", ""), "epochs": 0, "epoch_s": None,
        "images_per_s": None, "epoch_rates": [], "val_accuracy": None,
        "best_val_accuracy": None, "val_macro_f1": None, "train_time_s": None,
        "target": None, "target_metric": None, "reached": None, "tta_s": None,
        **dict.fromkeys(MEMORY), "run": "", "path": "",
    }


def reached_text(g: pd.DataFrame) -> str:
    """How many of a configuration's counted runs reached its target ('2/3'), '' when its
    use case sets none."""
    judged = [r for r in g.reached if r is not None and r == r]
    return f"{sum(bool(r) for r in judged)}/{len(judged)}" if judged else ""


def time_to_target(g: pd.DataFrame) -> tuple[float | None, float | None]:
    """(target, median time to it) of a configuration's counted runs; the time only when
    every one of them reached the same target (a median of the lucky ones would flatter).
    Its runs measure one metric: a target metric other than accuracy is in the setting."""
    targets = {t for t in g.target if t is not None and t == t}
    if len(targets) != 1 or g.empty or not all(r is True for r in g.reached):
        return (targets.pop() if len(targets) == 1 else None), None
    return targets.pop(), _median(list(g.tta_s.dropna()))


PEAKS = ("process", "node")
"""The peaks the speedup table gives a configuration: ``peak_<what>_gib`` (the median over
its runs that recorded it), ``_min`` and ``_max``."""


def memory_cells(runs: pd.DataFrame) -> dict[str, float | None]:
    """A configuration's peak memory per process and per node in GiB over ``runs`` (its
    counted runs): median, least and most (None each where none recorded it)."""
    cells = {}
    for what in PEAKS:
        values = [float(v) / GIB for v in runs[f"peak_{what}_bytes"].dropna()]
        cells |= {f"peak_{what}_gib": _median(values),
                  f"peak_{what}_gib_min": min(values, default=None),
                  f"peak_{what}_gib_max": max(values, default=None)}
    return cells


def shown(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of one configuration that give its figures: the counted ones or, where it
    has none, its completed noisy ones (a busy host's only measurement, marked noisy)."""
    return runs[runs.counted] if runs.counted.any() else runs[runs.status == "completed"]


def is_baseline(frame: pd.DataFrame) -> pd.Series:
    """The sequential baseline: one process on one node, nothing varied (not sequential
    ranks under MPI or Spark, not bf16, not accumulating)."""
    return (frame.config == BASELINE) & (frame.backend == LOCAL)
