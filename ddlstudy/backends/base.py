"""The Backend interface (how nodes are started and talk) and the registry of backends.

A run has two axes: the local Strategy (how one node trains: ``ddlstudy.strategies``) and
the Backend (how many nodes there are, where their processes come from, and how they
exchange gradients). ``ddlstudy.runner.run`` asks the backend, once, for everything that
differs between them:

- ``check(cfg, strategy, resuming)``: refuse, before anything starts, what it cannot run;
- ``nodes(cfg)``: how many nodes the run has (its effective parallelism needs it);
- ``describe(cfg)``: the manifest's ``backend`` block;
- ``launch(cfg, argv, run_id)``: start the run's processes when this one cannot be a node
  itself (ddlstudy's own ``mpiexec``), or None to run here;
- ``environment(cfg)``: who this process is among the nodes (an ``Environment``);
- ``fit(job, env)``: train this node; returns the resource samples of the node's other
  processes (the runner adds its own and gathers them on node 0).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ddlstudy.config import RunConfig
from ddlstudy.registry import Registry
from ddlstudy.strategies import Strategy

if TYPE_CHECKING:  # a launcher names backends without training (nor importing torch)
    from ddlstudy.training import Job


class Environment:
    """This process among the run's nodes: its rank, the world, and the few collectives
    the runner needs (the data plan from node 0, every node's samples on node 0). One node
    alone: rank 0 of 1, every collective a no-op."""

    rank: int = 0
    world: int = 1
    where: str = ""
    """How an error names this node (" on MPI rank 3"), empty alone."""

    def share(self, make: Callable[[], Any], dump: Callable[[Any], bytes],
              load: Callable[[bytes], Any]) -> Any:
        """``make()``, run on node 0, on every node; a UsageError it raises is raised on
        every node (they would wait for it forever). Between nodes it travels as ``dump``
        writes and ``load`` reads it (``ddlstudy.wire``: JSON, or torch's weights-only
        format). Alone: ``make()`` itself, nothing encoded."""
        return make()

    def gather(self, obj: Any, dump: Callable[[Any], bytes],
               load: Callable[[bytes], Any]) -> list[Any] | None:
        """Every node's ``obj`` on node 0 (None elsewhere), sent as ``share`` sends."""
        return [obj]

    def placement(self) -> dict[str, Any]:
        """Where the nodes run, for the manifest (hosts and PIDs of several nodes)."""
        return {}

    def failed(self, message: str) -> str:
        """The line a failing node logs (a launcher may read it back)."""
        return message

    def cause(self, exc: Exception) -> str | None:
        """What on another node made ``exc`` happen here, where this node can tell (a
        neighbour that died), else None."""
        return None

    def abort(self, code: int) -> None:
        """End every node after a failure here (the others would wait in a collective)."""


class Backend(ABC):
    """How a run's nodes are started and talk. Subclasses set ``name`` and ``summary`` and
    implement ``nodes`` and ``fit``, which runs the node's strategy's worker (never a
    training of its own) with a ``training.Link`` to the other nodes."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for `ddlstudy backends`."""
    multi_node: ClassVar[bool] = True
    """Whether its runs may have several nodes (``--nodes``)."""
    srun_tasks: ClassVar[bool] = False
    """Whether the tasks Slurm's srun starts join it as its nodes (else srun's several
    tasks are refused: they would be unrelated runs)."""
    unsampled: ClassVar[str | None] = None
    """Why its nodes' processes are not all in the sampled process trees, if they are not
    (a run's host load is then not judged)."""

    def outside_tree(self, cfg: RunConfig) -> str | None:
        """Why some of the run's processes on this host are outside the process tree of
        ``sampler.OthersLoad`` (their CPU would count as other processes'), if they are."""
        return None

    def launched(self) -> dict[str, Any]:
        """How this process was started, for the manifest's ``launch`` block: the launcher
        by name and what else says which one ran (a library's version)."""
        return {"launcher": "plain"}

    def check(self, cfg: RunConfig, strategy: Strategy, resuming: bool) -> None:
        """Refuse what it cannot run, before anything starts (ConfigError, Unavailable)."""
        return None

    @abstractmethod
    def nodes(self, cfg: RunConfig) -> int:
        """How many nodes the run has."""

    def describe(self, cfg: RunConfig) -> dict[str, Any]:
        """The manifest's ``backend`` block (before training; ``fit`` may add to it)."""
        return {"name": self.name, "nodes": self.nodes(cfg)}

    def launches(self, cfg: RunConfig) -> bool:
        """Whether ``launch`` starts the run's processes from this one (which then claims
        their run folder for them: ``records.runfolder.claim``)."""
        return False

    def launch(self, cfg: RunConfig, argv: list[str], run_id: str):
        """Start the run's processes elsewhere and say how they ended (a
        ``backends.mpi.launch.Launched``), or None: this process is a node, run here."""
        return None

    def environment(self, cfg: RunConfig) -> Environment:
        return Environment()

    @abstractmethod
    def fit(self, job: Job, env: Environment) -> list[dict]:
        """Train this node; returns the samples of the node's other processes."""


REGISTRY: Registry[type[Backend]] = Registry("--backend", "backend", group="ddlstudy.backends",
                                                base=Backend)
"""The backends by name: ddlstudy's own and those of installed plugins (entry points of the
group ``ddlstudy.backends``)."""
register = REGISTRY.register


def get_backend(name: str) -> Backend:
    return REGISTRY.named(name)()
