"""Spark standalone on the hosts: a master on host 1, a worker on each, sharing a secret."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddlstudy.errors import Unavailable
from ddlstudy.hosts.processes import _kill
from ddlstudy.hosts.spec import SPARK_PORT, STATE_DIR, Hosts, check_prefix
from ddlstudy.hosts.state import read
from ddlstudy.machine.environment import SAFE_PATH_ENV


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def spark_secret_file(prefix: str) -> Path:
    """The shared secret of the hosts' Spark daemons (``run --spark-secret-file``)."""
    return STATE_DIR / f"{check_prefix(prefix)}-spark" / "secret"


def _spark_properties(prefix: str) -> Path:
    """A new secret for the daemons, and their properties file that enables it (both
    readable by this user only: whoever holds the secret may run code on the workers)."""
    folder = spark_secret_file(prefix).parent
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32)
    for name, text in (("secret", secret + "\n"),
                       ("spark.properties", f"spark.authenticate true\n"
                                            f"spark.authenticate.secret {secret}\n")):
        file = folder / name
        file.unlink(missing_ok=True)
        with os.fdopen(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(text)
    return folder / "spark.properties"


def spark_up(hosts: Hosts, cores: int = 1, memory: str = "2g", timeout: float = 90) -> str:
    """A master on host 1 and one worker per host, bound to the hosts' addresses and
    accepting only drivers that hold their new shared secret (``spark_secret_file``);
    returns the master URL once every worker has registered."""
    spark_down(hosts.prefix)
    logs = STATE_DIR / f"{hosts.prefix}-spark"
    properties = _spark_properties(hosts.prefix)
    env = os.environ | SAFE_PATH_ENV | {"PYSPARK_PYTHON": sys.executable,
                                        "SPARK_NO_DAEMONIZE": "1"}
    master = hosts.spark_master

    def start(host: int, what: str, *args: str) -> None:
        command = [_spark_class(), what, "--host", hosts.addresses[host - 1],
                   "--properties-file", str(properties), *args]
        with open(logs / f"{what.rsplit('.', 1)[1].lower()}-h{host}.log", "w") as log:
            subprocess.Popen(hosts.command(host, command), env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)

    start(1, "org.apache.spark.deploy.master.Master", "--port", str(SPARK_PORT),
          "--webui-port", "8080")
    for host in range(1, hosts.count + 1):
        start(host, "org.apache.spark.deploy.worker.Worker", "--cores", str(cores),
              "--memory", memory, "--webui-port", "8081", master)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _registered_workers(logs) >= hosts.count:
            return master
        time.sleep(0.5)
    raise Unavailable("hosts spark", f"{hosts.count} worker(s) did not register with {master} "
                      f"within {timeout:.0f} s; see the logs in {logs}")


def _registered_workers(logs: Path) -> int:
    try:
        text = (logs / "master-h1.log").read_text()
    except OSError:
        return 0
    return text.count("Registering worker")


def spark_down(prefix: str) -> None:
    """Stop the Spark daemons on the hosts (every JVM in the namespaces ``hosts up``
    recorded as made; nothing if it made none)."""
    made = read(prefix)
    if made is not None:
        _kill(made.made["namespaces"], signal.SIGTERM, only="java")
