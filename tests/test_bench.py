"""`ddlstudy bench all`: every figure a ratio of two settings measured side by side."""

from __future__ import annotations

import json
import statistics

import pytest

from ddlstudy.cli import main
from ddlstudy.machine.environment import usable_cores


@pytest.mark.slow
def test_bench_all_writes_every_ratio_with_its_spread(tmp_path, datasets_dir, capsys,
                                                     monkeypatch):
    from ddlstudy.tools.bench import suite

    # One of the strategies that fit here (each one more run a repeat: the same code; the
    # pipeline group times pipeline's layouts against the baseline): cpu-intraop, one
    # process like the baseline (cpu-processes, 2 is transport's setting, run there).
    every = suite.strategy_flags
    assert {"cpu-intraop", "cpu-threads", "cpu-processes", "pipeline"} <= set(every(2))
    assert "hybrid" not in every(2) and "hybrid" in every(4)  # one process a core
    monkeypatch.setattr(suite, "strategy_flags", lambda cores: {
        k: v for k, v in every(cores).items() if k == "cpu-intraop"})
    # The spread of 2 repeats on the groups that time in this process; the groups of runs
    # (each a real `ddlstudy run` or MPI launch) once each: the same Ratio code writes both.
    figures = []
    for only, repeats in (("overhead,sampler,loader,reducers", 2),
                          ("ceiling,strategies,transport,mpi", 1)):
        out = tmp_path / f"bench-{repeats}"
        assert main(["bench", "all", "--only", only, "--steps", "3", "--repeats",
                     str(repeats), "--datasets-dir", str(datasets_dir), "--out",
                     str(out)]) == 0
        result = json.loads((out / "bench.json").read_text())
        for f in result["figures"]:
            ratios = [a / b for a, b in zip(f["a"], f["b"], strict=True)]
            assert f["repeats"] == len(ratios) == repeats and all(r > 0 for r in ratios)
            assert f["ratio"] == {"min": min(ratios), "median": statistics.median(ratios),
                                  "max": max(ratios)}
        table = (out / "bench.md").read_text()
        assert table.count("\n| ") == len(result["figures"]) + 1  # a header, a row a figure
        figures += result["figures"]
    names = [f["name"] for f in figures]
    assert names[:4] == ["ddlstudy loop / raw torch loop", "step time, sampler on (10 Hz) / off",
                         "DataLoader from the decoded cache / in-memory tensors",
                         "DataLoader decoding every image in the loop / in-memory tensors"]
    ceiling = names.index("sequential run / raw torch loop on batches in memory, 1 thread")
    assert names[ceiling + 1] == ("cpu-intraop run / raw torch loop on batches in memory, "
                                  f"{usable_cores()} thread" + "s" * (usable_cores() > 1))
    assert [n for n in names if n.endswith("/ sequential")] == ["cpu-intraop / sequential"]
    starts = [f for f in figures if f["group"] == "start"]  # the same runs' start-up
    assert len(starts) == 4 and all(0 < s for f in starts for s in f["a"] + f["b"])
    assert "cpu-processes, 2, shared memory / cpu-processes, 2 (DDP over gloo)" in names
    assert "MPI, 2 nodes / cpu-processes, 2 (DDP over gloo)" in names
    assert "MPI, 2 nodes / cpu-processes, 2, shared memory" in names
    assert sum("/ MPI Allreduce" in n for n in names) == 4
    assert "| strategies | cpu-intraop / sequential |" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_all_pipeline_sets_each_schedule_against_the_baseline_and_its_bound(
        tmp_path, datasets_dir, monkeypatch):
    from ddlstudy.tools.bench import suite

    # Three of its eight layouts (each one run takes a few seconds here): interleaved (two
    # stages a process), hybrid, and hybrid's twin through gloo.
    layouts = ["pipeline 2 stages, 4 mb, interleaved-1f1b", "hybrid 2 x 2 stages, 4 mb, 1f1b",
               "hybrid 2 x 2 stages, 4 mb, 1f1b, gloo"]
    monkeypatch.setattr(suite, "PIPELINES", {k: suite.PIPELINES[k] for k in layouts})
    out = tmp_path / "bench"
    assert main(["bench", "all", "--only", "pipeline", "--steps", "3", "--repeats", "1",
                 "--datasets-dir", str(datasets_dir), "--out", str(out)]) == 0
    figures = json.loads((out / "bench.json").read_text())["figures"]
    assert [f["name"] for f in figures] == [
        f"{layouts[0]} / sequential", f"{layouts[0]}: the step its stage times allow / its step",
        f"{layouts[1]} / sequential", f"{layouts[1]}: the step its stage times allow / its step",
        f"{layouts[2]} / sequential", f"{layouts[2]}: the step its stage times allow / its step",
        f"{layouts[0]}: predicted step / measured step",
        f"{layouts[1]}: predicted step / measured step",
        f"{layouts[2]}: predicted step / measured step",
        f"{layouts[1]}: shared memory / gloo"]
    assert {f["group"] for f in figures} == {"pipeline"}
    assert all(f["repeats"] == 1 and f["a"][0] > 0 and f["b"][0] > 0 for f in figures)
    # One sequential run is every layout's baseline in a repeat; the measured step the
    # model is set against is the hybrid run's own (its batch of 16 / its images/s).
    assert figures[0]["b"] == figures[2]["b"]
    assert figures[7]["b"][0] == pytest.approx(16 / figures[2]["a"][0], abs=1e-3)
    # The twins: the shared-memory run's images/s over the gloo run's, each as recorded.
    assert (figures[9]["a"], figures[9]["b"]) == (figures[2]["a"], figures[4]["a"])


@pytest.mark.parametrize("args, message", [
    (["--only", "overhead,warp"], "unknown group(s) warp"),
    (["--usecase", "nope"], "nope"),
    (["--steps", "0"], "--steps: must be a positive integer"),
])
def test_bad_bench_input(tmp_path, capsys, args, message):
    assert main(["bench", "all", "--out", str(tmp_path / "b"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
