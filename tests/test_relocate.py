"""A search lowers a grid once and relocates its programs onto the grid's other
placements (:mod:`simulator.schedule.relocate`): the schedule must be the one lowering
that placement anew gives, op by op, and so must its numbers."""

from __future__ import annotations

import pytest

from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule import relocate
from simulator.schedule.ir import Block, Collective, Compute, Recv, Send

from .helpers import same_numbers
from .test_shared_bodies import BASE  # 4 stages of 6 layers, tp 4, dp 2, on 4 nodes

PLACEMENTS = ["[tp,dp,pp]", "[tp,pp,dp]", "[dp,tp,pp]", "[pp,dp,tp]"]
RECIPES = [
    [],
    ["parallel.schedule=zb-h1"],  # I and W bodies, deferred weight gradients
    ["parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2", "parallel.sp=true"],
    ["training.sharding=full", "training.recompute=selective"],
    ["training.sharding=full", "parallel.dp_shard=2", "parallel.dp=4", "parallel.pp=2"],  # HSDP
    ["parallel.stage_layers=[5,7,7,5]"],
]


def _schedule(overrides: list[str]):
    scenario = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, *overrides])
    return scenario, build_schedule(scenario, numbers_only=True)


def _computes(schedule) -> list[int]:
    """The identity of every compute op, block bodies included, in program order."""
    found = []
    for _, program in sorted(schedule.programs.items()):  # by rank: by stage too
        for op in program.ops:
            for o in op.body if type(op) is Block else (op,):
                if type(o) is Compute:
                    found.append(id(o))
    return found


def _same(relocated, fresh) -> None:
    assert relocated.programs.keys() == fresh.programs.keys()
    for rank, program in fresh.programs.items():
        assert relocated.programs[rank].ops == program.ops, f"rank {rank}"
    assert relocated.groups == fresh.groups
    assert relocated.images == fresh.images
    assert relocated.rank_images == fresh.rank_images
    assert relocated.meta == fresh.meta
    # each body template pairs a body with the one it was retargeted from, as lowering does
    pairs = sorted((len(a), len(b)) for a, b in relocated.body_templates.values())
    assert pairs == sorted((len(a), len(b)) for a, b in fresh.body_templates.values())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: " ".join(r) or "1f1b")
def test_a_relocated_grid_is_the_grid_lowered_anew(recipe):
    relocate.forget()
    _, first = _schedule([*recipe, f"parallel.placement={PLACEMENTS[0]}"])  # lowered, kept
    for placement in PLACEMENTS[1:]:
        overrides = [*recipe, f"parallel.placement={placement}"]
        _, relocated = _schedule(overrides)
        # relocated, not lowered: the first placement's compute ops, shared
        assert _computes(relocated) == _computes(first)
        relocate.forget()
        _, fresh = _schedule(overrides)
        _same(relocated, fresh)
        # the relocated programs talk to this placement's groups and neighbours
        layout = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, *overrides]).layout
        for rank, program in relocated.programs.items():
            for op in program.ops:
                inner = op.body if type(op) is Block else (op,)
                for o in inner:
                    if type(o) is Collective:
                        assert rank in layout.members(o.group)
                    elif type(o) in (Send, Recv):
                        assert o.peer in layout.stage_ranks(o.peer)
                        assert layout.coords(o.peer)["tp"] == layout.coords(rank)["tp"]
        relocate.forget()
        _, first = _schedule([*recipe, f"parallel.placement={PLACEMENTS[0]}"])


def test_a_relocated_grid_gives_the_numbers_of_a_plain_run():
    relocate.forget()
    run_scenario(load_scenario("scenarios/pipeline-demo.yaml", BASE), numbers_only=True)
    for placement in PLACEMENTS[1:]:
        scenario = load_scenario(
            "scenarios/pipeline-demo.yaml", [*BASE, f"parallel.placement={placement}"]
        )
        relocated = run_scenario(scenario, numbers_only=True)
        plain = run_scenario(scenario)
        assert same_numbers(relocated.result.to_json(), plain.result.to_json()) == []


def test_only_a_search_keeps_what_it_lowered_and_only_the_last_grids():
    relocate.forget()
    scenario = load_scenario("scenarios/pipeline-demo.yaml", BASE)
    build_schedule(scenario)  # a run's schedule: nothing kept
    assert relocate.known_templates_count() == 0
    for layers in range(relocate.KEPT + 2):
        stages = f"parallel.stage_layers=[{5 + layers},{7 - layers},7,5]"
        build_schedule(
            load_scenario("scenarios/pipeline-demo.yaml", [*BASE, stages]), numbers_only=True
        )
    assert relocate.known_templates_count() == relocate.KEPT
