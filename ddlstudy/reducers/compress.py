"""Gradient compression on the wire between MPI nodes (``--compress``).

A compressor replaces the reducer: every rank sends a compressed copy of its gradient
buffer to every other (MPI Allgather), then decompresses and averages in float32.

- ``fp16``: the buffer cast to float16 (2 bytes an element instead of 4);
- ``topk:<ratio>``: only the ``ratio`` x n largest entries (by magnitude) of the gradient
  plus the residual, as (int32 index, float32 value) pairs; what was not sent is kept as
  the residual and added to the next step's gradient (error feedback), so no update is
  lost, only delayed.

Each reports the bytes it sent per step, so the manifest can show the saving against the
4 bytes an element of an uncompressed exchange.
"""

from __future__ import annotations

import numpy as np

from ddlstudy.errors import ConfigError


class Compressor:
    name = "none"
    wire_ratio = 1.0
    """Bytes on the wire per byte of the float32 gradient (advise's cost model)."""

    def __init__(self) -> None:
        self.sent_bytes = 0
        """Bytes this rank sent in its last exchange."""
        self.buffer_bytes = 0
        """Bytes of the float32 buffer it averaged then (what an uncompressed exchange sends)."""

    def __call__(self, comm, buf: np.ndarray, step: int = 0) -> None:
        self.buffer_bytes = buf.nbytes
        self.sent_bytes = self._exchange(comm, buf)

    def _exchange(self, comm, buf: np.ndarray) -> int:
        """Average ``buf`` in place across ``comm``; return the bytes this rank sent."""
        raise NotImplementedError


class Fp16(Compressor):
    name = "fp16"
    wire_ratio = 0.5

    def __init__(self) -> None:
        super().__init__()
        self._buffers = None
        """(this rank's float16 copy, every rank's): kept between steps, as a fresh
        allocation of their size each step costs page faults on every page."""

    def _exchange(self, comm, buf: np.ndarray) -> int:
        # torch converts float16 with vector instructions; numpy's casts are ~20x slower.
        # Imported here: the config parses --compress, and `ddlstudy --help` needs no torch.
        import torch

        shape = (comm.Get_size(), buf.size)
        if self._buffers is None or self._buffers[1].shape != shape:
            self._buffers = (torch.empty(buf.size, dtype=torch.float16),
                             torch.empty(shape, dtype=torch.float16))
        mine, everyone = self._buffers
        total = torch.from_numpy(buf)
        mine.copy_(total)
        comm.Allgather(mine.numpy(), everyone.numpy())
        total.copy_(everyone[0])
        for r in range(1, everyone.shape[0]):  # rank order: the same sum on every rank
            total.add_(everyone[r])
        total.div_(everyone.shape[0])
        return mine.numel() * 2


class TopK(Compressor):
    def __init__(self, ratio: float) -> None:
        super().__init__()
        self.ratio = ratio
        self.name = f"topk:{ratio:g}"
        self.wire_ratio = 2 * ratio  # an int32 index and a float32 value per kept element
        self.residual: np.ndarray | None = None

    def _exchange(self, comm, buf: np.ndarray) -> int:
        if self.residual is None:
            self.residual = np.zeros_like(buf)
        acc = self.residual
        acc += buf  # error feedback: what earlier steps did not send
        k = max(1, int(self.ratio * buf.size))
        index = np.argpartition(np.abs(acc), buf.size - k)[buf.size - k:].astype(np.int32)
        index.sort()
        values = acc[index]
        acc[index] = 0.0  # sent: the residual keeps the rest
        size = comm.Get_size()
        all_index = np.empty((size, k), dtype=np.int32)
        all_values = np.empty((size, k), dtype=np.float32)
        comm.Allgather(index, all_index)
        comm.Allgather(values, all_values)
        buf[:] = 0.0
        for r in range(size):  # rank order: the same sum on every rank
            np.add.at(buf, all_index[r], all_values[r])
        buf /= size
        return index.nbytes + values.nbytes


def parse(spec: str) -> Compressor | None:
    """None for "none", else the compressor ``spec`` names (ConfigError if malformed)."""
    if spec == "none":
        return None
    if spec == "fp16":
        return Fp16()
    if spec.startswith("topk:"):
        try:
            ratio = float(spec.split(":", 1)[1])
        except ValueError:
            ratio = -1.0
        if 0 < ratio <= 1:
            return TopK(ratio)
        raise ConfigError("--compress", f"topk needs a ratio in (0, 1], e.g. topk:0.01, "
                          f"got {spec!r}")
    raise ConfigError("--compress", f"unknown compression {spec!r}; choose one of: none, "
                      f"fp16, topk:<ratio>")
