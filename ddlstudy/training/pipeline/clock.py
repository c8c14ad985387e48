"""Where a pipeline process's steps go: ``StageClock``, timestamps taken where the schedule
calls into its stages, and the peak memory its steps reach.

The clock rewrites nothing and waits for nothing: it wraps the calls a torch.distributed
pipelining schedule makes into each of the process's stages (instance attributes that
shadow their methods) and reads ``time.perf_counter``, the host's monotonic clock, which
a pipeline's processes share. ``strategies.pipeline.stage_times`` turns every process's
``report`` into the manifest's ``backend.stages_time``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

PHASES = ("forward", "backward", "recv", "send", "exchange", "optimizer", "other")
COLUMNS = 6
"""A micro-batch's columns in a row: its activation's receive start and end and its send's
issue, then the same for its gradient."""


class SavedBytes:
    """Counts the bytes autograd saves for the backward pass while it is entered (the
    activations a micro-batch holds until its backward), each storage once, the module's
    own parameters left out."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = {p.data_ptr() for p in module.parameters()}
        self.seen: set[tuple[int, int]] = set()
        self.bytes = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # A view (a micro-batch is a slice of the batch) counts its own elements, not the
        # storage it views; each (start, size) once.
        key = (t.data_ptr(), t.numel())
        if t.untyped_storage().data_ptr() not in self.params and key not in self.seen:
            self.seen.add(key)
            self.bytes += t.numel() * t.element_size()
        return t

    def __enter__(self) -> SavedBytes:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)


class StageClock:
    """A process's steps split into ``PHASES`` (each second in one), over its ``chunks``
    stages (2 under an interleaved schedule), and the activations it holds.

    ``sums``: seconds per phase over the steps but the first (it meets the neighbours);
    ``rows``: those steps' start, end, end of the wait for its gradients' sends, then for
    each stage (chunk-major) and micro-batch its ``COLUMNS``; ``boxes``: the last step's
    forward and backward of each micro-batch, [micro-batch, 0 | 1, start, end, chunk].

    Memory: ``held`` counts the micro-batches whose activations a stage holds (forward
    done, backward not yet), ``peak_held`` its most over the steps; ``saved`` the bytes
    autograd saved in each stage's first forward (``SavedBytes``); ``peak_bytes`` the most
    the process held at once, the sum over its stages of held x saved. On a GPU the
    report also reads the allocator's own peak over the counted steps.
    """

    def __init__(self, micro: int, chunks: int = 1, device: torch.device | None = None
                 ) -> None:
        self.micro, self.chunks, self.sums = micro, chunks, dict.fromkeys(PHASES, 0.0)
        self.width = 3 + COLUMNS * micro * chunks
        self.device = device if device is not None and device.type == "cuda" else None
        self.rows: list[list[float]] = []
        self.row: list[float] = []
        self.boxes: list[list[float]] = []
        self.phase, self.last, self.origin, self.steps = "other", 0.0, 0.0, 0
        self.held = [0] * chunks
        self.peak_held = [0] * chunks
        self.saved = [0] * chunks
        self.peak_bytes = 0
        self.transport: dict[str, str] = {}  # how the stages and the replicas talked

    def mark(self, phase: str) -> float:
        """``phase`` from now on; the time since the last mark was the last phase's."""
        now = time.perf_counter()
        if self.row and self.steps:  # the first step is not counted
            self.sums[self.phase] += now - self.last
        self.phase, self.last = phase, now
        return now

    def start(self) -> None:
        if self.steps == 1 and self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.row, self.boxes = [math.nan] * self.width, []
        self.row[0] = self.last = self.origin = time.perf_counter()
        self.phase = "optimizer"  # zeroing the gradients

    def end(self) -> None:
        self.row[1] = self.mark("other")
        self.rows += [self.row] if self.steps else []
        self.row, self.steps = [], self.steps + 1

    def _at(self, column: int, now: float) -> float:
        if self.row:
            self.row[column] = now
        return now

    def watch(self, schedule, stages: list) -> None:
        """Timestamps at the schedule's calls into each of ``stages``, the loss counted
        in the forward pass."""
        for chunk, stage in enumerate(stages):
            self._watch_stage(stage, chunk)

        def loss_end(stage_, *_) -> None:
            now = self.mark("send")  # then the waits for the forward sends
            if stage_.is_last and self.boxes:
                self.boxes[-1][3] = now
        _wrap(schedule, "_maybe_compute_loss", lambda *_: self.mark("forward"), loss_end)

    def _watch_stage(self, stage, chunk: int) -> None:
        base = 3 + COLUMNS * self.micro * chunk

        def begin(phase: str, column: int) -> Callable:
            def at(i: int, *_) -> None:
                now = self._at(base + COLUMNS * i + column, self.mark(phase))
                self.boxes.append([i, phase == "backward", now, now, chunk])
            return at

        def close(step: int) -> Callable:
            def at(*_) -> None:
                self.boxes[-1][3] = self.mark("other")
                self.held[chunk] += step
                self.peak_held[chunk] = max(self.peak_held[chunk], self.held[chunk])
                held = sum(h * b for h, b in zip(self.held, self.saved, strict=True))
                self.peak_bytes = max(self.peak_bytes, held)
            return at

        for way, phase, recv, step in (("fwd", "forward", 0, 1), ("bwd", "backward", 3, -1)):
            _wrap(stage, f"get_{way}_recv_ops",
                  lambda i, *_, c=recv: self._at(base + COLUMNS * i + c, self.mark("recv")),
                  lambda *_: None)
            _wrap(stage, f"{phase}_one_chunk", begin(phase, recv + 1), close(step))
            _wrap(stage, f"get_{way}_send_ops", lambda *_: self.mark("send"),
                  lambda i, *_, c=recv + 2: self._at(base + COLUMNS * i + c,
                                                     time.perf_counter()))
        _wrap(stage, "perform_reduce_grad", lambda *_: self._at(2, self.mark("backward")),
              lambda *_: self.mark("other"))
        forward = stage.forward_one_chunk  # the first call also counts the saved bytes

        def first_forward(*args, **kwargs):
            stage.forward_one_chunk = forward  # once: later forwards run untouched
            with SavedBytes(stage.submod) as saved:
                out = forward(*args, **kwargs)
            self.saved[chunk] = saved.bytes
            return out
        stage.forward_one_chunk = first_forward

    def report(self, rank: int) -> dict:
        """What the run's writer needs of this process (``strategies.pipeline``)."""
        peak_gpu = (torch.cuda.max_memory_allocated(self.device)
                    if self.device is not None else None)
        return {"rank": rank, "sums": self.sums, "boxes": self.boxes, "origin": self.origin,
                "chunks": self.chunks, "peak_held": self.peak_held, "saved_bytes": self.saved,
                "peak_bytes": self.peak_bytes,
                "peak_gpu_bytes": peak_gpu,
                "rows": torch.tensor(self.rows, dtype=torch.float64).reshape(-1, self.width)}


def _wrap(obj, name: str, before: Callable, after: Callable) -> None:
    """``obj.name`` calls ``before`` with its arguments, then itself, then ``after``."""
    inner = getattr(obj, name)

    def timed(*args, **kwargs):
        before(*args)
        out = inner(*args, **kwargs)
        after(*args)
        return out
    setattr(obj, name, timed)
