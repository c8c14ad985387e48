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

from ddlstudy.training import memory
from ddlstudy.training.one_model import _consolidate
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
              "gloo": _train(gloo, rank, True), "consolidations": _consolidations(shm, rank)}
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request, tmp_path_factory) -> list[dict]:
    """What each of 2, then 3, spawned ranks trained and consolidated (``_ranks``)."""
    return _spawn(tmp_path_factory.mktemp("zero"), _ranks, request.param)


def test_zero_weights_in_shared_memory_give_the_broadcasts_bits(ranks):
    world = len(ranks)
    for r in ranks:  # no shared file left behind
        own, shared = r["own"], r["shared"]
        assert shared["shared"] and not own["shared"] and not r["gloo"]["shared"]
        assert shared["losses"] == own["losses"] and own["losses"][-1] < own["losses"][0]
        assert all(torch.equal(a, b) for a, b in zip(own["weights"], shared["weights"][:-1],
                                                     strict=True))
        assert own["moved"] == {"broadcast": 4 * world} and shared["moved"] == {"zero step": 4}
        assert torch.equal(shared["weights"][-1], shared["weights"][0] + 1.0)


def _consolidations(group, rank) -> dict:
    """A snapshot's consolidation of Adam's moments on rank 0, ddlstudy's and torch's
    (``consolidate_state_dict``): what rank 0 writes, and how far each raised each rank's
    peak resident memory above its training peak."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(4)))  # 16 MiB of weights
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                        process_group=group, lr=0.01)
    for _ in range(2):
        model(torch.randn(4, 1024)).sum().backward()
        optimizer.step()
    shard = sum(t.numel() * t.element_size() for state in optimizer.optim.state.values()
                for t in state.values())
    result = {"shard": shard}
    for name, consolidate in (("ours", _consolidate),
                              ("torch's", lambda o: o.consolidate_state_dict(to=0))):
        dist.barrier()
        memory.reset_peak()
        before = memory.peak_rss()
        consolidate(optimizer)
        result[name] = optimizer.state_dict() if rank == 0 else None
        result[f"{name} rise"] = memory.peak_rss() - before
    return result


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_snapshots_consolidation_is_torchs_without_its_copies(ranks):
    """ddlstudy's consolidation of ZeRO's shards (``one_model._consolidate``) gives rank 0
    torch's state dict, tensor for tensor; a sender's peak rises by less than its shard
    (it sends its tensors as they are), where torch's raised it by several shards (its
    pickle copied through a Python sequence of bytes: resnet18's 22 MB shard, 240 MB)."""
    world = len(ranks)
    ranks = [r["consolidations"] for r in ranks]
    first = ranks[0]
    assert _same(first["ours"], first["torch's"]) and len(first["ours"]["state"]) == 8
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(first["ours"]["state"][0])
    for r in ranks[1:]:
        assert r["ours"] is None and r["shard"] > 8 * 2**20 / world
        assert r["ours rise"] < r["shard"] / 2 < 2 * r["shard"] < r["torch's rise"], r
