"""The worker of cpu-threads: k model replicas in one process, one Python thread each.

A global batch (this worker's slice of it, among several nodes) of n images is split into k
sub-batches; thread i runs forward and backward on replica i (torch releases the GIL
inside its kernels, so the threads really run side by side). Each sub-batch's loss is
weighted by its share of the batch, so the summed replica gradients are exactly the
batch's mean gradient; replica 0 takes the optimizer step, and the others take its weights
before the next batch. Each replica draws its dropout masks from a generator of its own
(``own_dropout``): from torch's one global generator they came in whatever order the
threads reached it, so a run's losses moved with the machine's timing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from ddlstudy.training.flat import exchange_step, flat_gradients
from ddlstudy.training.job import Job, Link
from ddlstudy.training.loaders import make_loaders
from ddlstudy.training.steps import Batch, micro_batches
from ddlstudy.training.worker import new_model, new_optimizer, train_worker


class OwnDropout(nn.Dropout):
    """``nn.Dropout`` drawing its masks from ``generator`` (the same distribution: each
    element kept with probability 1 - p and scaled by 1 / (1 - p))."""

    def __init__(self, p: float, generator: torch.Generator) -> None:
        super().__init__(p)
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.empty_like(x).bernoulli_(1 - self.p, generator=self.generator)
        return x * keep / (1 - self.p)


def own_dropout(replicas: list[nn.Module]) -> None:
    """Give replica i's dropout layers a generator of its own, seeded from torch's seed and
    i, so that the threads' masks do not depend on which thread draws first."""
    base = torch.initial_seed()
    for i, replica in enumerate(replicas):
        generator = torch.Generator().manual_seed((base * 1_000_003 + i + 1) % 2**63)
        for name, module in list(replica.named_modules()):
            if type(module) is nn.Dropout:
                parent = replica.get_submodule(name.rpartition(".")[0])
                own = OwnDropout(module.p, generator).train(module.training)
                setattr(parent, name.rpartition(".")[2], own)


def replica_grads(replicas: list[nn.Module], loss_fn: nn.Module, pool: ThreadPoolExecutor
                  ) -> Callable[..., tuple[float, int, int]]:
    """``grads(batch, scale=1)``: forward and backward of a batch split over ``replicas``,
    one thread each, after the other replicas took replica 0's weights (which an optimizer
    step, a resume or a weight average may have changed); the gradients summed into
    replica 0's (in place: they are views of a flat buffer), each slice's loss weighted by
    its share of the batch (x ``scale``). The caller zeroes replica 0's gradients and
    steps."""
    if len(replicas) > 1:  # one replica draws from torch's generator, as the baseline does
        own_dropout(replicas)
    params = [list(r.parameters()) for r in replicas]

    def work(i: int, images: torch.Tensor, labels: torch.Tensor, total: int,
             autocast: tuple[bool, torch.dtype], scale: float):
        with torch.autocast("cpu", dtype=autocast[1], enabled=autocast[0]):  # thread-local
            logits = replicas[i](images)
            loss = loss_fn(logits, labels)
        (loss * (scale * labels.numel() / total)).backward()
        return loss.item() * labels.numel(), int((logits.argmax(1) == labels).sum())

    def grads(batch: Batch, scale: float = 1.0) -> tuple[float, int, int]:
        images, labels = batch
        total = labels.numel()
        parts = micro_batches(images, labels, len(replicas))
        sync_replicas(replicas)
        for r in replicas[1:]:
            r.zero_grad(set_to_none=True)
        autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        results = list(pool.map(lambda a: work(a[0], *a[1], total, autocast, scale),
                                enumerate(parts)))
        grads0 = [p.grad for p in params[0]]
        for i in range(1, len(parts)):
            torch._foreach_add_(grads0, [p.grad for p in params[i]])
        return sum(r[0] for r in results), sum(r[1] for r in results), total

    return grads


def sync_replicas(replicas: list[nn.Module]) -> None:
    """Copy replica 0's weights to the others."""
    with torch.no_grad():
        first = list(replicas[0].parameters())
        for other in replicas[1:]:
            torch._foreach_copy_(list(other.parameters()), first)


def train_replicas(job: Job, link: Link, device: torch.device, k: int) -> None:
    """Train ``k`` replicas of the model in this process, one thread each, on this
    worker's slice of every batch, averaged over ``link``."""
    cfg = job.cfg
    model = new_model(cfg, None if link.world == 1 else link.rank, device)
    replicas = [model] + [copy.deepcopy(model) for _ in range(k - 1)]
    optimizer = new_optimizer(model.parameters(), cfg)
    flat = flat_gradients(model)
    train, val = make_loaders(cfg, job.data, shard=link.shard)
    timer = link.attach(model, flat, train)
    with ThreadPoolExecutor(k, thread_name_prefix="replica") as pool:
        grads = replica_grads(replicas, nn.CrossEntropyLoss(), pool)
        step = exchange_step(model, optimizer, flat, link, cfg.global_batch, 1, timer,
                             local=grads)
        train_worker(job, link, model, optimizer, step, train, val, device=device)
