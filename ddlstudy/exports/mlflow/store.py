"""MLflow's store: where ddlstudy's runs go in a tracking store and how each is found again.

    ddlstudy run --usecase tiny --mlflow                # sqlite:///<runs-dir>/mlflow.db
    ddlstudy export mlflow runs/demo                    # the same names, after the fact

A run folder is one MLflow run, found again by its ``ddlstudy_run_id`` tag (so logging
twice updates it, never makes a second one), in the experiment of its study (else of the
folder its runs are in), nested under the study's parent run. What a run logs while it
trains is ``live``'s; the rest (params, samples, files) is ``runs``'.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.files import check_folder, turn
from ddlstudy.reading import BadFile, check_regular
from ddlstudy.redact import redact, remember, shown, split
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
SERVERS = ("http", "https")
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
"""Where MLflow reads a server's user and password (at each request): where a URI's own
go, so that the URI MLflow is handed, and so prints, logs and raises, holds none."""
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(:[0-9]{0,5})?(/.*)?")
"""A server's host (a name, an IPv4 or a bracketed IPv6 address), port and path."""
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
    cannot take it: an unknown scheme, a SQLite file whose folder cannot be made, parts
    its store cannot use (``_check_parts``). The one check every tracking URI given to
    ddlstudy passes: from here on it is remembered (``redact.remember``), and every
    message names it as ``redact.shown`` shows it, its user, query and fragment hidden."""
    if value == DEFAULT:
        value = default_uri(runs_dir)
    if not installed():
        raise ConfigError(flag, f"needs MLflow, which is not installed: {INSTALL}")
    clean = remember(value)
    scheme = scheme_of(value)
    if not value.strip() or scheme not in SCHEMES or not value.isprintable():
        raise ConfigError(flag, f"{clean!r:.200} is not a tracking URI MLflow takes (such as "
                          f"sqlite:///runs/mlflow.db, http://host:5000 or a folder); "
                          f"schemes: {', '.join(s for s in SCHEMES if s)}")
    _check_parts(value, scheme, flag)
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


def _check_parts(value: str, scheme: str, flag: str) -> None:
    """Refuse what a store cannot use, whose secret would otherwise reach it or its
    files: a server's URI with a query or fragment (MLflow adds its API's path after
    them: it never connects), or whose user info holds a ``?`` or ``#`` (a password's, or
    a query's ``@``: it cannot be told); a ``file:`` store's user info, query or
    fragment, a SQLite store's user info or fragment (MLflow writes a folder store's URI
    into every ``meta.yaml`` and ``MLmodel``)."""
    parts, clean = split(value), shown(value)
    if scheme in SERVERS:
        if parts.ambiguous:
            raise ConfigError(flag, f"{clean}: a ? or # before its @ (in a password, or an @ "
                              "in a query) cannot be read one way; give the password as "
                              "MLFLOW_TRACKING_PASSWORD, or write ? as %3F and # as %23")
        if parts.query is not None or parts.fragment is not None:
            raise ConfigError(flag, f"{clean}: a tracking server's URI takes no query or "
                              "fragment (MLflow adds its API's path after it); give a token "
                              "as MLFLOW_TRACKING_TOKEN")
        if not _ADDRESS.fullmatch(parts.address):
            raise ConfigError(flag, f"{clean}: give a server as http://host:port (a host "
                              "name or address, a port of digits)")
    elif scheme in ("file", "sqlite") and (
            parts.userinfo is not None or parts.fragment is not None or
            (scheme == "file" and parts.query is not None)):
        raise ConfigError(flag, f"{clean}: a {scheme}: store takes no user, password"
                          f"{', query' if scheme == 'file' else ''} or fragment (MLflow would "
                          f"write them into the store's files); give its "
                          f"{'folder' if scheme == 'file' else 'file'} alone")


def scheme_of(uri: str) -> str:
    """``uri``'s scheme, lower case, without a database's ``+driver`` ('' for a path)."""
    return split(uri).head.rstrip("/").rstrip(":").lower().split("+")[0]


def _path(uri: str) -> str:
    """The path of a ``file:`` or ``sqlite:`` URI, as typed (after its host, if any)."""
    parts = split(uri)
    if not parts.head.endswith("//"):
        return parts.address
    return parts.address[parts.address.find("/"):] if "/" in parts.address else ""


def folder_store(uri: str) -> Path | None:
    """The folder of a folder store (``file:`` URI, or a plain path); None for another."""
    scheme = scheme_of(uri)
    if scheme not in ("", "file"):
        return None
    return Path(_path(uri) if scheme else uri)


def installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


def experiment_name_most() -> int | None:
    """The longest experiment name MLflow accepts (its own MAX_EXPERIMENT_NAME_LENGTH);
    None when MLflow is not installed (said where it is needed)."""
    if not installed():
        return None
    _settle()
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH

    return MAX_EXPERIMENT_NAME_LENGTH


def sqlite_file(uri: str) -> Path:
    """The database file of a ``sqlite:///`` URI (relative to the working directory when
    it has three slashes, absolute with four)."""
    return Path(_path(uri)[1:] or ".")


def client(uri: str):
    """An MlflowClient of ``uri`` that has answered (UsageError in one line otherwise),
    handed the URI without a server's credentials (``handed``). A folder store's folder
    is checked first, as any folder ddlstudy writes into, and said in ddlstudy's words
    (MLflow 3 keeps such stores only when asked: MLFLOW_ALLOW_FILE_STORE, set here unless
    set already). MLflow is settled first (``_settle``)."""
    clean = remember(uri)
    folder = folder_store(uri)
    if folder is not None:
        check_folder(f"tracking URI {clean}", folder)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    _settle()
    try:
        import mlflow  # noqa: F401
        from mlflow import MlflowClient
    except ImportError:
        raise UsageError(f"MLflow is not installed: {INSTALL}") from None
    _redacted_logs()
    try:
        with in_turn(uri):  # two processes making one new store: the second waits
            return _made(MlflowClient, uri)
    except Exception as exc:  # noqa: BLE001 - any store's own kind of failure
        text = redact(" ".join(str(exc).split()))
        raise UsageError(f"MLflow cannot use tracking URI {clean}: {text[:300]}") from None


def _settle() -> None:
    """MLflow's settings, before it is imported: its telemetry off unless asked for (its
    thread sets and unsets an environment variable while requests reads them all: two
    exports at once into a server failed with "KeyError: '_MLFLOW_TELEMETRY_SESSION_ID'",
    seen here; and it would send usage data out); its "View run ... at: URL" lines off
    stdout, always (they came first on `run --format json`'s JSON, and held the URI as
    MLflow had it); an HTTP server that does not answer given up on in seconds, not
    retried for minutes."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


class _Redacting(logging.Formatter):
    """MLflow's own format, then ``redact``: its lines go to stderr through its own
    handler, not ddlstudy's."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def _redacted_logs() -> None:
    """MLflow's loggers (it gives them a handler of its own, apart from ddlstudy's) kept
    to their warnings, each line through ``redact``."""
    for name in ("mlflow", "alembic", "sqlalchemy.engine", "huey"):
        logger = logging.getLogger(name)
        if name in ("mlflow", "alembic"):
            logger.setLevel(logging.WARNING)
        for handler in logger.handlers:
            if not isinstance(handler.formatter, _Redacting):
                handler.setFormatter(_Redacting(handler.formatter))


def handed(uri: str) -> str:
    """The URI MLflow is given for ``uri``. A server's has no user info: its user and
    password (percent-decoded, as requests would) are set as MLflow's own variables
    (``CREDENTIALS``) for this process and those it starts, and a server's URI without
    them puts back what the variables held before; so nothing MLflow prints, logs or
    raises holds them. Another store's is ``uri`` (a database's user info is how it
    connects; ``redact`` takes it out of every copy)."""
    parts = split(uri)
    if scheme_of(uri) not in SERVERS:
        return uri
    if not _OWN:
        _OWN.update({name: os.environ.get(name) for name in CREDENTIALS})
    if parts.userinfo is None:
        values = [_OWN[name] for name in CREDENTIALS]
    else:
        user, _, password = parts.userinfo.partition(":")
        values = [unquote(user), unquote(password)]
    for name, value in zip(CREDENTIALS, values, strict=True):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return parts.head + parts.address


_OWN: dict[str, str | None] = {}
"""MLflow's credential variables as this process found them, before a URI's replaced them."""


def _made(MlflowClient, uri: str):
    """A client that has answered; a new SQLite store that could not be made (a full
    disk) is not left behind half made."""
    db = sqlite_file(uri) if scheme_of(uri) == "sqlite" else None
    new = db is not None and not db.exists()
    try:
        found = MlflowClient(tracking_uri=handed(uri))
        found.search_experiments(max_results=1)
        return found
    except Exception:
        if new:
            db.unlink(missing_ok=True)
        raise


def in_turn(uri: str):
    """The lock held while a store's tables are made or an export writes: a SQLite or
    folder store's folder's; a server's or a database's, this user's lock of it on this
    host (two exports at once made every run twice in a server, and one failed), in the
    temporary folder, named by the URI's hash."""
    if scheme_of(uri) == "sqlite":
        return turn(sqlite_file(uri).absolute().parent)
    folder = folder_store(uri)
    if folder is not None:
        return turn(folder.absolute())
    key = hashlib.sha256(shown(uri).encode()).hexdigest()[:16]
    return turn(Path(tempfile.gettempdir()) / f"ddlstudy-{os.getuid()}" / "mlflow" / key)


def experiment(mlflow, name: str, uri: str) -> str:
    """The id of experiment ``name``, made if new (a SQLite store's files beside it) or
    restored if deleted."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":  # deleted in the UI: logging brings it back
            mlflow.restore_experiment(found.experiment_id)
        return found.experiment_id
    where = None
    if scheme_of(uri) == "sqlite":
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
