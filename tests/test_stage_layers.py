"""Pipeline stages that hold different numbers of layers, and the parameters each
pipeline rank holds with virtual stages."""

from __future__ import annotations

import pytest

from simulator.arithmetic.counts import parameter_count, pipeline_rank_parameters
from simulator.common.errors import ScenarioError
from simulator.request.layout import balanced_stages
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule.ir import Compute

from .conftest import SCENARIOS

PIPE = SCENARIOS / "pipeline-demo.yaml"
FOUR = ["parallel.tp=4", "parallel.pp=4"]  # GPT-3 1.3B: 24 layers on 4 stages


def layers_run(schedule, rank):
    return {op.tags["layer"] for op in schedule.programs[rank].ops if "layer" in op.tags}


def test_uneven_stages_run_the_layers_they_are_given():
    scenario = load_scenario(PIPE, FOUR)
    layers, pp = scenario.model.layers, scenario.layout.pp
    split = [layers // pp - 1] + [layers // pp] * (pp - 2) + [layers // pp + 1]
    uneven = load_scenario(PIPE, [*FOUR, f"parallel.stage_layers={split}", "simulation.fold=false"])
    schedule = build_schedule(uneven)
    first = 0
    for stage, count in enumerate(split):
        rank = uneven.layout.rank_of(pp=stage)
        assert layers_run(schedule, rank) == set(range(first, first + count))
        assert list(uneven.recipe.layers_of(stage)) == list(range(first, first + count))
        first += count
    result = run_scenario(uneven).result
    assert result.memory.per_stage[-1].parameters > result.memory.per_stage[1].parameters


@pytest.mark.parametrize("tie", ["true", "false"])
def test_pipeline_ranks_hold_every_parameter_once_with_virtual_stages_and_moe(tie):
    overrides = [
        "parallel.tp=1", "parallel.pp=2", "parallel.dp=1", "parallel.ep=1",
        "parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2",
        "model.layers=8", "model.moe.every=2", "training.global_batch=4",
        "cluster.nodes=1", "cluster.gpus_per_node=2", "cluster.nic.per_node=2",
        f"model.tie_embeddings={tie}",
    ]  # fmt: skip
    scenario = load_scenario(SCENARIOS / "mixtral-ep.yaml", overrides)
    held = [
        pipeline_rank_parameters(scenario.recipe, scenario.model, scenario.moe, rank)
        for rank in range(2)
    ]
    total = parameter_count(scenario.model, scenario.moe)
    copy = scenario.model.vocab * scenario.model.hidden if tie == "true" else 0
    assert sum(held) == total + copy  # the last stage's copy of the tied embedding
    # rank 0 holds stages 0 and 2 (layers 0-1, 4-5), rank 1 stages 1 and 3
    assert scenario.recipe.rank_layers(0) == [0, 1, 4, 5]
    assert scenario.recipe.rank_layers(1) == [2, 3, 6, 7]


@pytest.mark.parametrize(
    "split,message",
    [
        ("[4, 4]", r"parallel.stage_layers: 2 entries, but pp\(4\)"),
        ("[5, 6, 6, 6]", r"sums to 23, not layers\(24\)"),
        ("[8, 0, 8, 8]", r"stage 1 holds no layer; only the first stage \(the embedding\)"),
        ("[-2, 10, 8, 8]", r"a stage holds -2 layers"),
    ],
)
def test_bad_stage_layers_are_refused(split, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(PIPE, [*FOUR, f"parallel.stage_layers={split}"])


@pytest.mark.parametrize("split", [[0, 8, 8, 8], [8, 8, 8, 0]])
def test_an_end_stage_may_hold_only_the_embedding_or_the_loss(split):
    """Megatron-Core's pipeline layouts (``Et|(tt|)*30L``) give the last stage the loss
    alone, or the first the embedding alone: that stage computes its part only."""
    scenario = load_scenario(
        PIPE, [*FOUR, f"parallel.stage_layers={split}", "simulation.fold=false"]
    )
    schedule = build_schedule(scenario)
    empty = split.index(0)
    rank = scenario.layout.rank_of(pp=empty)
    assert layers_run(schedule, rank) == set()
    labels = {op.label.split(".")[0] for op in schedule.programs[rank].ops if type(op) is Compute}
    head = {"embedding"} if empty == 0 else {"final_ln", "logits", "loss"}
    assert labels == {*head, "optimizer"}
    result = run_scenario(scenario).result
    even = run_scenario(load_scenario(PIPE, [*FOUR, "simulation.fold=false"])).result
    # a stage with nothing to do is a pipeline stage's worth of bubble on the others
    assert result.step_time_s > even.step_time_s


def test_uneven_layers_without_a_split_are_split_as_sweep_splits_them():
    """126 layers on 16 stages (Llama 3 405B) run as sweep would split them, the heavier
    stages in the middle, and the result says how; a split given still wins."""
    from simulator.tools import space

    assert space.balanced_stages is balanced_stages  # one rule for run and sweep
    scenario = load_scenario(SCENARIOS / "llama3-405b.yaml", ["parallel.stage_layers=null"])
    assert scenario.recipe.stage_layers == (7, *[8] * 14, 7)
    assert any("126 layers do not divide over pp(16) stages; split 7/8×14/7" in w
               for w in scenario.warnings)  # fmt: skip
    uneven = load_scenario(PIPE, [*FOUR, "model.layers=30"])
    assert uneven.recipe.stage_layers == balanced_stages(30, 4) == (7, 8, 8, 7)
    assert all(type(op) is not Compute or op.flops >= 0 for op in build_schedule(
        uneven
    ).programs[0].ops)  # fmt: skip
    given = load_scenario(PIPE, [*FOUR, "model.layers=30", "parallel.stage_layers=[8, 7, 7, 8]"])
    assert given.recipe.stage_layers == (8, 7, 7, 8)
    assert not any("do not divide" in w for w in given.warnings)
    even = load_scenario(PIPE, FOUR)
    assert not any("do not divide" in w for w in even.warnings)


def test_uneven_layers_split_over_virtual_stages():
    overrides = [*FOUR, "model.layers=30", "parallel.schedule=interleaved-1f1b"]
    scenario = load_scenario(PIPE, [*overrides, "parallel.virtual_stages=2"])
    assert scenario.recipe.stage_layers == balanced_stages(30, 8) == (3, 4, 4, 4, 4, 4, 4, 3)
    assert any("pp(4) * virtual_stages(2) = 8 stages" in w for w in scenario.warnings)


def test_too_few_layers_for_an_uneven_split_are_refused():
    """As sweep never splits unevenly below two layers a stage, run refuses to."""
    with pytest.raises(
        ScenarioError, match=r"layers\(7\) do not divide over pp\(4\) stages.*at least 2"
    ):
        load_scenario(PIPE, [*FOUR, "model.layers=7"])
    assert load_scenario(PIPE, [*FOUR, "model.layers=4"]).recipe.stage_layers == (1, 1, 1, 1)
