"""`ddlstudy advise` (issue 18): probes, the exchange's cost model, the ranking, and the
advice checked against what a study of its candidates measures."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from ddlstudy import hosts
from ddlstudy.cli import build_parser, main
from ddlstudy.cli.advise import _what
from ddlstudy.config import load_usecase
from ddlstudy.config.limits import size_bytes
from ddlstudy.records.advised import advice_plan, row_configs
from ddlstudy.records.memory import node_bytes as measured
from ddlstudy.report import load_runs
from ddlstudy.strategies.base import Footprint
from ddlstudy.tools import advise
from ddlstudy.tools.advise import checking
from ddlstudy.tools.advise.memory import split
from ddlstudy.tools.predict import Cost, measure_sizes

WHY_NOT = hosts.can_emulate()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def _exchange(beta: float) -> advise.Exchange:
    """Every reducer at alpha 50 us and ``beta`` s/byte; compressors costing 2 ns a
    gradient byte of compute on top of their wire bytes."""
    from ddlstudy import reducers

    return advise.Exchange({r: Cost(50e-6, beta) for r in reducers.REGISTRY},
                           {s: (50e-6, 2e-9, beta) for s in advise.COMPRESSORS}, "test")


def test_candidates_list_every_layout_and_say_why_one_cannot_fit():
    two = {c.label: c for c in advise.candidates(2, 0)}
    assert [c.flags.get("strategy") for c in two.values()] == [
        "sequential", "cpu-intraop", "cpu-threads", "cpu-processes", "gpu-data", "sharded",
        "sharded", "sharded", "zero", "tensor", "pipeline", "pipeline", "pipeline", "hybrid"]
    assert two["sharded (2 processes)"].flags == {"strategy": "sharded", "workers": 2}
    # sharded with FSDP's own buffers, a 2-D mesh (too large here), every schedule
    assert two["sharded (2 processes, own buffers)"].flags["no_shared_buffers"] is True
    assert "needs 4 processes" in two["sharded (4 processes, tensor 2)"].skip
    assert two["pipeline (2 stages x 4 mb, interleaved 1f1b)"].flags["schedule"] == \
        "interleaved-1f1b"
    # each again in another precision, as asked
    bf16 = {c.label: c for c in advise.candidates(2, 0, precisions=("bf16",))}
    assert bf16["zero (2 processes), bf16"].flags == {"strategy": "zero", "workers": 2,
                                                      "precision": "bf16"}
    assert len(bf16) == 2 * len(two)
    assert two["cpu-processes (2 processes)"].flags == {"strategy": "cpu-processes",
                                                        "workers": 2}
    assert "needs 4 processes" in two["hybrid (2 x 2 stages)"].skip
    assert not two["sequential"].skip
    eight = [c.flags.get("workers") for c in advise.candidates(8, 0)
             if c.flags.get("strategy") == "cpu-intraop"]
    assert eight == [8, 4, 2]
    one = advise.candidates(1, 0)
    assert any("1 usable core" in c.skip for c in one)
    gpus = {c.label: c for c in advise.candidates(2, 4)}  # more GPUs than cores: they count
    assert [c.flags["workers"] for c in gpus.values() if c.flags["strategy"] == "tensor"] == \
        [4, 2]
    assert not gpus["sharded (4 processes, a GPU each)"].skip
    assert gpus["zero (2 processes, a GPU each)"].flags == {"strategy": "zero", "workers": 2}
    assert all(c.skip for c in one if c.cores > 1)


def test_preflight_refusals_become_reasons_and_the_rest_get_their_footprint(tmp_path):
    cands = advise.candidates(2, 0)
    advise.check_fit(cands, "tiny", runs_dir=tmp_path)
    by = {c.label: c for c in cands}
    assert "needs CUDA GPUs" in by["gpu-data (all GPUs)"].skip
    assert by["sequential"].skip == "" and by["cpu-processes (2 processes)"].skip == ""
    assert by["sequential"].footprint == Footprint()
    assert by["cpu-processes (2 processes)"].footprint == Footprint(2, 2, 2)
    assert by["cpu-threads (2 replicas)"].footprint == Footprint(1, 2, 1, 1.5)
    assert by["zero (2 processes)"].footprint == Footprint(2, 2, 1, gathers=(0.0, 0.5))
    # its arena in shared memory: 3 x tiny's largest unit (classifier.1, 2304 x 1024
    # weights and 1024 biases, float32) and a page a unit (3) and 2 more
    arena = 3 * 4 * (2304 * 1024 + 1024) + 4096 * 5
    assert by["sharded (2 processes)"].footprint == Footprint(2, 1, 1, shared_bytes=arena,
                                                                 gathers=(1.0, 1.0))
    assert by["tensor (2 processes)"].footprint == Footprint(2, 2, 2, 2, tensor=2,
                                                             gathers=(1.0, 1.0))
    assert by["pipeline (2 stages x 4 mb)"].footprint == Footprint(2, 1, 1, 1.0)
    assert by["pipeline (2 stages x 4 mb, 1f1b)"].footprint == Footprint(2, 1, 1, 0.5)


MIB = 2**20


def _baseline_memory(peak: int, setup: int, params: int, optimizer: int,
                     shared: int = 0) -> dict:
    """A made-up ``backend.memory`` record of the baseline's one process (MiB)."""
    return {"per_rank": [{"rank": 0, "host": "h", "peak_rss_bytes": peak * MIB,
                          "setup_rss_bytes": setup * MIB, "setup_file_bytes": shared * MIB,
                          "held_bytes": {"parameters": params * MIB, "gradients": params * MIB,
                                         "optimizer_state": optimizer * MIB, "buffers": 0}}],
            "per_host_bytes": {"h": peak * MIB}}


def test_each_layout_s_peak_a_node_is_predicted_from_the_baseline_s_parts(tmp_path):
    """The baseline peaked at 1000 MiB: 600 of interpreter, torch and data (700 resident
    once set up, less its 100 of parameters), 200 of parameters and gradients, 100 of
    momentum, and 100 its steps added (activations). Each layout holds its copies."""
    cands = advise.candidates(2, 0)
    advise.check_fit(cands, "tiny", runs_dir=tmp_path)
    by = {c.label: c for c in cands}
    by["sequential"].memory = _baseline_memory(1000, 700, 100, 100)
    advise.admit(cands, 1750 * MIB, batch=16, linear=0.5)
    split = by["sequential"].split
    assert (split.rest, split.model, split.states, split.activations) == (
        600 * MIB, 200 * MIB, 100 * MIB, 100 * MIB)
    need = {label: c.peak(16) / MIB for label, c in by.items() if c.footprint}
    assert need["sequential"] == 1000 == by["sequential"].measured_peak() / MIB
    assert need["cpu-threads (2 replicas)"] == 600 + 2 * 200 + 100 + 1.5 * 100
    assert need["cpu-processes (2 processes)"] == 2 * (600 + 200 + 100) + 100
    assert need["zero (2 processes)"] == 2 * (600 + 200) + 100 + 100
    # sharded peaks as rank 0 writes its snapshot: the activations (100) freed, the whole
    # parameters (100) and optimizer state (100) gathered beside the shards
    assert need["sharded (2 processes)"] == 2 * 600 + 200 + 100 + 100 + 100
    # half the weights in Linear pairs, split in 2; each process the whole batch
    assert need["tensor (2 processes)"] == 2 * 600 + 2 * 0.75 * (200 + 100) + 2 * 100
    assert need["pipeline (2 stages x 4 mb, 1f1b)"] == 2 * 600 + 200 + 100 + 50
    # over 1750 MiB: left out before any probe, with what it would need
    assert by["zero (2 processes)"].skip == \
        "needs about 1.76 GiB a node, and --memory is 1.71 GiB"
    assert by["cpu-processes (2 processes)"].skip.startswith("needs about 1.86 GiB a node")
    assert by["tensor (2 processes)"].skip and not by["sharded (2 processes)"].skip
    # 2 MPI nodes of the baseline: a node computes half the batch (strong) or all (weak)
    seq = by["sequential"]
    strong = advise.Candidate("s x 2", {"strategy": "sequential", "backend": "mpi",
                                        "nodes": 2}, 1, nodes=2, node=seq)
    weak = advise.Candidate("s x 2 weak", strong.flags | {"scaling": "weak"}, 1, nodes=2,
                            node=seq)
    advise.admit([seq, strong, weak], 990 * MIB, batch=16)
    assert strong.peak(strong.node_batch(16)) / MIB == 950 and not strong.skip
    assert weak.peak(weak.node_batch(16)) / MIB == 1000 and "0.98 GiB a node" in weak.skip
    # rows predicted for nodes no probe ran: left out alike; the baseline's is kept
    rows = [{"label": "sequential", "nodes": 1, "predicted_need_node_bytes": 1000 * MIB},
            {"label": "zero x 4", "nodes": 4, "predicted_need_node_bytes": 1800 * MIB,
             "predicted_peak_node_bytes": 2000 * MIB},
            {"label": "old", "nodes": 1, "predicted_need_node_bytes": None}]
    fit, left = advise.fitting(rows, 900 * MIB)
    assert [r["label"] for r in fit] == ["sequential", "old"]
    assert left == [{"label": "zero x 4", "nodes": 4, "predicted_peak_node_bytes": 2000 * MIB,
                     "predicted_need_node_bytes": 1800 * MIB,
                     "skipped": "needs about 1.76 GiB a node, and --memory is 0.88 GiB"}]


def test_a_node_needs_its_own_pages_not_the_libraries_it_maps(tmp_path):
    """300 of the baseline's 700 MiB set up are files' pages (torch's libraries): a node
    of 2 processes peaks at 1900 MiB of resident memory counted a process, and needs 1300
    of its memory (what its host's cgroup is charged: the libraries' pages the machine
    has cached are not); --memory 1700 MiB holds it to the need. Its largest process
    peaks at its 600 of set-up less parameters, a whole replica and its state, and the
    activations of its half of the batch."""
    cands = advise.candidates(2, 0)
    advise.check_fit(cands, "tiny", runs_dir=tmp_path)
    by = {c.label: c for c in cands}
    by["sequential"].memory = _baseline_memory(1000, 700, 100, 100, shared=300)
    advise.admit(cands, 1700 * MIB, batch=16, linear=0.5)
    processes = by["cpu-processes (2 processes)"]
    assert processes.peak(16) / MIB == 1900 and processes.need(16) / MIB == 1300
    assert processes.process(16) / MIB == 600 + 200 + 100 + 100 / 2
    sharded = by["sharded (2 processes)"]  # each process maps the whole of its arena
    # and rank 0 peaks as it writes a snapshot: its half of the node's model, state and
    # activations, less its activations (freed), plus the whole parameters and state it
    # gathers (100 + 100)
    assert sharded.process(16) == round(600 * MIB + (200 + 100 + 100) * MIB / 2
                                        - 100 * MIB / 2 + 200 * MIB
                                        + sharded.footprint.shared_bytes)
    # ZeRO-1's writer receives the other rank's half of the optimizer state alone: 600 +
    # (400 + 100 + 100) / 2 less its 50 of activations plus 50; the node peaks training
    zero = by["zero (2 processes)"]
    assert zero.process(16) / MIB == 600 + 600 / 2 - 50 + 50
    assert zero.peak(16) / MIB == 1200 + 400 + 100 + 100
    assert by["tensor (2 processes)"].peak(16) / MIB == max(
        1200 + 2 * 0.75 * 200 + 2 * 0.75 * 100 + 2 * 100,  # training: a whole batch each
        1200 + 2 * 0.75 * 200 + 2 * 0.75 * 100 + 100 + 100)  # less 2 x 100 plus 200
    assert not processes.skip
    assert by["sequential"].need(16) / MIB == 700 and by["sequential"].peak(16) / MIB == 1000
    assert by["sequential"].process(16) / MIB == 1000
    # one process: all its own (600 + 2 x 200 + 100 + 1.5 x 100, less its 300 of files)
    assert by["cpu-threads (2 replicas)"].need(16) / MIB == 950
    record = processes.record()
    assert (record["predicted_peak_node_bytes"], record["predicted_need_node_bytes"]) == (
        1900 * MIB, 1300 * MIB)


def test_the_libraries_a_forked_baseline_maps_while_training_are_its_process_s():
    """Forked from a warm server, the baseline's probe had 32 MiB of its libraries' pages
    once set up and 100 at its end: the 68 it mapped while training are its process's
    rest (every process maps them), not its batch's activations, and a node holds all 100
    once."""
    memory = _baseline_memory(1000, 700, 100, 100, shared=32)
    memory["per_rank"][0]["end_file_bytes"] = 100 * MIB
    parts = split(memory, 16)
    assert (parts.rest, parts.activations, parts.shared) == (668 * MIB, 32 * MIB, 100 * MIB)


def test_an_mpi_probe_s_measured_peak_is_its_node_s_share_of_the_host():
    """Nodes sharing a host (one hostname) divide its figure; on hosts of their own each
    is its host's (of a run recorded before the files' pages were: its summed peaks)."""
    memory = {"per_host_bytes": {"h": 3000 * MIB}}
    assert measured(memory, 2) == 1500 * MIB and measured(memory, 1) == 3000 * MIB
    assert measured({"per_host_bytes": {"a": 900 * MIB, "b": 1000 * MIB}}, 2) == 1000 * MIB
    rank = _baseline_memory(1000, 700, 100, 100, shared=300)["per_rank"][0]
    assert measured({"per_rank": [rank, rank | {"rank": 1}]}, 2) == 700 * MIB


@pytest.mark.parametrize("text, nbytes", [("1GiB", 2**30), ("512MiB", 512 * 2**20),
                                          ("2.5GB", 2_500_000_000), ("3000", 3000),
                                          ("1 gib", 2**30)])
def test_memory_sizes_read_si_and_binary_units(text, nbytes):
    assert size_bytes("--memory", text) == nbytes


def test_probe_settings_time_box_an_epoch_s_steady_steps():
    """An epoch (tiny's 240 training images, batch 16: 15 steps; simple-big's 151) whose
    steady steps end once they have taken the box's seconds."""
    tiny = advise.probe_settings(load_usecase("tiny"), 3.0)
    assert tiny == {"epochs": 1, "max_steps": 15, "warmup_steps": 2, "steady_seconds": 3.0,
                    "max_val_steps": 1, "no_snapshot": True, "sample_hz": 0}
    big = advise.probe_settings(load_usecase("simple-big"), 1.5, warmup=1, epochs=2)
    assert (big["epochs"], big["max_steps"], big["warmup_steps"], big["steady_seconds"]) == (
        2, 151, 1, 1.5)


def test_a_compressor_pays_its_compute_everywhere_and_saves_on_a_slow_link():
    nbytes = 14e6
    fast, slow = _exchange(1e-10), _exchange(8 / 100e6)
    # shared memory: allreduce's 1.5 ms (2 messages, the buffer once) beats top-k's 28 ms
    # of compute
    assert fast.seconds("allreduce", 2, nbytes) == pytest.approx(2 * 50e-6 + 1.4e-3)
    assert fast.seconds("topk:0.01", 2, nbytes) == pytest.approx(
        50e-6 + nbytes * (2e-9 + 0.02 * 1e-10))
    assert fast.seconds("allreduce", 2, nbytes) < fast.seconds("topk:0.01", 2, nbytes)
    # 100 Mbit/s: the whole gradient takes 1.12 s, 2 % of it (index + value) 22 ms
    assert slow.seconds("allreduce", 2, nbytes) == pytest.approx(2 * 50e-6 + 1.12)
    assert slow.seconds("topk:0.01", 2, nbytes) == pytest.approx(
        50e-6 + nbytes * (2e-9 + 0.02 * 8e-8))
    assert slow.seconds("fp16", 2, nbytes) == pytest.approx(50e-6 + nbytes * (2e-9 + 4e-8))
    assert fast.seconds("topk:0.01", 1, nbytes) == 0.0  # one node exchanges nothing
    assert advise.on_link(fast, "100mbit").seconds("allreduce", 2, nbytes) == \
        pytest.approx(slow.seconds("allreduce", 2, nbytes))


def _probed(label: str, flags: dict, cores: int, speeds: list[float], **kw):
    c = advise.Candidate(label, flags, cores, **kw)
    c.speeds = speeds
    return c


def test_predictions_take_a_node_count_s_compute_from_its_mpi_probe():
    seq = _probed("sequential", {"strategy": "sequential"}, 1, [400.0, 380.0])
    intra = _probed("cpu-intraop (2 threads)", {"strategy": "cpu-intraop", "workers": 2}, 2,
                    [440.0])
    mpi = _probed("sequential x 2 MPI nodes, allreduce", {"strategy": "sequential",
                  "backend": "mpi", "nodes": 2, "reduce": "allreduce"}, 1, [320.0],
                  nodes=2, node=seq)
    mpi.exchanges = [2 * 50e-6 + 14e6 * 1e-10]  # as allreduce's fit: in a run as alone
    where = advise.Setting(2, shared=True, exchange=_exchange(1e-10), hosts=None, link=None,
                           placeable=2)
    rows, notes = advise.predictions([seq, intra, mpi], [1, 2, 4], where, 16, 14_000_000, 240)
    assert notes == ["4 nodes: they would share this machine's 2 cores, less than one each"]
    by = {(r["nodes"], r["label"]): r for r in rows}
    assert by[(1, "sequential")]["images_per_s"] == 390.0  # the probes' median
    assert by[(1, "sequential")]["low"] == 380.0 and by[(1, "sequential")]["high"] == 400.0
    assert by[(1, "cpu-intraop (2 threads)")]["speedup"] == pytest.approx(440 / 390)
    probed = by[(2, "sequential x 2 MPI nodes, allreduce")]
    assert probed["images_per_s"] == 320.0 and probed["basis"] == "probed"
    assert probed["flags"] == {"strategy": "sequential", "backend": "mpi", "nodes": 2,
                               "reduce": "allreduce"}
    compute = 16 / 320 - mpi.exchanges[0]  # the probe's step less its measured exchange
    ring = by[(2, "sequential x 2 MPI nodes, ring-reduce")]
    assert ring["basis"] == "probe + model"
    assert ring["images_per_s"] == pytest.approx(16 / (compute + 2 * 50e-6 + 2 * 14e6 * 1e-10))
    weak = by[(2, "sequential x 2 MPI nodes, allreduce weak (batch 32)")]
    assert weak["images_per_s"] == pytest.approx(32 / (2 * compute + 2 * 50e-6 + 14e6 * 1e-10))
    assert weak["flags"]["scaling"] == "weak"
    assert weak["convergence_key"] == "batch 32"
    # the 2-core intra-op node does not fit a node's share of this machine's cores
    assert not any("cpu-intraop" in label for n, label in by if n == 2)


def test_an_mpi_rank_s_process_holds_what_its_probe_measured_beyond_a_local_one(tmp_path):
    """An MPI rank holds its MPI library and the exchange's buffers beside what a local
    process of its strategy holds: on tiny its process peaked at 0.78 GiB against 0.50
    predicted from the local one. The MPI probe's excess goes to every row of its node
    count, probed or modelled; the node's figure (the libraries' pages left out) stays."""
    cands = advise.candidates(2, 0)
    advise.check_fit(cands, "tiny", runs_dir=tmp_path)
    seq = next(c for c in cands if c.label == "sequential")
    seq.memory = _baseline_memory(1000, 700, 100, 100)
    seq.speeds = [400.0]
    advise.admit([seq], None, batch=16)
    local = seq.process(8)
    mpi = _probed("sequential x 2 MPI nodes, allreduce", {"strategy": "sequential",
                  "backend": "mpi", "nodes": 2, "reduce": "allreduce"}, 1, [320.0],
                  nodes=2, node=seq)
    mpi.exchanges = [2 * 50e-6 + 14e6 * 1e-10]
    mpi.memory = {"peak_rss_bytes": local + 280 * MIB}  # its manifest's backend.memory
    where = advise.Setting(2, shared=True, exchange=_exchange(1e-10), hosts=None, link=None,
                           placeable=2)
    rows, _ = advise.predictions([seq, mpi], [1, 2], where, 16, 14_000_000, 240)
    by = {(r["nodes"], r["label"]): r for r in rows}
    assert by[(1, "sequential")]["predicted_peak_process_bytes"] == seq.process(16)
    for label in ("sequential x 2 MPI nodes, allreduce",  # probed
                  "sequential x 2 MPI nodes, ring-reduce"):  # its compute + the model
        assert by[(2, label)]["predicted_peak_process_bytes"] == local + 280 * MIB
        assert by[(2, label)]["predicted_need_node_bytes"] == seq.need(8)
    weak = by[(2, "sequential x 2 MPI nodes, allreduce weak (batch 32)")]
    assert weak["predicted_peak_process_bytes"] == seq.process(16) + 280 * MIB


def test_a_probed_row_holds_what_its_probe_measured_and_its_snapshot_adds(tmp_path):
    """A probed configuration's memory is its probe's (the baseline's parts scale only
    roughly: an own ResNet's cpu-processes measured 10 % above its scaled prediction),
    raised by what its snapshot's writer gathers, which no probe does: ZeRO's rank 0
    receives the other half of the 100 MiB of momentum. A row not probed keeps the
    model's."""
    cands = advise.candidates(2, 0)
    advise.check_fit(cands, "tiny", runs_dir=tmp_path)
    by = {c.label: c for c in cands}
    seq, procs, zero, tensor = (by[k] for k in (
        "sequential", "cpu-processes (2 processes)", "zero (2 processes)",
        "tensor (2 processes)"))
    seq.memory = _baseline_memory(1000, 700, 100, 100)
    advise.admit(cands, 2**40, batch=16, linear=0.5)
    probe = {"per_rank": [{"rank": r, "host": "h", "peak_rss_bytes": (1100 + 50 * r) * MIB,
                           "setup_file_bytes": 0} for r in (0, 1)],
             "peak_rss_bytes": 1150 * MIB, "per_host_bytes": {"h": 2250 * MIB}}
    for c in (seq, procs, zero, tensor):
        c.speeds, c.memory = [400.0], probe if c is not seq else c.memory
    where = advise.Setting(2, shared=True, exchange=_exchange(1e-10), hosts=None, link=None,
                           placeable=2)
    rows, _ = advise.predictions([seq, procs, zero, tensor], [1], where, 16, 14_000_000, 240)
    row = {r["label"]: r for r in rows}
    assert (row[procs.label]["predicted_need_node_bytes"],
            row[procs.label]["predicted_peak_process_bytes"]) == (2250 * MIB, 1150 * MIB)
    assert procs.need(16) / MIB == 1900  # scaled from the baseline: 16 % under its probe
    assert (row[zero.label]["predicted_need_node_bytes"],
            row[zero.label]["predicted_peak_process_bytes"]) == (2300 * MIB, 1200 * MIB)
    # tensor's rank 0 gathers the whole parameters and state (100 + 100) beside its shards
    assert (row[tensor.label]["predicted_need_node_bytes"],
            row[tensor.label]["predicted_peak_process_bytes"]) == (2450 * MIB, 1350 * MIB)
    assert {row[c.label]["memory_basis"] for c in (procs, zero, tensor)} == {"probe"}
    procs.memory = None  # not probed: scaled from the baseline
    rows, _ = advise.predictions([seq, procs], [1], where, 16, 14_000_000, 240)
    (row,) = (r for r in rows if r["label"] == procs.label)
    assert row["predicted_need_node_bytes"] == procs.need(16) and row["memory_basis"] == "model"


def test_a_weak_probe_gives_weak_scaling_its_own_compute():
    """A node's step is not proportional to its batch (a batch of 16 took 1.6 times as
    long as one of 8 on tiny, not twice): weak scaling is probed on the node count too,
    and its rows take their compute from that probe, not from N strong steps."""
    seq = _probed("sequential", {"strategy": "sequential"}, 1, [400.0])
    flags = {"strategy": "sequential", "backend": "mpi", "nodes": 2, "reduce": "allreduce"}
    strong = _probed("sequential x 2 MPI nodes, allreduce", flags, 1, [320.0], nodes=2,
                     node=seq)
    weak = _probed("sequential x 2 MPI nodes, allreduce weak", flags | {"scaling": "weak"}, 1,
                   [500.0], nodes=2, node=seq)
    fitted = 2 * 50e-6 + 14e6 * 1e-10  # allreduce's exchange, timed alone
    strong.exchanges, weak.exchanges = [fitted], [2 * fitted]  # twice as long in the run
    where = advise.Setting(2, shared=True, exchange=_exchange(1e-10), hosts=None, link=None,
                           placeable=2)
    rows, _ = advise.predictions([seq, strong, weak], [2], where, 16, 14_000_000, 240)
    by = {r["label"]: r for r in rows}
    probed = by["sequential x 2 MPI nodes, allreduce weak (batch 32)"]
    assert probed["images_per_s"] == 500.0 and probed["basis"] == "probed"
    compute = 32 / 500 - 2 * fitted  # a node's whole batch, as the weak probe measured it
    ring = by["sequential x 2 MPI nodes, ring-reduce weak (batch 32)"]
    assert ring["basis"] == "probe + model"
    # other methods' exchanges slowed as the probed one was in the run: twice their fit
    ring_fitted = 2 * 50e-6 + 2 * 14e6 * 1e-10
    assert ring["images_per_s"] == pytest.approx(32 / (compute + 2 * ring_fitted))
    assert ring["exchange_s"] == pytest.approx(2 * ring_fitted)
    assert by["sequential x 2 MPI nodes, allreduce"]["images_per_s"] == 320.0
    # the candidates of a node count are probed with both scalings, and the cheapest
    # compressor once (strong)
    cands = advise.mpi_candidates([seq], [2], where, 14_000_000)
    assert [(c.flags.get("scaling"), c.flags.get("compress")) for c in cands] == [
        (None, None), ("weak", None), (None, "topk:0.01")]
    assert all(c.node is seq and c.nodes == 2 for c in cands)
    # a strategy whose first probes were all noisy (a busy host) still gets its nodes
    busy = advise.Candidate("sequential", {"strategy": "sequential"}, 1)
    busy.noisy = [{"images_per_s": 300.0, "others_cores": 1.0, "run": "s1"}]
    assert len(advise.mpi_candidates([busy], [2], where, 14_000_000)) == 3


def test_a_compressor_takes_its_in_run_exchange_from_the_compressor_probe():
    """A compressor's cast and sum are compute: in a run they slowed unlike a reducer's
    copies (fp16 on tiny: predicted 23 % slow from step-wise's). Its rows, of both
    scalings, scale its fit by the fp16 probe's own in-run exchange; the reducers keep
    the reducer probe's."""
    seq = _probed("sequential", {"strategy": "sequential"}, 1, [400.0])
    flags = {"strategy": "sequential", "backend": "mpi", "nodes": 2}
    exchange = _exchange(1e-10)
    fit = {m: exchange.seconds(m, 2, 14e6) for m in ("allreduce", "fp16")}
    reducer = _probed("s x 2, allreduce", flags | {"reduce": "allreduce"}, 1, [320.0],
                      nodes=2, node=seq)
    squeeze = _probed("s x 2, fp16", flags | {"compress": "fp16"}, 1, [300.0], nodes=2,
                      node=seq)
    reducer.exchanges, squeeze.exchanges = [2 * fit["allreduce"]], [0.5 * fit["fp16"]]
    where = advise.Setting(2, shared=True, exchange=exchange, hosts=None, link=None,
                           placeable=2)
    rows, _ = advise.predictions([seq, reducer, squeeze], [2], where, 16, 14_000_000, 240)
    by = {r["label"]: r for r in rows}
    assert by["sequential x 2 MPI nodes, fp16"]["basis"] == "probed"
    assert by["sequential x 2 MPI nodes, fp16 weak (batch 32)"]["exchange_s"] == \
        pytest.approx(0.5 * fit["fp16"])
    assert by["sequential x 2 MPI nodes, topk:0.01"]["exchange_s"] == pytest.approx(
        0.5 * exchange.seconds("topk:0.01", 2, 14e6))
    assert by["sequential x 2 MPI nodes, ring-reduce"]["exchange_s"] == pytest.approx(
        2 * exchange.seconds("ring-reduce", 2, 14e6))


def test_noisy_probes_count_only_where_no_quiet_one_came():
    """A probe disturbed by another process is kept for the record; a configuration with a
    quiet probe is ranked on that one, one with noisy probes only on those, flagged."""
    seq = _probed("sequential", {"strategy": "sequential"}, 1, [400.0])
    seq.noisy = [{"images_per_s": 150.0, "others_cores": 1.1, "run": "s2"}]
    intra = advise.Candidate("cpu-intraop (2 threads)", {"strategy": "cpu-intraop",
                                                          "workers": 2}, 2)
    intra.noisy = [{"images_per_s": 300.0, "others_cores": 0.9, "run": "i1"},
                   {"images_per_s": 320.0, "others_cores": 1.0, "run": "i2"}]
    advise.settle_noisy([seq, intra])
    assert seq.speeds == [400.0] and not seq.busy
    assert intra.speeds == [300.0, 320.0] and intra.runs == ["i1", "i2"] and intra.busy
    assert intra.record()["only_noisy"] and len(intra.record()["noisy"]) == 2
    where = advise.Setting(2, shared=True, exchange=None, hosts=None, link=None, placeable=2)
    rows, _ = advise.predictions([seq, intra], [1], where, 16, 14_000_000, 240)
    by = {r["label"]: r for r in rows}
    assert by["sequential"]["images_per_s"] == 400.0 and not by["sequential"]["noisy"]
    assert by["cpu-intraop (2 threads)"]["images_per_s"] == 320.0
    assert by["cpu-intraop (2 threads)"]["noisy"]


def test_the_check_leaves_out_study_runs_on_a_busy_host(tmp_path):
    """The first-ranked measured 100 images/s; a noisy run of the second measured 150 (the
    check would fail on it), its quiet run 95: confirmed, one run left out."""
    advice = {"ranking": [{"rank": 1, "label": "a", "flags": {"strategy": "sequential"},
                           "images_per_s": 100.0},
                          {"rank": 2, "label": "b", "flags": {"strategy": "cpu-intraop"},
                           "images_per_s": 90.0}]}
    cells = []
    for run, strategy, speed, noisy in (("r1", "sequential", 100.0, False),
                                        ("r2", "cpu-intraop", 150.0, True),
                                        ("r3", "cpu-intraop", 95.0, False)):
        folder = tmp_path / run
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({
            "id": run, "status": "completed", "started_at": run, "usecase": "u",
            "strategy": {"name": strategy, "processes": 1, "threads_per_process": 1},
            "host": {"hostname": "h", "usable_cores": 2}, "backend": {"name": "local"},
            "config": {"usecase": {"name": "u"}}, "host_load": {"noisy": noisy},
            "epochs": [{"epoch": 1, "train_loss": 1.0, "steady_images_per_s": speed,
                        "val_accuracy": 0.5, "epoch_time_s": 1.0}]}))
        cells.append({"run": run, "flags": {"strategy": strategy, "epochs": 2}})
    check = advise.check(advice | {"usecase": "u"}, load_runs(tmp_path), cells)
    assert check["noisy_left_out"] == 1
    assert {r["label"]: r["measured"] for r in check["rows"]} == {"a": 100.0, "b": 95.0}
    assert check["confirmed"] and check["best_rank"] == 1
    assert "1 run(s) left out" in advise.check_text(check)


def test_other_machines_on_a_named_link_are_predicted_from_one_node():
    seq = _probed("sequential", {"strategy": "sequential"}, 1, [400.0])
    intra = _probed("cpu-intraop (2 threads)", {"strategy": "cpu-intraop", "workers": 2}, 2,
                    [500.0])
    where = advise.Setting(2, shared=False, exchange=advise.on_link(_exchange(1e-10),
                                                                   "10gbit"),
                           hosts=None, link="10gbit", placeable=0)
    rows, _ = advise.predictions([seq, intra], [2], where, 16, 14_000_000, 240)
    row = next(r for r in rows if r["label"] == "cpu-intraop (2 threads) x 2 MPI nodes, "
               "allreduce")
    assert row["basis"] == "model" and row["runnable"] is False
    assert row["images_per_s"] == pytest.approx(16 / (8 / 500 + 2 * 50e-6 + 14e6 * 8e-10))


def test_scaling_efficiency_is_against_the_fastest_one_node_probe_when_only_nodes_are_ranked():
    """``advise --nodes 2`` ranks no one-node row: a row's scaling efficiency is its images/s
    over 2 x the fastest local probe (it read 30525 % when divided by 1 image/s)."""
    rows = [{"label": "mpi", "nodes": 2, "images_per_s": 610.5, "epoch_s": 0.4,
             "convergence_key": "baseline"}]
    advise.rank(rows, {}, one_node=730.0)
    assert rows[0]["scaling_efficiency"] == pytest.approx(610.5 / (2 * 730.0))


def test_the_ranking_weighs_changed_convergence_by_its_measured_epochs():
    rows = [{"label": "exact", "nodes": 2, "images_per_s": 400.0, "epoch_s": 0.6,
             "convergence_key": "baseline"},
            {"label": "weak", "nodes": 2, "images_per_s": 600.0, "epoch_s": 0.4,
             "convergence_key": "batch 32"},
            {"label": "top-k", "nodes": 2, "images_per_s": 500.0, "epoch_s": 0.48,
             "convergence_key": "topk:0.01"},
            {"label": "local", "nodes": 1, "images_per_s": 300.0, "epoch_s": 0.8,
             "convergence_key": "baseline"}]
    by_speed = [dict(r) for r in rows]
    advise.rank(by_speed, {})
    # Two lists: what trains the baseline's model first, then what trains another (ranked
    # by images/s only: its epochs to target are unknown), however fast.
    assert [r["label"] for r in by_speed] == ["exact", "local", "weak", "top-k"]
    assert [r["list"] for r in by_speed] == ["same convergence"] * 2 + \
        ["changes convergence"] * 2
    assert "not measured: give --runs" in by_speed[2]["convergence"]
    assert by_speed[2]["scaling_efficiency"] == pytest.approx(600 / (2 * 300))
    # weak scaling took twice the baseline's epochs (measured: it joins the first list by
    # its time to target), top-k was not measured (last, though fastest)
    conv = {"baseline_epochs": 6, "target": 0.6, "factor": {"baseline": 1.0,
                                                            "batch 32": 2.0}}
    by_time = [dict(r) for r in rows]
    advise.rank(by_time, conv)
    assert [r["label"] for r in by_time] == ["exact", "weak", "local", "top-k"]
    assert by_time[1]["time_to_target_s"] == pytest.approx(12 * 0.4)
    assert by_time[1]["convergence"] == "measured: x2.00 the baseline's epochs"
    assert "not measured in --runs" in by_time[3]["convergence"]
    assert by_time[3]["list"] == "changes convergence"


def test_the_convergence_key_names_what_changes_convergence():
    key = advise.convergence_key
    assert key({"strategy": "sequential"}, 16, 16) == "baseline"
    assert key({"backend": "mpi", "nodes": 2, "reduce": "allreduce"}, 16, 16) == "baseline"
    assert key({"backend": "mpi", "reduce": "step-wise", "scaling": "weak"}, 32, 16) == \
        "batch 32 + step-wise"
    assert key({"backend": "mpi", "compress": "topk:0.01"}, 16, 16) == "topk:0.01"
    assert key({"backend": "mpi", "compress": "fp16"}, 16, 16) == "baseline"


def test_sureness_reads_the_probes_spread():
    a = {"low": 400.0, "high": 420.0}
    assert advise.sureness([a | {}, {"low": 300.0, "high": 390.0}]).startswith("sure")
    assert advise.sureness([a, {"low": 380.0, "high": 410.0}]).startswith("a toss-up")
    assert advise.sureness([{"low": 400.0, "high": 400.0}, a]).startswith("one probe each")


def test_one_mpi_launch_times_every_reducer_and_compressor_on_two_sizes():
    ms = measure_sizes([4096, 1024], 2, 2, compress=advise.COMPRESSORS)
    assert set(ms) == {4096, 1024}
    for by_method in ms.values():
        assert set(by_method) == {"allreduce", "parameter-server", "ring-reduce",
                                  "ring-allreduce", "step-wise", "fp16", "topk:0.01"}
        assert all(len(t) == 2 and all(x > 0 for x in t) for t in by_method.values())


def test_max_val_steps_validates_on_batches_spread_over_every_class(quick_config):
    from ddlstudy.data import prepare_data
    from ddlstudy.training import val_loader

    cfg = quick_config(max_val_steps=1)
    loader = val_loader(cfg, prepare_data(cfg))
    assert len(loader) == 1
    for _ in range(2):  # each validation takes the same images again
        (labels,) = [labels for _, labels in loader]
        assert labels.numel() == 16
        # The validation images come in class order: the first 16 alone are one class.
        assert set(labels.tolist()) == {0, 1, 2}
    full = val_loader(quick_config(), prepare_data(cfg))
    assert sum(labels.numel() for _, labels in full) == 60


@pytest.mark.slow
def test_bench_advise_advises_an_own_use_case_checks_it_and_finds_each_error(
        tmp_path, datasets_dir, capsys):
    """``bench advise --only own``: ``ddlstudy advise`` on an image folder and a model file
    of one's own (--data-dir alone: no use case written), every layout probed once (one
    round: as many probes on a busy host as on a quiet one), then ``study --from-advice``
    of 3 rows spread over its ranking, each a plain run. The check gives each row's
    errors, the rank correlation and the figure, the bench its row; an advice made wrong
    on purpose (one row's images/s 4 times its measured) shows as a large error. Whether
    the errors are small is this host's quiet (the benchmark's figures): here their
    arithmetic."""
    out = tmp_path / "bench"
    code = main(["bench", "advise", "--only", "own", "--rows", "3", "--rounds", "1",
                 "--check-epochs", "2", "--include-noisy", "--datasets-dir",
                 str(datasets_dir), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "| own | yes |" in printed, printed  # every layout probed at the default budget
    advice = json.loads((out / "own" / "advice" / "advise.json").read_text())
    assert advice["origin"]["usecase"] is None and advice["budget_s"] is None
    assert "free_page_reporting" in advice["host"]  # this host's, and whatever it is,
    assert advice["refaults"] is None  # an own ResNet has no weight over 32 MiB
    assert advice["every_layout"] and "budget_needed_s" not in advice or \
        advice["budget_needed_s"] is None
    log = (out / "own" / "advise.log").read_text()
    assert "[round 1] sequential:" in log and "steady box 3.0 s" in log
    probes = [p for p in advice["probes"] if "images_per_s" in p]
    assert {p["flags"].get("strategy", "sequential") for p in probes} >= {
        "sequential", "cpu-intraop", "cpu-processes", "sharded", "zero", "pipeline"}
    for p in probes:  # every probe a real run folder, its steps time-boxed
        m = json.loads((out / "own" / "advice" / "probes" / p["runs"][0] /
                        "manifest.json").read_text())
        assert m["status"] == "completed" and m["config"]["steady_seconds"] > 0
        assert m["config"]["max_val_steps"] == 1 and m["config"]["model"].endswith(
            "own_net.py:small_resnet")
    check = json.loads((out / "own" / "check" / "report" / "advice-check.json").read_text())
    assert (out / "own" / "check" / "report" / "advice-check.svg").stat().st_size > 1000
    bench = json.loads((out / "bench.json").read_text())["layouts"][0]
    s = check["summary"]
    assert bench["mape"] == s["mape"] and bench["spearman"] == s["spearman"]
    rows = check["rows"]  # noisy runs counted (a busy host's too), each marked; the 3
    # rows and the baseline the study adds (which is a row of the advice too)
    assert len(rows) == s["rows"] in (3, 4) and check["noisy_left_out"] == 0
    for r in rows:  # each row's errors, from its own figures
        assert r["error"] == pytest.approx((r["predicted"] - r["measured"]) / r["measured"])
        assert r["node_error"] == pytest.approx(
            (r["predicted_node_bytes"] - r["measured_node_bytes"]) / r["measured_node_bytes"])
        assert r["measured_process_bytes"] > r["measured_node_bytes"] / 4 > 0
    assert s["spearman"] is not None and -1 <= s["spearman"] <= 1
    assert 1 <= s["first_measured_rank"] <= len(rows)
    # the same runs against an advice made wrong: one row predicted at 4 times what its
    # run measured (whatever its own error was: that is the host's)
    wrong = out / "wrong.json"
    twisted = json.loads(json.dumps(advice))
    target = next(r for r in twisted["ranking"] if r["label"] == rows[-1]["label"]
                  and r["rank"] == rows[-1]["rank"])
    target["images_per_s"] = 4 * rows[-1]["measured"]
    wrong.write_text(json.dumps(twisted))
    assert main(["study", "--from-advice", str(wrong), "--top", "3", "--spread", "--repeat",
                 "1", "--epochs", "2", "--resume", "--include-noisy", "--runs-dir",
                 str(out / "own" / "check")]) == 0
    printed = capsys.readouterr().out
    again = json.loads((out / "own" / "check" / "report" / "advice-check.json").read_text())
    was = {r["rank"]: r for r in rows}
    for r in again["rows"]:  # the same runs, reused: only the twisted row's error moves
        assert r["measured"] == was[r["rank"]]["measured"]
    bad = next(r for r in again["rows"] if r["rank"] == target["rank"])
    assert bad["error"] == pytest.approx(3.0) and "+300%" in printed


@pytest.mark.slow
@needs_hosts
def test_a_slow_link_changes_the_advice_and_the_measured_runs_agree(tmp_path, datasets_dir,
                                                                     capsys):
    """On a 100 Mbit/s link the 14 MB gradient of tiny takes over a second to send:
    advise picks another exchange for 2 nodes than on shared memory (among those that
    train the baseline's model: its first list), and running both on the slow link shows
    its pick is the faster. A configuration advise probed on the link is measured by its
    probe's run (the same flags and steps as a run of it here); the other runs here."""
    def advice_for_two_nodes(rounds: int, *flags: str) -> tuple[dict, dict, Path]:
        """advise.json, its best row for 2 nodes, and the folder of its probes."""
        out = tmp_path / f"advice-{len(list(tmp_path.iterdir()))}"
        # Probes of a 1 s box (at least 3 steady steps): on the link each of them spends
        # over a second a step exchanging, and the methods differ twofold
        assert main(["advise", "--usecase", "tiny", "--nodes", "2", "--rounds", str(rounds),
                     "--probe-seconds", "1", "--budget", "150", "--datasets-dir",
                     str(datasets_dir), "--out", str(out), *flags]) == 0, \
            capsys.readouterr().err
        advice = json.loads((out / "advise.json").read_text())
        best = next(r for r in advice["ranking"] if r["nodes"] == 2
                    and "scaling" not in r["flags"])
        return advice, best, out / "probes"

    def method(row: dict) -> str:
        return row["flags"].get("compress") or row["flags"]["reduce"]

    def run_on_link(flags: dict, settings: dict) -> Path:
        """A run of ``flags`` as a probe runs (its ``settings``): its manifest."""
        runs = tmp_path / "measured"
        argv = ["run", "--usecase", "tiny", "--runs-dir", str(runs)]
        for key, value in (settings | flags).items():
            argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        assert main(argv) == 0, capsys.readouterr().err
        return max(runs.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)

    # On shared memory the local probes and the measured exchange tell the exact methods
    # from the compressors (1 round); on the link a second round probes real MPI nodes.
    _, shared, _ = advice_for_two_nodes(1)
    slow = hosts.up(2, prefix="dadv", subnet="10.80.0", rate="100mbit")
    try:
        advice, far, probes = advice_for_two_nodes(2, "--hosts", "emulated:dadv")
        assert far["flags"]["hosts"] == "emulated:dadv"
        assert method(far) != method(shared), (far["label"], shared["label"])
        assert far["list"] == shared["list"] == "same convergence"
        speeds = {}
        for row in (far, shared):
            flags = dict(row["flags"], hosts="emulated:dadv")
            probe = next((p for p in advice["probes"] if p["flags"] == flags
                          and p.get("runs")), None)
            path = probes / probe["runs"][0] / "manifest.json" if probe else run_on_link(
                flags, advice["probe_settings"])
            m = json.loads(path.read_text())
            assert m["status"] == "completed" and m["config"]["steady_seconds"] > 0, path
            speeds[method(row)] = statistics.median(e["steady_images_per_s"]
                                                    for e in m["epochs"])
        assert speeds[method(far)] > 1.3 * speeds[method(shared)], speeds
    finally:
        hosts.down(slow.prefix)


def test_earlier_runs_give_the_epochs_each_convergence_took(cli, tmp_path, tiny_20):
    """The baseline reaches tiny's 0.60 in some epoch (the session's 20 epochs of it,
    copied in: tiny's learning rate is constant, so its first epochs are a shorter run's);
    weak scaling over 2 processes (batch 32) did not in its 2 epochs: its rows rank last,
    as never reaching it."""
    code, err, runs = cli("run", "--usecase", "tiny", "--epochs", "2", "--no-snapshot",
                          "--sample-hz", "0", "--strategy", "cpu-processes", "--workers", "2",
                          "--scaling", "weak")
    assert code == 0, err
    baseline = tiny_20()
    shutil.copytree(baseline.path, runs / baseline.path.name)
    tta = {}
    for path in runs.glob("*/manifest.json"):
        m = json.loads(path.read_text())
        tta[m["strategy"]["name"]] = m["time_to_target"]
    assert tta["sequential"]["reached"], tta  # tiny's calibration: 0.60 by epoch 6
    assert tta["cpu-processes"]["reached"] is False
    conv = advise.convergence(runs, load_usecase("tiny"))
    assert conv["baseline_epochs"] == tta["sequential"]["epoch"] and conv["target"] == 0.6
    assert conv["factor"] == {"baseline": 1.0, "batch 32": float("inf")}
    rows = [{"label": "weak", "nodes": 2, "images_per_s": 900.0, "epoch_s": 0.3,
             "convergence_key": "batch 32"},
            {"label": "exact", "nodes": 1, "images_per_s": 400.0, "epoch_s": 0.6,
             "convergence_key": "baseline"}]
    advise.rank(rows, conv)
    assert [r["label"] for r in rows] == ["exact", "weak"]
    assert rows[1]["time_to_target_s"] is None
    assert "did not reach the target there" in rows[1]["convergence"]
    assert rows[0]["time_to_target_s"] == pytest.approx(conv["baseline_epochs"] * 0.6)
    assert advise.convergence(tmp_path / "runs", load_usecase("simple-big")) == {
        "note": f"no run in {tmp_path / 'runs'} of simple-big that converges like the "
                "baseline reached its target accuracy 0.9: ranked by images/s"}


def test_the_advice_prints_every_row_it_names_in_two_lists():
    """The summary's 'best per node count' names a rank: that row is printed even beyond
    the top 10; configurations that train another model come in a second list."""
    def row(rank, label, nodes, speed, lst="same convergence"):
        return {"rank": rank, "label": label, "nodes": nodes, "images_per_s": speed,
                "low": speed, "high": speed, "basis": "probed", "speedup": 1.0,
                "scaling_efficiency": 1.0, "convergence": "like the baseline", "runnable": True,
                "command": f"ddlstudy run {label}", "list": lst}

    ranking = [row(i, f"one-{i}", 1, 100.0 - i) for i in range(1, 12)] + \
        [row(12, "two-nodes", 2, 80.0), row(13, "weak", 2, 150.0, "changes convergence")]
    result = {"usecase": "tiny", "link": None, "hosts": None, "cores": 2, "gpus": 0,
              "nodes": [1, 2], "rounds": 1, "seconds": 10.0, "budget_s": 60.0,
              "convergence": {}, "sureness": "sure", "ranking": ranking, "notes": [],
              "probes": []}
    text = advise.markdown(result)
    same, changes = text.split("## same convergence as the baseline")[1].split(
        "## changes convergence")
    assert "| 12 | two-nodes | 2 |" in same and "- 2: two-nodes, 80.0 images/s (rank 12)" \
        in text
    assert "| 11 | one-11 |" not in same and "(1 more in advise.json)" in same
    assert "| 13 | weak | 2 |" in changes and "| 13 |" not in same


def test_strategies_asked_for_are_probed_with_the_baseline_and_the_others_say_why_not():
    from ddlstudy.errors import ConfigError

    cands = advise.skip_unasked(advise.candidates(2, 0), ["pipeline"])
    probed = {c.flags["strategy"] for c in cands if not c.skip}
    assert probed == {"sequential", "pipeline"}
    threads = next(c for c in cands if c.flags.get("strategy") == "cpu-threads")
    assert threads.skip == "cpu-threads is not among --strategies pipeline"
    assert all(not c.skip for c in advise.skip_unasked(advise.candidates(2, 0), None)
               if c.flags.get("strategy") not in ("hybrid", None) and c.cores <= 2)
    with pytest.raises(ConfigError, match="cpu-loaders has no layout to probe"):
        advise.skip_unasked(advise.candidates(2, 0), ["cpu-loaders"])


def test_nodes_sharing_one_host_fit_its_memory_together():
    """2 MPI nodes on this host, each needing 600 MiB of a per-node --memory of 1000:
    together 1200 MiB of a host with 1000 left out; on 2 emulated hosts (a node each), or
    predicted for a --link (a machine each), each node alone counts."""
    rows = [{"label": "sequential", "nodes": 1, "predicted_need_node_bytes": 700 * MIB},
            {"label": "s x 2", "nodes": 2, "predicted_need_node_bytes": 600 * MIB},
            {"label": "s x 3", "nodes": 3, "predicted_need_node_bytes": 300 * MIB},
            {"label": "s x 4", "nodes": 4, "predicted_need_node_bytes": 600 * MIB}]

    def setting(hosts, link, placeable):
        return advise.Setting(2, shared=link is None, exchange=None, hosts=hosts, link=link,
                              placeable=placeable, host_memory=None if link else 1000 * MIB)

    fit, left = advise.fitting(rows, 1000 * MIB, setting(None, None, 2))
    assert [r["label"] for r in fit] == ["sequential", "s x 3"]  # 3 x 300 fits 1000
    assert left[0]["skipped"] == ("its 2 nodes on one host need about 1.17 GiB together, "
                                  "and the host has 0.98 GiB")
    # emulated hosts: hydra's round robin puts 2 of 3 or 4 nodes on one of 2 hosts
    fit, left = advise.fitting(rows, 1000 * MIB, setting("emulated:x", None, 2))
    assert [r["label"] for r in fit] == ["sequential", "s x 2", "s x 3"]
    assert [r["skipped"] for r in left] == ["its 2 nodes on one host need about 1.17 GiB "
                                            "together, and the host has 0.98 GiB"]
    fit, left = advise.fitting(rows, 1000 * MIB, setting(None, "1gbit", 0))
    assert len(fit) == 4 and not left
    # before any probe of MPI nodes: the same rule leaves them out, never started
    (seq,) = [c for c in advise.candidates(2, 0) if c.label == "sequential"]
    seq.footprint, seq.memory = Footprint(), _baseline_memory(600, 400, 50, 50)
    pair = advise.Candidate("s x 2", {"strategy": "sequential", "backend": "mpi",
                                      "nodes": 2}, 1, nodes=2, node=seq)
    where = setting(None, None, 2)
    advise.admit([seq, pair], 1000 * MIB, 16, sharing=where.on_one_host,
                 host=where.host_memory)
    assert pair.skip.startswith("its 2 nodes on one host need about") and not seq.skip


def test_with_checkpointing_every_layout_that_can_is_a_configuration_of_its_own():
    """--with-checkpointing: each layout whose strategy checkpoints is probed again with
    its activations checkpointed (its own row, its own command); cpu-threads and the
    pipelines cannot, so they have no such twin."""
    plain = {c.label: c for c in advise.candidates(2, 0)}
    both = {c.label: c for c in advise.candidates(2, 0, checkpointed=True)}
    twins = {label.removesuffix(", checkpointed") for label in both if
             label.endswith(", checkpointed")}
    assert twins == {label for label, c in plain.items() if not c.skip or c.flags} - {
        "cpu-threads (2 replicas)", "pipeline (2 stages x 4 mb)",
        "pipeline (2 stages x 4 mb, 1f1b)", "pipeline (2 stages x 4 mb, interleaved 1f1b)",
        "hybrid (2 x 2 stages)"}
    seq = both["sequential, checkpointed"]
    assert seq.flags == plain["sequential"].flags | {"checkpoint_activations": True}
    assert "--checkpoint-activations" in advise.command("tiny", seq.flags)


def test_advise_heap_keep_probes_so_and_its_check_runs_and_matches_so(tmp_path):
    """``advise --heap keep`` gives its probes ``ddlstudy run --heap keep`` (its probe
    settings), and the study that checks the advice runs its cells so; a run matches a
    row only with the same ``heap`` (a run of glibc's own rule is another
    configuration)."""
    args = build_parser().parse_args(["advise", "--usecase", "tiny", "--heap", "keep"])
    assert _what(args) == ("tiny", {"heap": "keep"})
    assert _what(build_parser().parse_args(["advise", "--usecase", "tiny"]))[1] == {}
    path = tmp_path / "advise.json"
    path.write_text(json.dumps({
        "usecase": "tiny", "origin": {"usecase": "tiny"},
        "probe_settings": {"heap": "keep", "epochs": 1, "steady_seconds": 3.0},
        "ranking": [{"label": "cpu-intraop (2 threads)", "rank": 1,
                     "images_per_s": 1000.0, "nodes": 1,
                     "flags": {"strategy": "cpu-intraop", "workers": 2}}]}))
    plan = advice_plan(path, 1)
    assert plan.settings == {"heap": "keep"}  # not the probes' length: the check's own
    advice = json.loads(path.read_text())
    (row, config), = row_configs(path, advice)  # a run matched by what its manifest says
    assert config["heap"] == "keep" and config["strategy"] == "cpu-intraop"
    run = {"id": "r1", "status": "completed"}  # a run matched by its study cell's flags
    cell = {"run": "r1", "flags": {"heap": "keep", "strategy": "cpu-intraop", "workers": 2,
                                   "epochs": 6}}
    assert checking._runs([run], [cell], advice, None) == [(run, advice["ranking"][0])]
    other = dict(cell, flags=dict(cell["flags"], heap="return"))
    assert checking._runs([run], [other], advice, None) == []
