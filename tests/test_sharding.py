"""Sharded data parallelism: ZeRO-1/2/3 (``training.sharding``), FSDP's per-unit
gathers and reduce-scatters, and the memory each level saves."""

from __future__ import annotations

import pytest

from simulator.arithmetic.counts import pipeline_rank_parameters, unit_parameters
from simulator.common.errors import ScenarioError
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario
from simulator.schedule.ir import Collective

from .conftest import SCENARIOS

SMALL = SCENARIOS / "small.yaml"
# one micro-batch, bf16 gradients: every byte count below is in weight-sized units
ONE = ["training.grad_reduce_dtype=bf16", "training.global_batch=16", "training.micro_batch=4"]


def _dp_bytes_moved(scenario, rank: int = 0) -> float:
    """Bytes a rank sends over its data-parallel groups in one step, as a ring moves
    them: ``2(n-1)/n`` of an all-reduce's buffer, ``(n-1)/n`` of a gather's or scatter's,
    for a group of ``n``."""
    schedule = per_rank_schedule(scenario)
    total = 0.0
    for op in schedule.programs[rank].ops:
        if type(op) is not Collective or op.tags.get("axis") != "dp":
            continue
        n = len(schedule.groups[op.group])
        total += op.bytes * (n - 1) / n * (2 if op.kind == "all_reduce" else 1)
    return total


def test_zero3_moves_three_halves_of_what_data_parallelism_moves():
    dp = load_scenario(SMALL, ONE)
    full = load_scenario(SMALL, [*ONE, "training.sharding=full"])
    n = dp.layout.dp
    weight_bytes = 2 * pipeline_rank_parameters(dp.recipe, dp.model, dp.moe, 0)
    assert _dp_bytes_moved(dp) == pytest.approx(2 * (n - 1) / n * weight_bytes)
    assert _dp_bytes_moved(full) == pytest.approx(3 * (n - 1) / n * weight_bytes)


def test_hsdp_shards_inside_a_group_and_all_reduces_the_shards_across_groups():
    hsdp = load_scenario(SMALL, [*ONE, "training.sharding=full", "parallel.dp_shard=2"])
    assert hsdp.layout.shard_degree == 2
    s, r = 2, hsdp.layout.dp // 2
    weight_bytes = 2 * pipeline_rank_parameters(hsdp.recipe, hsdp.model, hsdp.moe, 0)
    # two gathers and a reduce-scatter inside the shard group, then an all-reduce of the
    # 1/s shard across the replicas
    expected = 3 * (s - 1) / s * weight_bytes + 2 * (r - 1) / r * weight_bytes / s
    assert _dp_bytes_moved(hsdp) == pytest.approx(expected)
    memory = run_scenario(hsdp).result.memory.per_stage[0].terms_bytes
    full = run_scenario(load_scenario(SMALL, [*ONE, "training.sharding=full"])).result
    assert memory["optimizer_state"] == pytest.approx(
        2 * full.memory.per_stage[0].terms_bytes["optimizer_state"]
    )
    with pytest.raises(ScenarioError, match="needs training.sharding: full"):
        load_scenario(SMALL, ["parallel.dp_shard=2"])
    with pytest.raises(ScenarioError, match="dp_shard.3. \\* dp_replicate"):
        load_scenario(SMALL, ["training.sharding=full", "parallel.dp_shard=3"])


def test_units_cover_every_parameter_once():
    for name, overrides in [
        ("gpt3-175b-interleaved.yaml", []),
        ("llama3-8b.yaml", []),
        ("pipeline-demo.yaml", ["parallel.stage_layers=[10, 14]"]),
    ]:
        scenario = load_scenario(SCENARIOS / name, overrides)
        recipe, model = scenario.recipe, scenario.model
        for rank in range(recipe.layout.pp):
            units = [
                unit_parameters(recipe, model, None, layer) for layer in recipe.rank_layers(rank)
            ]
            assert sum(units) == pipeline_rank_parameters(recipe, model, None, rank)


def test_each_unit_is_gathered_before_it_runs_and_prefetched_one_ahead():
    scenario = load_scenario(SMALL, [*ONE, "training.sharding=full"])
    ops = per_rank_schedule(scenario).programs[0].ops
    gathers = [op for op in ops if type(op) is Collective and op.kind == "all_gather"]
    layers = scenario.model.layers
    forward = [op.tags["layer"] for op in gathers if op.tags["phase"] == "fwd"]
    backward = [op.tags["layer"] for op in gathers if op.tags["phase"] != "fwd"]
    assert forward == list(range(layers)) and backward == list(reversed(range(layers)))
    by_id = {op.id: op for op in ops}
    for gather in gathers:
        layer, phase = gather.tags["layer"], gather.tags["phase"]
        first = next(
            op
            for op in ops
            if op.type == "compute"
            and op.tags.get("layer") == layer
            and (op.tags.get("phase") == "fwd") == (phase == "fwd")
        )
        # the layer's first op waits for its unit; the next unit's gather was issued
        # before this layer started
        assert gather.id in first.deps
        assert gather.id < first.id
    scatters = [op for op in ops if type(op) is Collective and op.kind == "reduce_scatter"]
    assert [op.tags["layer"] for op in scatters] == list(reversed(range(layers)))
    assert not [op for op in ops if type(op) is Collective and op.kind == "all_reduce"
                and op.tags.get("axis") == "dp"]  # fmt: skip
    assert by_id  # every id above belongs to the program


def test_without_resharding_the_backward_gathers_nothing():
    scenario = load_scenario(
        SMALL, [*ONE, "training.sharding=full", "training.reshard_after_forward=false"]
    )
    ops = per_rank_schedule(scenario).programs[0].ops
    phases = {op.tags["phase"] for op in ops if type(op) is Collective and op.kind == "all_gather"}
    assert phases == {"fwd"}


def test_with_fast_links_full_sharding_costs_no_compute_and_hides_its_gathers():
    dp = run_scenario(load_scenario(SMALL, ONE)).result
    full = run_scenario(load_scenario(SMALL, [*ONE, "training.sharding=full"])).result
    for phase in ("fwd", "bwd"):
        assert full.per_rank[0].compute_by_phase[phase] == pytest.approx(
            dp.per_rank[0].compute_by_phase[phase], rel=1e-12
        )
    # the optimizer updates a quarter of the weights; on NVLink the gathers hide
    # behind the layers they prefetch for
    saved = (
        dp.per_rank[0].compute_by_phase["optimizer"]
        - (full.per_rank[0].compute_by_phase["optimizer"])
    )
    assert saved > 0
    assert full.step_time_s == pytest.approx(dp.step_time_s - saved, rel=0.05)


@pytest.mark.parametrize("level", ["optimizer", "gradients", "full"])
def test_memory_falls_with_each_level(level):
    none = run_scenario(load_scenario(SMALL, ONE)).result.memory.per_stage[0]
    sharded = load_scenario(SMALL, [*ONE, f"training.sharding={level}"])
    terms = run_scenario(sharded).result.memory.per_stage[0].terms_bytes
    dp = sharded.layout.dp
    recipe, model = sharded.recipe, sharded.model
    two_units = sum(
        sorted(unit_parameters(recipe, model, None, layer) for layer in recipe.rank_layers(0))[-2:]
    )
    base = none.terms_bytes
    assert terms["optimizer_state"] == pytest.approx(base["optimizer_state"] / dp)
    if level == "optimizer":
        assert terms["gradients"] == base["gradients"] and terms["weights"] == base["weights"]
    if level == "gradients":
        bucket = min(recipe.grad_bucket_bytes, base["gradients"])
        assert terms["gradients"] == pytest.approx(base["gradients"] / dp + bucket)
    if level == "full":
        assert terms["weights"] == pytest.approx(base["weights"] / dp + 2 * two_units)
        assert terms["gradients"] == pytest.approx(base["gradients"] / dp + 2 * two_units)


def test_the_shards_halve_when_the_replicas_double():
    def shards(nodes: int) -> dict[str, float]:
        scenario = load_scenario(
            SMALL,
            [
                *ONE,
                "training.sharding=full",
                "training.micro_batch=1",
                f"cluster.nodes={nodes}",
                "parallel.dp=null",
            ],
        )
        memory = run_scenario(scenario).result.memory.per_stage[0].terms_bytes
        return memory

    one, two = shards(1), shards(2)
    assert two["optimizer_state"] == pytest.approx(one["optimizer_state"] / 2)
    assert two["weights"] < one["weights"] and two["gradients"] < one["gradients"]


def test_optimizer_sharding_is_the_older_spelling_of_sharding_optimizer():
    old = load_scenario(SMALL, ["training.optimizer_sharding=true"])
    new = load_scenario(SMALL, ["training.sharding=optimizer"])
    assert old.recipe == new.recipe and old.recipe.sharding == "optimizer"
    with pytest.raises(ScenarioError, match="training.optimizer_sharding"):
        load_scenario(SMALL, ["training.optimizer_sharding=true", "training.sharding=full"])
    with pytest.raises(ScenarioError, match="training.sharding: full with schedule zb-h1"):
        load_scenario(
            SCENARIOS / "pipeline-demo.yaml", ["training.sharding=full", "parallel.schedule=zb-h1"]
        )
