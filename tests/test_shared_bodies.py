"""A search's runs (``run_scenario(..., numbers_only=True)``) lower each block body
once for every pipeline stage of its shape and run it on each stage's own groups, and
write a stage's last backward in blocks of layers: the result must be the plain run's,
number for number (to float rounding)."""

from __future__ import annotations

import pytest

from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.schedule.ir import Block, Compute

from .helpers import same_numbers

# 4 stages of 6 layers, 2-way data parallelism across the two nodes' halves
BASE = [
    "cluster.nodes=4",
    "model.layers=24",
    "parallel.tp=4",
    "parallel.pp=4",
    "parallel.dp=2",
    "training.global_batch=16",
    "simulation.fidelity=analytic",  # blocks: a folded analytic step, as a search runs
]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["parallel.schedule=gpipe", "training.recompute=full"],
        ["parallel.schedule=zb-h1"],  # split backward: I and W bodies, deferred gradients
        ["parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2"],
        ["training.sharding=full", "training.recompute=selective"],  # per-layer gathers
        ["parallel.placement=[dp,tp,pp]", "parallel.sp=true"],  # TP groups across nodes
        ["parallel.stage_layers=[5,7,7,5]"],  # stages of two shapes and two ends
        # 6 stages, TP pairs (p, p+6): those of stages 0 and 1 stay in a node of 8, those
        # of the later stages cross one; a middle stage's body must not carry another's
        # groups
        [
            "cluster.nodes=3",
            "parallel.tp=2",
            "parallel.pp=6",
            "parallel.dp=2",
            "parallel.placement=[pp,tp,dp]",
        ],
    ],
)
def test_shared_bodies_give_the_plain_run_s_numbers(overrides):
    scenario = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, *overrides])
    plain = run_scenario(scenario).result.to_json()
    shared = run_scenario(scenario, numbers_only=True)
    assert same_numbers(shared.result.to_json(), plain) == []
    if scenario.layout.pp > 2:  # the middle stages did share: one lowering, several runs
        bodies = [  # a body by its first compute op, which the stages share
            {
                id(next(o for o in op.body if type(o) is Compute))
                for op in program.ops
                if type(op) is Block
            }
            for program in shared.schedule.programs.values()
        ]
        assert len(set.union(*bodies)) < sum(len(b) for b in bodies)
        # and the engine was told which body each one came from, to time it once
        assert shared.schedule.body_templates
