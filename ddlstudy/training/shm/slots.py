"""The collectives' algorithms over one shared file (``collectives``'s): a slot per rank in
each of two areas, a barrier of counters and doorbells, and the chunked all-reduce,
reduce-scatter, all-gather and broadcast on flat CPU rows.

The areas take turns: between two barriers a rank writes only the next area and reads only
the one written before the last barrier, so a rank that runs ahead never overwrites what a
slower one still reads. A collective goes in chunks of a slot: each rank copies its part
into its slot, all meet at a barrier, then each reads what it needs. A reduction adds (or
takes the MIN, MAX) in rank order, and every element of a result is computed by the same
kernels in the same order wherever it is computed, so every rank has the same bits.

The barrier: each rank has a cache line of counters in the file's control page, bumps its
epoch there (after its writes: x86-64 keeps stores in order), rings every other rank's
doorbell and sleeps in ``poll`` until every epoch reached its own. A collective's first
barrier also compares a checksum of what each rank called (name, size, dtype, op), so ranks
that called different collectives or sizes fail at once instead of reading each other's
bytes wrongly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ddlstudy.training.shm import file
from ddlstudy.training.shm.average import HEADER

LINE = 64
"""A rank's counters (epoch, the checksums of two collectives) have a cache line."""
SMALL = 64 << 10
"""An all-reduce's chunk of at most this many bytes (of any size between 2 ranks) is
reduced whole by every rank after one barrier; a larger one a share a rank, then a second
barrier before every rank copies the sums out (each rank reads its chunk once, not once a
rank)."""
R = dist.ReduceOp.RedOpType
COMBINE = {R.SUM: torch.add, R.AVG: torch.add, R.PREMUL_SUM: torch.add,
           R.MIN: torch.minimum, R.MAX: torch.maximum}


@dataclass(frozen=True)
class Reduction:
    """A reduction this module does: ``op``, and PREMUL_SUM's factor."""

    op: R
    factor: float | None = None

    def __str__(self) -> str:
        return self.op.name + ("" if self.factor is None else f" x {self.factor}")


def file_bytes(size: int, slot_bytes: int) -> int:
    """The shared file of ``size`` ranks: the token's page, the counters' pages, 2 areas."""
    return HEADER + control_bytes(size) + 2 * size * slot_bytes


def control_bytes(size: int) -> int:
    """The counters' bytes after the token's page, whole pages."""
    return -(-size * LINE // 4096) * 4096


class Slots:
    """This rank's view of the shared file (``file.Shared``) of ``size`` ranks."""

    def __init__(self, rank: int, size: int, shared: file.Shared, slot_bytes: int,
                 timeout_s: float) -> None:
        self.rank, self.size, self.slot = rank, size, slot_bytes
        self._shared, self._timeout = shared, timeout_s
        self._control = np.frombuffer(shared.mm, dtype=np.int64, count=size * LINE // 8,
                                      offset=HEADER).reshape(size, LINE // 8)
        base = HEADER + control_bytes(size)
        self._areas = [torch.frombuffer(shared.mm, dtype=torch.uint8, count=size * slot_bytes,
                                        offset=base + i * size * slot_bytes
                                        ).view(size, slot_bytes) for i in (0, 1)]
        self._epoch, self._broken, self._called = 0, "", ""

    def allreduce(self, row: torch.Tensor, how: Reduction) -> None:
        """``row`` (every rank's) becomes their reduction."""
        size, me, per = self.size, self.rank, self.slot // row.element_size()
        for lo in range(0, row.numel(), per):
            part = row[lo:lo + per]
            m = part.numel()
            _put(self._next(row.dtype)[me, :m], part, how)
            self.barrier()
            if size == 2 or m * row.element_size() <= SMALL:
                _combine(how, self._last(row.dtype)[:, :m], part)
                continue
            share = -(-m // (size * 16)) * 16  # whole cache lines for 4-byte elements
            a, b = min(m, me * share), min(m, (me + 1) * share)
            _combine(how, self._last(row.dtype)[:, a:b], self._next(row.dtype)[0, a:b])
            self.barrier()
            part.copy_(self._last(row.dtype)[0, :m])

    def reduce_scatter(self, blocks: list[torch.Tensor], out: torch.Tensor,
                       how: Reduction) -> None:
        """``out`` = the reduction of every rank's ``blocks[this rank]``."""
        size, me = self.size, self.rank
        per = self.slot // (size * out.element_size())
        direct = blocks[me].data_ptr() != out.data_ptr()  # its own block read in place
        for lo in range(0, out.numel(), per):
            m = min(out.numel() - lo, per)
            mine = self._next(out.dtype)[me, :size * m].view(size, m)
            for k, block in enumerate(blocks):
                if k != me or not direct:
                    _put(mine[k], block[lo:lo + m], how)
            self.barrier()
            rows = list(self._last(out.dtype)[:, me * m:(me + 1) * m])
            if direct:  # scaled as the others' were into their slots
                own = blocks[me][lo:lo + m]
                rows[me] = own if how.factor is None else torch.mul(own, how.factor)
            _combine(how, rows, out[lo:lo + m])

    def gather(self, mine: torch.Tensor, outs: list[torch.Tensor]) -> None:
        """Every rank's bytes ``mine`` into ``outs[that rank]`` (this rank's own not copied
        where ``mine`` is its place in ``outs`` already: an all-gather in place, FSDP's)."""
        others = [k for k in range(self.size)
                  if k != self.rank or outs[k].data_ptr() != mine.data_ptr()]
        for lo in range(0, mine.numel(), self.slot):
            m = min(mine.numel() - lo, self.slot)
            self._next(torch.uint8)[self.rank, :m].copy_(mine[lo:lo + m])
            self.barrier()
            last = self._last(torch.uint8)
            for k in others:
                outs[k][lo:lo + m].copy_(last[k, :m])

    def broadcast(self, row: torch.Tensor, root: int) -> None:
        """Rank ``root``'s bytes ``row`` into every rank's."""
        for lo in range(0, row.numel(), self.slot):
            m = min(row.numel() - lo, self.slot)
            if self.rank == root:
                self._next(torch.uint8)[0, :m].copy_(row[lo:lo + m])
            self.barrier()
            if self.rank != root:
                row[lo:lo + m].copy_(self._last(torch.uint8)[0, :m])

    def _next(self, dtype: torch.dtype) -> torch.Tensor:
        """The area this rank may write until the next barrier (a row a rank)."""
        return self._areas[(self._epoch + 1) % 2].view(dtype)

    def _last(self, dtype: torch.dtype) -> torch.Tensor:
        """The area written before the last barrier, which this rank may read."""
        return self._areas[self._epoch % 2].view(dtype)

    def expect(self, called: str) -> None:
        """What this rank calls now (e.g. "all_reduce of 1000 float32 (SUM)"): the next
        barrier checks that every rank called the same."""
        self._called = called
        column = 1 + (self._epoch + 1) % 2  # the other column may still be read
        self._control[self.rank, column] = zlib.crc32(called.encode())

    def barrier(self) -> None:
        """Until every rank has reached this barrier; raises after the timeout, or where the
        ranks called different collectives (then every later collective raises too)."""
        if self._broken:
            raise RuntimeError(self._broken)
        self._epoch += 1
        epoch, flags = self._epoch, self._control[:, 0]
        flags[self.rank] = epoch  # after this rank's writes: x86-64 keeps their order
        for peer in range(self.size):
            if peer != self.rank:
                self._shared.ring(peer)
        try:
            if flags.min() < epoch:
                file.sleep_until(self._shared.bells[self.rank],
                                 lambda: flags.min() >= epoch, self._timeout,
                                 lambda: self._late(epoch))
            self._check()
        except RuntimeError as exc:
            self._broken = str(exc)
            raise

    def _check(self) -> None:
        if not self._called:
            return
        sums = self._control[:, 1 + self._epoch % 2]
        called, self._called = self._called, ""
        others = [r for r in range(self.size) if sums[r] != sums[self.rank]]
        if others:
            raise RuntimeError(f"rank {self.rank} called {called} and rank(s) {others} "
                               "another collective or size: the ranks are out of step")

    def _late(self, epoch: int) -> str:
        missing = [r for r in range(self.size) if self._control[r, 0] < epoch]
        return (f"rank {self.rank} waited {self._timeout:.0f} s in a collective for rank(s) "
                f"{missing} through shared memory: they stopped or died, or called "
                "another collective")

    def close(self) -> None:
        self._areas.clear()
        self._control = np.zeros((0, LINE // 8), dtype=np.int64)
        self._shared.close()


def _put(slot: torch.Tensor, src: torch.Tensor, how: Reduction) -> None:
    if how.factor is None:
        slot.copy_(src)
    else:
        torch.mul(src, how.factor, out=slot)


def _combine(how: Reduction, rows, out: torch.Tensor) -> None:
    """``out`` = ``rows`` (a row a rank: a 2-D tensor or a list) reduced by ``how``, in
    rank order."""
    if out.numel() == 0:
        return
    if len(rows) == 1:
        out.copy_(rows[0])
    else:
        fn = COMBINE[how.op]
        fn(rows[0], rows[1], out=out)
        for row in rows[2:]:
            fn(out, row, out=out)
    if how.op == R.AVG:
        out.div_(len(rows))
