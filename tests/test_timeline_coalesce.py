"""The timeline's merging of thin ops with arrays (:func:`simulator.report.coalesce.
coalesce`) gives exactly the bars of the rule written op by op."""

from __future__ import annotations

import pytest

from simulator.analysis.trace import OpRecord
from simulator.report.coalesce import _COALESCED, coalesce, coalesce_one_by_one
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
    phase (drawn as forward): a later merge must see it as forward, as the rule does."""

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
