"""The lower bound a sweep examines its layouts by (``simulator/tools/bound.py``): below
every simulated step, shipped scenarios and sampled sweep layouts alike, never higher
for a lighter recompute, and a best-first sweep that ranks what simulating every layout
ranks."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from simulator.common.errors import ParasimError
from simulator.report.sweep_report import count_lines
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools import sweep
from simulator.tools.bound import StepBound
from simulator.tools.cache import ResultCache
from simulator.tools.pool import load_overridden
from simulator.tools.space import Candidate, faster_first, never_slower

from .conftest import SCENARIOS

SHIPPED = sorted(SCENARIOS.glob("*.yaml")) + sorted((SCENARIOS / "teaching").glob("*.yaml"))
SMALL = SCENARIOS / "small.yaml"
TWO_NODES = ["model.heads=16", "cluster.nodes=2"]  # GPT-2 small on 16 A100s


def _bound(scenario) -> float:
    """The refined bound of the scenario's own layout, after checking that the cheap one
    lies below it."""
    bound = StepBound(scenario, scenario.recipe.recompute_fraction)
    candidate, batch = Candidate.of_recipe(scenario.recipe), scenario.spec.training.global_batch
    cheap, refined = bound.seconds(candidate, batch), bound.refined(candidate, batch)
    assert 0 < cheap <= refined
    return refined


def _step(scenario) -> float:
    return run_scenario(scenario, numbers_only=True).result.step_time_s


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_bound_lies_below_every_shipped_scenarios_step(path):
    # as written, and with the TP collectives waited for at once
    for overrides in ([], ["training.tp_comm_overlap=none"]):
        scenario = load_scenario(path, ["simulation.fidelity=analytic", *overrides])
        bound, step = _bound(scenario), _step(scenario)
        assert 0 < bound <= step, (overrides, bound, step)


ZERO_AT_1024 = [
    "cluster.nodes=128",
    "training.global_batch=512",
    "parallel.tp=8",
    "parallel.pp=1",
    "parallel.dp=128",
    "parallel.sp=true",
    "training.micro_batch=4",
    "training.recompute=full",
    "training.sharding=gradients",
    "training.optimizer_sharding=false",
]


@pytest.mark.parametrize(
    "path, overrides",
    [
        (SMALL, [*TWO_NODES, "parallel.tp=2", "parallel.pp=2", "simulation.fidelity=flow"]),
        (SCENARIOS / "pipeline-demo.yaml", ["simulation.fidelity=flow"]),
        (SMALL, ["cluster.gpu.jitter=0.2"]),  # stragglers: some ranks run faster
        (SCENARIOS / "gpt3-175b.yaml", ["training.recompute_fraction=0.5"]),
        # ZeRO-2 over 128 replicas: the updated weights gathered in one call, whose
        # latency a call per layer would count 96 times
        (SCENARIOS / "gpt3-175b.yaml", ZERO_AT_1024),
    ],
    ids=["flow-3d", "flow-pipeline", "jitter", "recompute-fraction", "zero2-gather"],
)
def test_the_bound_lies_below_other_fidelities_and_recipes(path, overrides):
    scenario = load_scenario(path, overrides)
    bound, step = _bound(scenario), _step(scenario)
    assert 0 < bound <= step


def _sample(path, overrides, gpus, per_schedule, fixed=None, seed=0):
    """Valid candidates of a sweep, ``per_schedule`` of each schedule (at random)."""
    base, candidates = sweep.plan_sweep(path, overrides, gpus, fixed)
    rng = random.Random(seed)
    rng.shuffle(candidates)
    by_schedule: dict[str, list] = defaultdict(list)
    for candidate in candidates:
        chosen = by_schedule[candidate.schedule]
        if len(chosen) >= per_schedule:
            continue
        overrides = base.candidate_overrides(candidate, "analytic")
        try:
            scenario = load_overridden(base.raw, base.source, base.base_dir, overrides)
        except ParasimError:
            continue
        chosen.append((candidate, scenario))
    return base, [pair for pairs in by_schedule.values() for pair in pairs]


FULL = {"sharding": "full", "dp_shard": 0}
TORCHTITAN = ["training.framework=torchtitan"]


@pytest.mark.parametrize(
    "path, overrides, gpus, per_schedule, fixed",
    [
        (SMALL, TWO_NODES, None, 8, None),
        (SCENARIOS / "gpt3-175b.yaml", [], 64, 6, None),
        (SCENARIOS / "gpt3-175b.yaml", [], 64, 3, FULL),
        (SCENARIOS / "llama3-8b.yaml", TORCHTITAN, 32, 3, FULL),
        (SCENARIOS / "mixtral-ep.yaml", [], 64, 4, None),
        (SCENARIOS / "mixtral-ep-skewed.yaml", ["training.global_batch=16"], 32, 1, None),
    ],
    ids=["small-16", "gpt3-64", "gpt3-64-fsdp", "llama-fsdp2", "mixtral-64", "mixtral-skewed"],
)
def test_the_bound_lies_below_sampled_sweep_layouts(path, overrides, gpus, per_schedule, fixed):
    base, sample = _sample(path, overrides, gpus, per_schedule, fixed)
    assert len({candidate.schedule for candidate, _ in sample}) > 2
    bound = StepBound(sample[0][1], sweep._spec(base.raw).training.recompute_fraction)
    for candidate, scenario in sample:
        cheap = bound.seconds(candidate, base.global_batch)
        refined = bound.refined(candidate, base.global_batch)
        step = _step(scenario)
        assert 0 < cheap <= refined <= step, (candidate.label(), cheap, refined, step)


def test_a_lighter_recompute_or_sharding_never_bounds_higher():
    # the best-first search examines a layout before those it makes needless
    base, candidates = sweep.plan_sweep(SCENARIOS / "gpt3-175b.yaml", gpus=256)
    scenario = load_overridden(base.raw, base.source, base.base_dir, ["parallel.dp=null"])
    bound = StepBound(scenario)
    groups: dict[Candidate, list[tuple[tuple[int, ...], float]]] = defaultdict(list)
    for candidate in candidates:
        key, weight = faster_first(candidate)
        groups[key].append((weight, bound.seconds(candidate, base.global_batch)))
    compared = 0
    for members in groups.values():
        for lighter, low in members:
            for heavier, high in members:
                if never_slower(lighter, heavier):
                    assert low <= high
                    compared += 1
    assert compared > 1000


def test_a_bound_does_not_depend_on_what_was_bounded_before():
    # every memo of the bound is keyed by all it depends on: the same bounds in any order
    base, candidates = sweep.plan_sweep(SCENARIOS / "gpt3-175b.yaml", gpus=256)
    scenario = load_overridden(base.raw, base.source, base.base_dir, ["parallel.dp=null"])
    sample = random.Random(1).sample(candidates, 400)
    batch = base.global_batch
    forward, backward = StepBound(scenario), StepBound(scenario)
    ahead = [(forward.seconds(c, batch), forward.refined(c, batch)) for c in sample]
    behind = [(backward.seconds(c, batch), backward.refined(c, batch)) for c in sample[::-1]]
    assert ahead == behind[::-1]


def _ranked(result, keep):
    return [(row["layout"], row["step_time_s"]) for row in result.rows[:keep]]


# GPT-2 small on 16 A100s, micro-batches of one sequence (global batch 32): 1,665 layouts
SPACE = {
    "overrides": [*TWO_NODES, "training.global_batch=32", "training.micro_batch=1"]
    + ["parallel.tp=8", "parallel.pp=2"],  # its own layout: far from the best
    "fixed": {"micro_batch": 1},
}


@pytest.fixture(scope="module")
def every_layout():
    return sweep.run_sweep(SMALL, workers=1, **SPACE)


def test_a_best_first_sweep_ranks_what_simulating_every_layout_ranks(every_layout):
    every = every_layout
    best = sweep.run_sweep(SMALL, workers=1, keep=5, **SPACE)
    assert _ranked(best, 5) == _ranked(every, 5)
    counts = best.counts
    assert counts["bounded"] > counts["simulated"] > 5
    assert every.counts["bounded"] == 0 and every.counts["bound_s"] is None
    assert counts["enumerated"] == sum(
        counts[key] for key in ("invalid", "pruned_memory", "dominated", "bounded", "simulated")
    )
    # every ranked row's step is below the threshold the search stopped at
    assert counts["bound_s"] >= best.rows[4]["step_time_s"]
    assert sum(line.startswith("left out") for line in count_lines(best)) == 1
    # the scenario's own layout, which the bound left out, still gets its step
    own = best.scenario_layout
    assert own is not None and own["rank"] is None
    assert "outside the 5 fastest" in own["unranked"]
    assert own["step_time_s"] > counts["bound_s"]


def test_a_bound_above_a_simulated_step_makes_the_search_examine_everything(
    every_layout, monkeypatch
):
    every = every_layout
    monkeypatch.setattr(StepBound, "seconds", lambda self, candidate, batch: 1e6)
    wrong = sweep.run_sweep(SMALL, workers=1, keep=5, **SPACE)
    assert wrong.counts["bounded"] == 0
    assert _ranked(wrong, len(every.rows)) == _ranked(every, len(every.rows))


def test_a_step_cut_short_is_not_kept_in_the_cache(every_layout, tmp_path):
    # a layout found slower than the ranking needs is not accounted; a later search that
    # ranks every layout must simulate it in full rather than read that from the cache
    cache = ResultCache(tmp_path)
    best = sweep.run_sweep(SMALL, workers=1, keep=3, cache=cache, **SPACE)
    assert best.counts["bounded"] > 0
    every = sweep.run_sweep(SMALL, workers=1, cache=ResultCache(tmp_path), **SPACE)
    assert _ranked(every, len(every.rows)) == _ranked(every_layout, len(every_layout.rows))
    assert all("breakdown_mean_s" in row for row in every.rows)
