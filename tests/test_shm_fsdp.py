"""FSDP2's all-gathers and reduce-scatters with their buffers in shared memory
(``training.shm.fsdp``), between 2 and 3 spawned processes: the same losses and weights, to the
bit, as the group's own collectives through its slots (and gloo's bits between 2 ranks),
with every collective moved as a barrier in the arena (backward's prefetch included),
AVG and PREMUL_SUM; with no room in the arena, the group's own collectives."""

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from test_shm_collectives import _init, _spawn
from torch import nn

from ddlstudy.training.shm import collectives, fsdp
from ddlstudy.training.shm import file as shm_file

pytestmark = pytest.mark.skipif(shm_file.usable() != "", reason=shm_file.usable())


def _train(group, rank, share: bool, divide: float | None, total: int | None = None):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # 33 rows: padded to a multiple of 2 and of 3 ranks
    model = nn.Sequential(nn.Linear(12, 33), nn.ReLU(), nn.Linear(33, 20), nn.ReLU(),
                          nn.Linear(20, 6))
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
        if divide:
            layer.set_gradient_divide_factor(divide)
    arena = fsdp.share_buffers(model, group, total) if share else None
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 12, generator=gen), torch.randint(0, 6, (8,), generator=gen)
    losses = []
    for _ in range(4):  # each rank its own batch, again
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    weights = [p.full_tensor() for p in model.parameters()]
    counts = getattr(group, "counts", Counter())
    moved = {k: v for k, v in counts.items() if not k.startswith("gloo")}  # not full_tensor's
    counts.clear()
    return {"losses": losses, "weights": weights, "moved": moved, "arena": arena is not None}


def _ranks(rank, world, port, out):
    _init(rank, world, port)  # gloo, one thread
    shm, gloo = collectives.new_group(slot_bytes=1024), dist.new_group(backend="gloo")
    result = {}
    for divide in (None, 4.0):  # AVG, then PREMUL_SUM (which gloo has not)
        result[divide] = {"own": _train(shm, rank, False, divide),
                          "gloo": _train(gloo, rank, False, divide) if divide is None else None,
                          "shared": _train(shm, rank, True, divide),
                          "no room": _train(shm, rank, True, divide, total=8)}
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp_buffers_in_shared_memory_give_gloos_bits(tmp_path, world):
    for result in _spawn(tmp_path, _ranks, world):  # no shared file left behind
        for divide, runs in result.items():
            own = runs["own"]  # the group's own collectives through its slots
            for name in ("shared", "no room"):
                assert runs[name]["arena"] and not own["arena"], (divide, name)
                assert runs[name]["losses"] == own["losses"], (divide, name)
                assert all(torch.equal(a, b) for a, b in zip(
                    runs[name]["weights"], own["weights"], strict=True)), (divide, name)
            if divide is None:  # gloo's bits between 2 ranks; 3 add in another order
                same = torch.equal if world == 2 else torch.allclose
                assert all(same(a, b) for a, b in zip(
                    own["weights"], runs["gloo"]["weights"], strict=True))
            # 4 steps of 3 units: forward's gathers, backward's again but the root's, a
            # reduce-scatter each
            assert runs["shared"]["moved"] == {"fsdp all_gather": 4 * 5,
                                               "fsdp reduce_scatter": 4 * 3}, divide
            assert runs["no room"]["moved"] == own["moved"] == {
                "all_gather_single": 4 * 5, "reduce_scatter_single": 4 * 3}, divide
            assert own["losses"][-1] < own["losses"][0]
