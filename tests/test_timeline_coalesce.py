"""The timeline's merging of thin ops with arrays (:func:`simulator.report.timeline.
coalesce`) gives exactly the bars of the rule written op by op."""

from __future__ import annotations

import pytest

from simulator.analysis.trace import OpRecord
from simulator.report.timeline import _COALESCED, coalesce, coalesce_one_by_one
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
