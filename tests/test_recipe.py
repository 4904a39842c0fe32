"""The Recipe: one frozen value per step, its compact text form, and the one mapping of
pipeline ranks to layers that the builder, the parameter count and memory share."""

from __future__ import annotations

import pytest

from simulator.analysis.memory import memory_per_rank
from simulator.common.errors import ScenarioError
from simulator.request.recipe import Recipe
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule
from simulator.schedule.ir import Collective

from .conftest import SCENARIOS

SMALL = SCENARIOS / "small.yaml"
MIXTRAL = SCENARIOS / "mixtral-ep.yaml"


def test_the_text_form_reads_back_to_the_same_recipe():
    scenario = load_scenario(
        SCENARIOS / "gpt3-175b-interleaved.yaml",
        ["training.optimizer_sharding=true", "training.attention=unfused"],
    )
    recipe = scenario.recipe
    text = str(recipe)
    assert text.startswith(f"tp{recipe.layout.tp} pp{recipe.layout.pp} dp{recipe.layout.dp}")
    assert "sharding=optimizer" in text and "attention=unfused" in text
    assert f"mb{recipe.micro_batch}x{recipe.microbatches}" in text
    assert Recipe.parse(text) == recipe
    assert Recipe.parse(text).rank_layers(1) == recipe.rank_layers(1)


def test_uneven_stages_and_defaults_in_the_text_form():
    scenario = load_scenario(
        SCENARIOS / "pipeline-demo.yaml",
        ["parallel.stage_layers=[3, 5]", "parallel.pp=2", "model.layers=8"],
    )
    text = str(scenario.recipe)
    assert "stage_layers=3/5" in text and "attention" not in text
    assert Recipe.parse(text).layers_of(1) == range(3, 8)


def test_the_label_is_the_sweep_s_layout_name():
    recipe = load_scenario(SMALL, ["parallel.sp=true"]).recipe
    tp, pp, dp = recipe.layout.tp, recipe.layout.pp, recipe.layout.dp
    assert recipe.label() == (
        f"tp{tp} pp{pp} dp{dp} sp mb{recipe.micro_batch} {recipe.schedule} "
        f"rc={recipe.recompute} [{','.join(recipe.layout.placement)}]"
    )


@pytest.mark.parametrize(
    "text, field",
    [
        ("tp2 pp1 dp4 mb1x8 1f1b rc=sometimes [tp,dp,pp] L4", "recompute"),
        ("tp2 pp1 dp4 mb1x8 1f1b rc=none [tp,dp,pp]", "L<layers>"),
        ("tp2 pp2 dp4 mb1x8 1f1b rc=none [tp,dp,pp] L5", "L<layers>"),
        ("tp2 pp2 dp4 mb1x8 1f1b rc=none [tp,dp,pp] L6 stage_layers=2/3", "not L6"),
        ("tp2 dp4 mb1x8 1f1b rc=none [tp,dp,pp] L4", "pp"),
        ("tp2 pp1 dp4 mb1x8 1f1b rc=none fast [tp,dp,pp] L4", "fast"),
    ],
)
def test_a_bad_text_form_is_one_clear_error(text, field):
    with pytest.raises(ScenarioError, match=field):
        Recipe.parse(text)


def test_a_recipe_is_frozen_and_changes_by_copy():
    recipe = load_scenario(SMALL).recipe
    with pytest.raises(AttributeError):
        recipe.micro_batch = 2  # type: ignore[misc]
    wider = recipe.with_(tp=recipe.layout.tp * 2, dp=recipe.layout.dp // 2, sp=True)
    assert wider.layout.tp == 2 * recipe.layout.tp and wider.sp and not recipe.sp


MOE_EVERY_OTHER = "model.moe={experts: 8, top_k: 2, every: 2, routing: {kind: zipf, exponent: 1.0}}"
SCHEDULES = {
    "gpipe": ["parallel.schedule=gpipe"],
    "1f1b": ["parallel.schedule=1f1b"],
    "interleaved": ["parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2"],
    "zb-h1": ["parallel.schedule=zb-h1"],
    "zb-h2": ["parallel.schedule=zb-h2"],
}


@pytest.mark.parametrize("model", ["dense", "moe"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_each_pipeline_rank_reduces_exactly_the_parameters_memory_counts(model, schedule):
    """The gradients a pipeline rank's own ops hand to data parallelism (its bucket
    collectives, in elements) are the parameters memory counts for that rank: one mapping
    of ranks to layers, even with MoE layers every other layer and interleaving."""
    overrides = [
        "model.layers=8",
        "parallel.tp=2",
        "parallel.pp=2",
        "parallel.dp=4",
        "parallel.ep=1",
        "training.global_batch=16",
        "simulation.fold=false",
        *SCHEDULES[schedule],
    ]
    overrides += [MOE_EVERY_OTHER, "parallel.ep=2"] if model == "moe" else ["model.moe=null"]
    scenario = load_scenario(MIXTRAL, overrides)
    schedule_ir = build_schedule(scenario)
    memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, 80 * 2**30)
    layout = scenario.layout
    for pipeline_rank in range(layout.pp):
        rank = layout.rank_of(pp=pipeline_rank)
        reduced = sum(
            op.bytes
            for op in schedule_ir.programs[rank].ops
            if type(op) is Collective and ".bucket" in op.label
        )
        counted = memory.per_stage[pipeline_rank].parameters
        assert reduced / scenario.recipe.grad_bytes == counted
    layers = [scenario.recipe.rank_layers(r) for r in range(layout.pp)]
    assert sorted(sum(layers, [])) == list(range(8))
