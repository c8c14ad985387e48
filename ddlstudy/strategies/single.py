"""One process, one model: the sequential baseline and torch's intra-op threads."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.models import build_model
from ddlstudy.strategies.base import Job, Strategy, register, train_epochs
from ddlstudy.training import (
    Trainer,
    make_loaders,
    make_scaler,
    plain_step,
    seed_everything,
)


def fit_one_model(job: Job, threads: int, loader_workers: int) -> None:
    """Train one model in this process with ``threads`` intra-op threads."""
    cfg, uc = job.cfg, job.cfg.usecase
    torch.set_num_threads(threads)
    seed_everything(uc.train.seed)
    model = build_model(uc.model, len(uc.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=uc.train.momentum)
    train_loader, val_loader = make_loaders(cfg, job.data, loader_workers=loader_workers)
    step = plain_step(model, optimizer, nn.CrossEntropyLoss(), cfg.accumulate,
                      make_scaler(cfg.precision))
    trainer = Trainer(model, step, train_loader, val_loader, max_steps=cfg.max_steps,
                      show_progress=job.show_progress)
    train_epochs(job, trainer, optimizer)


@register
class Sequential(Strategy):
    name = "sequential"
    resumable = True
    accumulates = True
    summary = ("the baseline: one process, one intra-op thread, data loaded in that process; "
               "every speedup is measured against it")

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        return {"processes": 1, "threads_per_process": 1, "loader_workers": 0}

    def fit(self, job: Job) -> None:
        # By definition the baseline decodes its own data: no loader workers.
        fit_one_model(job, threads=1, loader_workers=0)


@register
class CpuIntraOp(Strategy):
    name = "cpu-intraop"
    resumable = True
    accumulates = True
    summary = ("one process, one model, torch's intra-op threads over all cores "
               "(the paper's CPU single-process)")
    flags = "--workers N (threads, default: all usable cores), --loader-workers"

    def layout(self, cfg: RunConfig) -> dict[str, Any]:
        return {"processes": 1, "threads_per_process": self.workers(cfg),
                "loader_workers": cfg.loader_workers}

    def fit(self, job: Job) -> None:
        fit_one_model(job, threads=self.workers(job.cfg), loader_workers=job.cfg.loader_workers)
