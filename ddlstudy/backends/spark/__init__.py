"""The Spark backend: one barrier task per node, gang-scheduled, each running the worker of
the node's one-process strategy (sequential, cpu-intraop, cpu-threads) on its slice of
every global batch.

The driver (the `ddlstudy run` process) starts a SparkContext on ``--spark-master``: in gloo
mode as soon as the flags are read, beside torch's import (``ddlstudy.machine.sparkjvm``); the
seconds the run then waits for it are ``backend.session_start_s`` in the manifest. It runs
a single barrier stage of ``--nodes`` tasks. Two ways to keep the nodes in step:

- ``--spark-sync gloo``: the tasks exchange "host:port" with ``BarrierTaskContext.allGather``
  and form a torch.distributed gloo group (as Spark's own TorchDistributor does); each
  task's worker is then one of a process group, as a cpu-processes rank is (gradients
  averaged every step: through this host's shared memory where every task runs on it,
  else DDP over gloo), so a run of sequential tasks computes what ``--strategy
  cpu-processes --workers N`` computes.
- ``--spark-sync allgather`` (SparkNet): each task's worker trains on its own slice with
  local SGD and every ``--sync-every`` steps (and at every epoch end) the weights are
  averaged through ``allGather`` itself (the worker's ``Link.settle``), in chunks small
  enough for Spark's RPC messages. Each such barrier call costs Spark a round trip through
  the driver, hence the K steps.

Task 0 writes the run folder (the runs and data folders must be visible to the executors:
a shared file system on a real cluster, as for MPI). If a task fails Spark retries the
whole barrier stage; the attempt number is recorded in the manifest and the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlstudy.backends.base import Backend, Environment, register
from ddlstudy.config import RunConfig
from ddlstudy.errors import Unavailable
from ddlstudy.machine import environment
from ddlstudy.machine.sparkjvm import is_local
from ddlstudy.strategies import Strategy

if TYPE_CHECKING:
    from ddlstudy.training import Job


def _driver():
    """The driver (``driver``), imported where a Spark run is checked or run: it imports
    torch, which a process that names the backends alone (MPI's launcher) need not."""
    from ddlstudy.backends.spark import driver

    return driver


@register
class Spark(Backend):
    name = "spark"
    summary = ("each Spark barrier task a node of one process running its strategy's "
               "worker; gradients over gloo every step, or weights through allGather")
    unsampled = "Spark's executors run outside the sampled process trees"

    def outside_tree(self, cfg: RunConfig) -> str | None:
        if is_local(cfg):  # the executors are threads of the JVM this process started
            return None
        return "Spark's executors run under the master's workers, outside this process tree"

    def launched(self) -> dict[str, Any]:
        return {"launcher": "spark", "java": environment.java_version()}

    def check(self, cfg: RunConfig, strategy: Strategy, resuming: bool) -> None:
        _driver().check(cfg)
        layout = strategy.layout(cfg)
        if layout.device_type == "cuda":
            raise Unavailable("--strategy", f"Spark's tasks train on the CPU here, and "
                              f"{strategy.name} lays its node out on GPUs; use --backend mpi "
                              f"for GPU nodes")
        processes = layout.processes
        if processes > 1:
            raise Unavailable("--strategy", f"a Spark barrier task is one process, and a "
                              f"{strategy.name} node runs {processes}; give each task a "
                              f"strategy of one process (sequential, cpu-intraop, "
                              f"cpu-threads), or use --backend mpi, whose ranks lead nodes "
                              f"of several processes")
        if resuming:
            raise Unavailable("--resume", "Spark runs cannot be resumed yet (Spark retries "
                              "a failed stage itself); use --backend mpi")

    def nodes(self, cfg: RunConfig) -> int:
        return _driver().nodes(cfg)

    def describe(self, cfg: RunConfig) -> dict[str, Any]:
        return _driver().describe(cfg)

    def fit(self, job: Job, env: Environment) -> list[dict]:
        _driver().fit(job)  # the tasks write their own samples into the run folder
        return []
