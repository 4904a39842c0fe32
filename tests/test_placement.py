"""Where a pipeline's stages live: one Placement, as torch.distributed.pipelining places
them, asked by every module that needs a stage's rank."""

from __future__ import annotations

import re

import pytest

from simulator.arithmetic.counts import pipeline_rank_parameters
from simulator.arithmetic.layer_ops import logits_forward_op
from simulator.common.errors import ScenarioError
from simulator.request.placement import Placement, placement_style
from simulator.request.scenario import load_scenario
from simulator.schedule.actions import with_communication
from simulator.schedule.pipeline import zbv_order

from .conftest import ROOT, SCENARIOS

PIPELINE = SCENARIOS / "pipeline-demo.yaml"


@pytest.mark.parametrize("style", ["loop", "v"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_placement_is_torch_s(style, ranks, chunks):
    utils = pytest.importorskip("torch.distributed.pipelining._utils")
    placement = Placement(ranks, chunks, style)
    theirs = utils.generate_stage_to_rank_mapping(ranks, ranks * chunks, style=style)
    assert {s: placement.rank_of(s) for s in range(placement.stages)} == theirs
    for rank in range(ranks):
        stages = placement.stages_of(rank)
        assert [placement.rank_of(s) for s in stages] == [rank] * chunks
        assert [placement.chunk_of(s) for s in stages] == list(range(chunks))


def test_a_v_turns_on_one_rank_and_ends_where_it_began():
    placement = Placement(4, 2, "v")
    assert placement.stages_of(0) == (0, 7) and placement.stages_of(3) == (3, 4)
    assert placement.same_rank(3, 4) and not placement.same_rank(2, 3)
    # the turn's hand-over is the rank's own: no send or receive between stages 3 and 4
    lowered = [str(a) for a in with_communication(zbv_order(4, 8)[3], placement)]
    assert "3SEND_F0" not in lowered and "4RECV_F0" not in lowered
    assert "4SEND_F0" in lowered and "3RECV_F0" in lowered
    assert placement_style("zbv") == "v" and placement_style("interleaved-1f1b") == "loop"


def test_placement_refuses_what_is_not_a_placement():
    with pytest.raises(ValueError, match="style 'w'"):
        Placement(2, 2, "w")
    with pytest.raises(ValueError, match="ranks and chunks"):
        Placement(0, 2)


def test_zbv_puts_the_embedding_and_the_output_layer_on_rank_0():
    overrides = ["parallel.schedule=zbv", "parallel.virtual_stages=2", "model.tie_embeddings=false"]
    scenario = load_scenario(PIPELINE, overrides)
    recipe, model, moe = scenario.recipe, scenario.model, scenario.moe
    assert recipe.placement.stages_of(0) == (0, recipe.stages - 1)
    first, last = (
        pipeline_rank_parameters(recipe, model, moe, r) for r in (0, recipe.layout.pp - 1)
    )
    # rank 0 holds the embedding and the output layer beside its layers: the most
    assert first > last
    tied = load_scenario(PIPELINE, [*overrides[:2], "model.tie_embeddings=true"])
    # tied, the output layer is the embedding rank 0 already holds: counted once
    output = logits_forward_op(model, 1, recipe.layout.tp).weight_params
    assert pipeline_rank_parameters(tied.recipe, tied.model, None, 0) == first - output


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["parallel.schedule=zbv"],
            "zbv places 2 model chunks on each pipeline rank; set virtual_stages: 2",
        ),
        (
            ["parallel.schedule=zbv", "parallel.virtual_stages=3"],
            "set virtual_stages: 2 \\(got 3\\)",
        ),
    ],
)
def test_zbv_asks_for_its_two_chunks(overrides, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(PIPELINE, overrides)


def test_no_module_places_stages_by_hand():
    """``stage % p`` and ``stage // p`` live in the placement alone: a module that needs
    a stage's rank or chunk asks :class:`Placement` (a V-shaped schedule would otherwise
    run on the wrong ranks there)."""
    by_hand = re.compile(r"\b(action\.)?stage\)?\s*(%|//)\s*\w")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("simulator", "hardware")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "placement.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line.split("#")[0]) and "``" not in line
    ]
    assert not offenders, "\n".join(offenders)
