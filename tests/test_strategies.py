"""Every data-parallel strategy takes the same optimisation step as the sequential baseline.

Tolerance: the update (weights after minus before) of a strategy must match the baseline's
to a relative norm error of 1e-5. The strategies only reorder float32 sums (sub-batch
gradients added up, or all-reduced), which moves the update by ~1e-7 relative; a wrong
weighting of sub-batches (e.g. averaging 6+5+5 images as if equal) errs by ~1e-2.
Dropout is off (eval mode; AlexNet has no batch norm) so that all draw the same network.
"""

import contextlib
import copy
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlstudy.config import ModelSpec, RunConfig, with_overrides
from ddlstudy.models import build_model
from ddlstudy.runner import run
from ddlstudy.strategies import REGISTRY, get_strategy
from ddlstudy.training import ShardedBatches, plain_step, split_sizes
from ddlstudy.training.distributed import free_port, spawn
from ddlstudy.training.flat import exchange_step, flat_gradients
from ddlstudy.training.job import Link
from ddlstudy.training.one_model import ddp_step
from ddlstudy.training.replicas import replica_grads
from ddlstudy.training.shm import average as shm_average

BATCH = 16
TOLERANCE = 1e-5


def _ranks(fn, nprocs: int, args: tuple) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes as a run starts them (forked from the
    warm server that imported torch once), waiting for all."""
    context = spawn(fn, nprocs, args)
    while not context.join():
        pass


def _setup():
    torch.manual_seed(0)
    model = build_model(ModelSpec(arch="alexnet", width=0.25), 3).eval()
    images = torch.randn(BATCH, 3, 64, 64)
    labels = torch.randint(0, 3, (BATCH,))
    return model, images, labels


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _sequential_update(steps: int = 1):
    model, images, labels = _setup()
    before = _flat(model)
    step = plain_step(model, _sgd(model), nn.CrossEntropyLoss())
    for i in range(steps):  # the second batch: the first's images upside down
        step((images.flip(2) if i else images, labels))
    return before, _flat(model) - before


def _relative_error(update, reference):
    return ((update - reference).norm() / reference.norm()).item()


@pytest.mark.parametrize("replicas", [2, 3])  # 3 does not divide 16: 6 + 5 + 5 images
def test_cpu_threads_steps_equal_sequential(replicas):
    """Two steps of cpu-threads' worker step (alone): the second is right only if the
    replicas took replica 0's new weights before it."""
    before, reference = _sequential_update(steps=2)
    model, images, labels = _setup()
    copies = [model] + [copy.deepcopy(model) for _ in range(replicas - 1)]
    with ThreadPoolExecutor(replicas) as pool:
        step = exchange_step(model, _sgd(model), flat_gradients(model), Link.alone(), BATCH,
                             local=replica_grads(copies, nn.CrossEntropyLoss(), pool))
        loss, correct, n = step((images, labels))
        step((images.flip(2), labels))
    assert n == BATCH
    update = _flat(model) - before
    assert _relative_error(update, reference) < TOLERANCE


def _ddp_setup(rank, world, port):
    """A rank's DDP model and its slice of the one test batch."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    model, images, labels = _setup()
    mine = next(iter(ShardedBatches([list(range(BATCH))], rank, world)))
    return model, DistributedDataParallel(model), (images[mine], labels[mine])


def _ddp_rank(rank, world, port, out):
    model, ddp, batch = _ddp_setup(rank, world, port)
    ddp_step(ddp, _sgd(ddp), nn.CrossEntropyLoss(), BATCH, world)(batch)
    if rank == 0:
        torch.save(_flat(model), out)
    dist.barrier()  # rank 0 holds the TCPStore: none leaves while another still uses it
    dist.destroy_process_group()


def test_cpu_processes_step_equals_sequential(tmp_path):
    """3 ranks: 3 does not divide 16 (6 + 5 + 5 images); 2 ranks' DDP step is
    test_ranks_keep_gloo's."""
    before, reference = _sequential_update()
    out = tmp_path / "weights.pt"
    _ranks(_ddp_rank, 3, (3, free_port(), out))
    update = torch.load(out, weights_only=True) - before
    assert _relative_error(update, reference) < TOLERANCE


def _shared_memory_rank(rank, world, port, out, shm_dir=None):
    """A step whose gradient buffer is this rank's slot of the host's shared memory (or,
    where rank 0 finds no ``shm_dir``, a DDP step over gloo), and what /dev/shm holds."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if shm_dir is not None and rank == 0:
        shm_average.SHM_DIR = shm_dir
    model, images, labels = _setup()
    mine = next(iter(ShardedBatches([list(range(BATCH))], rank, world)))
    shared = shm_average.join("auto", rank, world, sum(p.numel() for p in model.parameters()))
    if shared is None:
        ddp_step(DistributedDataParallel(model), _sgd(model), nn.CrossEntropyLoss(), BATCH,
                 world)((images[mine], labels[mine]))
    else:
        flat = flat_gradients(model, shared.buffer)
        link = Link(rank, world, lambda _flat, _step: shared.average(), None, None, None)
        exchange_step(model, _sgd(model), flat, link, BATCH)((images[mine], labels[mine]))
    left = sorted(p.name for p in shm_average.SHM_DIR.glob(f"ddlstudy-{os.getpid()}-*"))
    torch.save({"weights": _flat(model), "shared": shared is not None, "left": left},
               out.with_suffix(f".{rank}.pt"))
    dist.barrier()  # rank 0 holds the TCPStore: none leaves while another still uses it
    dist.destroy_process_group()


def _shared_memory_step(world, tmp_path, shm_dir=None):
    out = tmp_path / "weights"
    _ranks(_shared_memory_rank, world, (world, free_port(), out, shm_dir))
    return [torch.load(out.with_suffix(f".{r}.pt"), weights_only=True) for r in range(world)]


def test_shared_memory_step_equals_sequential_with_the_same_bits_on_every_rank(tmp_path):
    """3 ranks: each averages its share of the buffer, the last share shorter."""
    before, reference = _sequential_update()
    results = _shared_memory_step(3, tmp_path)
    assert all(r["shared"] for r in results)
    assert all(r["left"] == [] for r in results)  # unlinked once every rank mapped it
    assert _relative_error(results[0]["weights"] - before, reference) < TOLERANCE
    assert all(torch.equal(r["weights"], results[0]["weights"]) for r in results)


def test_ranks_keep_gloo_where_one_cannot_map_the_shared_file(tmp_path):
    before, reference = _sequential_update()
    results = _shared_memory_step(2, tmp_path, shm_dir=tmp_path / "no-shm")
    assert not any(r["shared"] for r in results)
    assert _relative_error(results[0]["weights"] - before, reference) < TOLERANCE


def test_sharded_batches_cover_each_batch_once():
    batches = [[7, 3, 9, 1, 4], [2, 8], [5]]
    shards = [list(ShardedBatches(batches, r, 2)) for r in range(2)]
    assert shards[0] == [[7, 3, 9], [2]] and shards[1] == [[1, 4], [8]]  # [5] < world: dropped


def test_shares_cut_each_batch_in_proportion_and_still_cover_it_once():
    batches = [list(range(16)), list(range(100, 103))]
    shards = []
    for r in range(2):
        sharded = ShardedBatches(batches, r, 2)
        sharded.shares = [0.75, 0.25]
        shards.append(list(sharded))
    assert [len(s) for s in shards[0]] == [12, 2] and [len(s) for s in shards[1]] == [4, 1]
    assert [a + b for a, b in zip(*shards, strict=True)] == batches
    assert split_sizes(16, 2, [100, 1]) == [15, 1]  # at least one image each
    assert split_sizes(17, 3, [1, 1, 1]) == split_sizes(17, 3) == [6, 6, 5]
    assert split_sizes(16, 2, [2, 1]) == [11, 5]  # 10.67 and 5.33, largest remainders
    for n, world, shares in [(16, 2, [0.7, 0.3]), (5, 3, [3, 1, 1]), (33, 4, [1, 2, 3, 4])]:
        sizes = split_sizes(n, world, shares)
        assert sum(sizes) == n and min(sizes) >= 1


def test_registry_lists_the_strategies():
    assert {"sequential", "cpu-intraop", "cpu-threads", "cpu-processes"} <= set(REGISTRY)
    assert all(cls.summary and get_strategy(name).name == name
               for name, cls in REGISTRY.items())


LEARN_EPOCHS = 10


@pytest.fixture(scope="module")
def learned(tmp_path_factory, datasets_dir, tiny, tiny_20):
    """The validation accuracies of a strategy's first LEARN_EPOCHS tiny epochs (no schedule:
    a run of as many): cpu-processes' from the session's 20, any other's run here once."""
    def get(strategy: str = "sequential", **flags) -> list[float]:
        folder = tiny_20(strategy, **flags) if strategy == "cpu-processes" else run(RunConfig(
            usecase=with_overrides(tiny, epochs=LEARN_EPOCHS), datasets_dir=datasets_dir,
            runs_dir=tmp_path_factory.mktemp("learn"), sample_hz=0, snapshot=False,
            strategy=strategy, **flags), show_progress=False)
        assert folder.manifest["status"] == "completed"
        return [e["val_accuracy"] for e in folder.manifest["epochs"][:LEARN_EPOCHS]]
    return functools.cache(get)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, flags", [
    ("cpu-threads", {"workers": 2}), ("cpu-processes", {"workers": 2}),
    ("pipeline", {"stages": 2}), ("hybrid", {"stages": 2, "replicas": 2}),
])
def test_strategies_learn_like_the_baseline(learned, strategy, flags):
    """Ten tiny epochs: every strategy ends well above chance (1/3) and near the baseline.
    Their runs differ from the baseline's only in dropout masks, so the curves are not
    identical; 60 validation images make one image 1.7 points. Observed best accuracies
    in ten epochs: 0.67 (pipeline) to 0.72 (the baseline); in twenty, 0.73 to 0.82."""
    base, other = learned(), learned(strategy, **flags)
    assert len(other) == LEARN_EPOCHS
    assert max(other) >= 0.55
    # at most 9 of the 60 validation images apart (0.15 in floats can be 0.15000000000000002)
    assert round(60 * abs(max(other) - max(base))) <= 9


def test_thread_replicas_repeat_bit_for_bit(quick_config, tmp_path):
    """Each replica draws its dropout masks from its own generator: two runs of the same
    config have the same losses, however the threads happened to be scheduled."""
    runs = [run(quick_config(strategy="cpu-threads", workers=2, epochs=2, snapshot=False,
                             runs_dir=tmp_path / str(i)), show_progress=False)
            for i in range(2)]
    first, second = ([e["train_loss"] for e in r.manifest["epochs"]] for r in runs)
    assert first == second


def test_balanced_cuts_minimise_the_slowest_stage():
    from ddlstudy.training.pipeline import balanced_cuts

    assert balanced_cuts([1, 1, 1, 1], 2) == [0, 2]
    assert balanced_cuts([5, 1, 1, 1, 1, 1], 2) == [0, 1]
    assert balanced_cuts([1, 1, 1, 1, 1, 5], 3) == [0, 2, 5]  # stages cost 2, 3, 5


def _pipeline_rank(rank, world, port, replicas, micro, out, schedule="gpipe", shared=True):
    """One rank of ``replicas`` pipelines (1: a plain pipeline), as the strategy builds it
    (``shared``: stages and replicas through this host's shared memory, else gloo); the
    last stage of pipeline 0 saves its step's loss, rank 0 the weights."""
    from ddlstudy.config.run import stages_a_process
    from ddlstudy.models.cuts import Layers
    from ddlstudy.training import shm
    from ddlstudy.training.pipeline import stages as pipe
    from ddlstudy.training.pipeline.exchange import gather_weights, replica_exchange

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    stages = world // replicas
    chunks = stages_a_process(schedule)
    replica, index = divmod(rank, stages)
    if shared:
        shm.register_pipes()
    pipes, data_groups = pipe._groups(replicas, stages,
                                      shm.PipesOptions(1 << 20) if shared else None)
    assert isinstance(pipes[replica], shm.HostPipes) == shared
    model, images, labels = _setup()
    layers = Layers(model)
    starts = pipe.balanced_cuts([1.0] * len(layers), stages * chunks, layers.starts)
    mine = next(iter(ShardedBatches([list(range(BATCH))], replica, replicas)))
    x, y = images[mine], labels[mine]
    sched, _, module = pipe.build_schedule(
        schedule, layers, starts, index, stages, micro,
        pipe.stage_inputs(layers, starts, x[: len(mine) // micro]), torch.device("cpu"),
        pipes[replica])
    average, zero, how = replica_exchange(model, module, layers, starts, rank, replicas,
                                          data_groups[index], stages, shared=shared)
    if replicas > 1:  # the replicas average through what was asked for
        assert how == ("shared-memory" if shared else "gloo")
    loss, _, n = pipe.pipeline_step(sched, _sgd(module), index == 0, index == stages - 1,
                                    average, zero=zero)((x, y))
    if replica == 0:
        gather_weights(model, layers, starts, rank, stages)
    if rank == 0:
        torch.save(_flat(model), out)
    if rank == stages - 1:
        torch.save(torch.tensor(loss / n), out.with_suffix(".loss"))
    dist.barrier()  # rank 0 holds the TCPStore: none leaves while another still uses it
    dist.destroy_process_group()


def _sequential_loss() -> float:
    model, images, labels = _setup()
    loss, _, n = plain_step(model, _sgd(model), nn.CrossEntropyLoss())((images, labels))
    return loss / n


@pytest.mark.parametrize("stages, micro, schedule, shared", [
    (2, 4, "gpipe", False), (3, 2, "gpipe", True), (2, 4, "1f1b", True),
    (2, 4, "interleaved-1f1b", True)])
def test_pipeline_step_equals_sequential(stages, micro, schedule, shared, tmp_path):
    """Every schedule runs the same micro-batches: the same loss and the same update as
    one sequential step on the whole batch (interleaved: 4 stages on 2 processes),
    through gloo and through shared memory."""
    before, reference = _sequential_update()
    out = tmp_path / "weights.pt"
    _ranks(_pipeline_rank, stages, (stages, free_port(), 1, micro, out, schedule, shared))
    update = torch.load(out, weights_only=True) - before
    assert _relative_error(update, reference) < TOLERANCE
    loss = torch.load(out.with_suffix(".loss"), weights_only=True).item()
    assert loss == pytest.approx(_sequential_loss(), rel=1e-5)


def test_hybrid_step_equals_sequential(tmp_path):
    before, reference = _sequential_update()
    out = tmp_path / "weights.pt"
    _ranks(_pipeline_rank, 4, (4, free_port(), 2, 2, out))
    update = torch.load(out, weights_only=True) - before
    assert _relative_error(update, reference) < TOLERANCE


@pytest.mark.parametrize("k", [2, 3])  # 3 does not divide 16: 6 + 5 + 5 images
def test_accumulated_micro_batches_step_equals_the_whole_batch(k):
    before, reference = _sequential_update()
    model, images, labels = _setup()
    loss, correct, n = plain_step(model, _sgd(model), nn.CrossEntropyLoss(), k)(
        (images, labels))
    assert n == BATCH
    assert _relative_error(_flat(model) - before, reference) < TOLERANCE


def _ddp_accumulating_rank(rank, world, port, out):
    """Count the gradient all-reduces of one step with --accumulate 4."""
    model, ddp, batch = _ddp_setup(rank, world, port)
    calls = []
    ddp.register_comm_hook(None, lambda _, bucket: (calls.append(1), dist.all_reduce(
        bucket.buffer().div_(world), async_op=True).get_future().then(
        lambda f: f.value()[0]))[1])
    ddp_step(ddp, _sgd(ddp), nn.CrossEntropyLoss(), BATCH, world, accumulate=4)(batch)
    if rank == 0:
        torch.save({"weights": _flat(model), "allreduces": torch.tensor(len(calls))}, out)
    dist.barrier()  # rank 0 holds the TCPStore: none leaves while another still uses it
    dist.destroy_process_group()


def test_accumulation_under_ddp_syncs_once_and_equals_the_whole_batch(tmp_path):
    before, reference = _sequential_update()
    out = tmp_path / "result.pt"
    _ranks(_ddp_accumulating_rank, 2, (2, free_port(), out))
    result = torch.load(out, weights_only=True)
    assert _relative_error(result["weights"] - before, reference) < TOLERANCE
    # The tiny model's gradients fill DDP's first two buckets: one synced backward makes
    # 1-2 all-reduces; a sync on each of the 4 micro-batches would make 4-8.
    assert 1 <= int(result["allreduces"]) <= 2


def _mesh_rank(rank, world, port, out):
    """One step of each strategy's worker pieces (sharded: FSDP2 per block; zero:
    ZeroRedundancyOptimizer; tensor: the Linear pairs split, the whole batch on every rank),
    then the whole weights gathered on rank 0."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from ddlstudy.training.sharding import FULL, shard_model, tensor_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mine = next(iter(ShardedBatches([list(range(BATCH))], rank, world)))
    for strategy in ("sharded", "zero", "tensor"):
        model, images, labels = _setup()
        mesh = init_device_mesh("cpu", (world,))
        if strategy == "tensor":
            assert tensor_parallel(model, mesh) == [("classifier.1", "classifier.4")]
            plain_step(model, _sgd(model), nn.CrossEntropyLoss())((images, labels))
        elif strategy == "sharded":
            units = shard_model(model, mesh)
            assert "classifier.1" in units and units[-1] == ""
            ddp_step(model, _sgd(model), nn.CrossEntropyLoss(), BATCH, world,
                     no_sync=contextlib.nullcontext)((images[mine], labels[mine]))
        else:
            ddp = DistributedDataParallel(model)
            zero = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD, lr=0.05,
                                           momentum=0.9)
            ddp_step(ddp, zero, nn.CrossEntropyLoss(), BATCH, world)((images[mine],
                                                                      labels[mine]))
        whole = get_model_state_dict(model, options=FULL)
        if rank == 0:
            plain, _, _ = _setup()
            plain.load_state_dict(whole)
            torch.save(_flat(plain), out.with_suffix(f".{strategy}.pt"))
    dist.barrier()  # rank 0 holds the TCPStore: none leaves while another still uses it
    dist.destroy_process_group()


def test_sharded_zero_and_tensor_steps_equal_sequential(tmp_path):
    """Their whole weights after a step, gathered from the shards, are the baseline's."""
    before, reference = _sequential_update()
    out = tmp_path / "weights"
    _ranks(_mesh_rank, 2, (2, free_port(), out))
    for strategy in ("sharded", "zero", "tensor"):
        update = torch.load(out.with_suffix(f".{strategy}.pt"), weights_only=True) - before
        assert _relative_error(update, reference) < TOLERANCE, strategy
