"""Collectives through this host's shared memory (``training.shm.collectives``, the ``ddlstudy-shm``
backend) between 2 spawned processes: each gives gloo's bits (2 ranks: a sum in either
order is the same float, gloo's AVG is that sum halved), in chunks larger messages than a
slot, non-contiguous tensors, async works; FSDP2, ZeRO-1 and a DTensor MLP train as over
gloo; a host without room, or a rank that cannot open the file, gets gloo on every rank;
nothing is left in /dev/shm."""

import os
import re
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddlstudy.training.distributed import free_port, run_ranks
from ddlstudy.training.shm import collectives
from ddlstudy.training.shm import file as shm_file
from ddlstudy.training.shm.average import SHM_DIR

pytestmark = pytest.mark.skipif(shm_file.usable() != "", reason=shm_file.usable())
R = dist.ReduceOp
SLOT = 1024
"""Bytes a slot in the tests: 1000 elements go in several chunks."""
SCATTERS = 200


def _init(rank, world, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)


def _differences(g, rank) -> list:
    """Every collective on ``g`` against the same on the default (gloo) group: the cases
    whose results differ."""
    gen = torch.Generator().manual_seed(rank)
    bad = []
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64):
        x = (torch.randn(1000, generator=gen) * 100).to(dt)
        for op in (R.SUM, R.AVG, R.MIN, R.MAX):
            if op == R.AVG and dt == torch.int64:
                continue  # gloo refuses it, and so (through gloo) does this group
            mine, theirs = x.clone(), x.clone()
            dist.all_reduce(mine, op=op, group=g)
            dist.all_reduce(theirs, op=op)
            bad += [("all_reduce", dt, op)] * (not torch.equal(mine, theirs))
            mine, theirs = torch.empty(500, dtype=dt), torch.empty(500, dtype=dt)
            dist.reduce_scatter_single(mine, x, op=op, group=g)
            dist.reduce_scatter_single(theirs, x, op=op)
            bad += [("reduce_scatter_single", dt, op)] * (not torch.equal(mine, theirs))
            mine = torch.empty(500, dtype=dt)
            dist.reduce_scatter(mine, list(x.chunk(2)), op=op, group=g)
            bad += [("reduce_scatter", dt, op)] * (not torch.equal(mine, theirs))
        mine, theirs = torch.empty(2000, dtype=dt), torch.empty(2000, dtype=dt)
        dist.all_gather_single(mine, x, group=g)
        dist.all_gather_single(theirs, x)
        bad += [("all_gather_single", dt)] * (not torch.equal(mine, theirs))
        listed = [torch.empty(1000, dtype=dt) for _ in range(2)]
        dist.all_gather(listed, x, group=g)
        bad += [("all_gather", dt)] * (not torch.equal(torch.cat(listed), theirs))
        mine, theirs = x.clone(), x.clone()
        dist.broadcast(mine, group=g, group_src=1)
        dist.broadcast(theirs, group_src=1)
        bad += [("broadcast", dt)] * (not torch.equal(mine, theirs))
    return bad


def _odd_shapes(g, rank) -> dict:
    """Non-contiguous tensors, an all-gather into its own output, PREMUL_SUM, async."""
    m = torch.arange(1200, dtype=torch.float32).view(40, 30) * (rank + 1)
    mine, theirs = m.clone().t(), m.t().clone()  # a transposed view: summed, written back
    dist.all_reduce(mine, group=g)
    dist.all_reduce(theirs)
    out = torch.zeros(2, 600)
    dist.all_gather_single(out[:, ::2], m[::2, ::2].contiguous().view(-1), group=g)
    inplace = torch.zeros(2, 700)
    inplace[rank] = rank + 1.5  # FSDP2's all-gather: its input is its output's part
    dist.all_gather_single(inplace, inplace[rank], group=g)
    scattered = torch.arange(1400.0).view(2, 700) * (rank + 1)  # out: its own block
    dist.reduce_scatter_single(scattered[rank], scattered.view(-1), group=g)
    premul = torch.full((1000,), float(rank + 1))
    dist.all_reduce(premul, op=R.PREMUL_SUM(0.25), group=g)
    premul_rs = torch.empty(500)
    dist.reduce_scatter_single(premul_rs, torch.full((1000,), float(rank + 1)),
                               op=R.PREMUL_SUM(0.25), group=g)
    work = dist.all_reduce(async_in := torch.ones(3), group=g, async_op=True)
    return {"transposed": torch.equal(mine, theirs),
            "strided out": torch.equal(out[1, ::2], (m[::2, ::2] / (rank + 1) * 2).reshape(-1))
            and torch.equal(out[:, 1::2], torch.zeros(2, 300)),
            "in place": torch.equal(inplace, torch.tensor([[1.5], [2.5]]).expand(2, 700))
            and torch.equal(scattered[rank], torch.arange(1400.0).view(2, 700)[rank] * 3),
            "premul": torch.equal(premul, torch.full((1000,), 0.75))
            and torch.equal(premul_rs, torch.full((500,), 0.75)),
            "async": (work.is_completed(), work.wait(), work.get_future().value()[0].tolist(),
                      async_in.tolist())}


def _gloo_does_the_rest(g, rank) -> dict:
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": rank}, group=g)
    dist.barrier(group=g)
    if rank == 0:
        dist.send(torch.arange(4.0), group=g, group_dst=1)
        got = None
    else:
        got = torch.empty(4)
        dist.recv(got, group=g, group_src=0)
    product = torch.full((2,), rank + 2.0)
    dist.all_reduce(product, op=R.PRODUCT, group=g)  # not moved here: gloo's
    # Scatters of tensors freed at once, as set_optimizer_state_dict's: reached through
    # torch's trampoline (holding the GIL) gloo's worker thread, freeing them, waited for
    # the GIL while the next call waited for gloo's queue, and a resumed run hung.
    scattered = []
    for i in range(SCATTERS):
        part = torch.empty(3)
        parts = [torch.full((3,), float(i + r)) for r in range(2)] if rank == 0 else None
        dist.scatter(part, parts, group=g, group_src=0)
        scattered.append(part[0].item())
    gathered = [torch.empty(1) for _ in range(2)] if rank == 1 else None
    dist.gather(torch.full((1,), rank + 7.0), gathered, group=g, group_dst=1)
    return {"objects": objects, "got": got, "product": product.tolist(),
            "scattered": scattered, "gathered": gathered and [t.item() for t in gathered],
            "counts": dict(g.counts)}


def _ops(rank, world, port, out):
    _init(rank, world, port)
    g = collectives.new_group(slot_bytes=SLOT)
    result = {"rank": rank, "shared": collectives.is_shared(g), "bad": _differences(g, rank),
              **_odd_shapes(g, rank), **_gloo_does_the_rest(g, rank)}
    # a tmpfs without room for the file, and a rank that cannot open it: gloo on both
    huge = collectives.new_group(slot_bytes=1 << 50)
    if rank == 1:
        opened = shm_file.os.open
        shm_file.os.open = lambda path, *a: (_ for _ in ()).throw(PermissionError(13, "no"))
    refused = collectives.new_group()
    if rank == 1:
        shm_file.os.open = opened
    x = torch.full((5,), rank + 1.0)
    dist.all_reduce(x, group=refused)
    result |= {"huge": collectives.is_shared(huge), "refused": collectives.is_shared(refused),
               "refused sum": x.tolist()}
    late = collectives.new_group(timeout=timedelta(seconds=2))
    if rank == 0:  # rank 1 never joins this all-reduce
        try:
            dist.all_reduce(torch.ones(1), group=late)
        except RuntimeError as exc:
            result["late"] = str(exc)
    out_of_step = collectives.new_group()
    try:  # rank 0 sums 10 floats, rank 1 12: one chunk each, the same barriers
        dist.all_reduce(torch.ones(10 + 2 * rank), group=out_of_step)
    except RuntimeError as exc:
        result["out of step"] = str(exc)
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


def _spawn(tmp_path, fn, world=2):
    before = set(SHM_DIR.glob("ddlstudy-*"))
    run_ranks(fn, world, (free_port(), tmp_path))
    assert not left_behind(before)  # unlinked once every rank opened it
    return [torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in range(world)]


def left_behind(before: set[Path], pattern: str = "ddlstudy-*") -> set[Path]:
    """Files of /dev/shm new since ``before`` whose maker (the process id in the name) has
    ended: those the spawned ranks left. Another run's on this host, whose maker is still
    running (the suite beside a study), are its own business."""
    def ended(path: Path) -> bool:
        found = re.search(r"-(\d+)-[0-9a-f]+", path.name)
        if found is None:
            return True
        try:
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    return {p for p in set(SHM_DIR.glob(pattern)) - before if ended(p)}


def test_collectives_give_gloos_bits_and_gloo_does_the_rest(tmp_path):
    results = _spawn(tmp_path, _ops)
    for r in results:
        assert r["shared"] and r["bad"] == [], r
        assert r["transposed"] and r["strided out"] and r["in place"] and r["premul"], r
        assert r["async"] == (True, True, [2.0] * 3, [2.0] * 3)
        assert r["objects"] == [{"rank": 0}, {"rank": 1}]
        assert r["product"] == [6.0, 6.0]
        assert r["scattered"] == [float(i + r["rank"]) for i in range(SCATTERS)]
        # through gloo's own bindings (which release the GIL), every one counted
        assert {k: r["counts"][k] for k in ("gloo scatter", "gloo gather", "gloo barrier")} \
            == {"gloo scatter": SCATTERS, "gloo gather": 1, "gloo barrier": 1}
        assert r["counts"]["gloo allreduce"] == 1  # the product; every other one moved here
        assert r["counts"]["allreduce"] == 5 * 4 - 1 + 3  # 19 compared, 3 odd shapes
        assert r["counts"]["allgather"] == 5 + 2  # all_gather_object: sizes, then bytes
        assert not r["huge"] and not r["refused"] and r["refused sum"] == [3.0] * 5
    assert results[1]["got"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert results[1]["gathered"] == [7.0, 8.0] and results[0]["gathered"] is None
    assert results[0]["counts"]["gloo send"] == results[1]["counts"]["gloo recv"] == 1
    assert results[0]["late"].startswith("rank 0 waited 2 s in a collective for rank(s) [1]")
    assert results[1]["out of step"] == ("rank 1 called all_reduce of 12 torch.float32 (SUM) "
                                         "and rank(s) [0] another collective or size: the "
                                         "ranks are out of step")
    assert results[0]["out of step"].startswith("rank 0 called all_reduce of 10 torch.float32")


def _three(rank, world, port, out):
    """3 ranks: gloo's ring adds in another order, so sums agree with gloo's to float
    tolerance; every rank has the same bits (each chunk reduced in rank order)."""
    _init(rank, world, port)
    g = collectives.new_group(slot_bytes=256 << 10)  # 300 000 floats: 5 chunks, each shared
    gen = torch.Generator().manual_seed(rank)
    result = {"shared": collectives.is_shared(g), "far": [], "unlike": []}
    for n, dt in ((300_000, torch.float32), (999, torch.float32), (300_000, torch.int64)):
        x = (torch.randn(n, generator=gen) * 100).to(dt)
        for op in (R.SUM, R.MIN, R.MAX) + ((R.AVG,) if dt.is_floating_point else ()):
            mine, theirs = x.clone(), x.clone()
            dist.all_reduce(mine, op=op, group=g)
            dist.all_reduce(theirs, op=op)
            if not torch.allclose(mine.double(), theirs.double(), rtol=1e-6, atol=1e-4):
                result["far"].append((n, dt, op))
            every = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(every, mine)  # over gloo
            if not all(torch.equal(e, mine) for e in every):
                result["unlike"].append((n, dt, op))
    mine, theirs = torch.empty(100_000), torch.empty(100_000)
    dist.reduce_scatter_single(mine, x[:300_000].float(), group=g)
    dist.reduce_scatter_single(theirs, x[:300_000].float())
    result["reduce_scatter"] = torch.allclose(mine, theirs)
    mine, theirs = torch.empty(900_000, dtype=torch.int64), torch.empty(900_000, dtype=torch.int64)
    dist.all_gather_single(mine, x, group=g)
    dist.all_gather_single(theirs, x)
    result["all_gather"] = torch.equal(mine, theirs)
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


def test_three_ranks_share_each_chunk_and_agree_to_the_bit(tmp_path):
    for r in _spawn(tmp_path, _three, world=3):
        assert r["shared"] and r["far"] == [] and r["unlike"] == [], r
        assert r["reduce_scatter"] and r["all_gather"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 6))


def _train(model, optimizer, inputs) -> list[float]:
    losses = []
    for x, y in inputs:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _moved(group) -> dict[str, int]:
    """What ``group`` moved since last asked (nothing for gloo's)."""
    counts = getattr(group, "counts", Counter())
    taken = dict(counts)
    counts.clear()
    return taken


def _strategies(rank, world, port, out):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel

    _init(rank, world, port)
    gen = torch.Generator().manual_seed(rank)
    own = [(torch.randn(8, 12, generator=gen), torch.randint(0, 6, (8,), generator=gen))
           for _ in range(3)]  # each rank its own batches (data parallel)
    same = [(torch.randn(8, 12, generator=torch.Generator().manual_seed(9 + i)),
             torch.arange(8) % 6) for i in range(3)]  # every rank the same (tensor parallel)
    result = {}
    for name, group in (("shm", collectives.new_group(slot_bytes=SLOT)),
                        ("gloo", dist.new_group(backend="gloo"))):
        mesh = DeviceMesh.from_group(group, "cpu")
        result[name] = {"shared": collectives.is_shared(group)}
        model = _mlp()
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
        result[name]["fsdp"] = _train(model, torch.optim.Adam(model.parameters(), lr=0.01),
                                      own)
        result[name]["fsdp moved"] = _moved(group)
        model = DistributedDataParallel(_mlp(), process_group=group)
        result[name]["zero"] = _train(model, ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.Adam, process_group=group, lr=0.01), own)
        result[name]["zero moved"] = _moved(group)
        model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(),
                                                  "2": RowwiseParallel()})
        result[name]["tp"] = _train(model, torch.optim.SGD(model.parameters(), lr=0.1), same)
        result[name]["tp moved"] = _moved(group)
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


def test_fsdp2_zero_and_tensor_parallel_train_as_over_gloo(tmp_path):
    for r in _spawn(tmp_path, _strategies):
        assert r["shm"]["shared"] and not r["gloo"]["shared"]
        for strategy in ("fsdp", "zero", "tp"):
            assert r["shm"][strategy] == r["gloo"][strategy], strategy
        # each strategy's collectives went through shared memory, none to gloo but those
        # left to it by design (DDP's barrier and the like: GLOO_DOES)
        assert set(r["shm"]["fsdp moved"]) == {"all_gather_single", "reduce_scatter_single"}
        assert {"broadcast", "allreduce"} <= set(r["shm"]["zero moved"])  # ZeRO's, DDP's
        assert "allreduce" in r["shm"]["tp moved"]
        assert not [k for s in ("zero", "tp") for k in r["shm"][s + " moved"]
                    if k.startswith("gloo")
                    and k.removeprefix("gloo ") not in collectives.GLOO_DOES]
        assert r["shm"]["fsdp"][2] < r["shm"]["fsdp"][0]  # it learns


def test_bench_collectives_sets_shared_memory_against_gloo(capsys):
    from ddlstudy.cli import main

    assert main(["bench", "collectives", "--size", "4096", "--repeats", "2"]) == 0
    table = capsys.readouterr().out
    assert "collectives on 4096 (4,096 float32s, 0 MiB) between 2 processes" in table
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["| all_reduce", "| reduce_scatter_single",
                                    "| all_gather_single"]
    assert all(float(v) > 0 for r in rows for cell in r[1:] for v in
               cell.strip(" |").split(" / "))
    assert "could not be used" not in table
