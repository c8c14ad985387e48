"""Where a pipeline stage's step goes: the record ``backend.stages_time`` of a real run (2
stages x 4 micro-batches of tiny, a few steps) and the schedule timeline drawn from it.

The values asserted are the record's own arithmetic and the schedule's order (a stage
computes one pass at a time; a micro-batch's forward precedes its backward; a stage
receives what its neighbour finished), never how fast anything ran."""

from __future__ import annotations

import logging

import pytest
from test_findings import _manifest

from ddlstudy.config import RunConfig, with_overrides
from ddlstudy.machine.environment import usable_cores
from ddlstudy.records import formats
from ddlstudy.report import Report, make_figures
from ddlstudy.report.timeline import plot_timeline
from ddlstudy.runner import run
from ddlstudy.strategies.pipeline import bound, stage_times

STAGES, MICRO, STEPS = 2, 4, 4
PARTS = ("forward_s", "backward_s", "comm_s", "wait_s", "optimizer_s")


def _piped(tmp_path_factory, datasets_dir, tiny, **flags):
    """One real pipeline run: (its runs folder, its manifest as read back and checked, the
    lines ddlstudy logged)."""
    runs = tmp_path_factory.mktemp("runs")
    cfg = RunConfig(usecase=with_overrides(tiny, epochs=1), datasets_dir=datasets_dir,
                    runs_dir=runs, sample_hz=0, snapshot=False, strategy="pipeline",
                    micro_batches=MICRO, max_steps=STEPS, max_val_steps=1,
                    **{"stages": STAGES, **flags})
    lines = _Lines()
    logging.getLogger("ddlstudy").addHandler(lines)
    try:
        folder = run(cfg, show_progress=False)
    finally:
        logging.getLogger("ddlstudy").removeHandler(lines)
    manifest = formats.load(folder.path / "manifest.json", formats.Manifest, "run manifest")
    return runs, manifest, lines.said


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


@pytest.fixture(scope="module")
def piped(tmp_path_factory, datasets_dir, tiny):
    return _piped(tmp_path_factory, datasets_dir, tiny)[:2]


@pytest.fixture(scope="module")
def three_1f1b(tmp_path_factory, datasets_dir, tiny):
    """3 stages under 1F1B: on 2 cores, more processes than cores."""
    return _piped(tmp_path_factory, datasets_dir, tiny, stages=3, schedule="1f1b")


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory, datasets_dir, tiny):
    """4 stages on 2 processes."""
    return _piped(tmp_path_factory, datasets_dir, tiny, schedule="interleaved-1f1b")[:2]


def _record(manifest: dict) -> dict:
    return manifest["backend"]["stages_time"]


def test_the_record_has_one_entry_per_stage(piped):
    _, manifest = piped
    assert manifest["status"] == "completed"
    per_stage = _record(manifest)["per_stage"]
    assert [(s["rank"], s["pipeline"], s["stage"]) for s in per_stage] == [(0, 0, 0), (1, 0, 1)]
    assert [s["steps"] for s in per_stage] == [STEPS - 1] * STAGES  # the first is not counted


def test_the_parts_are_positive_and_add_up_to_the_step(piped):
    _, manifest = piped
    for s in _record(manifest)["per_stage"]:
        # Work and transfers take time on every stage. Whether a stage waits at all is
        # timing: a neighbour running ahead of it leaves it none (CI saw the last stage
        # never wait), so only >= 0.
        assert all(s[part] > 0 for part in PARTS if part != "wait_s"), s
        assert s["wait_s"] >= 0
        # Every second of a step is in exactly one part...
        everything = sum(s[p] for p in PARTS) + s["exchange_s"] + s["other_s"]
        assert everything == pytest.approx(s["step_s"], rel=1e-9)
        # ... and the schedule's own work between the parts is a small share (a part the
        # clock missed, a backward, would be half the step).
        assert sum(s[p] for p in PARTS) == pytest.approx(s["step_s"], rel=0.25), s


def _boxes(manifest: dict) -> dict[tuple[int, int, str], tuple[float, float]]:
    return {(b["stage"], b["micro_batch"], b["phase"]): (b["start_s"], b["end_s"])
            for b in _record(manifest)["timeline"]}


def test_the_timeline_follows_the_gpipe_schedule(piped):
    _, manifest = piped
    boxes = _boxes(manifest)
    assert len(_record(manifest)["timeline"]) == len(boxes) == STAGES * MICRO * 2
    assert set(boxes) == {(s, m, p) for s in range(STAGES) for m in range(MICRO)
                          for p in ("forward", "backward")}
    for stage in range(STAGES):
        row = sorted(v for k, v in boxes.items() if k[0] == stage)
        assert all(start <= end for start, end in row)
        assert all(a[1] <= b[0] for a, b in zip(row, row[1:], strict=False)), row
        for m in range(MICRO):
            assert boxes[stage, m, "forward"][1] <= boxes[stage, m, "backward"][0]
    for m in range(MICRO):  # an activation goes down the pipeline, its gradient back up
        assert boxes[1, m, "forward"][0] >= boxes[0, m, "forward"][1]
        assert boxes[0, m, "backward"][0] >= boxes[1, m, "backward"][1]


def test_the_figure_draws_the_recorded_boxes(piped, tmp_path):
    runs, manifest = piped
    paths = make_figures(Report(runs), tmp_path)
    assert tmp_path / f"timeline-{manifest['id']}.png" in paths
    fig = plot_timeline(manifest, "t")
    (ax,) = fig.axes
    drawn = sorted((round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_width())
                   for p in ax.patches)  # nothing else is drawn: the bubble stays empty
    recorded = sorted((k[0], 1e3 * start, 1e3 * (end - start))
                      for k, (start, end) in _boxes(manifest).items())
    assert len(drawn) == len(recorded) == STAGES * MICRO * 2
    for got, want in zip(drawn, recorded, strict=True):
        assert got == pytest.approx(want)
    labels = sorted(int(t.get_text()) for t in ax.texts)
    assert labels == sorted(m for m in range(MICRO) for _ in range(STAGES * 2))


def _row(start: float, recv_f: tuple, sent_f: float, recv_b: tuple, sent_b: float,
         sends_done: float) -> list[float]:
    """A StageClock row of one micro-batch (nan: what the stage does not do)."""
    return [start, 99.0, sends_done, *recv_f, sent_f, *recv_b, sent_b]


def test_a_receive_and_a_send_are_split_into_waiting_and_transfer():
    """Stage 1 posts its receive at 0, stage 0 sends at 3, it arrives at 4: 3 s of waiting,
    1 of transfer. Stage 1 sends the gradient at 10, which stage 0 had waited for since 6
    (4 s waiting, 0.5 of transfer); stage 1's send waits for stage 0's receive (posted
    before it: no waiting) until 11: 1 s of transfer."""
    nan = float("nan")
    rows = [[_row(0.0, (0.0, 0.0), 3.0, (6.0, 10.5), nan, nan)],
            [_row(0.0, (0.0, 4.0), nan, (5.0, 5.0), 10.0, 11.0)]]
    sums = [{"forward": 1.0, "backward": 1.0, "recv": 4.5, "send": 0.0, "exchange": 0.0,
             "optimizer": 1.0, "other": 0.0},
            {"forward": 1.0, "backward": 1.0, "recv": 4.0, "send": 1.0, "exchange": 0.0,
             "optimizer": 1.0, "other": 0.0}]
    everyone = [{"rank": r, "sums": sums[r], "rows": _Rows(rows[r]), "origin": 0.0,
                 "boxes": []} for r in range(2)]
    first, second = stage_times(everyone, 2)["per_stage"]
    assert (first["wait_s"], first["comm_s"]) == pytest.approx((4.0, 0.5))
    assert (second["wait_s"], second["comm_s"]) == pytest.approx((3.0, 2.0))


class _Rows(list):
    """Rows as the gather hands them over (a tensor's ``tolist``)."""

    def tolist(self) -> list:
        return list(self)


def test_a_run_recorded_before_the_record_is_read_and_has_no_timeline():
    old = _manifest("pipeline", [20.0])
    assert "stages_time" not in old["backend"]
    formats.check(old, formats.Manifest, "manifest.json", "run manifest")
    assert plot_timeline(old, "t") is None


def _held(manifest: dict) -> list[list[int]]:
    return [s["peak_micro_batches_held"] for s in _record(manifest)["per_stage"]]


def test_gpipe_holds_every_micro_batch_and_1f1b_one_a_stage_to_come(piped, three_1f1b):
    """The activations a stage holds at most: GPipe all M micro-batches on every stage;
    1F1B, stage i of S only S - i (its warm-up forwards) before its first backward. The
    bytes are what autograd saved for one micro-batch, times those."""
    assert _held(piped[1]) == [[MICRO]] * STAGES
    _, manifest, _ = three_1f1b
    assert manifest["status"] == "completed"
    assert manifest["strategy"]["schedule"] == "1f1b"
    assert _held(manifest) == [[3], [2], [1]]
    for s in _record(manifest)["per_stage"]:
        assert s["activation_bytes"][0] > 0
        assert s["peak_activation_bytes"] == s["peak_micro_batches_held"][0] * \
            s["activation_bytes"][0]
    for s in _record(piped[1])["per_stage"]:  # GPipe: all MICRO at once
        assert s["peak_activation_bytes"] == MICRO * s["activation_bytes"][0] > 0


def test_1f1b_alternates_on_the_last_stage_and_3_stages_on_2_cores_warn(three_1f1b):
    _, manifest, said = three_1f1b
    boxes = [b for b in _record(manifest)["timeline"] if b["stage"] == 2]
    order = [(b["phase"][0], b["micro_batch"]) for b in sorted(boxes, key=lambda b: b["start_s"])]
    assert order == [(p, m) for m in range(MICRO) for p in ("f", "b")]
    if usable_cores() < 3:
        assert any("3 processes on" in line and "compete" in line for line in said), said


def test_the_bound_is_the_slowest_stage_plus_the_bubble(piped):
    """Two stages over 10 steps: stage 1 is the slowest (forward 2, backward 4, optimizer 1
    a step: 7 s); the bubble is 1 of its 4 micro-batches' slices of 6 s of passes (1.5 s),
    or of 8 (0.75 s) with two stages a process; the steps took 10 s."""
    def stage(i, fwd, bwd, opt):
        return {"pipeline": 0, "stage": i, "steps": 10, "forward_s": 10 * fwd,
                "backward_s": 10 * bwd, "optimizer_s": 10 * opt, "step_s": 100.0}
    per_stage = [stage(0, 1, 2, 0), stage(1, 2, 4, 1)]
    assert bound(per_stage, 2, 4, 1) == pytest.approx({"bound_step_s": 8.5, "of_bound": 0.85})
    assert bound(per_stage, 2, 4, 2) == pytest.approx({"bound_step_s": 7.75,
                                                       "of_bound": 0.775})
    record = _record(piped[1])  # and the run's record is that arithmetic on its own times
    assert bound(record["per_stage"], STAGES, MICRO, 1) == pytest.approx(
        {k: record[k] for k in ("bound_step_s", "of_bound")})


def test_interleaved_holds_two_stages_a_process_and_draws_them_hatched(interleaved):
    _, manifest = interleaved
    record = _record(manifest)
    assert len(manifest["strategy"]["stage_starts"]) == 2 * STAGES
    assert [s["chunks"] for s in record["per_stage"]] == [2] * STAGES
    assert all(len(s["peak_micro_batches_held"]) == 2 for s in record["per_stage"])
    chunks = [b["chunk"] for b in record["timeline"]]
    assert len(chunks) == STAGES * 2 * MICRO * 2 and chunks.count(1) == len(chunks) // 2
    fig = plot_timeline(manifest, "t")
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == chunks.count(1)
