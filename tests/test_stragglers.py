"""Stragglers (``gpu.jitter``): each rank's compute runs ``1 + jitter·z`` times as long,
``z`` a stratified normal draw per rank, shuffled by the seed; the step waits for the
slowest, and the result says what that cost."""

from __future__ import annotations

import pytest

from simulator.engine.stragglers import normal_scores, rank_factors
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario

from .conftest import SCENARIOS


def _run(*overrides: str):
    return run_scenario(load_scenario(SCENARIOS / "small.yaml", list(overrides))).result


def test_no_jitter_no_straggler():
    assert _run().straggler_s == 0.0


@pytest.mark.parametrize("fidelity", ["flow", "analytic"])
def test_jitter_slows_the_step_by_what_the_result_reports(fidelity):
    base = _run(f"simulation.fidelity={fidelity}")
    jittered = _run(f"simulation.fidelity={fidelity}", "cluster.gpu.jitter=0.1")
    assert jittered.step_time_s > base.step_time_s
    assert jittered.straggler_s == pytest.approx(jittered.step_time_s - base.step_time_s)
    # the same seed draws the same stragglers
    again = _run(f"simulation.fidelity={fidelity}", "cluster.gpu.jitter=0.1")
    assert again.step_time_s == jittered.step_time_s


def test_another_seed_makes_other_ranks_slow_by_the_same_expected_amounts():
    schedule = type("S", (), {"programs": {r: None for r in range(8)}, "rank_images": {}})()
    first = rank_factors(schedule, 8, 0.1, 0)
    other = rank_factors(schedule, 8, 0.1, 7)
    assert first != other
    assert sorted(first.values()) == sorted(other.values())
    # stratified: the slowest of 8 sits at the expected maximum of 8 normal draws
    # (1.42σ; Blom's score 1.434), the ranks' mean at 1
    assert max(first.values()) == pytest.approx(1 + 0.1 * normal_scores(8)[-1])
    assert normal_scores(8)[-1] == pytest.approx(1.42, abs=0.02)
    assert sum(first.values()) / 8 == pytest.approx(1.0)


def test_more_jitter_costs_more():
    costs = [_run(f"cluster.gpu.jitter={j}").straggler_s for j in (0.02, 0.05, 0.1)]
    assert costs == sorted(costs) and costs[0] > 0


def test_a_folded_rank_takes_the_slowest_of_the_ranks_it_stands_for():
    scenario = load_scenario(
        SCENARIOS / "gpt3-175b.yaml", ["simulation.fidelity=analytic", "cluster.gpu.jitter=0.05"]
    )
    schedule = build_schedule(scenario)
    world = scenario.layout.world
    folded = rank_factors(schedule, world, 0.05, 0)
    every = rank_factors(
        type(schedule)(programs={r: None for r in range(world)}, groups={}), world, 0.05, 0
    )
    assert len(folded) < world
    for rank, factor in folded.items():
        stands_for = schedule.rank_images.get(rank, (rank,))
        assert factor == max(every[r] for r in stands_for)
        assert factor >= 1.0  # the slowest of many is slower than the mean
    assert all(f >= 0.5 for f in every.values())
