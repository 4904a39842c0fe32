"""The routed experts belong to their expert-data-parallel group (``dp / ep`` ranks)
under a sharded optimizer, as Megatron-Core's distributed optimizer keeps them: their
optimizer state and the optimizer's work shard over ``edp``, and their updated weights
are all-gathered there, while the rest of the model shards and gathers over ``dp``."""

from __future__ import annotations

import pytest

from simulator.analysis.memory import memory_per_rank
from simulator.arithmetic.counts import pipeline_rank_parameters
from simulator.arithmetic.layer_ops import ACT_BYTES
from simulator.request.scenario import scenario_from_dict
from simulator.run.simulate import per_rank_schedule
from simulator.schedule.sharding_units import rank_expert_parameters


def _scenario(ep: int, sharding: str = "optimizer", overlap: bool = False):
    return scenario_from_dict(
        {
            "name": "edp",
            "cluster": {"preset": "dgx-h100", "nodes": 1},
            "model": {
                "layers": 4,
                "hidden": 1024,
                "heads": 8,
                "seq_len": 1024,
                "vocab": 32000,
                "mlp": "swiglu",
                "norm": "rmsnorm",
                "position": "rope",
                "bias": False,
                "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 512},
            },
            "training": {
                "global_batch": 8,
                "micro_batch": 1,
                "sharding": sharding,
                "param_gather_overlap": overlap,
            },
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": ep},
            "simulation": {"fidelity": "analytic"},
        },
        source="test",
    )


def _shares(scenario):
    recipe, model, moe = scenario.recipe, scenario.model, scenario.moe
    params = pipeline_rank_parameters(recipe, model, moe, 0)
    experts = rank_expert_parameters(recipe, model, moe, 0)
    return params, experts


@pytest.mark.parametrize("overlap", [False, True])
def test_expert_weights_are_gathered_over_edp_and_the_rest_over_dp(overlap):
    scenario = _scenario(ep=4, overlap=overlap)
    params, experts = _shares(scenario)
    assert 0 < experts < params
    ops = per_rank_schedule(scenario).programs[0].ops
    gathers = {op.label: op for op in ops if op.type == "collective" and "param_all" in op.label}
    dense, expert = gathers["dp.param_all_gather"], gathers["edp.param_all_gather"]
    assert dense.group.startswith("dp") and expert.group.startswith("edp")
    assert dense.bytes == pytest.approx((params - experts) * ACT_BYTES)
    assert expert.bytes == pytest.approx(experts * ACT_BYTES)


def test_the_optimizer_steps_its_experts_shard_of_edp():
    scenario = _scenario(ep=4)
    recipe = scenario.recipe
    params, experts = _shares(scenario)
    ops = per_rank_schedule(scenario).programs[0].ops
    (step,) = [op for op in ops if op.label == "optimizer.step"]
    # dp 8, ep 4: the experts' state over 2 ranks, the rest over 8
    local = (params - experts) / 8 + experts / 2
    per_param = recipe.optimizer_step_bytes + 2 * recipe.grad_bytes
    assert step.bytes == pytest.approx(per_param * local)
    assert step.bytes > 1.5 * per_param * params / 8  # what sharding all over dp gave


@pytest.mark.parametrize("sharding", ["optimizer", "gradients", "full"])
def test_memory_shards_the_experts_state_over_edp(sharding):
    scenario = _scenario(ep=4, sharding=sharding)
    recipe, model, moe = scenario.recipe, scenario.model, scenario.moe
    params, experts = _shares(scenario)
    capacity = scenario.cluster_spec.gpu.hbm_capacity
    terms = memory_per_rank(recipe, model, moe, capacity).per_stage[0].terms_bytes
    state = recipe.optimizer_state_bytes
    assert terms["optimizer_state"] == pytest.approx(((params - experts) / 8 + experts / 2) * state)
