"""One process, one model: the sequential baseline and torch's intra-op threads."""

from __future__ import annotations

import torch
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.strategies.base import Layout, Strategy, register
from ddlstudy.training import Job, Link, make_loaders, make_scaler, plain_step
from ddlstudy.training.worker import new_model, new_optimizer, train_worker


def fit_one_model(job: Job, threads: int, loader_workers: int) -> None:
    """Train one model in this process with ``threads`` intra-op threads."""
    cfg = job.cfg
    torch.set_num_threads(threads)
    model = new_model(cfg)
    optimizer = new_optimizer(model.parameters(), cfg)
    train, val = make_loaders(cfg, job.data, loader_workers=loader_workers)
    step = plain_step(model, optimizer, nn.CrossEntropyLoss(), cfg.accumulate,
                      make_scaler(cfg.precision))
    train_worker(job, Link.alone(), model, optimizer, step, train, val)


@register
class Sequential(Strategy):
    name = "sequential"
    resumable = True
    accumulates = True

    def layout(self, cfg: RunConfig) -> Layout:
        return Layout(loader_workers=0)

    def fit(self, job: Job) -> None:
        # By definition the baseline decodes its own data: no loader workers.
        fit_one_model(job, threads=1, loader_workers=0)


@register
class CpuIntraOp(Strategy):
    name = "cpu-intraop"
    options = ("workers",)
    resumable = True
    accumulates = True

    def layout(self, cfg: RunConfig) -> Layout:
        return Layout(threads_per_process=self.workers(cfg), loader_workers=cfg.loader_workers)

    def fit(self, job: Job) -> None:
        fit_one_model(job, threads=self.workers(job.cfg), loader_workers=job.cfg.loader_workers)
