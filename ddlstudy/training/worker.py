"""A worker's set-up, written once for every strategy and backend: its model (the same
initial weights everywhere), its optimizer (the use case's: ``recipe``), and its epochs
(a Trainer over its step, run by ``train_epochs`` with its ``Link`` to the others)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ddlstudy.config import RunConfig
from ddlstudy.machine.environment import mark_phase
from ddlstudy.models import build_model
from ddlstudy.models.checkpointing import checkpoint_blocks
from ddlstudy.models.trained import load_initial
from ddlstudy.records.memory import node_share
from ddlstudy.training import memory, recipe
from ddlstudy.training.job import Job, Link, States, train_epochs
from ddlstudy.training.loaders import val_loader
from ddlstudy.training.loop import Trainer
from ddlstudy.training.steps import Batch, StepFn, seed_everything


def new_model(cfg: RunConfig, rank: int | None = None,
              device: torch.device | None = None) -> nn.Module:
    """The use case's model with the seeded initial weights every worker shares; with
    ``rank``, torch's generator is then reseeded so that each data-parallel worker draws
    its own dropout masks and flips (the one-model strategies keep the baseline's stream)."""
    uc = cfg.usecase
    seed_everything(uc.train.seed)
    model = build_model(uc.model, len(uc.classes), alongside=_compiler)
    if cfg.init_weights is not None:  # fine-tuning: weights of one's own (checked before)
        load_initial(model, cfg.init_weights)
    if cfg.checkpoint_activations:  # the blocks' forwards: names and weights unchanged
        checkpoint_blocks(model)
    if device is not None:
        model.to(device)
    if rank is not None:
        torch.manual_seed(uc.train.seed + rank)
    mark_phase("model")
    return model


def _compiler() -> None:
    """Import torch's compiler front end, which every torch optimizer imports as it is made
    and as it steps (1.0-1.3 s here, torch's largest part after torch itself): while the
    paper's model draws its weights on the other core (simple-big: 0.3 s), or at once. A
    rank forked from the warm server has it already."""
    import torch._dynamo  # noqa: F401


def new_optimizer(params: Iterable[nn.Parameter], cfg: RunConfig, zero: bool = False,
                  group: dist.ProcessGroup | None = None) -> torch.optim.Optimizer:
    """The use case's optimizer (the paper's SGD with momentum unless ``[train] optimizer``
    names another: ``recipe``), at the run's effective learning rate; with ``zero``, its
    state sharded over ``group`` (default: the default process group; ZeRO-1: each rank
    steps its share of the weights, then every rank broadcasts its share, one bucket a
    rank)."""
    return recipe.optimizer(params, cfg.usecase.train, cfg.lr, zero, group)


def train_worker(job: Job, link: Link, model: nn.Module, optimizer: torch.optim.Optimizer,
                 step: StepFn, train: Iterable[Batch], val: Iterable[Batch], *,
                 device: torch.device | None = None,
                 before_eval: Callable[[], None] = lambda: None, whole: bool = True,
                 states: States | None = None) -> None:
    """The epochs of one worker (``model``: what it validates); worker 0 shows progress
    and writes the run folder. Before every validation, where the backend averages
    weights (``link.nodes.settle``) they are averaged, and where every worker holds the whole
    model (``whole``: not a pipeline's stages) worker 0's buffers become everyone's
    (``same_buffers``); a step that times its exchange has its figures recorded once
    training ends (``record_exchange``). Where the workers' weights differ
    (``link.nodes.exact`` false), ``val`` gives way to worker 0's model on the whole
    validation set, split among the workers that hold its weights (``link.peers``).
    ``states``: how its model and optimizer are snapshot (``train_epochs``)."""
    cuda = device is not None and device.type == "cuda"
    if whole and not link.nodes.exact:  # each worker's own weights: worker 0's validated
        val = [] if link.peers is None else val_loader(job.cfg, job.data, link.peers)
    own, settle = before_eval, link.nodes.settle
    buffers = [b for b in model.buffers() if b.is_floating_point()]

    def before_eval() -> None:
        if settle is not None:
            settle(model, None)
        if whole and link.world > 1 and buffers:
            same_buffers(buffers, link)
        own()

    memory.steady_heap(job.cfg.heap == "keep")  # trains from its first step as it ends
    peak_method = memory.reset_peak(device)  # set-up done: its peak is not training's
    setup_rss, setup_shared = memory.resident(), memory.shared_resident()
    setup_faults = memory.minor_faults()
    trainer = Trainer(model, step, train, val, max_steps=job.cfg.max_steps,
                      warmup_steps=job.cfg.warmup_steps,
                      show_progress=job.show_progress and link.rank == 0, reduce=link.sum,
                      before_eval=before_eval, device=device,
                      classes=len(job.cfg.usecase.classes),
                      sync=torch.cuda.synchronize if cuda else (lambda: None))
    train_epochs(job, trainer, optimizer, rank=link.rank, writer=link.rank == 0,
                 gather=link.gather, barrier=link.barrier, states=states)
    if link.world > 1 and hasattr(step, "times"):
        record_exchange(job, link, step)
    record_memory(job, link, memory.record(peak_method, model, optimizer, setup_rss,
                                                  setup_shared, device,
                                                  trainer.activation_bytes, setup_faults))


def record_memory(job: Job, link: Link, mine: dict) -> None:
    """Every worker's peak resident memory and counted bytes on the manifest
    (``backend.memory``): per process, and summed per host. A collective."""
    everyone = link.gather({"rank": link.rank, "host": socket.gethostname(), **mine})
    if everyone is None or link.rank != 0:
        return
    hosts: dict[str, int] = {}
    for row in everyone:
        hosts[row["host"]] = hosts.get(row["host"], 0) + node_share(row)
    record(job, "memory", {
        "per_rank": everyone, "peak_rss_bytes": max(r["peak_rss_bytes"] for r in everyone),
        "per_host_bytes": hosts,
        "note": "peak_rss_bytes: the most any one process held resident while training "
                "(shared memory included); per_host_bytes: the sum of its processes' peaks, "
                "each process's shared memory (shmem_bytes, the node's collectives' buffers "
                "in /dev/shm, as at the end of training) counted by its share "
                "(shmem_pss_bytes), so that the node counts those pages once (an upper "
                "bound: the processes need not peak at once); held_bytes: counted from the "
                "process's own tensors; setup_rss_bytes: resident once set up, before the "
                "first step (of which setup_file_bytes are files' pages, shared with the "
                "node's other processes; end_file_bytes: the files' pages at the end); "
                "training_faults: the pages the process faulted in while training (--heap)"})


def same_buffers(buffers: list[torch.Tensor], link: Link) -> None:
    """Worker 0's buffers on every worker (DDP's rule: they are the model's). BatchNorm's
    running statistics are used only to validate, so that is where they must agree; each
    worker's are updated by its own batches in between."""
    if link.broadcast is None:
        raise RuntimeError("the backend's Link has no broadcast, and the model has buffers "
                           "(BatchNorm's running statistics) that every worker must share")
    flat = torch.cat([b.detach().reshape(-1) for b in buffers])
    link.broadcast(flat)
    with torch.no_grad():
        torch._foreach_copy_(buffers, [part.view_as(b) for part, b in zip(
            flat.split([b.numel() for b in buffers]), buffers, strict=True)])


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
