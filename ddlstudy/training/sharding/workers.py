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
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
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

from ddlstudy.training import shm
from ddlstudy.training.job import Job, Link, States
from ddlstudy.training.loaders import make_loaders
from ddlstudy.training.one_model import ddp_step, train_one_model
from ddlstudy.training.sharding.plan import pairs_in
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


def arena_bytes(model: nn.Module, ranks: int) -> int:
    """The shared-memory arena sharded's ``ranks`` processes would gather and reduce
    ``model``'s units through (``shm.arena_bytes`` of the units ``shard_model``
    makes: ``shard_units``, then the root)."""
    modules = dict(model.named_modules())
    return shm.arena_bytes([modules[n] for n in [*shard_units(model), ""]], ranks)


def shard_model(model: nn.Module, mesh: DeviceMesh, precision: str = "fp32",
                reshard_after_forward: bool = True) -> list[str]:
    """FSDP2 over ``mesh``: each of ``shard_units`` a unit, then the root with the rest;
    after forward each unit but the last (the last in the model's order, the first
    ``shard_units`` names: backward gathers it again first) frees its gathered weights
    where ``reshard_after_forward`` (as torchtitan does for its last block);
    bf16 through FSDP's mixed precision (bf16 weights gathered, float32 gradients
    reduced). Returns the units' names (the root's is "")."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    modules = dict(model.named_modules())
    units = [*shard_units(model), ""]
    for name in units:  # the last unit's weights, needed again at once by backward, kept
        fully_shard(modules[name], mesh=mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward and name != units[0])
    return units


def mesh_of(processes: int, tensor: int, transport: str = "auto",
            device: torch.device | None = None) -> DeviceMesh:
    """The node's ``processes`` (its process group) as a mesh: ("shard",), or ("shard",
    "tensor") with ``tensor`` > 1, tensor parallel among consecutive ranks, or ("tensor",)
    where every process is in the tensor group. On GPUs NCCL's groups; on CPU, with
    ``transport`` auto, each dimension's groups move their collectives through this host's
    shared memory (``training.shm``: every process of a node runs on its host), else
    gloo's."""
    if tensor in (1, processes):
        shape, names = (processes,), ("shard" if tensor == 1 else "tensor",)
    else:
        shape, names = (processes // tensor, tensor), ("shard", "tensor")
    kind = "cpu" if device is None else device.type
    if transport != "auto" or processes == 1 or kind != "cpu":
        return init_device_mesh(kind, shape, mesh_dim_names=names)
    ranks = torch.arange(processes).view(shape)
    groups = []
    for dim in range(len(shape)):  # every process makes every group, in the same order
        lines = ranks.movedim(dim, -1).reshape(-1, shape[dim]).tolist()
        made = [shm.new_group(ranks=line) for line in lines]
        groups.append(next(g for g, line in zip(made, lines, strict=True)
                           if dist.get_rank() in line))
    return DeviceMesh.from_group(groups if len(groups) > 1 else groups[0], "cpu", mesh=ranks,
                                 mesh_dim_names=names)


def transport_of(mesh: DeviceMesh) -> str:
    """How the mesh's collectives travel: the manifest's ``transport``."""
    if mesh.device_type == "cuda":
        return "nccl"
    shared = all(shm.is_shared(mesh.get_group(d)) for d in range(mesh.ndim))
    return shm.SHARED if shared and mesh.size() > 1 else shm.GLOO


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


def between_nodes(link: Link, params: list[nn.Parameter]) -> Callable[[int], None] | None:
    """Where the run's nodes are several (MPI ranks leading nodes of processes): each
    process's local gradients (its shards) averaged with the same shards of every other
    node, HSDP's exchange. The node's shards meet on its leader, each received straight
    into its place in one buffer of the node's whole gradient (the leader holds that one
    copy more, no other), which the leaders average by the run's reducer
    (``link.nodes.average``) and hand back; None on a run of one node."""
    k = dist.get_world_size()
    if link.world == k:
        return None
    leader = dist.get_rank() == 0

    def exchange(step: int) -> None:
        local = [getattr(p.grad, "_local_tensor", p.grad) for p in params]
        mine = sum(g.numel() for g in local)
        on = local[0].device  # NCCL's collectives take the GPU's tensors
        sizes = [torch.zeros(1, dtype=torch.int64, device=on) for _ in range(k)]
        dist.all_gather(sizes, torch.tensor([mine], device=on))
        counts = [int(n) for n in sizes]
        if leader:  # a node of one process averages through the link's own exchange
            dtype = functools.reduce(torch.promote_types, (g.dtype for g in local))
            whole = torch.empty(sum(counts), dtype=dtype, device=local[0].device)
            parts = whole.split(counts)
            flat = torch.cat([g.reshape(-1) for g in local], out=parts[0])
            for src in range(1, k):
                dist.recv(parts[src], src=src)
            link.nodes.average(whole, step)
            for dst in range(1, k):
                dist.send(parts[dst], dst=dst)
        else:
            flat = torch.cat([g.reshape(-1) for g in local])
            dist.send(flat, dst=0)
            dist.recv(flat, src=0)
        torch._foreach_copy_(local, [part.view_as(g) for part, g in zip(
            flat.split([g.numel() for g in local]), local, strict=True)])

    return exchange


Worker = Callable[[Job, Link, torch.device, "int | None"], None]


def in_node_group(work: Worker) -> Worker:
    """``work`` in its node's process group, or, for a node of one process (an MPI rank
    alone, or --workers 1), in a group of this process alone: a mesh and a sharded
    optimizer need one."""

    @functools.wraps(work)
    def run(job: Job, link: Link, device: torch.device,
            loader_workers: int | None = None) -> None:
        if dist.is_initialized():
            return work(job, link, device, loader_workers)
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1, device_id=device if cuda else None)
        try:
            return work(job, link, device, loader_workers)
        finally:
            dist.destroy_process_group()

    return run


@in_node_group
def train_sharded(job: Job, link: Link, device: torch.device,
                  loader_workers: int | None = None) -> None:
    """A process of ``sharded``: FSDP2 over its node's processes (on the mesh's shard
    dimension, tensor parallel on the other where --tensor is given); between nodes,
    each shard averaged by the run's reducer (HSDP)."""
    cfg = job.cfg
    tensor = cfg.tensor or 1
    mesh = mesh_of(dist.get_world_size(), tensor, cfg.transport, device)
    dp_rank, dp = link.rank // tensor, link.world // tensor
    model = new_model(cfg, dp_rank, device)  # a tensor group shares its dropout masks
    if tensor > 1:
        tensor_parallel(model, mesh["tensor"])
    shards = mesh["shard"] if tensor > 1 else mesh
    units = shard_model(model, shards, cfg.precision, cfg.reshard_after_forward)
    arena = shm.share_buffers(model, shards.get_group()) \
        if cfg.shared_buffers and tensor == 1 else None  # a 2-D mesh: FSDP's own buffers
    optimizer = new_optimizer(model.parameters(), cfg)
    train, val = make_loaders(cfg, job.data, shard=(dp_rank, dp) if dp > 1 else None,
                              loader_workers=loader_workers)
    step = ddp_step(model, optimizer, nn.CrossEntropyLoss(), cfg.global_batch, dp, device,
                    cfg.accumulate, no_sync=lambda: _fsdp_no_sync(model),
                    between=between_nodes(link, list(model.parameters())))
    if link.rank == 0:
        record(job, "mesh", {"shard": dist.get_world_size() // tensor, "tensor": tensor,
                             "nodes": link.world // dist.get_world_size(), "units": units,
                             "transport": transport_of(mesh),
                             "buffers": "own" if arena is None else "shared-memory"})
    train_worker(job, counted_once(link, tensor), model, optimizer, step, train, val,
                 device=device, states=full_states(model, optimizer))


@in_node_group
def train_zero(job: Job, link: Link, device: torch.device,
               loader_workers: int | None = None) -> None:
    """A node's process of ``zero``: cpu-processes' worker, its optimizer state sharded."""
    train_one_model(job, link, device, loader_workers, zero=True)


@in_node_group
def train_tensor(job: Job, link: Link, device: torch.device,
                 loader_workers: int | None = None) -> None:
    """A process of ``tensor``: its node's slice of every batch (all of it on one node),
    the Linear pairs split over the node's processes, everything else computed alike by
    each; between nodes, every process's gradients averaged with its twins'."""
    cfg = job.cfg
    k = dist.get_world_size()
    nodes, node = link.world // k, link.rank // k
    model = new_model(cfg, None if nodes == 1 else node, device)  # one stream a node
    mesh = mesh_of(k, k, cfg.transport, device)
    pairs = tensor_parallel(model, mesh)
    optimizer = new_optimizer(model.parameters(), cfg)
    train, val = make_loaders(cfg, job.data, shard=(node, nodes) if nodes > 1 else None,
                              loader_workers=loader_workers)
    step = ddp_step(model, optimizer, nn.CrossEntropyLoss(), cfg.global_batch, nodes, device,
                    cfg.accumulate, no_sync=contextlib.nullcontext,
                    between=between_nodes(link, list(model.parameters())))
    if link.rank == 0:
        record(job, "mesh", {"tensor": k, "nodes": nodes, "pairs": [list(p) for p in pairs],
                             "transport": transport_of(mesh)})
    train_worker(job, counted_once(link, k), model, optimizer, step, train, val,
                 device=device, states=full_states(model, optimizer))
