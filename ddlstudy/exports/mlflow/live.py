"""What `run --mlflow` logs while the run trains: ddlstudy's ``mlflow`` watcher.

Node 0 opens the run's MLflow run when the run folder is made (``opened``, nested under its
study's), the rank that records epochs logs each one as it ends (``epoch``, step = the
epoch), and the run's status follows when its folder is closed (``closed``); the rest
(params, samples, files) is ``runs``' when the run ends. MLflow failing never fails the
run: it is said in a warning, recorded in the manifest's ``mlflow`` block, and the run goes
on. The run folder finds this watcher through ddlstudy's entry point (``ddlstudy.watchers``),
never by importing it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ddlstudy.exports.mlflow.store import (
    STATUS,
    client,
    epoch_metrics,
    experiment,
    experiment_name,
    handed,
    log_batch,
    now_ms,
    open_run,
    parent_run,
    resolved,
    run_tags,
)
from ddlstudy.redact import redact, shown
from ddlstudy.watchers import Watcher

log = logging.getLogger("ddlstudy")

_CLIENTS: dict[str, Any] = {}


def _live(uri: str):
    """This process's client of ``uri`` (a worker makes its own once), with ``uri``'s
    credentials the ones MLflow reads (``store.handed``: the last store used may have
    been another)."""
    if uri not in _CLIENTS:
        _CLIENTS[uri] = client(uri)
    else:
        handed(uri)
    return _CLIENTS[uri]


class MlflowWatcher(Watcher):
    name = "mlflow"
    summary = "`run --mlflow`: the run's MLflow run, each epoch as it ends, its status"

    def setting(self, value: str, runs_dir: Path, flag: str) -> str:
        return resolved(value, runs_dir, flag)

    def opened(self, manifest: dict[str, Any], folder: Path) -> None:
        """Open the run's MLflow run (nested under its study's) and note where in the
        manifest's ``mlflow`` block."""
        uri = (manifest.get("config") or {}).get("mlflow")
        if not uri:
            return
        try:
            mlflow = _live(uri)
            exp = experiment(mlflow, experiment_name(manifest, folder), uri)
            tags = run_tags(manifest)
            study = tags.get("study")
            if study:
                tags["mlflow.parentRunId"] = parent_run(mlflow, exp, study).info.run_id
            run, _ = open_run(mlflow, exp, tags, manifest["id"])
            manifest["mlflow"] = {"tracking_uri": uri, "experiment_id": exp,
                                  "run_id": run.info.run_id}
        except Exception as exc:  # noqa: BLE001 - the run goes on without MLflow
            _failed(manifest, uri, exc)

    def epoch(self, manifest: dict[str, Any], record: dict[str, Any]) -> None:
        """Log the epoch just recorded (on the rank that records it)."""
        where = _logging(manifest)
        if where is None:
            return
        try:
            log_batch(_live(where["tracking_uri"]), where["run_id"],
                      epoch_metrics(record, record["epoch"], now_ms()))
        except Exception as exc:  # noqa: BLE001
            _failed(manifest, where["tracking_uri"], exc)

    def closed(self, manifest: dict[str, Any]) -> None:
        """The run's status in MLflow (the rest follows from ``runs``, or at the end of its
        study)."""
        where = _logging(manifest)
        if where is None:
            return
        try:
            from mlflow.entities import RunTag

            mlflow = _live(where["tracking_uri"])
            tags = {k: v for k, v in run_tags(manifest).items() if k in ("status", "noisy")}
            mlflow.log_batch(where["run_id"], tags=[RunTag(k, v) for k, v in tags.items()])
            status = STATUS.get(manifest.get("status"), "RUNNING")
            if status != "RUNNING":
                mlflow.set_terminated(where["run_id"], status)
        except Exception as exc:  # noqa: BLE001
            _failed(manifest, where["tracking_uri"], exc)


WATCHER = MlflowWatcher()


def _logging(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's ``mlflow`` block while the run logs there (None: it does not, or
    MLflow failed earlier in this run)."""
    where = manifest.get("mlflow") or {}
    return where if where.get("run_id") and not where.get("error") else None


def _failed(manifest: dict, uri: str, exc: Exception) -> None:
    text = redact(" ".join(str(exc).split()))[:300]  # redacted whole, then cut
    manifest.setdefault("mlflow", {"tracking_uri": uri})["error"] = text
    log.warning("MLflow (%s): %s; the run goes on without it (`ddlstudy export mlflow` "
                "logs it afterwards)", shown(uri), text)
