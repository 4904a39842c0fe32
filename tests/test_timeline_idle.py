"""The timeline draws each compute lane's idle stretches as the time accounting
attributes them: bubbles, stalls and exposed communication add up to the breakdown."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.report.timeline import timeline_figure
from simulator.request.scenario import load_scenario
from simulator.run.simulate import idle_intervals, make_trace, run_scenario

from .conftest import SCENARIOS


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("pipeline-demo.yaml", ["parallel.tp=4", "parallel.dp=2", "training.global_batch=16"]),
        (
            "mixtral-ep-skewed.yaml",
            ["model.layers=2", "model.seq_len=1024", "training.global_batch=16"],
        ),
    ],
)
def test_idle_bars_add_up_to_the_breakdown(name, overrides):
    run = run_scenario(load_scenario(SCENARIOS / name, overrides))
    trace = make_trace(run)
    for row in run.result.per_rank:
        intervals = trace.meta["idle"][str(row.rank)]
        for category in ("bubble", "imbalance_stall", "exposed_comm", "other"):
            drawn = sum(hi - lo for cat, lo, hi in intervals if cat == category)
            assert drawn == pytest.approx(row.breakdown[category], abs=1e-12)
        # idle stretches never overlap each other
        spans = sorted((lo, hi) for _, lo, hi in intervals)
        assert all(a[1] <= b[0] + 1e-15 for a, b in zip(spans, spans[1:], strict=False))
    # the run keeps the stretches its accounting found; worked out again, they are equal
    assert run.idle is not None
    ranks = sorted(run.schedule.programs)
    assert idle_intervals(run, ranks) == idle_intervals(replace(run, idle=None), ranks)
    fig, info = timeline_figure(trace, "idle")
    names = [t.name for t in fig.data]
    critical = run.result.breakdown.critical
    if critical["bubble"] > 0:
        assert "idle: pipeline bubble" in names
    if critical["imbalance_stall"] > 0:
        assert "idle: imbalance stall" in names
    # idle bars sit on compute lanes only
    lanes = list(fig.layout.yaxis.ticktext)
    for t in fig.data:
        if t.name.startswith("idle:"):
            assert {lanes[y].split(" ", 1)[1] for y in t.y} == {"compute"}
    labels = [a.text for a in fig.layout.annotations]
    assert any(label.startswith("stage 0 · node") for label in labels)


def test_a_merge_of_touching_ops_says_so_not_a_fraction_of_a_nanosecond():
    from simulator.report.timeline import _cap_note

    info = {
        "ranks_shown": [0],
        "ranks_total": 1,
        "coalesced_from": 1000,
        "truncated": False,
        "bars": 10,
        "bars_total": 10,
        "selection": "every rank",
    }
    touching = _cap_note({**info, "merge_gap_s": 2.5e-10}, 10)
    assert touching.startswith("Ops of one kind that touch are drawn as one bar")
    assert "ns" not in touching
    wider = _cap_note({**info, "merge_gap_s": 3e-6}, 10)
    assert "less than 3 us apart" in wider and "trace.json has each one" in wider
    thin = _cap_note({**info, "merge_gap_s": 3e-6, "merge_narrow": True}, 10, zoomable=True)
    assert thin.startswith("Ops shorter than 3 us and as close to each other")
    assert thin.endswith("(1,000 ops; zoom in to see each one)")
    # a chart that shows only some ranks says so on the first line
    some = _cap_note({**info, "ranks_total": 8, "merge_gap_s": 3e-6}, 10)
    assert some.startswith("Showing 1 of 8 ranks") and "<br>Ops of one kind" in some
