"""The timeline's merging of thin ops with arrays (:func:`simulator.report.coalesce.
coalesce`) gives exactly the bars of the rule written op by op, and a bar of ops of
several categories is drawn as what it mostly is."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from simulator.analysis.trace import OpRecord, Trace
from simulator.report.coalesce import (
    _COALESCED,
    coalesce,
    coalesce_one_by_one,
    display_category,
    dominant_offset,
)
from simulator.report.timeline import PIXEL_DIVISIONS, fit_trace
from simulator.request.scenario import load_scenario
from simulator.run.simulate import make_trace, run_scenario

from .conftest import SCENARIOS


@pytest.fixture(scope="module")
def traces():
    cases = [
        ("pipeline-demo.yaml", ["model.layers=4", "training.global_batch=8"]),
        ("small.yaml", []),
        (
            "cpu-tiny.yaml",
            ["parallel.tp=1", "parallel.dp=2", "parallel.ep=2", "model.moe={experts: 4, top_k: 2}"],
        ),
    ]
    return [make_trace(run_scenario(load_scenario(SCENARIOS / n, o))) for n, o in cases]


@pytest.mark.parametrize("divisions", [1e9, 2e3, 500, 20])
@pytest.mark.parametrize("narrow", [False, True])
def test_array_coalescing_equals_the_op_by_op_rule(traces, divisions, narrow):
    for trace in traces:
        gap = trace.step_time / divisions
        narrower = gap if narrow else None
        _COALESCED.clear()
        fast = coalesce(trace.records, gap, narrower)
        assert fast == coalesce_one_by_one(trace.records, gap, narrower)
        assert coalesce(trace.records, gap, narrower) is fast  # asked again: not redone


def test_overlapping_ops_in_a_lane_follow_the_plain_rule():
    def op(i, start, end, phase="fwd"):
        return OpRecord(
            0, i, "compute", "compute", "gemm", f"op{i}", {"phase": phase}, start, start, end
        )

    # op 1 ends after op 2 (a lane whose ops overlap): the run's end is its latest end
    records = [
        op(0, 0.0, 1.0),
        op(1, 1.0, 5.0),
        op(2, 2.0, 3.0),
        op(3, 4.5, 6.0),
        op(4, 9.0, 10.0, "bwd"),
    ]
    for gap in (0.1, 1.0, 4.0):
        assert coalesce(records, gap) == coalesce_one_by_one(records, gap)
        assert coalesce(records, gap, 2.0) == coalesce_one_by_one(records, gap, 2.0)


@pytest.mark.parametrize("narrow", [False, True])
def test_a_merge_of_merged_bars_reads_their_derived_columns_right(traces, narrow):
    """A chart merges the output of a merge again; the second reads columns derived
    from the first's arrays, not from the records, and must agree with the rule."""
    for trace in traces:
        _COALESCED.clear()
        touching = coalesce(trace.records, trace.step_time * 1e-9)
        for divisions in (2e3, 500, 20):
            gap = trace.step_time / divisions
            narrower = gap if narrow else None
            expected = coalesce_one_by_one(
                coalesce_one_by_one(trace.records, trace.step_time * 1e-9), gap, narrower
            )
            assert coalesce(touching, gap, narrower) == expected


def test_merged_bars_whose_shared_tags_name_another_category_merge_as_that_one():
    """Two backward ops of different phases merge into a bar whose shared tags have no
    phase: the bar takes its first op's phase (backward, not the forward a missing phase
    reads as), and a later merge sees it as the rule does."""

    def op(i, start, end, phase):
        return OpRecord(
            0, i, "compute", "compute", "gemm", f"op{i}", {"phase": phase}, start, start, end
        )

    records = [
        op(0, 0.0, 1.0, "bwd_input"),
        op(1, 1.0, 2.0, "bwd_weight"),
        op(2, 2.5, 3.0, "fwd"),
        op(3, 3.5, 4.0, "bwd"),
    ]
    _COALESCED.clear()
    first = coalesce(records, 0.1)
    assert first == coalesce_one_by_one(records, 0.1)
    for gap in (0.6, 1.0):
        assert coalesce(first, gap) == coalesce_one_by_one(first, gap)


def test_lanes_that_overlap_beside_lanes_that_do_not():
    def op(rank, i, start, end, stream="compute"):
        return OpRecord(
            rank, i, stream, "compute", "gemm", f"op{i}", {"phase": "fwd"}, start, start, end
        )

    records = [
        op(1, 0, 0.0, 1.0),
        op(0, 0, 0.0, 1.0),
        op(0, 1, 1.0, 5.0),
        op(1, 1, 1.05, 2.0),
        op(0, 2, 2.0, 3.0),  # inside op 1 of rank 0: that lane overlaps
        op(1, 2, 2.05, 3.0, "comm"),
        op(0, 3, 4.5, 6.0),
    ]
    for gap in (0.01, 0.1, 1.0):
        _COALESCED.clear()
        assert coalesce(records, gap) == coalesce_one_by_one(records, gap)
        assert coalesce(records, gap, 2.0) == coalesce_one_by_one(records, gap, 2.0)


def _thin_op(i: int, start: float, end: float, phase: str) -> OpRecord:
    return OpRecord(
        0, i, "compute", "compute", "gemm", f"op{i}", {"phase": phase}, start, start, end
    )


def test_a_train_of_thin_ops_of_two_categories_is_one_bar_of_what_it_mostly_is():
    """A layer's recompute, then its backward (twice as long), layer after layer, each
    op thinner than the resolution: one bar, drawn as backward, whose busy time is every
    op's; ops wider than the resolution still keep their categories apart."""
    records, t = [], 0.0
    for _layer in range(4):
        for phase, length in (("recompute", 0.1), ("bwd", 0.2)):
            records.append(_thin_op(len(records), t, t + length, phase))
            t += length
    _COALESCED.clear()
    for narrower in (None, 0.5):
        (bar,) = coalesce(records, 0.5, narrower)
        assert bar == coalesce_one_by_one(records, 0.5, narrower)[0]
        assert display_category(bar) == "backward" and bar.tags["phase"] == "bwd"
        assert bar.tags["busy_s"] == pytest.approx(1.2) and (bar.start, bar.end) == (0.0, t)
        assert bar.label == "8 ops: op0 … op7"
    # mostly recompute: the bar is recompute
    heavy = [
        replace(r, end=r.start + 0.3) if r.tags["phase"] == "recompute" else r for r in records
    ]
    (bar,) = coalesce_one_by_one(heavy, 0.5)
    assert display_category(bar) == "recompute" and coalesce(heavy, 0.5) == [bar]
    # wider than the resolution: every op is its own bar again
    assert len(coalesce(records, 0.05)) == len(records)


def test_a_tie_goes_to_the_category_that_comes_first():
    records = [_thin_op(0, 0.0, 0.1, "recompute"), _thin_op(1, 0.1, 0.2, "bwd")]
    assert dominant_offset(["recompute", "backward"], [0.1, 0.1]) == 0
    assert dominant_offset(["a", "b", "b", "a"], [1.0, 0.5, 0.5, 0.5]) == 0
    assert dominant_offset(["a", "b", "b", "a"], [0.5, 1.0, 0.5, 0.5]) == 1
    _COALESCED.clear()
    (bar,) = coalesce(records, 0.5)
    assert (
        display_category(bar)
        == "recompute"
        == display_category(coalesce_one_by_one(records, 0.5)[0])
    )


@pytest.fixture(scope="module")
def recompute_trace():
    overrides = ["training.recompute=full", "simulation.fidelity=analytic"]
    return make_trace(run_scenario(load_scenario(SCENARIOS / "pipeline-demo.yaml", overrides)))


def _drawn_as_what_it_mostly_is(trace: Trace, max_bars: int) -> list[OpRecord]:
    """The bars a chart of ``trace`` draws, each checked to be in the category most of
    the op time under it belongs to."""
    by_lane = defaultdict(list)
    for rec in trace.records:
        by_lane[(rec.rank, rec.stream)].append(rec)
    shown, info = fit_trace(trace, max_bars)
    assert info.get("merge_gap_s") and not info["truncated"]
    for bar in shown.records:
        time = defaultdict(float)
        for rec in by_lane[(bar.rank, bar.stream)]:
            if rec.start >= bar.start and rec.end <= bar.end:
                time[display_category(rec)] += rec.end - rec.start
        assert display_category(bar) == max(time, key=time.get), bar.label
    return shown.records


def test_a_zoomed_out_backward_pass_with_recompute_reads_as_backward():
    """Full recompute interleaves each layer's recompute with its backward; where a
    layer's pair is thinner than a pixel of the full-width chart, the pass is drawn as
    backward (what it mostly is, 2:1), not as whichever category is drawn last; the
    forward pass, wide, stays forward."""
    records: list[OpRecord] = []
    t = 0.0
    for _layer in range(2000):
        records.append(_thin_op(len(records), t, t + 0.3e-3, "fwd"))
        t += 0.3e-3
    for _layer in range(2000):
        for phase, length in (("recompute", 0.1e-3), ("bwd", 0.2e-3)):
            for _ in range(3):
                records.append(_thin_op(len(records), t, t + length, phase))
                t += length
    trace = Trace(records=records, step_time=t, meta={})
    assert 0.9e-3 < t / PIXEL_DIVISIONS  # a layer's recompute and backward: under a pixel
    bars = _drawn_as_what_it_mostly_is(trace, 30000)
    drawn = defaultdict(float)
    for bar in bars:
        drawn[display_category(bar)] += bar.tags.get("busy_s", bar.end - bar.start)
    assert set(drawn) == {"forward", "backward"} and len(bars) == 2
    assert drawn["forward"] == pytest.approx(0.6) and drawn["backward"] == pytest.approx(1.8)


def test_every_bar_of_a_fitted_timeline_is_what_its_ops_mostly_are(recompute_trace):
    for max_bars in (30000, 2000, 300):
        _drawn_as_what_it_mostly_is(recompute_trace, max_bars)


def test_array_coalescing_equals_the_op_by_op_rule_with_recompute(recompute_trace):
    for divisions in (2e3, 20):
        gap = recompute_trace.step_time / divisions
        for narrower in (None, gap):
            _COALESCED.clear()
            expected = coalesce_one_by_one(recompute_trace.records, gap, narrower)
            assert coalesce(recompute_trace.records, gap, narrower) == expected
