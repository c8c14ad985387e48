"""`ddlstudy bench collectives`: the collectives of sharded and tensor parallelism between
this host's processes, through its shared memory (``training.shm``) and through gloo.

Each repeat times every collective over shared memory and over gloo, one after the other
(A B, A B, ...), after a barrier, and counts the slowest rank's time (of one call, or the
mean of several where the buffer is small); one untimed call of each warms up (first-touch
pages, connections).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddlstudy.tools.bench.ratios import Ratio, _spread, gradient_floats
from ddlstudy.training import shm
from ddlstudy.training.distributed import free_port, run_ranks

COLLECTIVES = ("all_reduce", "reduce_scatter_single", "all_gather_single")
SHARED, GLOO = "shared memory", "gloo"
ONE = "{:.2f}"
SMALL, CALLS = 4 << 20, 200
"""A repeat times a collective on less than SMALL bytes that many times (at most CALLS)
and counts the mean: a single call is as short as the clock's noise."""


def _call(name: str, group, buffers: dict[str, torch.Tensor]) -> None:
    if name == "all_reduce":
        dist.all_reduce(buffers["full"], group=group)
    elif name == "reduce_scatter_single":
        dist.reduce_scatter_single(buffers["part"], buffers["full"], group=group)
    else:
        dist.all_gather_single(buffers["full"], buffers["part"], group=group)


def _slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (over the default group's gloo)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _rank(rank: int, world: int, port: int, floats: int, repeats: int, out: Path,
          slot_bytes: int | None) -> None:
    torch.set_num_threads(1)  # a process a core, as the strategies run
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    groups = {SHARED: shm.new_group(slot_bytes=slot_bytes),
              GLOO: dist.new_group(backend="gloo")}
    shared = shm.is_shared(groups[SHARED])
    floats -= floats % world
    calls = max(1, min(CALLS, SMALL // (4 * floats)))
    buffers = {"full": torch.randn(floats), "part": torch.randn(floats // world)}
    ms: dict[str, dict[str, list[float]]] = {c: {SHARED: [], GLOO: []} for c in COLLECTIVES}
    for name in COLLECTIVES:
        for group in groups.values():
            _call(name, group, buffers)
        for _ in range(repeats):
            for how, group in groups.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    _call(name, group, buffers)
                ms[name][how].append(1e3 * _slowest(time.perf_counter() - start) / calls)
    if rank == 0:
        torch.save({"ms": ms, "shared": shared}, out)
    dist.barrier()
    dist.destroy_process_group()


def measure(floats: int, ranks: int = 2, repeats: int = 5,
            slot_bytes: int | None = None) -> dict:
    """The milliseconds of each collective on ``floats`` float32s between ``ranks``
    processes, ``repeats`` times through each group (shared memory's slots of
    ``slot_bytes``, default ``shm.CollOptions``'); and whether shared memory was used
    (False: this host cannot, and both columns are gloo's)."""
    with tempfile.TemporaryDirectory(prefix="ddlstudy-bench-") as tmp:
        out = Path(tmp) / "ms.pt"
        run_ranks(_rank, ranks, (free_port(), floats, repeats, out, slot_bytes))
        return torch.load(out)


def bench_collectives(size: str, ranks: int = 2, repeats: int = 5) -> str:
    """The table of ``measure`` on ``size`` float32s (``bench.gradient_floats``: a number
    or a model's gradient) in the full buffer: the input of all_reduce and reduce_scatter,
    the output of all_gather."""
    floats = gradient_floats(size)
    result = measure(floats, ranks, repeats)
    lines = [f"collectives on {size} ({floats:,} float32s, {4 * floats / 2**20:.0f} MiB) "
             f"between {ranks} processes of this host, {repeats} alternated repeats (the "
             "slowest rank's ms a call)"]
    if not result["shared"]:
        lines.append("this host's shared memory could not be used: both columns are gloo")
    lines += ["| collective | shared memory ms min / median / max | gloo ms min / median / max "
              "| gloo / shared memory, each repeat: min / median / max |", "|---|---|---|---|"]
    for name, ms in result["ms"].items():
        a, b = ms[SHARED], ms[GLOO]
        ratio = Ratio("collectives", name, "ms", b, a)
        lines.append(f"| {name} | {_spread(a, fmt=ONE)} | {_spread(b, fmt=ONE)} | "
                     f"{_spread(ratio.ratios)} |")
    return "\n".join(lines)
