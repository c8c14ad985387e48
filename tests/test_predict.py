"""`ddlstudy predict`: the alpha-beta model, its fit, and the command on real runs."""

from __future__ import annotations

import json

import pytest

from ddlstudy.cli import main
from ddlstudy.tools.predict import REDUCERS, Cost, Node, fit, terms


def test_reducer_terms_follow_their_algorithms():
    assert all(terms(r, 1) == (0, 0) for r in REDUCERS)
    assert terms("ring-allreduce", 4) == (6, 1.5)
    assert terms("ring-allreduce", 256)[1] == pytest.approx(2, rel=0.01)  # -> 2 S
    assert terms("allreduce", 8) == (6, 1.75)  # log2 8 halvings and doublings
    assert terms("allreduce", 3) == (4, 3)  # 2 ranks' algorithm + the extra rank's hand-off
    assert terms("parameter-server", 5) == terms("ring-reduce", 5) == (8, 8)
    assert terms("step-wise", 5) == (4, 4)


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 50e-6, 8 / 1e9  # 50 us, 1 Gbit/s
    samples = {r: {s: Cost(alpha, beta).seconds(r, 2, s) for s in (1e6, 16e6)}
               for r in REDUCERS}
    for cost in fit(samples).values():
        assert cost.alpha == pytest.approx(alpha) and cost.beta == pytest.approx(beta)


def test_strong_scaling_saturates_where_the_exchange_dominates():
    node = Node("x", images_per_s=100.0, train_images=3200, batch=32, val_s=0.0,
                gradient_bytes=100_000_000, run="")
    cost = Cost(20e-6, 8 / 10e9)
    one = node.epoch_s(cost, "ring-allreduce", 1, 32)
    assert one == pytest.approx(100 * 32 / 100.0)  # 100 steps of 0.32 s, no exchange
    speedups = [one / node.epoch_s(cost, "ring-allreduce", n, 32) for n in (2, 8, 64)]
    assert speedups == sorted(speedups) and speedups[-1] < 32 / (2 * 0.08 * 100 / 32 + 0.5)
    overlapped = one / node.epoch_s(cost, "ring-allreduce", 8, 32, overlap=True)
    assert overlapped > speedups[1]


def test_the_pipeline_model_gives_the_gpipe_bubble_and_shares_the_cores():
    from ddlstudy.tools.pipeline_model import Stages, order, step_s

    equal = Stages(forward_s=[1.0, 1.0], backward_s=[2.0, 2.0], optimizer_s=[0.5, 0.5])
    # A core a stage: (M + S - 1) passes of forward and backward, then the optimizer.
    assert step_s(equal, 4, "gpipe", cores=2) == pytest.approx(5 * 3 + 0.5)
    assert step_s(equal, 4, "1f1b", cores=2) == pytest.approx(5 * 3 + 0.5)  # same bubble
    # One core: never idle, so the step is all the work (2 stages x 4 x 3 s + 2 x 0.5 s).
    assert step_s(equal, 4, "gpipe", cores=1) == pytest.approx(25)
    # Two pipelines on two cores share them as one does one core.
    assert step_s(equal, 4, "gpipe", replicas=2, cores=2) == pytest.approx(25)
    # 1F1B holds at most S - s micro-batches on stage s; GPipe all of them.
    assert [(k, m) for k, _, m in order(0, 2, 4, "1f1b")] == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    # A slow last stage: the others wait for it, and the bubble grows with it.
    slow = Stages(forward_s=[1.0, 2.0], backward_s=[2.0, 4.0], optimizer_s=[0.0, 0.0])
    assert step_s(slow, 4, "gpipe", cores=2) == pytest.approx(1 + 4 * 6 + 2)
    # Interleaved: 4 equal stages on 2 processes, each half of a stage above. A core a
    # process runs every pass of its two stages (2 x 4 x 1.5 s) plus a bubble of one
    # chunk's forward and backward (1.5 s: half of GPipe's 3 s with stages twice as long),
    # then its two optimizer steps (2 x 0.25 s).
    quarter = Stages(forward_s=[0.5] * 4, backward_s=[1.0] * 4, optimizer_s=[0.25] * 4)
    assert step_s(quarter, 4, "interleaved-1f1b", cores=2, chunks=2) == pytest.approx(
        12 + 1.5 + 0.5)


@pytest.mark.parametrize("processes, micro, chunks", [(2, 4, 2), (2, 2, 2), (3, 6, 2),
                                                      (4, 8, 3)])
def test_the_interleaved_order_is_torchs(processes, micro, chunks):
    """The model's order of each process equals ScheduleInterleaved1F1B's pipeline_order
    (its idle slots left out)."""
    from torch.distributed.pipelining.schedules import (
        FORWARD,
        ScheduleInterleaved1F1B,
        _Action,
    )

    from ddlstudy.tools.pipeline_model import order

    class Shape:  # what the schedule's order reads of itself
        n_local_stages, pp_group_size, _n_microbatches = chunks, processes, micro
        microbatches_per_round = micro // max(1, micro // processes)

    for p in range(processes):
        theirs = ScheduleInterleaved1F1B._calculate_single_rank_operations(Shape(), p)
        assert order(p, processes, micro, "interleaved-1f1b", chunks) == [
            ("F" if a.computation_type == FORWARD else "B", a.stage_index, a.microbatch_index)
            for a in theirs if isinstance(a, _Action)]


@pytest.mark.slow
def test_predict_from_real_runs_checks_itself_against_them(tmp_path, datasets_dir, capsys):
    """One MPI node, two MPI nodes and a pipeline, an epoch of 6 steps each (4 of them
    steady) validating on one batch: predict's node, its check and its pipeline row. Each
    command runs in this process (the ranks are processes of their own), so none starts
    an interpreter that imports torch again."""
    runs = tmp_path / "runs"
    short = ["--epochs", "1", "--max-steps", "6", "--max-val-steps", "1", "--no-snapshot",
             "--quiet", "--sample-hz", "0"]
    for layout in (["--backend", "mpi", "--nodes", "1"], ["--backend", "mpi", "--nodes", "2"],
                   ["--strategy", "pipeline", "--stages", "2"]):
        assert main(["run", "--usecase", "tiny", "--datasets-dir", str(datasets_dir),
                     "--runs-dir", str(runs), *layout, *short]) == 0, \
            capsys.readouterr().err[-2000:]
    capsys.readouterr()
    code = main(["predict", str(runs), "--repeats", "2", "--nodes", "1,2,4,256", "--links",
                 "10gbit"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    result = json.loads((runs / "predict" / "predict.json").read_text())
    assert (runs / "predict" / "predict.png").stat().st_size > 10_000
    (check,) = result["validation"]
    assert check["nodes"] == 2 and check["measured_images_per_s"] > 0
    assert check["error_percent"] == pytest.approx(
        100 * (check["predicted_images_per_s"] / check["measured_images_per_s"] - 1), abs=0.2)
    rows = [r for r in result["table"] if r["link"] == "10gbit" and not r["overlap"]
            and r["reduce"] == "ring-reduce"]
    assert [r["nodes"] for r in rows] == [1, 2, 4, 256] and rows[0]["speedup"] == 1
    assert rows[-1]["scaling_efficiency"] < rows[1]["scaling_efficiency"]
    assert result["costs"]["allreduce"]["beta_s_per_byte"] > 0
    assert "| ResNet-101 | 90% |" in out.out
    (pipe,) = result["pipelines"]  # the pipeline run, predicted from its piece costs
    assert pipe["schedule"] == "gpipe" and pipe["measured_step_s"] > 0
    assert pipe["predicted_step_s"] > 0 and set(pipe["other_schedules"]) == {"1f1b"}
    assert f"| {pipe['run']} | 2 stages x 4 mb, gpipe |" in out.out


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1,x"], "--nodes: '1,x'"),
    (["--nodes", "0,2"], "must be positive"),
    (["--links", "fast"], "--links: 'fast'"),
    (["--hosts", "emulated:dnone"], "no emulated hosts named 'dnone'"),
    ([], "no runs in"),
])
def test_bad_predict_input(tmp_path, capsys, args, message):
    (tmp_path / "runs").mkdir()
    assert main(["predict", str(tmp_path / "runs"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs" / "predict").exists()
