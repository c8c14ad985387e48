"""FSDP2's all-gather and reduce-scatter with their buffers in this host's shared memory
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``), for a shard group
that is a ``collectives`` group.

FSDP asks its comm for the buffer first (``allocate``), copies into it, then calls the
collective. Here the buffers are blocks of one more shared file of the group's ranks (the
arena), at the same offset on every rank:

- all-gather: the output is one block that every rank sees; each rank's copy-in writes its
  own part of it, so the collective is a barrier, with nothing copied through the slots,
  and FSDP's copy-out reads the gathered weights from the block.
- reduce-scatter: each rank's input is its own part of a block of ``ranks`` inputs; after a
  barrier rank r adds up the r-th piece of every rank's input, in rank order, straight into
  its output (a private tensor: FSDP keeps the sharded gradients in it). The same kernels
  in the same order as ``slots``' reduce-scatter: the same bits.

A block's bytes are reused only when every rank is done with them: a rank takes a block
only once its own tensors of the block's last use are gone (an all-gather's output lives
until FSDP's copy-out, a reduce-scatter's input until the collective returns), and the
ranks meet at a barrier (checking they took the same block) before writing into it. Where
the arena has no room, the buffer is a private tensor and the collective the group's own,
on every rank alike.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ddlstudy.training.shm import collectives
from ddlstudy.training.shm.average import HEADER
from ddlstudy.training.shm.slots import _combine

ALIGN = 4096
"""Blocks start on a page."""


class Arena:
    """First fit over the file's bytes after its token's page; every rank takes and frees
    the same blocks in the same order, so they lie at the same offsets everywhere."""

    def __init__(self, group: collectives.HostColl, total: int) -> None:
        self.group, self.total = group, total
        self.shared = group.open_file(HEADER + total, "ddlstudy-fsdp", "FSDP's buffers")
        self._held: dict[int, tuple[int, weakref.ref | None]] = {}  # offset: bytes, owner

    def take(self, nbytes: int, what: str) -> tuple[int | None, torch.Tensor | None]:
        """A block of ``nbytes`` (offset and the tensor of its bytes), or (None, None)
        where there is no room; a barrier of the ranks, which took the same."""
        self._held = {o: (n, ref) for o, (n, ref) in self._held.items()
                      if ref is not None and ref() is not None}
        at = self._fit(nbytes) if self.shared is not None else None
        self.group.meet(f"fsdp {what}: {nbytes} bytes at {at}")
        if at is None:
            return None, None
        array = np.frombuffer(self.shared.mm, dtype=np.uint8, count=nbytes,
                              offset=HEADER + at)
        self._held[at] = (nbytes, weakref.ref(array))
        return at, torch.from_numpy(array)  # alive while any view of it is

    def _fit(self, nbytes: int) -> int | None:
        at = 0
        for offset, (n, _) in sorted(self._held.items()):
            if offset - at >= nbytes:
                break
            at = max(at, -(-(offset + n) // ALIGN) * ALIGN)
        return at if self.total - at >= nbytes else None

    def free(self, offset: int) -> None:
        """The block at ``offset`` may be taken again (its bytes read by every rank once
        the ranks meet next)."""
        self._held.pop(offset, None)

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        return torch.frombuffer(self.shared.mm, dtype=torch.uint8, count=nbytes,
                                offset=HEADER + offset)


def _bytes(size, dtype: torch.dtype) -> int:
    return math.prod(int(s) for s in size) * dtype.itemsize


class SharedAllGather(AllGather):
    """FSDP's all-gather into a block every rank sees: a barrier."""

    def __init__(self, arena: Arena) -> None:
        self.arena, self._blocks = arena, {}

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        at, block = self.arena.take(_bytes(size, dtype), "all_gather buffer")
        if block is None:
            return torch.empty(*size, dtype=dtype, device=device)
        out = block.view(dtype).view(*size)
        self._blocks[out.data_ptr()] = at
        return out

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        at = self._blocks.pop(output_tensor.data_ptr(), None)
        if at is None:
            return torch.distributed.all_gather_single(output_tensor, input_tensor,
                                                       group=group, async_op=async_op)
        mine = input_tensor.numel() * input_tensor.element_size()
        if input_tensor.data_ptr() != output_tensor.data_ptr() + self.arena.group.rank() * mine:
            raise RuntimeError("FSDP's all-gather input is not its rank's part of the output")
        self.arena.group.meet(f"fsdp all_gather of {mine} bytes at {at}", "fsdp all_gather")
        return None


class SharedReduceScatter(ReduceScatter):
    """FSDP's reduce-scatter from every rank's input in one block: a barrier, then each
    rank adds up its piece of the others' inputs in place."""

    def __init__(self, arena: Arena) -> None:
        self.arena, self._blocks, self._input_bytes = arena, {}, 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        nbytes, group = _bytes(size, dtype), self.arena.group
        if nbytes * group.size() == self._input_bytes:  # the output, after its input
            self._input_bytes = 0
            return torch.empty(*size, dtype=dtype, device=device)
        self._input_bytes = nbytes
        at, block = self.arena.take(nbytes * group.size(), "reduce_scatter buffer")
        if block is None:
            return torch.empty(*size, dtype=dtype, device=device)
        mine = block[group.rank() * nbytes:(group.rank() + 1) * nbytes]
        out = mine.view(dtype).view(*size)
        self._blocks[out.data_ptr()] = (at, block)
        return out

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        at, block = self._blocks.pop(input_tensor.data_ptr(), (None, None))
        how = collectives.reduction(op, output_tensor.dtype)
        if at is None or how is None or not output_tensor.is_contiguous():
            if at is not None:  # the group's own collective, from the block's part
                self.arena.free(at)
            return torch.distributed.reduce_scatter_single(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        coll, n = self.arena.group, output_tensor.numel()
        coll.meet(f"fsdp reduce_scatter of {n} {output_tensor.dtype} at {at} ({how})",
                  "fsdp reduce_scatter")
        me, dtype = coll.rank(), output_tensor.dtype
        rows = list(block.view(dtype).view(coll.size(), coll.size(), n)[:, me])
        if how.factor is not None:  # scaled as slots scales each rank's block
            rows = [torch.mul(row, how.factor) for row in rows]
        with torch.no_grad():
            _combine(how, rows, output_tensor.view(-1))
        self.arena.free(at)  # read: the next taker meets every rank first
        return None


def share_buffers(model: nn.Module, group, total: int | None = None) -> Arena | None:
    """Every FSDP unit of ``model`` (sharded over ``group``) gathers and reduces through
    one arena in shared memory of ``total`` bytes, by default sized for the largest unit's
    reduce-scatter and one more unit's all-gather; None (FSDP's own buffers) where
    ``group`` is not a ``collectives`` group or the arena cannot be made (on every rank alike)."""
    if not collectives.is_shared(group):
        return None
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    arena = Arena(group, total or arena_bytes(units, group.size()))
    if arena.shared is None:
        return None
    gather, scatter = SharedAllGather(arena), SharedReduceScatter(arena)
    for unit in units:
        unit.set_custom_all_gather(gather)
        unit.set_custom_reduce_scatter(scatter)
    return arena


def arena_bytes(units: list[nn.Module], ranks: int) -> int:
    """The arena ``share_buffers`` makes for FSDP ``units`` over ``ranks``: the largest
    unit's reduce-scatter (its gathered bytes on every rank) and one more unit's
    all-gather, aligned; a unit's own parameters are those no unit below it holds
    (``advise --memory`` predicts sharded's node with it)."""
    largest = 0
    for unit in units:
        inner = {id(p) for m in unit.modules() if m is not unit and m in units
                 for p in m.parameters()}
        largest = max(largest, sum(_padded(p, ranks) for p in unit.parameters()
                                   if id(p) not in inner))
    return -(-(ranks + 1) * largest // ALIGN) * ALIGN + ALIGN * (len(units) + 2)


def _padded(param: torch.Tensor, ranks: int) -> int:
    """A sharded parameter's bytes gathered (dim 0 padded to a multiple of the ranks), at
    4 bytes an element (float32 gradients reduced, the widest case here)."""
    shape = list(getattr(param, "shape", ()))
    if not shape:
        return 4
    shape[0] = -(-shape[0] // ranks) * ranks
    return _bytes(shape, torch.float32)
