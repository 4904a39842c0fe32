"""FP8 training (``training.dtype: fp8``): the linear layers' GEMMs on FP8 tensor cores,
their casts, the FP8 weight copies, and FP8 all-gathers under FSDP."""

from __future__ import annotations

import pytest

from simulator.arithmetic.counts import layer_fp8_parameters, unit_parameters
from simulator.arithmetic.layer_ops import FP8_GEMMS, layer_forward_ops
from simulator.common.errors import ScenarioError
from simulator.engine.compute import ComputeModel
from simulator.engine.gemm import gemm_efficiency
from simulator.request.recipe import Recipe
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario
from simulator.schedule.ir import Collective

from .conftest import SCENARIOS

LLAMA = SCENARIOS / "llama3-8b.yaml"


def test_an_fp8_gemm_runs_at_the_fp8_peak_and_saves_its_input_in_fp8():
    scenario = load_scenario(LLAMA)
    model = scenario.model
    bf16 = {op.name: op for op in layer_forward_ops(model, 1, 2, True)}
    fp8 = {op.name: op for op in layer_forward_ops(model, 1, 2, True, fp8=True)}
    compute = ComputeModel(scenario.cluster_spec)
    for name in ("qkv", "proj", "fc1", "fc2"):
        assert fp8[name].fp8 and not bf16[name].fp8
        assert fp8[name].saved_bytes == bf16[name].saved_bytes / 2
        assert f"{name}.cast" in fp8  # its input cast to FP8 (and the gradient's, backward)
        ratio = compute.compute_seconds(fp8[name]) / compute.compute_seconds(bf16[name])
        # at the FP8 peak, at the share of bf16's efficiency FP8's microbenchmark reaches,
        # and with an FP8 tile's prologue twice as deep in k as a BF16 tile's
        gpu = scenario.cluster_spec.gpu
        share = gpu.fp8_matmul_efficiency / gpu.matmul_efficiency
        m, n, k = fp8[name].shape
        tiles = {"base": 1.0, "sm_count": gpu.sm_count, "largest_tile": gpu.gemm_tile}
        deeper = gemm_efficiency(m, n, k, k_overhead=512, **tiles) / gemm_efficiency(
            m, n, k, **tiles
        )
        assert 0.85 < deeper < 1
        assert ratio == pytest.approx(989.4 / 1978.9 / share / deeper)
    assert not fp8["attn_core"].fp8  # attention stays in bf16
    assert set(FP8_GEMMS) >= {"qkv", "proj", "fc1", "fc2"}


def test_fp8_speeds_the_step_up_and_trades_weight_copies_for_activations():
    bf16 = run_scenario(load_scenario(LLAMA)).result
    scenario = load_scenario(LLAMA, ["training.dtype=fp8"])
    fp8 = run_scenario(scenario).result
    assert fp8.step_time_s < 0.85 * bf16.step_time_s
    assert fp8.model_flops_per_step == bf16.model_flops_per_step
    before, after = bf16.memory.per_stage[0].terms_bytes, fp8.memory.per_stage[0].terms_bytes
    assert after["activations"] < before["activations"]
    recipe, model = scenario.recipe, scenario.model
    layers = recipe.rank_layers(0)
    copies = sum(layer_fp8_parameters(recipe, model, None, layer) for layer in layers)
    assert after["weights"] == pytest.approx(before["weights"] + 2 * copies)
    assert Recipe.parse(str(recipe)) == recipe and "dtype=fp8" in str(recipe)


def test_fp8_all_gathers_halve_the_fp8_layers_gathered_bytes():
    full = ["training.optimizer_sharding=false", "training.sharding=full", "training.dtype=fp8"]
    plain = load_scenario(LLAMA, full)
    halved = load_scenario(LLAMA, [*full, "training.fp8_all_gather=true"])

    def gathered(scenario):
        ops = per_rank_schedule(scenario).programs[0].ops
        return sum(op.bytes for op in ops if type(op) is Collective and op.kind == "all_gather")

    recipe, model = plain.recipe, plain.model
    per_step = (
        sum(
            2 * layer_fp8_parameters(recipe, model, None, layer)  # forward and backward gather
            for layer in range(model.layers)
        )
        * recipe.microbatches
    )
    assert gathered(plain) - gathered(halved) == pytest.approx(per_step)
    assert unit_parameters(recipe, model, None, 3) > layer_fp8_parameters(recipe, model, None, 3)


def test_fp8_needs_fp8_tensor_cores_and_fp8_all_gather_needs_both():
    with pytest.raises(ScenarioError, match="training.dtype: fp8 needs FP8 tensor cores"):
        load_scenario(SCENARIOS / "small.yaml", ["training.dtype=fp8"])
    with pytest.raises(ScenarioError, match="training.fp8_all_gather"):
        load_scenario(LLAMA, ["training.fp8_all_gather=true"])


def test_an_fp8_mixture_of_experts_runs_its_experts_in_fp8():
    scenario = load_scenario(
        SCENARIOS / "mixtral-ep.yaml", ["training.dtype=fp8", "simulation.fidelity=analytic"]
    )
    ops = per_rank_schedule(scenario).programs[0].ops
    experts = [op for op in ops if op.type == "compute" and "expert_fc1" in op.label]
    assert experts and all(op.fp8 for op in experts if ".cast" not in op.label)
    assert run_scenario(scenario).result.step_time_s > 0
