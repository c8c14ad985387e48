"""What a pipeline's stages exchange besides their micro-batches: the replicas of a stage
average its gradients (hybrid: ``replica_exchange``, through this host's shared memory where
it can), an MPI node's stages hand the whole model's to its leader and back
(``node_exchange``), and every stage sends its weights to rank 0 to validate and save
(``gather_weights``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddlstudy.models.cuts import Layers
from ddlstudy.training import shm
from ddlstudy.training.flat import average, check_views, flat_gradients, param_ranges
from ddlstudy.training.job import Link


def rank_module(layers: Layers, starts: list[int], rank: int, stages: int) -> nn.Module:
    """What pipeline rank ``rank`` of ``stages`` trains: stage ``rank`` of the model cut at
    ``starts``, or under an interleaved schedule (more starts than ranks) each stage
    ``rank``, ``rank + stages``, ... (a ModuleList)."""
    mine = range(rank, len(starts), stages)
    if len(mine) == 1:
        return layers.stage(starts, rank)
    return nn.ModuleList(layers.stage(starts, q) for q in mine)


class Exchange(NamedTuple):
    """What a stage does with its gradients between its backward passes and its optimizer
    step: ``run`` the exchange; ``zero`` them before the next step (None: the stage has
    nothing to exchange, the optimizer zeroes them); ``transport``, how they move within
    the node (``shm.SHARED`` or a group's backend)."""
    run: Callable[[], None]
    zero: Callable[[], None] | None = None
    transport: str | None = None


def replica_exchange(full: nn.Module, module: nn.Module, layers: Layers,
                     starts: list[int], rank: int, replicas: int, data_group,
                     stages: int = 0, shared: bool = False) -> Exchange:
    """A stage alone on its node: its replicas average its gradients, one buffer of which
    every gradient is a view, through this host's shared memory where ``shared`` and
    every replica maps it (``training.shm``), else one all-reduce over ``data_group``."""
    params = list(module.parameters())
    if replicas == 1 or not params:
        return Exchange(lambda: None)
    memory = shm.HostMemory.join(rank // stages, replicas, sum(p.numel() for p in params),
                                 data_group) if shared else None
    if memory is not None:
        return Exchange(memory.average, flat_gradients(module, memory.buffer).zero_,
                        shm.SHARED)
    flat = flat_gradients(module)
    return Exchange(lambda: average(flat, data_group, replicas), flat.zero_,
                    dist.get_backend(data_group))


def transport_of(group) -> str:
    """How a pipeline's stages send: ``shm.SHARED``, or the group's backend (gloo
    where the shared-memory backend fell back to it)."""
    if isinstance(group, shm.HostPipes):
        return shm.SHARED
    backend = dist.get_backend(group)
    return shm.GLOO if backend == shm.PIPES_BACKEND else backend


def gather_weights(full: nn.Module | None, layers: Layers, starts: list[int],
                   rank: int, world: int) -> None:
    """Send every stage's parameters and floating-point buffers (BatchNorm's running
    statistics: each stage owns its own) to rank 0, which loads them into its whole
    model (``world``: the pipeline's ranks; each sends all of its stages')."""
    for other in range(1, world):
        module = rank_module(layers, starts, other, world)
        state = [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]
        if not state or rank not in (0, other):
            continue
        flat = torch.cat([t.detach().flatten() for t in state])
        if rank == other:
            dist.send(flat, dst=0)
        else:
            dist.recv(flat, src=other)
            with torch.no_grad():
                torch._foreach_copy_(state, [part.view_as(t) for part, t in zip(
                    flat.split([t.numel() for t in state]), state, strict=True)])


def node_exchange(node: Link, full: nn.Module, module: nn.Module, layers: Layers,
                  starts: list[int], rank: int, replicas: int, data_group, stages: int,
                  shared: bool = False) -> Exchange:
    """An MPI node's exchange after every step's backward passes, and the zeroing of this
    rank's gradients before them. Every gradient is a view of one buffer of the whole
    model's, where each stage's part is one contiguous range (parameters in layer order);
    a rank of ``stages`` holds one stage, or under an interleaved schedule several.

    Where ``shared`` and every process of the node maps it, the buffers are this host's
    shared memory, a whole model's for each replica (``_through_memory``): the leader sees
    every stage's gradients where backward left them. Else, over gloo: the replicas of this
    rank average its ranges; the first pipeline's ranks send theirs to the leader (rank 0
    of pipeline 0), which averages the whole buffer between the nodes and sends each range
    back; the replicas then take them from the first pipeline.
    """
    replica, index = divmod(rank, stages)
    ranges = _stage_ranges(full, layers, starts)
    memory = shm.HostMemory.join(rank, replicas * stages, sum(
        p.numel() for p in full.parameters()), slots=replicas) if shared else None
    flat = flat_gradients(full, None if memory is None else memory.slots[replica])
    if memory is not None:
        dist.barrier()  # every rank zeroed its replica's whole slot before any backward
    mine = [flat[lo:hi] for lo, hi in ranges[index::stages] if hi > lo]

    def zero() -> None:
        for part in mine:
            part.zero_()

    if memory is not None:
        return Exchange(_through_memory(node, full, memory, ranges[index::stages], replica),
                        zero, shm.SHARED)
    others = [(q % stages, flat[lo:hi]) for q, (lo, hi) in enumerate(ranges)
              if q % stages and hi > lo]
    count = 0

    def exchange() -> None:
        nonlocal count
        if count == 0:
            check_views(full, flat)
        for part in mine if replicas > 1 else ():
            average(part, data_group, replicas)  # this rank's over the node's replicas
        if node.nodes.average is not None:  # the leader
            for source, part in others:
                dist.recv(part, src=source)
            node.nodes.average(flat, count)
            for source, part in others:
                dist.send(part, dst=source)
        elif replica == 0:
            for part in mine:
                dist.send(part, dst=0)
            for part in mine:
                dist.recv(part, src=0)
        for part in mine if replicas > 1 else ():
            dist.broadcast(part, src=index, group=data_group)  # from pipeline 0's rank
        count += 1

    return Exchange(exchange, zero, dist.get_backend())


def _stage_ranges(full: nn.Module, layers: Layers, starts: list[int]) -> list[tuple[int, int]]:
    """Each stage's (start, end) in the whole model's flat buffer."""
    offsets = param_ranges(full)
    ranges = []
    for s in range(len(starts)):
        spans = sorted(offsets[id(p)] for p in layers.stage(starts, s).parameters())
        lo, hi = (spans[0][0], spans[-1][1]) if spans else (0, 0)
        if sum(b - a for a, b in spans) != hi - lo:
            raise RuntimeError(f"stage {s}'s parameters are not one range of the buffer")
        ranges.append((lo, hi))
    return ranges


def _through_memory(node: Link, full: nn.Module, memory: shm.HostMemory,
                    mine: list[tuple[int, int]], replica: int) -> Callable[[], None]:
    """The node's exchange in shared memory: slot r holds replica r's whole model. After
    a barrier (every backward done), rank (r, s) puts the mean over the replicas of the
    r-th share of its ranges into slot 0; the leader averages slot 0 between the nodes;
    then each rank copies its share of slot 0 into the other slots. Barriers (gloo's few
    small messages) order each step; nothing but the nodes' own exchange moves a byte."""
    slots, replicas = memory.slots, len(memory.slots)
    shares = [(lo + (hi - lo) * replica // replicas, lo + (hi - lo) * (replica + 1) // replicas)
              for lo, hi in mine]
    count = 0

    def exchange() -> None:
        nonlocal count
        if count == 0:
            check_views(full, slots[replica])
        dist.barrier()  # every stage's gradients are in its replica's slot
        if replicas > 1:
            for lo, hi in shares:
                memory.mean_into(0, lo, hi)
            dist.barrier()
        if node.nodes.average is not None:  # the leader
            node.nodes.average(slots[0], count)
        dist.barrier()  # slot 0 holds the nodes' mean
        if replicas > 1:
            for lo, hi in shares:
                memory.copy_out(0, lo, hi)
            dist.barrier()  # before anyone's next backward writes its slot
        count += 1

    return exchange
