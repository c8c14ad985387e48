"""MLflow's store: where ddlstudy's runs go in a tracking store and how each is found again.

    ddlstudy run --usecase tiny --mlflow                # sqlite:///<runs-dir>/mlflow.db
    ddlstudy export mlflow runs/demo                    # the same names, after the fact

A run folder is one MLflow run, found again by its ``ddlstudy_run_id`` tag (so logging
twice updates it, never makes a second one), in the experiment of its study (else of the
folder its runs are in), nested under the study's parent run. What a run logs while it
trains is ``live``'s; the rest (params, samples, files) is ``runs``'.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.files import check_folder, turn
from ddlstudy.reading import BadFile, check_regular
from ddlstudy.watchers import ALONE

INSTALL = "pip install 'ddlstudy[mlflow]'"
DEFAULT = ALONE
"""``--mlflow`` alone (or a plan's ``mlflow = true``): the SQLite store beside the runs."""
STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
"""Where a SQLite store's experiments keep their files: beside the store."""
SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https",
           "databricks", "databricks-uc", "uc")
"""The tracking URIs MLflow's own stores take (a database's ``+driver`` aside)."""
RUN_TAG = "ddlstudy_run_id"
PARENT_TAG = "ddlstudy_study"
"""The tag of a study's parent run: the study's name."""
STATUS = {"running": "RUNNING", "completed": "FINISHED", "failed": "FAILED",
          "interrupted": "KILLED"}
"""A ddlstudy run's status as MLflow's."""
BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit)."""


def default_uri(folder: Path) -> str:
    """The SQLite store in ``folder`` (absolute: a study's cells agree on it)."""
    return f"sqlite:///{(Path(folder) / STORE).absolute()}"


def resolved(value: str, runs_dir: Path, flag: str = "--mlflow") -> str:
    """``value`` as a tracking URI (``default``: the store in ``runs_dir``), refused
    (ConfigError naming ``flag``) without writing anything if MLflow is not installed or
    cannot take it: an unknown scheme, a SQLite file whose folder cannot be made."""
    if value == DEFAULT:
        value = default_uri(runs_dir)
    if not installed():
        raise ConfigError(flag, f"needs MLflow, which is not installed: {INSTALL}")
    scheme = urlparse(value).scheme.split("+")[0]
    if not value.strip() or scheme not in SCHEMES or not value.isprintable():
        raise ConfigError(flag, f"{value!r:.200} is not a tracking URI MLflow takes (such as "
                          f"sqlite:///runs/mlflow.db, http://host:5000 or a folder); "
                          f"schemes: {', '.join(s for s in SCHEMES if s)}")
    if scheme == "sqlite":
        check_folder(flag, sqlite_file(value).parent)
        db = sqlite_file(value)
        if db.exists() or db.is_symlink():  # a FIFO there would hang SQLite's open
            try:
                check_regular(db, "MLflow store")
            except BadFile as exc:
                raise ConfigError(flag, str(exc)) from None
    elif (folder := folder_store(value)) is not None:  # a folder MLflow keeps its runs in
        check_folder(flag, folder)
    return value


def folder_store(uri: str) -> Path | None:
    """The folder of a folder store (``file:`` URI, or a plain path); None for another."""
    scheme = urlparse(uri).scheme.split("+")[0]
    if scheme not in ("", "file"):
        return None
    return Path(urlparse(uri).path if scheme else uri)


def installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


def experiment_name_most() -> int | None:
    """The longest experiment name MLflow accepts (its own MAX_EXPERIMENT_NAME_LENGTH);
    None when MLflow is not installed (said where it is needed)."""
    if not installed():
        return None
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH

    return MAX_EXPERIMENT_NAME_LENGTH


def sqlite_file(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI (relative to the working directory when
    it has three slashes, absolute with four)."""
    return Path(urlparse(uri).path[1:] or ".")


def client(uri: str):
    """An MlflowClient of ``uri`` that has answered (UsageError in one line otherwise).
    A folder store's folder is checked first, as any folder ddlstudy writes into, and
    said in ddlstudy's words (MLflow 3 keeps such stores only when asked:
    MLFLOW_ALLOW_FILE_STORE, set here unless set already). MLflow's start-up chatter is
    kept to its warnings, and an HTTP server that does not answer is given up on in
    seconds, not retried for minutes."""
    folder = folder_store(uri)
    if folder is not None:
        check_folder(f"tracking URI {uri}", folder)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        import mlflow  # noqa: F401
        from mlflow import MlflowClient
    except ImportError:
        raise UsageError(f"MLflow is not installed: {INSTALL}") from None
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    try:
        with in_turn(uri):  # two processes making one new store: the second waits
            return _made(MlflowClient, uri)
    except Exception as exc:  # noqa: BLE001 - any store's own kind of failure
        text = " ".join(str(exc).split())
        raise UsageError(f"MLflow cannot use tracking URI {uri}: {text[:300]}") from None


def _made(MlflowClient, uri: str):
    """A client that has answered; a new SQLite store that could not be made (a full
    disk) is not left behind half made."""
    db = sqlite_file(uri) if urlparse(uri).scheme.split("+")[0] == "sqlite" else None
    new = db is not None and not db.exists()
    try:
        found = MlflowClient(tracking_uri=uri)
        found.search_experiments(max_results=1)
        return found
    except Exception:
        if new:
            db.unlink(missing_ok=True)
        raise


def in_turn(uri: str):
    """The lock of a SQLite or folder store's folder, held while its tables are made or
    an export writes (a server keeps its own order: nothing to hold)."""
    if urlparse(uri).scheme.split("+")[0] == "sqlite":
        return turn(sqlite_file(uri).absolute().parent)
    folder = folder_store(uri)
    return nullcontext() if folder is None else turn(folder.absolute())


def experiment(mlflow, name: str, uri: str) -> str:
    """The id of experiment ``name``, made if new (a SQLite store's files beside it) or
    restored if deleted."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":  # deleted in the UI: logging brings it back
            mlflow.restore_experiment(found.experiment_id)
        return found.experiment_id
    where = None
    if urlparse(uri).scheme.split("+")[0] == "sqlite":
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "experiment"
        where = (sqlite_file(uri).absolute().parent / ARTIFACTS / slug).as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=where)
    except Exception:  # another process made it in between
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def find_run(mlflow, experiment_id: str, tag: str, value: str):
    """The run of ``experiment_id`` whose ``tag`` is ``value`` (the oldest, if several),
    or None."""
    found = mlflow.search_runs([experiment_id], f"tags.{tag} = '{value}'", max_results=10,
                               order_by=["attributes.start_time ASC"])
    return found[0] if found else None


def open_run(mlflow, experiment_id: str, tags: dict[str, str], name: str,
             start_ms: int | None = None):
    """The run tagged ``tags[RUN_TAG]`` (or ``tags[PARENT_TAG]``, a study's) in the
    experiment, else a new one named ``name``; returns (run, made now)."""
    tag = RUN_TAG if RUN_TAG in tags else PARENT_TAG
    found = find_run(mlflow, experiment_id, tag, tags[tag])
    if found is not None:
        return found, False
    return mlflow.create_run(experiment_id, start_time=start_ms, tags=tags,
                             run_name=name), True


def experiment_name(manifest: dict, folder: Path) -> str:
    """A run's experiment: its study's name, else the name of the folder it is in."""
    study = (manifest.get("study") or {}).get("name")
    return study or Path(folder).absolute().parent.name or "ddlstudy"


def parent_run(mlflow, experiment_id: str, study: str, start_ms: int | None = None):
    """A study's parent run (made if new), under which its runs nest."""
    run, _ = open_run(mlflow, experiment_id, {PARENT_TAG: study, "study": study}, study,
                      start_ms)
    return run


def run_tags(manifest: dict) -> dict[str, str]:
    """A run's tags: which run, study, cell and repeat it is, how it went, where and from
    what it ran."""
    study = manifest.get("study") or {}
    git = manifest.get("git") or {}
    tags = {RUN_TAG: manifest.get("id"), "study": study.get("name"),
            "cell": study.get("cell"), "repeat": study.get("repeat"),
            "status": manifest.get("status"),
            "noisy": (manifest.get("host_load") or {}).get("noisy"),
            "host": (manifest.get("host") or {}).get("hostname"),
            "launcher": (manifest.get("launch") or {}).get("launcher"),
            "git_commit": git.get("commit"), "mlflow.source.git.commit": git.get("commit"),
            "ddlstudy_version": (manifest.get("versions") or {}).get("ddlstudy")}
    return {k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in tags.items() if v is not None}


def epoch_metrics(values: dict[str, Any], epoch: int, timestamp_ms: int) -> list:
    """An epoch's record (metrics.csv's row) as MLflow metrics under its column names,
    step = the epoch; what is not a finite number is left out."""
    from mlflow.entities import Metric

    return [Metric(name, float(v), timestamp_ms, int(epoch)) for name, v in values.items()
            if name != "epoch" and _number(v)]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value)


def log_batch(mlflow, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), BATCH):
        mlflow.log_batch(run_id, metrics=metrics[i:i + BATCH])


def now_ms() -> int:
    return int(time.time() * 1000)
