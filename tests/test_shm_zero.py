"""ZeRO-1's weights in shared memory (``training.shm.zero``), between 2 and 3 spawned processes:
the same losses and weights, to the bit, as ZeroRedundancyOptimizer's own broadcasts, its
step's exchange a barrier, every rank's parameters views of one file (an update by one
rank is seen by all); over gloo, nothing changes."""

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from test_shm_collectives import _init, _spawn
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddlstudy.training.shm import collectives, zero
from ddlstudy.training.shm import file as shm_file

pytestmark = pytest.mark.skipif(shm_file.usable() != "", reason=shm_file.usable())


def _train(group, rank, share: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 33), nn.ReLU(), nn.Linear(33, 20), nn.ReLU(),
                          nn.Linear(20, 6))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD,
                                        process_group=group, parameters_as_bucket_view=True,
                                        lr=0.1, momentum=0.9)
    shared = zero.share_weights(optimizer) if share else None
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 12, generator=gen), torch.randint(0, 6, (8,), generator=gen)
    losses = []
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():  # the gradients averaged, as the strategies do
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=group)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    counts = getattr(group, "counts", Counter())
    moved = {k: counts[k] for k in ("zero step", "broadcast") if counts[k]}
    counts.clear()
    weights = [p.detach().clone() for p in model.parameters()]
    if shared is not None:  # one file: a change by the last rank is every rank's
        dist.barrier()  # every rank has its copy of the weights before the change
        if rank == dist.get_world_size() - 1:
            next(model.parameters()).data.add_(1.0)
        dist.barrier()
        weights.append(next(model.parameters()).detach().clone())
        dist.barrier()
    return {"losses": losses, "weights": weights, "moved": moved, "shared": shared is not None}


def _ranks(rank, world, port, out):
    _init(rank, world, port)  # gloo, one thread
    shm, gloo = collectives.new_group(), dist.new_group(backend="gloo")
    result = {"own": _train(shm, rank, False), "shared": _train(shm, rank, True),
              "gloo": _train(gloo, rank, True)}
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


@pytest.mark.parametrize("world", [2, 3])
def test_zero_weights_in_shared_memory_give_the_broadcasts_bits(tmp_path, world):
    for r in _spawn(tmp_path, _ranks, world):  # no shared file left behind
        own, shared = r["own"], r["shared"]
        assert shared["shared"] and not own["shared"] and not r["gloo"]["shared"]
        assert shared["losses"] == own["losses"] and own["losses"][-1] < own["losses"][0]
        assert all(torch.equal(a, b) for a, b in zip(own["weights"], shared["weights"][:-1],
                                                     strict=True))
        assert own["moved"] == {"broadcast": 4 * world} and shared["moved"] == {"zero step": 4}
        assert torch.equal(shared["weights"][-1], shared["weights"][0] + 1.0)
