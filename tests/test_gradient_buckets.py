"""Every parameter a rank holds has its gradient reduced exactly once, whatever the
pipeline schedule, block and expert layout."""

from __future__ import annotations

import pytest

from simulator.arithmetic.counts import pipeline_rank_parameters
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule
from simulator.schedule.ir import Collective

from .conftest import SCENARIOS

CASES = [
    ("gpt3-175b-zb.yaml", ["simulation.fold=true"]),
    ("gpt3-175b-interleaved.yaml", ["simulation.fold=true"]),
    (
        "pipeline-demo.yaml",
        ["parallel.schedule=zb-h2", "parallel.tp=4", "parallel.dp=2", "training.global_batch=16"],
    ),
    ("llama3-8b.yaml", []),
    ("small.yaml", ["training.grad_reduce_dtype=bf16"]),
]


@pytest.mark.parametrize("name,overrides", CASES)
def test_bucket_bytes_equal_the_parameters_a_rank_holds(name, overrides):
    scenario = load_scenario(SCENARIOS / name, overrides)
    if scenario.layout.dp == 1:
        pytest.skip("no data parallelism")
    schedule = build_schedule(scenario)
    layout = scenario.layout
    for rank, program in schedule.programs.items():
        reduced = sum(
            op.bytes
            for op in program.ops
            if type(op) is Collective and op.stream == "dp" and op.label.startswith("dp.bucket")
        )
        held = pipeline_rank_parameters(
            scenario.recipe, scenario.model, scenario.moe, layout.coords(rank)["pp"]
        )
        assert reduced == pytest.approx(held * scenario.recipe.grad_bytes, rel=1e-12), rank


def test_swiglu_experts_run_as_swiglu_and_reduce_every_expert_gradient():
    overrides = [
        "model.preset=mixtral-8x7b", "model.layers=2", "model.hidden=512", "model.heads=8",
        "model.kv_heads=2", "model.ffn_hidden=1024", "model.seq_len=256", "model.vocab=1024",
        "parallel.ep=1", "parallel.tp=2", "parallel.dp=8", "training.global_batch=8",
    ]  # fmt: skip
    scenario = load_scenario(SCENARIOS / "mixtral-ep.yaml", overrides)
    schedule = build_schedule(scenario)
    ops = schedule.programs[0].ops
    labels = {op.label for op in ops}
    assert any(".expert_swiglu." in label for label in labels)
    assert not any(".expert_gelu." in label for label in labels)
    fc1 = next(op for op in ops if ".expert_fc1.fwd" in op.label)
    assert fc1.shape[1] == 2 * 1024 // 2  # gate and up, split over tp 2
    edp = sum(op.bytes for op in ops if type(op) is Collective and op.stream == "dp")
    assert edp == pytest.approx(
        pipeline_rank_parameters(scenario.recipe, scenario.model, scenario.moe, 0)
        * scenario.recipe.grad_bytes
    )
