"""A worker's set-up, written once for every strategy and backend: its model (the same
initial weights everywhere), its optimizer (the paper's SGD with momentum), and its epochs
(a Trainer over its step, run by ``train_epochs`` with its ``Link`` to the others)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

import torch
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.models import build_model
from ddlstudy.training.job import Job, Link, train_epochs
from ddlstudy.training.loop import Trainer
from ddlstudy.training.steps import Batch, StepFn, seed_everything


def new_model(cfg: RunConfig, rank: int | None = None,
              device: torch.device | None = None) -> nn.Module:
    """The use case's model with the seeded initial weights every worker shares; with
    ``rank``, torch's generator is then reseeded so that each data-parallel worker draws
    its own dropout masks and flips (the one-model strategies keep the baseline's stream)."""
    uc = cfg.usecase
    seed_everything(uc.train.seed)
    model = build_model(uc.model, len(uc.classes))
    if device is not None:
        model.to(device)
    if rank is not None:
        torch.manual_seed(uc.train.seed + rank)
    return model


def new_optimizer(params: Iterable[nn.Parameter], cfg: RunConfig) -> torch.optim.Optimizer:
    """The paper's SGD with momentum, at the run's effective learning rate."""
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.usecase.train.momentum)


def train_worker(job: Job, link: Link, model: nn.Module, optimizer: torch.optim.Optimizer,
                 step: StepFn, train: Iterable[Batch], val: Iterable[Batch], *,
                 device: torch.device | None = None,
                 before_eval: Callable[[], None] = lambda: None) -> None:
    """The epochs of one worker (``model``: what it validates); worker 0 shows progress
    and writes the run folder. Where the backend averages weights (``link.settle``) they
    are averaged before every validation; a step that times its exchange has its figures
    recorded once training ends (``record_exchange``)."""
    cuda = device is not None and device.type == "cuda"
    if link.settle is not None:
        own, settle = before_eval, link.settle

        def before_eval() -> None:
            settle(model, None)
            own()

    trainer = Trainer(model, step, train, val, max_steps=job.cfg.max_steps,
                      show_progress=job.show_progress and link.rank == 0, reduce=link.sum,
                      before_eval=before_eval, device=device,
                      sync=torch.cuda.synchronize if cuda else (lambda: None))
    train_epochs(job, trainer, optimizer, rank=link.rank, writer=link.rank == 0,
                 gather=link.gather, barrier=link.barrier)
    if link.world > 1 and hasattr(step, "times"):
        record_exchange(job, link, step)


def record_exchange(job: Job, link: Link, step: StepFn) -> None:
    """Every worker's compute and exchange seconds on the manifest (``backend.exchange``):
    where a step's time goes, and which worker the others wait for. A collective."""
    mine = {"rank": link.rank, "host": socket.gethostname(), **step.times}
    everyone = link.gather(mine)
    if everyone is not None and link.rank == 0:
        record(job, "exchange", {
            "per_rank": everyone,
            "note": "seconds over the run (since its last resume); exchange: from the end "
                    "of a step's backward to its averaged gradient, waiting for the slowest "
                    "worker included"})


def record(job: Job, key: str, value: dict) -> None:
    """Add what the backend measured to the manifest (the writer's ``backend`` section)."""
    if job.folder is not None:
        job.folder.manifest["backend"][key] = value
        job.folder.write_manifest()
