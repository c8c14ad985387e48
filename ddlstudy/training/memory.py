"""What a training process holds: its peak resident memory while training (set-up left
out), the shared memory among it, and the bytes its own tensors count.

On Linux the peak is the kernel's high-water mark, ``VmHWM`` in ``/proc/self/status``,
reset once set-up is done by writing 5 to ``/proc/self/clear_refs``; where that cannot be
written the peak is ``getrusage``'s ``ru_maxrss``, set-up included (the record says
which). The counted bytes are this process's part of the model: a sharded parameter,
gradient or optimizer state counts its local shard (a DTensor's ``_local_tensor``).
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
ROLLUP = Path("/proc/self/smaps_rollup")
HWM = "VmHWM (reset after set-up)"
RUSAGE = "getrusage ru_maxrss (set-up included)"


def reset_peak(device: torch.device | None = None) -> str:
    """Start measuring the peak from now (on a GPU ``device``, its allocator's peaks too);
    how it is measured (HWM or RUSAGE)."""
    if device is not None and device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        CLEAR_REFS.write_text("5")
        return HWM
    except OSError:
        return RUSAGE


def give_back() -> None:
    """Return the memory this process has freed to the system (glibc's ``malloc_trim``;
    nothing elsewhere). Called once an epoch, after its validation: glibc keeps the pages
    of freed tensors and, as training and validation interleave, its heap grows with its
    holes, so a run's peak grew with its epochs, not with what it trained: small_resnet at
    64 px, one process, 1150 MiB after one epoch, 1227 after 2, 1288 after 3, 1276 after 5;
    trimmed after each epoch, 1136 and 1157. A run's peak is then what its steps need, and
    a short probe's predicts a long run's (advise)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
"""mallopt's parameters (glibc's malloc.h)."""
MMAP_MOST = 32 << 20
"""The most glibc's sliding mmap threshold reaches on a 64-bit machine
(DEFAULT_MMAP_THRESHOLD_MAX); it then trims the heap past twice that."""
KEEP_MOST = (1 << 31) - 1
"""The largest trim threshold mallopt takes (an int): with ``keep``, the heap is never
trimmed on its own (``give_back`` still returns what an epoch freed)."""


def steady_heap(keep: bool = False) -> None:
    """Start training with glibc's allocator where its own rules leave it once warm: blocks
    up to 32 MiB from the heap, freed ones kept unless 64 MiB lie free at its top. Left
    alone, glibc starts at 128 KiB and raises its threshold only as freed blocks prove
    larger, so a cold process maps, faults in and unmaps its tensors for its first
    seconds: tiny's cpu-intraop trained at 780-860 images/s for 6 epochs (90 steps), then
    at 930-1,100, with twice the system time; fixed from the start, its first epoch is as
    fast as its last, and a probe forked from a warm process measures what a run started
    from a shell does. Peaks: tiny's as before (773 MiB against 769-779), simple-big's
    2-3 % higher (sequential 2,495-2,507 MiB against 2,427-2,456).

    ``keep`` (``--heap keep``): every block from the heap, none mapped apart, and the heap
    trimmed only by ``give_back``. glibc maps a block over 32 MiB afresh each time it is
    made, and its pages are faulted in (zeroed) again: tiny-full's AdamW makes and frees
    its 151 and 67 MB layers' gradients and temporaries every step, 212 such maps in 30
    steps; on a VM whose balloon hands free memory back to its hypervisor every 2 s
    (``environment.free_page_reporting``, this host's), the step that faults on pages the
    host took back pays the host's faults too, 0.3-0.6 s, so that every fourth or fifth
    of its steps took twice the median. Kept, no page is faulted in after the
    first step, and no step is slow: 48.5 images/s against 39.5, peaks alike. Where the
    heap fragments the peak grows instead: simple-big, 12 steps, sequential +4-11 %,
    sharded +8-18 % (2,615-2,850 MiB against 2,417-2,434), zero +8-13 %."""
    if _LIBC is None:
        return
    if keep:
        _LIBC.mallopt(M_MMAP_MAX, 0)
        _LIBC.mallopt(M_TRIM_THRESHOLD, KEEP_MOST)
    else:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_MOST)
        _LIBC.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_MOST)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS)
        return None


_LIBC = _glibc()


def on_glibc() -> bool:
    """Whether glibc allocates here (else ``steady_heap`` and ``--heap`` change nothing)."""
    return _LIBC is not None


def peak_rss() -> int:
    """The peak resident bytes since ``reset_peak`` (or the process's start)."""
    return _status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident() -> int | None:
    """The bytes resident now (None where /proc does not say)."""
    return _status("VmRSS:")


def shared_resident() -> int | None:
    """The bytes resident now that are files' pages (torch's libraries, mapped data):
    pages the processes of a node share, which its memory holds once (None where /proc
    does not say)."""
    return _status("RssFile:")


def shared_memory() -> dict[str, int]:
    """This process's resident pages of shared memory (``/dev/shm``: the buffers through
    which a node's processes average, gather and send), all of them (``shmem_bytes``, in
    every process's resident figure) and its proportional share of them (``shmem_pss_bytes``:
    each page divided among the processes that map it, so a node's shares sum to what its
    memory holds once); empty where /proc does not say."""
    rss, pss = _status("RssShmem:"), _status("Pss_Shmem:", ROLLUP)
    return {} if rss is None or pss is None else {"shmem_bytes": rss, "shmem_pss_bytes": pss}


def _status(key: str, path: Path = STATUS) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return None


class SavedForBackward:
    """While entered, the bytes autograd saves for backward in this thread (saved-tensor
    hooks), each storage once and parameters left out (``model``'s, and any leaf that
    requires grad: FSDP's gathered ones): what one step's
    forward holds until its backward, its activations. Threads of their own (cpu-threads'
    replicas) are not seen; a checkpointed block counts the inputs it keeps."""

    def __init__(self, model: nn.Module, done: Callable[[int], None]) -> None:
        self.bytes, self.done = 0, done
        self._seen = {_storage(p)[0] for p in model.parameters()}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base  # a view's: a weight's transpose
        if base.is_leaf and base.requires_grad:  # a parameter (FSDP's gathered ones too)
            return t
        where, size = _storage(t)
        if where is not None and where not in self._seen:
            self._seen.add(where)
            self.bytes += size
        return t

    def __enter__(self) -> SavedForBackward:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self.done(self.bytes)


def _storage(t: torch.Tensor) -> tuple[int | None, int]:
    """Where ``t``'s memory is and how large (a DTensor's: its local shard's), or None
    where it has none of its own (a meta or sparse tensor, FSDP's freed parameters)."""
    local = getattr(t, "_local_tensor", t)
    try:
        storage = local.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None, 0


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            local = getattr(t, "_local_tensor", t)  # a DTensor's shard on this process
            total += local.numel() * local.element_size()
    return total


def held(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this process's own tensors hold: parameters, gradients, optimizer state and
    buffers (ZeRO's optimizer: its shard's state)."""
    params = list(model.parameters())
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local one
    state = [v for s in inner.state.values() for v in s.values()]
    return {"parameters": _bytes(params), "gradients": _bytes(p.grad for p in params),
            "optimizer_state": _bytes(state), "buffers": _bytes(model.buffers())}


def minor_faults() -> int:
    """The pages this process has faulted in so far, all its threads' (each one the kernel
    mapped and, for fresh memory, zeroed; on torch's huge pages a fault is 2 MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def record(peak_method: str, model: nn.Module, optimizer: torch.optim.Optimizer,
           setup_rss: int | None = None, setup_shared: int | None = None,
           device: torch.device | None = None, activations: int | None = None,
           setup_faults: int | None = None) -> dict:
    """This process's figures: its peak, how it was measured, what it holds, and what it
    held resident once set up (``setup_rss``: before its first step made gradients,
    optimizer state and activations; ``setup_shared``: of which files' pages; and the
    files' pages resident at the end, ``end_file_bytes``: a process forked from a warm
    server maps its libraries' pages as it first runs them, and the data set's decoded
    cache as it reads it, 32 MiB once set up and 106 by the end of a run of an own
    ResNet, where a process of its own has its libraries' 311 from its imports); on a GPU
    ``device``, its allocator's peaks since ``reset_peak`` beside them; ``activations``:
    what its first step saved for backward (``SavedForBackward``), among what it holds;
    ``setup_faults``: ``minor_faults`` once set up, so that ``training_faults`` are the
    pages training faulted in (``steady_heap``: a step that makes its large tensors
    afresh faults in theirs every time)."""
    gpu = {"gpu_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
           "gpu_max_reserved_bytes": torch.cuda.max_memory_reserved(device)} \
        if device is not None and device.type == "cuda" else {}
    holds = held(model, optimizer) | ({"activations": activations} if activations else {})
    files = shared_resident()
    return {"peak_rss_bytes": peak_rss(), "peak_method": peak_method,
            "held_bytes": holds} | shared_memory() | gpu | (
        {"end_file_bytes": files} if files is not None else {}) | (
        {"setup_rss_bytes": setup_rss} if setup_rss is not None else {}) | (
        {"setup_file_bytes": setup_shared} if setup_shared is not None else {}) | (
        {"training_faults": minor_faults() - setup_faults} if setup_faults is not None else {})
