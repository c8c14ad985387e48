"""What a worker is handed (``Job``), how it reaches the other workers (``Link``), and the
epoch loop every strategy shares (``train_epochs``): resume, record, snapshot."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.data import DataPlan
from ddlstudy.machine import environment
from ddlstudy.records.runfolder import RunFolder
from ddlstudy.signals import deferred
from ddlstudy.training import recipe
from ddlstudy.training.loop import EpochResult, Trainer, log_epoch
from ddlstudy.training.steps import rng_state, set_rng_state

log = logging.getLogger("ddlstudy")

SNAPSHOT_FORMAT = 1


@dataclass
class Job:
    """What a strategy is handed: the config, the data it trains on, where results go, and
    the snapshot to continue from (``ddlstudy run --resume``)."""

    cfg: RunConfig
    data: DataPlan
    folder: RunFolder | None = None
    show_progress: bool = True
    resume: dict | None = None
    plan: Any = None
    """What the strategy prepared once on node 0 for every worker of every node (the
    pipeline's cuts: ``Strategy.prepare``), plain JSON values."""
    stop_file: str | None = None
    """A file whose appearance stops training at the next step, its snapshot written first
    (``signals.STOP_ENV``); None: nothing is watched."""


def _untimed(model: nn.Module, flat: torch.Tensor, train: Any) -> None:
    return None


@dataclass(frozen=True)
class Nodes:
    """The outer dimension of a worker's mesh: the run's nodes, crossed by the backend
    (MPI's reducers, Spark's tasks), never by torch.distributed. A node is one process or
    several; everything within a node is its processes' own process group (``Link.local``).
    """

    index: int = 0
    count: int = 1
    average: Callable[[torch.Tensor, int], None] | None = None
    """``average(flat, step)``, on the node's leader (its process 0) where the run has
    other nodes: its buffer averaged in place with theirs by the run's reducer (a node's
    gradients, a pipeline node's whole model's); None elsewhere."""
    exact: bool = True
    """Whether the average leaves every node the same weights (every reducer but MPI's
    step-wise). Where not, node 0's model is the run's (the one it saves): its processes
    validate it on the whole validation set (``Link.peers``), the others nothing."""
    attach: Callable[[nn.Module, torch.Tensor, Any], Any] = _untimed
    """``attach(model, flat, train)``: the backend's hooks on a worker's model, gradient
    buffer and training loader (MPI's buckets sent during backward, its throughput
    balance), called once the worker has them; returns what times each step's compute
    (``exchange_step``'s ``balancer``), or None."""
    settle: Callable[[nn.Module, int | None], None] | None = None
    """``settle(model, steps)``: where the nodes average weights rather than gradients
    (local SGD: Spark's allgather mode), called after every optimizer step with the steps
    done and before every validation with None."""


@dataclass(frozen=True)
class Link:
    """Where one training process stands among a run's workers, and how it reaches the
    others: what a backend hands a strategy's worker (``Strategy.worker``).

    The workers form a mesh of two dimensions the backend knows: ``nodes`` (the backend's
    own, between hosts) and each node's processes (``local``: this process's index among
    them and their number), which are this process's default torch.distributed group where
    there are several. A strategy lays its own dimensions over a node's processes
    (replicas x stages: ``training.pipeline``; shards x tensor: ``sharding.mesh_of``).

    Over every worker of the run: ``exchange(flat, step)`` averages the gradient buffer in
    place; ``sum`` adds per-worker counts; ``gather`` collects an object from every worker
    on worker 0 (None elsewhere); ``barrier`` waits for all; ``broadcast(tensor)`` puts
    worker 0's ``tensor`` on every worker, in place (a model's buffers, BatchNorm's running
    statistics: worker 0's are the model's, as in DDP), needed by a link of several
    workers whose model has buffers.
    """

    rank: int
    world: int
    exchange: Callable[[torch.Tensor, int], None]
    sum: Callable[..., list[float]]
    gather: Callable[[Any], list | None]
    barrier: Callable[[], None]
    broadcast: Callable[[torch.Tensor], None] | None = None
    local: tuple[int, int] = (0, 1)
    nodes: Nodes = Nodes()
    group: bool = False
    """Whether every worker of the run is in this process's default torch.distributed
    group and the backend takes no part in the exchange (local processes, Spark's gloo
    tasks): it is one all-reduce over the group, so a worker may average through this
    host's shared memory or let DDP do it in backward. Not MPI's nodes, even one node:
    their exchange goes through the run's reducer."""

    @classmethod
    def alone(cls) -> Link:
        """The only worker of a run: nothing to exchange, its own counts, itself."""
        return cls(0, 1, lambda flat, step: None, lambda *values: list(values),
                   lambda obj: [obj], lambda: None)

    @property
    def peers(self) -> tuple[int, int] | None:
        """This worker's place among those that hold worker 0's weights where the nodes'
        differ (index, count: node 0's processes), None for the others."""
        return self.local if self.nodes.index == 0 else None

    @property
    def attach(self) -> Callable[[nn.Module, torch.Tensor, Any], Any]:
        """The backend's hooks on a worker's model (``Nodes.attach``)."""
        return self.nodes.attach

    @property
    def shard(self) -> tuple[int, int] | None:
        """This worker's slice of every global batch (None: alone, all of it)."""
        return None if self.world == 1 else (self.rank, self.world)


@dataclass(frozen=True)
class States:
    """How a worker's model and optimizer go into a snapshot and come back from one: their
    own state dicts, or, where each process holds a part (sharded, tensor parallel), the
    whole gathered on the writer (``model`` and ``optimizer`` are then collectives)."""

    model: Callable[[], dict]
    optimizer: Callable[[], dict]
    load: Callable[[dict, dict], None]

    @classmethod
    def of(cls, model: nn.Module, optimizer: torch.optim.Optimizer) -> States:
        def load(model_state: dict, optimizer_state: dict) -> None:
            model.load_state_dict(model_state)
            optimizer.load_state_dict(optimizer_state)

        return cls(model.state_dict, optimizer.state_dict, load)


def train_epochs(job: Job, trainer: Trainer, optimizer: torch.optim.Optimizer, *,
                 rank: int = 0, writer: bool = True,
                 gather: Callable[[Any], list | None] = lambda obj: [obj],
                 barrier: Callable[[], None] = lambda: None,
                 states: States | None = None) -> None:
    """The epoch loop every strategy shares.

    Continues from ``job.resume`` when given (weights, optimizer, this rank's random
    states, the shuffling generator and the position in the epoch), records every epoch
    (``writer``: the rank that owns the run folder), and snapshots at every epoch end and
    every ``--snapshot-every`` steps. ``gather`` collects every rank's random states on the
    writer (a collective: every rank calls it at the same step), ``barrier`` ends an epoch;
    ``states``: how the model and optimizer are saved and loaded (default: their own state
    dicts). Where ``job.stop_file`` is watched, every rank asks after every step whether it
    appeared for any of them (``stop_asked``): then each writes its part of a snapshot at
    that step and its training ends there.
    """
    cfg = job.cfg
    trainer.precision = cfg.precision
    trainer.steady_seconds = cfg.steady_seconds
    schedule = recipe.schedule(optimizer, cfg.usecase.train, trainer.steps_per_epoch)
    states = states or States.of(trainer.model, optimizer)
    first = 1 if job.resume is None else resume(job.resume, trainer, states, schedule, rank)

    snapshot = _snapshots(job, states, schedule, gather, writer)
    every = cfg.snapshot_every if cfg.snapshot else None
    stop = stop_asked(job.stop_file, trainer.reduce)

    def after_step(epoch: int, step: int) -> None:
        if schedule is not None:
            advance(schedule, optimizer)
        snapped = bool(every and step % every == 0)
        if snapped:
            snapshot(epoch - 1, trainer.position())
        if stop():  # every rank at this step: its snapshot, then the end of its training
            if not snapped:
                snapshot(epoch - 1, trainer.position())
            raise _Stopped(f"stopped at epoch {epoch}, step {step}, its snapshot written")

    trainer.after_step = after_step
    try:
        for epoch in range(first, cfg.usecase.train.epochs + 1):
            result = trainer.train_epoch(epoch)
            # The epoch's record and its snapshot land together: a Ctrl-C or SIGTERM
            # between them would leave an epoch on record that --resume cannot continue
            # from.
            with deferred():
                if writer:
                    job_epoch(job, result, trainer.step_log)
                trainer.step_log = []
                if cfg.snapshot:
                    snapshot(epoch, {"generator": trainer.generator.get_state(),
                                     "sums": dict(trainer.sums)})
            barrier()
    except _Stopped as stopped:
        if writer:
            log.warning("%s, as %s asked", stopped, job.stop_file)


class _Stopped(Exception):
    """The run's stop file appeared (``Job.stop_file``): its snapshot is written."""


def stop_asked(path: str | None, reduce: Callable[..., list[float]]) -> Callable[[], bool]:
    """Whether the training stops at this step: ``path`` exists where any rank looks
    (``reduce`` sums over every rank: a collective each step, only where a file is
    watched, so that every rank stops at the same step)."""
    if path is None:
        return lambda: False
    return lambda: reduce(float(os.path.exists(path)))[0] > 0


def _snapshots(job: Job, states: States, schedule: torch.optim.lr_scheduler.LRScheduler | None,
               gather: Callable[[Any], list | None],
               writer: bool) -> Callable[[int, dict], None]:
    """``snapshot(epochs_done, position)``: a collective every rank calls at the same step;
    the writer saves the run's snapshot."""

    def snapshot(epochs_done: int, position: dict) -> None:
        # Every rank's own random states and running sums (each sums its slice).
        ranks = gather({"rng": rng_state(), "sums": position["sums"]})
        model, optim = states.model(), states.optimizer()  # every rank: may gather
        if writer and job.folder is not None:
            job.folder.save_snapshot({
                "format": SNAPSHOT_FORMAT, "epoch": epochs_done,
                "step": position["sums"]["steps"], "model": model, "optimizer": optim,
                "scheduler": None if schedule is None else schedule.state_dict(),
                "position": {"generator": position["generator"],
                             "sums": [r["sums"] for r in ranks]},
                "rng": [r["rng"] for r in ranks]})

    return snapshot


def resume(snapshot: dict, trainer: Trainer, states: States,
           schedule: torch.optim.lr_scheduler.LRScheduler | None, rank: int) -> int:
    """Continue from ``snapshot``: weights, optimizer, learning-rate schedule, this rank's
    random states and the position in the epoch. Returns the epoch to train first."""
    # A private copy: spawned ranks receive the snapshot's tensors in shared memory, and
    # the optimizer adopts its momentum buffers as they are; shared, every rank would
    # update the same buffers.
    snap = copy.deepcopy(snapshot)
    states.load(snap["model"], snap["optimizer"])
    if schedule is not None and snap.get("scheduler") is not None:
        schedule.load_state_dict(snap["scheduler"])
    set_rng_state(snap["rng"][rank])
    trainer.resume_epoch({"generator": snap["position"]["generator"],
                          "sums": snap["position"]["sums"][rank]})
    return snap["epoch"] + 1


def advance(schedule: torch.optim.lr_scheduler.LRScheduler,
            optimizer: torch.optim.Optimizer) -> None:
    """The schedule's next step, unless fp16's scaler skipped the optimizer's (an overflow,
    ``steps.optimizer_step``): the warm-up and the schedule count the steps that moved the
    weights."""
    if not getattr(optimizer, "skipped_step", False):
        schedule.step()


def job_epoch(job: Job, result: EpochResult, steps: list[tuple] = ()) -> None:
    """Log the epoch and append it (and its steps, as rank 0 saw them) to the run
    folder."""
    log_epoch(result, job.cfg.usecase.train.epochs)
    if job.folder is not None:
        job.folder.record_steps(steps)
        if result.first_step_s is not None:  # the first attempt's, not a resume's
            job.folder.manifest.setdefault("first_step_s", round(result.first_step_s, 2))
            job.folder.manifest.setdefault("startup", environment.startup())
        job.folder.record_epoch(result.as_dict(), result.confusion)
