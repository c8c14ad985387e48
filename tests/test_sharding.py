"""sharded, zero and tensor through the command line: they train as their data-parallel
twins do, resume bit for bit after a killed rank, and a sharded run's snapshot is a plain
model's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_faults import _identical, _manifest, ddlstudy, run_and_kill

from ddlstudy.config import load_usecase
from ddlstudy.models import build_model
from ddlstudy.records.runfolder import MANIFEST, SNAPSHOT
from ddlstudy.report import config_label

OWN_NET = f"{Path(__file__).parent / 'models' / 'own_net.py'}:small_resnet"


def _run(runs: Path, datasets_dir: Path, *extra: str) -> Path:
    workers = () if "--workers" in extra else ("--workers", "2")
    assert ddlstudy("run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir),
                    "--runs-dir", str(runs), "--sample-hz", "0", "--quiet", *workers,
                    *extra) == 0
    (folder,) = runs.glob("*/")
    return folder


@pytest.fixture(scope="module")
def twin(tmp_path_factory, datasets_dir):
    """Two epochs of 3 steps with the given flags, run once for the module's tests."""
    made: dict[tuple[str, ...], Path] = {}

    def get(*flags: str) -> Path:
        if flags not in made:
            made[flags] = _run(tmp_path_factory.mktemp("twin"), datasets_dir, *TWO, *flags)
        return made[flags]

    return get


TWO = ("--epochs", "2", "--max-steps", "3", "--no-snapshot")


def _losses(folder: Path) -> list[float]:
    return [e["train_loss"] for e in json.loads((folder / MANIFEST).read_text())["epochs"]]


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, OWN_NET], ids=["tiny", "own-batchnorm-net"])
def test_sharded_and_zero_train_as_cpu_processes(model, twin):
    """The same slices, dropout masks and averaged gradients: the same losses, epoch by
    epoch (FSDP2 sums a reduce-scatter where cpu-processes sums its shared slots: float
    tolerance, not bits)."""
    extra = ("--workers", "2", *(("--model", model) if model else ()))
    base = _losses(twin("--strategy", "cpu-processes", *extra))
    # zero keeps cpu-processes' model and buffers (its optimizer alone differs): one net
    for strategy in ("sharded", "zero") if model is None else ("sharded",):
        folder = twin("--strategy", strategy, *extra)
        assert _losses(folder) == pytest.approx(base, rel=1e-5), strategy
        manifest = _manifest(folder)
        transport = manifest["backend"]["mesh"]["transport"] if strategy == "sharded" \
            else manifest["transport"]
        assert transport == "shared-memory", strategy


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["cpu-processes", "sharded", "zero"])
def test_the_nodes_shared_memory_is_counted_once(strategy, twin):
    """Each process's peak holds the pages of /dev/shm it maps (the flat gradient buffer,
    FSDP's arena, ZeRO's buckets), and so does the other's: the node's figure counts each
    process's shared pages by its share, so those pages once, not twice."""
    memory = _manifest(twin("--strategy", strategy, "--workers", "2"))["backend"]["memory"]
    ranks = memory["per_rank"]
    assert all(r["shmem_bytes"] > 2**20 for r in ranks), ranks  # its buffers, mapped
    assert all(r["shmem_pss_bytes"] < r["shmem_bytes"] for r in ranks), ranks  # shared
    node = sum(r["peak_rss_bytes"] - r["shmem_bytes"] + r["shmem_pss_bytes"] for r in ranks)
    assert memory["per_host_bytes"] == {ranks[0]["host"]: node}
    assert node < sum(r["peak_rss_bytes"] for r in ranks)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sharded", "zero"])
def test_own_buffers_take_the_same_steps(strategy, twin):
    """--no-shared-buffers: sharded's FSDP allocates its buffers at each use and its
    collectives go through the group's slots; zero broadcasts each process's updated
    weights. The same sums in the same order, so the same losses to the bit (sharded's
    manifest says which buffers it used); the report keeps them apart."""
    shared = _manifest(twin("--strategy", strategy, "--workers", "2"))
    own = _manifest(twin("--strategy", strategy, "--workers", "2", "--no-shared-buffers"))
    assert [e["train_loss"] for e in own["epochs"]] == \
        [e["train_loss"] for e in shared["epochs"]]
    if strategy == "sharded":
        assert (own["backend"]["mesh"]["buffers"], shared["backend"]["mesh"]["buffers"]) \
            == ("own", "shared-memory")
    assert config_label(own) == config_label(shared) + " own buffers"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sharded", "tensor"])
def test_killed_then_resumed_ends_bit_identical(strategy, tmp_path, datasets_dir):
    """zero's resume (its optimizer's moments consolidated on rank 0) is test_recipe's."""
    args = ["run", "--usecase", "tiny", "--epochs", "3", "--max-steps", "5",
            "--snapshot-every", "2", "--datasets-dir", str(datasets_dir), "--sample-hz", "0",
            "--quiet", "--strategy", strategy, "--workers", "2"]
    runs = tmp_path / "runs"
    code, _, folder = run_and_kill([*args, "--runs-dir", str(runs)], runs, "worker-1",
                                   after_epochs=1)
    assert code != 0 and _manifest(folder)["status"] == "failed"
    assert torch.load(folder / SNAPSHOT, weights_only=True)["epoch"] < 3
    assert ddlstudy("run", "--resume", str(folder), "--quiet") == 0
    reference = _run(tmp_path / "reference", datasets_dir, *args[3:])
    assert _identical(folder, reference)
    assert _losses(folder) == _losses(reference)


@pytest.mark.slow
def test_a_sharded_snapshot_exports_into_a_plain_model(tmp_path, datasets_dir):
    folder = _run(tmp_path / "runs", datasets_dir, "--strategy", "sharded", "--epochs", "1",
                  "--max-steps", "2")
    assert _manifest(folder)["backend"]["mesh"]["shard"] == 2
    assert ddlstudy("export", "model", str(folder), "--out", str(tmp_path / "weights.pt")) == 0
    tiny = load_usecase("tiny")
    plain = build_model(tiny.model, len(tiny.classes))
    plain.load_state_dict(torch.load(tmp_path / "weights.pt", weights_only=True))  # strict
    snap = torch.load(folder / SNAPSHOT, weights_only=True)["model"]
    assert all(torch.equal(plain.state_dict()[k], snap[k]) for k in snap)
    assert not all(torch.equal(v, build_model(tiny.model, 3).state_dict()[k])
                   for k, v in snap.items())  # trained weights, not fresh ones


@pytest.mark.slow
def test_under_mpi_each_trains_as_its_local_twin(twin):
    """MPI nodes of sharded are HSDP (shards within a node, each averaged between nodes by
    the reducer), of tensor a tensor-parallel group a node: each takes the steps of one
    node of as many processes (tensor's twin: the 2-D mesh of sharded --tensor). The local
    twins of sharded and zero are the test above's runs."""
    mpi = ("--backend", "mpi", "--nodes", "2")
    # sharded: nodes of 2, whose shards (of unequal sizes: a Linear of 3 outputs) meet
    # on the leader between nodes
    pairs = {"sharded": (("--strategy", "sharded", "--workers", "2", *mpi),
                         ("--strategy", "sharded", "--workers", "4")),
             "zero": (("--strategy", "zero", "--workers", "1", *mpi),
                      ("--strategy", "cpu-processes", "--workers", "2")),
             "tensor": (("--strategy", "tensor", "--workers", "2", *mpi),
                        ("--strategy", "sharded", "--workers", "4", "--tensor", "2"))}
    for name, (nodes, local) in pairs.items():
        a, b = twin(*nodes), twin(*local)
        assert _losses(a) == pytest.approx(_losses(b), rel=1e-5), name
        assert _manifest(a)["backend"]["name"] == "mpi"
    assert _manifest(a)["backend"]["mesh"] == {
        "tensor": 2, "nodes": 2, "transport": "shared-memory",
        "pairs": [["classifier.1", "classifier.4"]]}
    assert _manifest(b)["backend"]["mesh"]["buffers"] == "own"  # a 2-D mesh: FSDP's own
    assert _manifest(twin(*pairs["sharded"][0]))["backend"]["mesh"]["buffers"] == \
        "shared-memory"  # HSDP: the arena within each node


def test_strategies_name_what_each_shards(capsys):
    from ddlstudy.cli import main

    assert main(["strategies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shards = {lines[i - 2 if "flags:" in lines[i - 1] else i - 1].split()[0]: line
              for i, line in enumerate(lines) if "shards:" in line}
    assert "FSDP2" in shards["sharded"] and "ZeRO-3" in shards["sharded"]
    assert "ZeRO-1" in shards["zero"] and "tensor parallel" in shards["tensor"]
    assert "cpu-processes" not in shards  # a whole replica a process: nothing shards


@pytest.mark.parametrize("gpus, device, collectives", [(0, None, "gloo"), (1, None, "gloo"),
                                                       (2, "cuda", "nccl")])
def test_each_goes_to_gpus_when_there_is_one_a_process(monkeypatch, quick_config, gpus, device,
                                                      collectives):
    """The same workers on GPUs over NCCL where there is a GPU for each of the node's
    processes (pipeline's rule), else on CPU processes: what the layout, hence the local
    backend and the manifest, gets (the CUDA path itself runs under ``make gpu-check``)."""
    from ddlstudy.strategies import get_strategy, processes

    monkeypatch.setattr(processes, "cuda_devices", lambda: gpus)
    for name in ("sharded", "zero", "tensor"):
        layout = get_strategy(name).layout(quick_config(strategy=name, workers=2))
        assert (layout.device, layout.collectives, layout.processes) == (device, collectives, 2)
        assert layout.device_type == (device or "cpu")
        assert layout.threads_per_process == 1 or device is None


def test_zero_2_is_a_configuration_of_its_own_in_the_report():
    """sharded with --no-reshard-after-forward (ZeRO-2) is not a repeat of sharded (ZeRO-3):
    a study of both keeps them in rows of their own."""
    from ddlstudy.report import config_label

    def label(reshard: bool) -> str:
        return config_label({"strategy": {"name": "sharded", "processes": 2},
                             "config": {"reshard_after_forward": reshard}})

    assert label(True) == "sharded (2 processes)"
    assert label(False) == "sharded (2 processes) ZeRO-2"
