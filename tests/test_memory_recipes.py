"""What a recipe keeps in memory besides its layout: a fraction of the layers recomputed
(``training.recompute_fraction``), the optimizer's precision (``optimizer_dtype``,
``master_weights``) and FP8 primary weights under a sharded optimizer
(``fp8_all_gather``), each in the memory estimate and in the step's ops."""

from __future__ import annotations

import pytest

from simulator.analysis.memory import layer_activation_bytes, memory_per_rank
from simulator.arithmetic.counts import layer_fp8_parameters, pipeline_rank_parameters
from simulator.common.errors import ScenarioError
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule
from simulator.schedule.context import StepConfig
from simulator.schedule.ir import Collective, Compute
from simulator.tools.sweep import Candidate

from .conftest import SCENARIOS

SMALL = SCENARIOS / "small.yaml"


def _terms(scenario) -> dict[str, float]:
    memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, 80e9)
    return memory.per_stage[0].terms_bytes


def _recomputed_layers(scenario) -> set[int]:
    ops = per_rank_schedule(scenario).programs[0].ops
    recomputed = (op for op in ops if type(op) is Compute and op.tags.get("phase") == "recompute")
    return {op.tags["layer"] for op in recomputed}


def test_a_fraction_recomputes_evenly_spaced_layers_as_fms_fsdp_picks_them():
    scenario = load_scenario(SMALL)
    layers = scenario.recipe.layers
    for fraction in (0.25, 0.5, 0.75):
        recipe = scenario.recipe.with_(recompute="full", recompute_fraction=fraction)
        chosen = [layer for layer in range(layers) if recipe.recomputes(layer)]
        assert len(chosen) == round(fraction * layers)
        # fms_fsdp/policies/ac_handler.py: the i-th block (from 1) when i·p crosses the
        # next half
        block, cut_off, expected = 0, 0.5, []
        for layer in range(layers):
            block += 1
            if block * fraction >= cut_off:
                cut_off += 1
                expected.append(layer)
        assert chosen == expected
    assert not scenario.recipe.with_(recompute="selective").recomputes(0)


def test_recompute_fraction_sits_between_none_and_full_in_memory_and_in_the_step():
    overrides = ["training.global_batch=16", "training.micro_batch=4"]
    none = load_scenario(SMALL, [*overrides, "training.recompute=none"])
    full = load_scenario(SMALL, [*overrides, "training.recompute=full"])
    half = load_scenario(
        SMALL, [*overrides, "training.recompute=full", "training.recompute_fraction=0.5"]
    )
    layers = half.recipe.layers
    # the step reruns the forward of exactly the layers the recipe names
    assert _recomputed_layers(full) == set(range(layers))
    assert _recomputed_layers(half) == {i for i in range(layers) if half.recipe.recomputes(i)}
    assert _recomputed_layers(none) == set()
    activations = {
        name: _terms(s)["activations"]
        for name, s in (("none", none), ("half", half), ("full", full))
    }
    assert activations["full"] < activations["half"] < activations["none"]
    # each recomputed layer gives up the same bytes, and while one of them runs its
    # backward it holds its whole activations again (one layer, one micro-batch)
    rerun = layer_activation_bytes(StepConfig(half.recipe, half.model, half.moe), 0, "none")
    saving_full = activations["none"] - activations["full"] + rerun
    saving_half = activations["none"] - activations["half"] + rerun
    share = len(_recomputed_layers(half)) / layers
    assert saving_half == pytest.approx(share * saving_full)


def test_recompute_fraction_is_refused_without_full_recompute():
    with pytest.raises(ScenarioError, match=r"training.recompute_fraction: 0.5 .*recompute: full"):
        load_scenario(SMALL, ["training.recompute=selective", "training.recompute_fraction=0.5"])
    with pytest.raises(ScenarioError, match="training.recompute_fraction"):
        load_scenario(SMALL, ["training.recompute=full", "training.recompute_fraction=1.5"])


@pytest.mark.parametrize(
    ("dtype", "master", "state", "step"),
    [("fp32", True, 12, 26), ("bf16", True, 8, 18), ("bf16", False, 4, 12)],
)
def test_optimizer_precision_sets_its_state_and_its_step(dtype, master, state, step):
    """fp32 moments and master weights (mixed precision), bf16 moments beside fp32 master
    weights (Megatron-Core's precision-aware optimizer), pure bf16 (torchtune)."""
    overrides = [f"training.optimizer_dtype={dtype}", f"training.master_weights={master}"]
    scenario = load_scenario(SMALL, overrides)
    params = pipeline_rank_parameters(scenario.recipe, scenario.model, scenario.moe, 0)
    assert _terms(scenario)["optimizer_state"] == pytest.approx(state * params)
    ops = per_rank_schedule(scenario).programs[0].ops
    (optimizer,) = [op for op in ops if type(op) is Compute and op.label == "optimizer.step"]
    grad_bytes = scenario.recipe.grad_bytes
    assert optimizer.bytes == pytest.approx((step + 2 * grad_bytes) * params)


def test_fp8_primary_weights_under_a_sharded_optimizer_halve_what_the_fp8_layers_gather():
    overrides = ["training.dtype=fp8", "training.sharding=optimizer"]
    cluster = ["cluster.preset=dgx-h100"]
    plain = load_scenario(SMALL, [*cluster, *overrides])
    primary = load_scenario(SMALL, [*cluster, *overrides, "training.fp8_all_gather=true"])
    recipe, model = plain.recipe, plain.model
    params = pipeline_rank_parameters(recipe, model, plain.moe, 0)
    fp8 = sum(layer_fp8_parameters(recipe, model, plain.moe, i) for i in recipe.rank_layers(0))
    assert 0 < fp8 < params

    def gathered(scenario) -> float:
        ops = per_rank_schedule(scenario).programs[0].ops
        return sum(
            op.bytes for op in ops if type(op) is Collective and "param_all_gather" in op.label
        )

    assert gathered(plain) == pytest.approx(2 * params)
    assert gathered(primary) == pytest.approx(2 * params - fp8)
    # no bf16 copy beside the FP8 weight and its transpose: 2 bytes per FP8 parameter less
    saved = _terms(plain)["weights"] - _terms(primary)["weights"]
    assert saved == pytest.approx(2 * fp8)
    with pytest.raises(ScenarioError, match="training.fp8_all_gather"):
        load_scenario(SMALL, [*cluster, "training.dtype=fp8", "training.fp8_all_gather=true"])


def test_a_sweep_tries_lighter_recompute_beside_a_fraction_of_full():
    """A scenario's ``recompute_fraction`` is a share of the fully recomputed layers: a
    sweep candidate with a lighter recompute drops it instead of being refused."""
    base = ["training.recompute=full", "training.recompute_fraction=0.5"]
    scenario = load_scenario(SMALL, base)
    knobs = {**scenario.recipe.knobs(), "placement": tuple(scenario.layout.placement)}
    for recompute in ("none", "selective", "full"):
        candidate = Candidate.from_knobs({**knobs, "recompute": recompute})
        recipe = load_scenario(SMALL, [*base, *candidate.overrides()]).recipe
        assert recipe.recompute == recompute
        assert recipe.recompute_fraction == (0.5 if recompute == "full" else 1.0)


@pytest.mark.parametrize(
    "framework, cross_entropy, per_logit",
    [
        ("megatron", "auto", 2.0),  # the vocabulary-parallel loss: bf16 logits beside it
        ("torchtitan", "auto", 8.0),  # eager F.cross_entropy: two fp32 gradients at once
        ("torchtitan", "fused", 2.0),
        ("torchtitan", "fused-fp32", 6.0),  # torchtune: fp32 logits, compiled loss
        ("fsdp1", "te", 2.0),
    ],
)
def test_the_loss_holds_its_working_buffers_on_the_last_stage_only(
    framework, cross_entropy, per_logit
):
    overrides = [
        f"training.framework={framework}",
        f"training.cross_entropy={cross_entropy}",
        "parallel.tp=1",
        "parallel.pp=2",
        "parallel.dp=4",
        "training.global_batch=32",
    ]
    scenario = load_scenario(SMALL, overrides)
    memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, 80e9)
    first, last = memory.per_stage
    model, b = scenario.model, scenario.recipe.micro_batch
    assert first.terms_bytes["transient"] == 0.0
    assert last.terms_bytes["transient"] == pytest.approx(
        b * model.seq_len * model.vocab * per_logit
    )
    assert last.total_bytes == pytest.approx(sum(last.terms_bytes.values()))


def test_one_gpu_without_accumulation_holds_no_gradient_at_the_loss():
    """torch's ``zero_grad`` frees the gradients; on one GPU with one micro-batch a step
    makes them as its backward frees the activations, so the peak is the larger moment."""
    one_gpu = [
        "parallel.tp=1",
        "parallel.dp=1",
        "training.global_batch=4",
        "training.micro_batch=4",
        "cluster.gpus_per_node=1",
        "cluster.nic.per_node=1",
    ]
    eager = _terms(load_scenario(SMALL, [*one_gpu, "training.framework=torchtitan"]))
    assert eager["gradients"] == 0.0 and eager["activations"] > 0.0
    megatron = _terms(load_scenario(SMALL, one_gpu))  # its gradient buffer stays
    assert megatron["gradients"] > 0.0
    accumulating = _terms(
        load_scenario(SMALL, [*one_gpu, "training.framework=torchtitan", "training.micro_batch=2"])
    )
    assert accumulating["gradients"] > 0.0
    # with almost no activations the step's end, all gradients made, is the peak
    tiny = _terms(
        load_scenario(
            SMALL,
            [
                *one_gpu,
                "training.framework=torchtitan",
                "training.global_batch=1",
                "training.micro_batch=1",
                "model.seq_len=8",
            ],
        )
    )
    assert tiny["gradients"] > 0.0 and tiny["activations"] == tiny["transient"] == 0.0
