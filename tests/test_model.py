"""Model math: parameter counts and Megatron's FLOPs formula from the per-op sums."""

from __future__ import annotations

import pytest

from simulator.model import (
    MODEL_PRESETS,
    ModelSpec,
    activation_bytes_per_layer,
    backward_of,
    layer_forward_ops,
    megatron_model_flops,
    model_flops_per_step,
    parameter_count,
)


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("global_batch", [1, 64, 1536])
def test_model_flops_equal_megatron_formula(name, global_batch):
    model = ModelSpec(**MODEL_PRESETS[name])
    assert model.ffn == 4 * model.hidden
    assert model_flops_per_step(model, global_batch) == pytest.approx(
        megatron_model_flops(model, global_batch), rel=1e-12
    )


def test_gpt3_175b_has_175b_parameters():
    model = ModelSpec(**MODEL_PRESETS["gpt3-175b"])
    assert parameter_count(model) == pytest.approx(175e9, rel=0.01)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_splits_matmul_flops(tp):
    model = ModelSpec(**MODEL_PRESETS["gpt3-13b"])
    whole = sum(op.model_flops for op in layer_forward_ops(model, 2, 1))
    shard = sum(op.model_flops for op in layer_forward_ops(model, 2, tp))
    assert shard * tp == pytest.approx(whole, rel=1e-12)


def test_backward_is_twice_forward_in_model_flops():
    model = ModelSpec(**MODEL_PRESETS["gpt3-6.7b"])
    for op in layer_forward_ops(model, 1, 2):
        assert sum(b.model_flops for b in backward_of(op)) == pytest.approx(2 * op.model_flops)


def test_activation_memory_formulas_limiting_cases():
    model = ModelSpec(**MODEL_PRESETS["gpt3-175b"])
    s, b, h, a = model.seq_len, 1, model.hidden, model.heads
    sbh = s * b * h
    assert activation_bytes_per_layer(model, b, 1) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(model, b, 8) == pytest.approx(
        sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    )
    assert activation_bytes_per_layer(model, b, 8, sp=True) == pytest.approx(
        sbh / 8 * (34 + 5 * a * s / h)
    )
    assert activation_bytes_per_layer(model, b, 8, recompute="full") == pytest.approx(2 * sbh)


def test_hidden_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match=r"hidden\(100\).*heads\(3\)"):
        ModelSpec(layers=2, hidden=100, heads=3, seq_len=8, vocab=16)
