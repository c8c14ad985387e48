"""The workers of the strategies that split a model's memory over a node's processes:
``sharded`` (FSDP2, with tensor parallelism inside on a 2-D mesh), ``zero`` (ZeRO-1)
and ``tensor`` (DTensor's tensor parallelism); ``strategies.sharded`` says what each holds.

Every process builds the whole model from the use case's seed first (on a CPU mesh torch's
random generator is not mesh-aware: initialising on the meta device would give every shard
the same values), then keeps its part. Snapshots hold the gathered, unsharded state
(``full_states``): a sharded run's snapshot is a plain model's state dict, ``export model``
loads it into plain PyTorch, and ``--resume`` scatters it back bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from ddlstudy.training.job import Job, Link, States
from ddlstudy.training.loaders import make_loaders
from ddlstudy.training.one_model import ddp_step, train_one_model
from ddlstudy.training.steps import plain_step
from ddlstudy.training.tensor_plan import pairs_in
from ddlstudy.training.worker import new_model, new_optimizer, record, train_worker

UNIT_SHARE = 0.05
"""A module of at least this share of the model's weights is a unit of its own (one
all-gather, one reduce-scatter); the smaller ones go with the root's."""

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Gathered on rank 0 (the writer), nothing elsewhere."""
SCATTER = StateDictOptions(full_state_dict=True)


def full_states(model: nn.Module, optimizer: torch.optim.Optimizer) -> States:
    """A sharded or tensor-parallel model's and optimizer's states, gathered unsharded on
    rank 0 for a snapshot (a collective) and scattered back from a snapshot."""

    def load(model_state: dict, optimizer_state: dict) -> None:
        set_model_state_dict(model, model_state, options=SCATTER)
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=SCATTER)

    return States(model=lambda: get_model_state_dict(model, options=FULL),
                  optimizer=lambda: get_optimizer_state_dict(model, optimizer, options=FULL),
                  load=load)


def shard_units(model: nn.Module, share: float = UNIT_SHARE) -> list[str]:
    """The modules FSDP2 shards as units of their own: those holding parameters directly
    and at least ``share`` of the model's weights (AlexNet's convolutions and Linear
    layers; any model's), innermost first as fully_shard wants them."""
    total = sum(p.numel() for p in model.parameters())
    return [name for name, module in reversed(list(model.named_modules())) if name and
            sum(p.numel() for p in module.parameters(recurse=False)) >= share * total]


def shard_model(model: nn.Module, mesh: DeviceMesh, precision: str = "fp32",
                reshard_after_forward: bool = True) -> list[str]:
    """FSDP2 over ``mesh``: each of ``shard_units`` a unit, then the root with the rest;
    bf16 through FSDP's mixed precision (bf16 weights gathered, float32 gradients
    reduced). Returns the units' names (the root's is "")."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    modules = dict(model.named_modules())
    units = [*shard_units(model), ""]
    for name in units:
        fully_shard(modules[name], mesh=mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward)
    return units


def mesh_of(link: Link, tensor: int) -> DeviceMesh:
    """The node's processes as a mesh: ("shard",) or, with ``tensor`` > 1, ("shard",
    "tensor"), tensor parallel among consecutive ranks."""
    shape = (link.world // tensor, tensor) if tensor > 1 else (link.world,)
    names = ("shard", "tensor")[:len(shape)]
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def tensor_parallel(model: nn.Module, mesh: DeviceMesh) -> list[tuple[str, str]]:
    """Each Linear pair split over ``mesh`` (column-wise, then row-wise); the pairs. A split
    layer's output is a view autograd must not see changed in place: the in-place
    activations (AlexNet's ReLU(inplace=True)) compute out of place, the same values."""
    pairs = pairs_in(model)
    for module in model.modules():
        if getattr(module, "inplace", False):
            module.inplace = False
    plan = {}
    for first, second in pairs:
        plan |= {first: ColwiseParallel(), second: RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    return pairs


def counted_once(link: Link, copies: int) -> Link:
    """``link`` whose sums count a batch seen by ``copies`` processes once (tensor
    parallel ranks each compute the whole of their group's slice)."""
    if copies == 1:
        return link
    return dataclasses.replace(link, sum=lambda *values: [v / copies for v in
                                                          link.sum(*values)])


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module):
    """FSDP2's no_sync: gradients kept unsharded and not reduced until the last
    micro-batch."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def train_sharded(job: Job, link: Link, device: torch.device,
                  loader_workers: int | None = None) -> None:
    """A node's process of ``sharded``: FSDP2 over the node's processes (on the mesh's
    shard dimension, tensor parallel on the other where --tensor is given)."""
    cfg = job.cfg
    tensor = cfg.tensor or 1
    mesh = mesh_of(link, tensor)
    dp_rank, dp = link.rank // tensor, link.world // tensor
    model = new_model(cfg, dp_rank, device)  # a tensor group shares its dropout masks
    if tensor > 1:
        tensor_parallel(model, mesh["tensor"])
    units = shard_model(model, mesh["shard"] if tensor > 1 else mesh, cfg.precision,
                        cfg.reshard_after_forward)
    optimizer = new_optimizer(model.parameters(), cfg)
    train, val = make_loaders(cfg, job.data, shard=(dp_rank, dp) if dp > 1 else None,
                              loader_workers=loader_workers)
    step = ddp_step(model, optimizer, nn.CrossEntropyLoss(), cfg.global_batch, dp, device,
                    cfg.accumulate, no_sync=lambda: _fsdp_no_sync(model))
    if link.rank == 0:
        record(job, "mesh", {"shard": dp, "tensor": tensor, "units": units})
    train_worker(job, counted_once(link, tensor), model, optimizer, step, train, val,
                 device=device, states=full_states(model, optimizer))


def train_zero(job: Job, link: Link, device: torch.device,
               loader_workers: int | None = None) -> None:
    """A node's process of ``zero``: cpu-processes' worker, its optimizer state sharded."""
    train_one_model(job, link, device, loader_workers, zero=True)


def train_tensor(job: Job, link: Link, device: torch.device,
                 loader_workers: int | None = None) -> None:
    """A node's process of ``tensor``: the whole batch, the Linear pairs split over the
    node's processes, everything else computed alike by each."""
    cfg = job.cfg
    mesh = init_device_mesh("cpu", (link.world,), mesh_dim_names=("tensor",))
    model = new_model(cfg, None, device)  # every process the baseline's dropout stream
    pairs = tensor_parallel(model, mesh)
    optimizer = new_optimizer(model.parameters(), cfg)
    train, val = make_loaders(cfg, job.data, shard=None, loader_workers=loader_workers)
    step = plain_step(model, optimizer, nn.CrossEntropyLoss(), cfg.accumulate)
    if link.rank == 0:
        record(job, "mesh", {"tensor": link.world, "pairs": [list(p) for p in pairs]})
    train_worker(job, counted_once(link, link.world), model, optimizer, step, train, val,
                 device=device, states=full_states(model, optimizer))

