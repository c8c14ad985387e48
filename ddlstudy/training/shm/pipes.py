"""Activations and their gradients between a pipeline's stages through this host's shared
memory, not gloo's loopback TCP.

``HostPipes`` is a Python torch.distributed process group (the ``ddlstudy-pipes`` backend)
that does what torch.distributed.pipelining asks of its stages' group: ``send`` and
``recv`` of one tensor to or from one peer. Neighbours (modulo the group's size) have a
ring of bytes each way in one ``/dev/shm`` file; a send copies its bytes in behind a header
of its size, a receive copies them out, in order, as MPI and gloo match messages. A message
larger than the room left goes in parts as the receiver frees room. Nothing spins: a rank
that must wait sleeps in ``poll`` on its doorbell (a FIFO), rung by a peer that wrote bytes
for it or freed room in its ring; every wait moves every pending transfer of the rank on,
so two ranks that both send first cannot deadlock however full their rings are.

The counters are plain 8-byte words written after the bytes, which orders them on x86-64's
total store order; elsewhere (``usable``) the group is gloo's. The file and the FIFOs are
unlinked once every rank has them open, or the setup failed. A dead peer ends a wait at the
group's timeout; a message of a size the receiver did not expect breaks the group for good.
"""

from __future__ import annotations

import mmap
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ddlstudy.training.shm import file
from ddlstudy.training.shm.average import HEADER
from ddlstudy.training.shm.file import usable

BACKEND = "ddlstudy-pipes"
"""The name this module registers with torch.distributed (``new_group(backend=...)``)."""
MESSAGE_HEADER = 64
"""Bytes before each message in a ring: its size (the receiver checks it against its
buffer's)."""
CONTROL = 128
"""A ring's counters: bytes written (offset 0) and bytes read (offset 64), each on its own
cache line."""


@dataclass(frozen=True)
class PipesOptions:
    """``new_group(pg_options=...)`` of the ``ddlstudy-pipes`` backend: the bytes of each
    ring (round it to the largest message times the messages in flight)."""

    ring_bytes: int


class _Ring:
    """The bytes from one rank to another: a counter of bytes written, one of bytes read
    (both only ever grow), and ``size`` bytes of data indexed modulo ``size``."""

    def __init__(self, mm: mmap.mmap, offset: int, size: int) -> None:
        self.size = size
        self.written = torch.frombuffer(mm, dtype=torch.int64, count=1, offset=offset)
        self.read = torch.frombuffer(mm, dtype=torch.int64, count=1, offset=offset + 64)
        self.data = np.frombuffer(mm, dtype=np.uint8, count=size, offset=offset + CONTROL)

    def put(self, src: np.ndarray) -> int:
        """As many of ``src``'s bytes as there is room for; how many."""
        head, tail = int(self.written), int(self.read)
        n = min(len(src), self.size - (head - tail))
        self._copy(head, n, src, out=False)
        self.written.fill_(head + n)  # after the bytes: a reader that sees it sees them
        return n

    def take(self, dst: np.ndarray) -> int:
        """As many bytes into ``dst`` as are there; how many."""
        head, tail = int(self.written), int(self.read)
        n = min(len(dst), head - tail)
        self._copy(tail, n, dst, out=True)
        self.read.fill_(tail + n)
        return n

    def _copy(self, at: int, n: int, buf: np.ndarray, out: bool) -> None:
        """numpy's copy, on this thread: torch's would wake its pool of threads, whose
        spinning costs the other stages' cores more than the copy takes."""
        start = at % self.size
        first = min(n, self.size - start)
        for lo, hi, ring_lo in ((0, first, start), (first, n, 0)):
            if hi > lo:
                part = self.data[ring_lo:ring_lo + hi - lo]
                if out:
                    buf[lo:hi] = part
                else:
                    part[:] = buf[lo:hi]


class _Transfer(dist.Work):
    """One send or receive: its bytes (after a header) and how many have moved."""

    def __init__(self, group: HostPipes, peer: int, tensor: torch.Tensor, send: bool) -> None:
        super().__init__()
        self.group, self.peer, self.send = group, peer, send
        self.tensor = tensor
        body = tensor if tensor.is_contiguous() else tensor.contiguous()
        self.body = body
        self.header = torch.zeros(MESSAGE_HEADER // 8, dtype=torch.int64)
        if send:
            self.header[0] = body.numel() * body.element_size()
        self.parts = [self.header.view(torch.uint8).numpy(),
                      body.detach().reshape(-1).view(torch.uint8).numpy()]
        self.moved = [0, 0]

    @property
    def done(self) -> bool:
        return self.moved[1] == len(self.parts[1]) and self.moved[0] == MESSAGE_HEADER

    def advance(self, ring: _Ring) -> bool:
        """Move what the ring allows; whether anything moved."""
        moved = False
        for i, part in enumerate(self.parts):
            if self.moved[i] < len(part):
                n = (ring.put if self.send else ring.take)(part[self.moved[i]:])
                self.moved[i] += n
                moved = moved or n > 0
                if self.moved[i] < len(part):
                    break
                if i == 0 and not self.send:
                    self._check_header()
        if self.done and not self.send and self.body is not self.tensor:
            with torch.no_grad():
                self.tensor.copy_(self.body)
        return moved

    def _check_header(self) -> None:
        sent, wanted = int(self.header[0]), len(self.parts[1])
        if sent != wanted:
            self.group._broken = (f"rank {self.group.rank()} expected {wanted} bytes from "
                                  f"rank {self.peer} and was sent {sent}: the ranks' sends "
                                  "and receives are out of step")
            raise RuntimeError(self.group._broken)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Until done; raises after ``timeout`` (the group's where none is given)."""
        seconds = timeout.total_seconds() if timeout else None
        self.group.wait_for(self, seconds or None)
        return True

    def is_completed(self) -> bool:
        self.group.progress()
        return self.done

    def is_success(self) -> bool:
        return self.done


class HostPipes(file.NamedGroup):
    """Send and receive between the ranks of one host through shared memory (see the
    module's docstring); nothing else."""

    def __init__(self, rank: int, size: int, shared: file.Shared, ring_bytes: int,
                 timeout: timedelta) -> None:
        super().__init__(rank, size, BACKEND)
        self._shared, self._timeout = shared, timeout.total_seconds()
        stride = CONTROL + ring_bytes
        self._rings = {pair: _Ring(shared.mm, HEADER + i * stride, ring_bytes)
                       for i, pair in enumerate(neighbours(size))}
        self._peers = sorted({b for a, b in self._rings if a == rank})
        self._sends: dict[int, deque[_Transfer]] = {p: deque() for p in self._peers}
        self._recvs: dict[int, deque[_Transfer]] = {p: deque() for p in self._peers}
        self._broken = ""

    def _get_backend(self, device: torch.device) -> HostPipes:
        return self  # batch_isend_irecv asks it whether it coalesces: it does not

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Transfer:
        return self._post(tensors, dst, tag, send=True)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Transfer:
        return self._post(tensors, src, tag, send=False)

    def _post(self, tensors: list[torch.Tensor], peer: int, tag: int, send: bool) -> _Transfer:
        if len(tensors) != 1 or tensors[0].device.type != "cpu" or tag != 0:
            raise ValueError(f"{BACKEND} moves one CPU tensor with tag 0 at a time")
        if (self._me, peer) not in self._rings:
            raise ValueError(f"{BACKEND}: rank {self._me} has no ring to rank {peer} of "
                             f"{self._size}: only neighbours in the pipeline's ring talk")
        if self._broken:
            raise RuntimeError(self._broken)
        op = _Transfer(self, peer, tensors[0], send)
        (self._sends if send else self._recvs)[peer].append(op)
        self._advance(peer, send)
        return op

    def _advance(self, peer: int, send: bool) -> bool:
        """The transfers queued to or from ``peer``, in order, as far as its ring allows;
        rings the peer's doorbell when anything moved."""
        queue = (self._sends if send else self._recvs)[peer]
        ring = self._rings[(self._me, peer) if send else (peer, self._me)]
        moved = False
        while queue:
            moved = queue[0].advance(ring) or moved
            if not queue[0].done:
                break
            queue.popleft()
        if moved:
            self._shared.ring(peer)
        return moved

    def progress(self) -> bool:
        """Every queued transfer as far as it can go; whether anything moved."""
        moved = False
        if self._broken:  # a message out of step: every later byte would be misread
            raise RuntimeError(self._broken)
        for peer in self._peers:
            moved = self._advance(peer, True) | moved
            moved = self._advance(peer, False) | moved
        return moved

    def wait_for(self, op: _Transfer, timeout: float | None = None) -> None:
        """Until ``op`` is done, moving every transfer on and sleeping on this rank's
        doorbell between tries; raises after ``timeout`` s (default: the group's)."""
        limit = timeout or self._timeout

        def done() -> bool:
            self.progress()
            return op.done

        file.sleep_until(self._shared.bells[self._me], done, limit, lambda: (
            f"rank {self._me} waited {limit:.0f} s for rank {op.peer} to "
            f"{'receive' if op.send else 'send'} through shared memory: it stopped or died"))

    def shutdown(self) -> None:
        self._rings.clear()
        self._shared.close()


def create(store: dist.Store, rank: int, size: int, timeout: timedelta,
           ring_bytes: int) -> HostPipes | None:
    """Every rank of a new group: its HostPipes, or None on every rank where some rank could
    not open the shared file and the doorbells (another host, no /dev/shm, no room)."""
    total = HEADER + len(neighbours(size)) * (CONTROL + ring_bytes)
    shared = file.open_shared(store, rank, size, total, "ddlstudy-pipes",
                              "pipeline stages", " or pass --transport gloo")
    return None if shared is None else HostPipes(rank, size, shared, ring_bytes, timeout)


def _create_backend(options, pipes: PipesOptions | None):
    """torch's extended creator: HostPipes, or where shared memory fails or this host
    cannot use it (``usable``), gloo."""
    ring = pipes.ring_bytes if pipes is not None else 1 << 22
    made = None if usable() else create(options.store, options.group_rank,
                                        options.group_size, options.timeout, ring)
    if made is not None:
        return made
    return dist.ProcessGroupGloo(options.store, options.group_rank, options.group_size,
                                 options.timeout)


def register() -> None:
    """The ``ddlstudy-pipes`` backend, once a process."""
    file.register(BACKEND, _create_backend)


def neighbours(size: int) -> list[tuple[int, int]]:
    """The ordered pairs of ranks that get a ring: each rank and the next and the one
    before it, modulo ``size`` (the last stage of an interleaved round sends to rank 0)."""
    return sorted({(a, b) for a in range(size) for b in ((a + 1) % size, (a - 1) % size)
                   if a != b})


def ring_bytes(message_bytes: int, in_flight: int) -> int:
    """Room for ``in_flight`` messages of ``message_bytes`` with their headers, between
    1 MiB and 64 MiB (a larger message streams through in parts)."""
    want = in_flight * (message_bytes + MESSAGE_HEADER)
    return max(1 << 20, min(1 << 26, -(-want // 4096) * 4096))
