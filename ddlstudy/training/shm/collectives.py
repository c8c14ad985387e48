"""Collectives of one host's ranks through its shared memory, not gloo's loopback TCP: the
``ddlstudy-shm`` torch.distributed backend, for sharded data parallel (FSDP2), ZeRO-1 and
tensor parallel (DTensor) on CPU.

Use it as any process group (every rank of the default group calls ``new_group``, which
``training.shm`` offers)::

    group = shm.new_group()                     # or new_group(ranks=[...])
    mesh = DeviceMesh.from_group(group, "cpu")  # fully_shard(model, mesh=mesh), DTensor
    ZeroRedundancyOptimizer(params, torch.optim.SGD, process_group=group, lr=0.1)

``HostColl`` moves all_reduce (SUM, AVG, MIN, MAX, PREMUL_SUM; one tensor),
reduce_scatter_single (``reduce_scatter_tensor``) and its list form, all_gather_single
(``all_gather_into_tensor``) and its list form, and broadcast of CPU tensors itself;
everything else (barrier, send/recv, gather, scatter, objects' collectives, other ops or
dtypes, tensors off the CPU) goes to a gloo group made from the same store, registered as
its CPU backend and called through its own Python bindings (``GLOO_DOES``).
``new_group`` gives that plain gloo group on every rank where some rank cannot map the
file (another host, no /dev/shm, no room) or the host is not x86-64.

The ranks map one file (``slots``): two areas of a slot per rank, used in turn. A
collective goes in chunks of a slot: each rank copies its part into its slot, all meet at
a barrier, then each reads what it needs. Between 2 ranks (or for a chunk of at most 64
KiB) every rank adds up the whole chunk of every slot in rank order into its own tensor;
with more ranks rank r adds up the r-th share into the other area and, after a second
barrier, every rank copies the sums out. A reduce-scatter's rank r adds up the r-th block
of every other slot and of its own input straight into its output (it puts only the
others' blocks into its slot); an all-gather copies every slot out, but its own where its
input is already its place in the output (FSDP's all-gather in place). Reductions run
in rank order with the same kernels wherever they run, so every rank has the same bits
(gloo's, bit for bit, between 2 ranks: a + b is b + a, and AVG is that sum halved). A
barrier is a counter per rank in the file and a doorbell (FIFO) per rank: a rank bumps its
counter, rings the others and sleeps in ``poll`` (no spinning) until every counter reached
its own; a collective's first barrier also checks every rank called the same one.

Measured with ``ddlstudy bench collectives`` (2 processes, 1 thread each, 4 MiB slots,
the slowest rank's ms; gloo / shared memory per alternated repeat, min / median / max) on
the 2-core development host on 2026-11-27, while other processes kept both cores busy
(figures on a quiet host will be tighter):

- 64 MiB float32, 9 repeats: all_reduce 201 ms against gloo's 302 (1.25 / 1.45 / 1.89x),
  reduce_scatter_single 142 against 553 (2.45 / 4.11 / 6.29x), all_gather_single 63
  against 268 (1.89 / 3.76 / 6.81x). Two runs of 5 repeats gave medians of 2.30x and
  0.70x (all_reduce: its copy in and reads are memory-bound, and a descheduled rank stalls
  every chunk), 3.20x and 7.08x, 3.33x and 4.84x.
- 4 KiB: all_reduce 0.58 ms against 1.59 (2.4x), reduce_scatter 0.67 against 1.31 (2.0x),
  all_gather 0.58 against 1.14 (2.0x).
- The barrier: 40-60 us a doorbell barrier between 2 ranks, where gloo's barrier took
  about 2 ms on the same busy host (a 4 KiB all-reduce of two gloo barriers: 5.2 ms
  against 2.0 with doorbells); spinning up to 20 or 100 us before sleeping made it 2-3x
  slower here (the ranks share 2 cores with others), so it never spins.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from ddlstudy.training.shm import file
from ddlstudy.training.shm.slots import LINE, R, Reduction, Slots, file_bytes

log = logging.getLogger("ddlstudy")

BACKEND = "ddlstudy-shm"
"""The name this module registers with torch.distributed."""
NUMBERS = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8,
           torch.int8, torch.int16, torch.int32, torch.int64}
"""The dtypes reduced here (SUM, MIN, MAX; AVG and PREMUL_SUM only the floating ones)."""


@dataclass(frozen=True)
class CollOptions:
    """``dist.new_group(pg_options=...)`` of the ``ddlstudy-shm`` backend: the bytes of a
    rank's slot (a multiple of 64; a larger message goes in chunks). The file holds two
    slots a rank."""

    slot_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if self.slot_bytes <= 0 or self.slot_bytes % LINE:
            raise ValueError(f"{BACKEND}: slot_bytes={self.slot_bytes} must be a positive "
                             f"multiple of {LINE}")


def reduction(op, dtype: torch.dtype) -> Reduction | None:
    """What ``op`` does to ``dtype`` here, or None where gloo decides (it may refuse)."""
    kind = op if isinstance(op, R) else op.op if isinstance(op, dist.ReduceOp) else op
    if kind in (R.SUM, R.MIN, R.MAX) and dtype in NUMBERS:
        return Reduction(kind)
    if kind == R.AVG and dtype in NUMBERS and dtype.is_floating_point:
        return Reduction(kind)
    if kind == R.PREMUL_SUM and dtype in NUMBERS and dtype.is_floating_point:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1 or factor.device.type != "cpu":
                return None
            factor = factor.item()
        return Reduction(kind, float(factor))
    return None


def _cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.layout == torch.strided for t in tensors)


class _Flat:
    """A tensor as one contiguous row (itself where it is contiguous, else a copy that
    ``back`` writes back)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.copied = tensor, not tensor.is_contiguous()
        self.row = (tensor.contiguous() if self.copied else tensor).view(-1)

    def bytes(self) -> torch.Tensor:
        return self.row.view(torch.uint8)

    def back(self) -> None:
        if self.copied:
            self.tensor.copy_(self.row.view(self.tensor.shape))


class HostColl(file.NamedGroup):
    """A process group of one host's ranks whose collectives go through shared memory (see
    the module's docstring); gloo does the rest."""

    def __init__(self, rank: int, size: int, shared: file.Shared, slot_bytes: int,
                 gloo: dist.ProcessGroupGloo, timeout: timedelta,
                 store: dist.Store | None = None) -> None:
        super().__init__(rank, size, BACKEND)
        self._gloo, self._store, self._files = gloo, store, 0
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._slots = Slots(rank, size, shared, slot_bytes, timeout.total_seconds())
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """The collectives this group moved, by method name, and those it left to gloo
        ("gloo <name>")."""

    def open_file(self, total: int, prefix: str, what: str) -> file.Shared | None:
        """Another shared file of ``total`` bytes for this group's ranks (a collective: every
        rank calls it), or None on every rank where some rank could not map it."""
        if self._store is None:
            return None
        self._files += 1
        store = dist.PrefixStore(f"file{self._files}/", self._store)
        return file.open_shared(store, self._me, self._size, total, prefix, what)

    def meet(self, called: str, counted: str = "") -> None:
        """A barrier of this group's ranks, which all called ``called`` (else every rank
        raises): what a collective whose bytes already lie in shared memory needs."""
        with self._lock:
            self._slots.expect(called)
            self._slots.barrier()
        if counted:
            self.counts[counted] += 1

    # -- the collectives moved here ------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        how = reduction(opts.reduceOp, tensors[0].dtype) if len(tensors) == 1 else None
        if how is None or not _cpu(*tensors):
            return self._gloo_does("allreduce", tensors, opts)
        flat = _Flat(tensors[0])
        with self._lock, torch.no_grad():  # one collective at a time
            self._slots.expect(f"all_reduce of {flat.row.numel()} {flat.row.dtype} ({how})")
            self._slots.allreduce(flat.row, how)
            flat.back()
        return self._moved("allreduce", tensors)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002 (torch's names)
        opts = opts or dist.ReduceScatterOptions()
        how = reduction(opts.reduceOp, input.dtype)
        if (how is None or not _cpu(output, input) or output.dtype != input.dtype
                or input.numel() != self._size * output.numel()):
            return self._gloo_does("reduce_scatter_single", output, input, opts)
        with self._lock, torch.no_grad():  # one collective at a time
            blocks = _Flat(input).row.view(self._size, output.numel())
            self._reduce_scatter(list(blocks), output, how)
        return self._moved("reduce_scatter_single", [output])

    def reduce_scatter(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        ins = inputs[0] if len(inputs) == 1 and len(outputs) == 1 else []
        how = reduction(opts.reduceOp, outputs[0].dtype) if ins else None
        if (how is None or len(ins) != self._size or not _cpu(outputs[0], *ins)
                or any(t.dtype != outputs[0].dtype or t.numel() != outputs[0].numel()
                       for t in ins)):
            return self._gloo_does("reduce_scatter", outputs, inputs, opts)
        with self._lock, torch.no_grad():  # one collective at a time
            self._reduce_scatter([_Flat(t).row for t in ins], outputs[0], how)
        return self._moved("reduce_scatter", outputs)

    def _reduce_scatter(self, blocks: list[torch.Tensor], output: torch.Tensor,
                        how: Reduction) -> None:
        out = _Flat(output)
        self._slots.expect(f"reduce_scatter of {out.row.numel()} {out.row.dtype} ({how})")
        self._slots.reduce_scatter(blocks, out.row, how)
        out.back()

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's names)
        opts = opts or dist.AllgatherOptions()
        if (not _cpu(output, input) or output.dtype != input.dtype
                or output.numel() != self._size * input.numel()):
            return self._gloo_does("all_gather_single", output, input, opts)
        with self._lock, torch.no_grad():  # one collective at a time
            out = _Flat(output)
            rows = out.bytes().view(self._size, input.numel() * input.element_size())
            self._gather(input, list(rows))
            out.back()
        return self._moved("all_gather_single", [output])

    def allgather(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        outs = outputs[0] if len(inputs) == 1 and len(outputs) == 1 else []
        if (len(outs) != self._size or not _cpu(inputs[0], *outs)
                or any(t.dtype != inputs[0].dtype or t.numel() != inputs[0].numel()
                       for t in outs)):
            return self._gloo_does("allgather", outputs, inputs, opts)
        flats = [_Flat(t) for t in outs]
        with self._lock, torch.no_grad():  # one collective at a time
            self._gather(inputs[0], [f.bytes() for f in flats])
            for f in flats:
                f.back()
        return self._moved("allgather", outs)

    def _gather(self, input: torch.Tensor, outs: list[torch.Tensor]) -> None:  # noqa: A002
        mine = _Flat(input).bytes()
        self._slots.expect(f"all_gather of {mine.numel()} bytes")
        self._slots.gather(mine, outs)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        if len(tensors) != 1 or opts.rootTensor != 0 or not _cpu(*tensors):
            return self._gloo_does("broadcast", tensors, opts)
        flat = _Flat(tensors[0])
        with self._lock, torch.no_grad():  # one collective at a time
            self._slots.expect(f"broadcast of {flat.bytes().numel()} bytes from rank "
                               f"{opts.rootRank}")
            self._slots.broadcast(flat.bytes(), opts.rootRank)
            if self._me != opts.rootRank:
                flat.back()
        return self._moved("broadcast", tensors)

    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single

    def _moved(self, name: str, result: list[torch.Tensor]) -> dist.Work:
        """A finished Work (every collective here ends before it returns), counted."""
        self.counts[name] += 1
        future = torch.futures.Future()
        future.set_result(result)
        return _create_work_from_future(future)

    def _gloo_does(self, name: str, *args, **kwargs) -> dist.Work:
        """The inner gloo group's ``name`` on ``args``, counted as "gloo <name>"."""
        self.counts[f"gloo {name}"] += 1
        return getattr(self._gloo, name)(*args, **kwargs)

    def shutdown(self) -> None:
        self._slots.close()
        self._gloo.shutdown()


def _to_gloo(name: str):
    def method(self: HostColl, *args, **kwargs):
        return self._gloo_does(name, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"gloo's {name} (see GLOO_DOES)."
    return method


GLOO_DOES = ("all_gather_single_coalesced", "allreduce_coalesced", "reduce", "alltoall",
             "all_to_all_single", "barrier", "gather", "scatter",
             "reduce_scatter_single_coalesced", "send", "recv")
"""The collectives HostColl leaves to its gloo group through a Python method each. Not a
fallback to the registered backend: torch's trampoline for a Python process group
(``PyProcessGroup``'s WORK_OVERRIDE) calls the C++ base *holding the GIL*, so a gloo
collective reached that way waits for gloo's queue while gloo's worker thread, freeing a
finished collective's tensors, waits for the GIL: a deadlock seen in
``set_optimizer_state_dict``'s scatters on resuming a sharded run. gloo's own Python
bindings release the GIL."""
for _name in GLOO_DOES:
    setattr(HostColl, _name, _to_gloo(_name))


def _create_backend(options, coll: CollOptions | None) -> HostColl | dist.ProcessGroupGloo:
    """torch's extended creator: HostColl over a gloo group, or where shared memory fails
    or this host cannot use it (``file.usable``), that gloo group alone."""
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", options.store), rank, size, timeout)
    slot = (coll or CollOptions()).slot_bytes
    why = file.usable()
    if why:
        if rank == 0:
            log.info("collectives through gloo, not shared memory: %s", why)
        return gloo
    total = file_bytes(size, slot)
    shared = file.open_shared(dist.PrefixStore("shm/", options.store), rank, size, total,
                              "ddlstudy-coll", "collectives")
    return gloo if shared is None else HostColl(rank, size, shared, slot, gloo, timeout,
                                                options.store)


def register() -> None:
    """The ``ddlstudy-shm`` backend, once a process."""
    file.register(BACKEND, _create_backend)


def new_group(ranks: list[int] | None = None, timeout: timedelta | None = None,
              slot_bytes: int | None = None) -> dist.ProcessGroup:
    """A group of ``ranks`` (default: every rank) whose collectives go through this host's
    shared memory: a HostColl, or (every rank alike) a gloo group where they cannot. Every
    rank of the default group calls it; a rank outside ``ranks`` gets
    ``GroupMember.NON_GROUP_MEMBER``."""
    register()
    options = CollOptions(slot_bytes) if slot_bytes else None
    return dist.new_group(ranks, timeout=timeout, backend=BACKEND, pg_options=options)


def is_shared(group) -> bool:
    """Whether ``group``'s collectives go through shared memory (a HostColl)."""
    return isinstance(group, HostColl)
