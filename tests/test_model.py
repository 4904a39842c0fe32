"""Model math: parameter counts against published totals, FLOPs against closed forms,
activation memory against Korthikanti et al.'s formulas, all from the per-op sums."""

from __future__ import annotations

import itertools

import pytest

from simulator.arithmetic.closed_forms import korthikanti_activation_bytes, megatron_model_flops
from simulator.arithmetic.counts import (
    active_parameter_count,
    dense_parameter_count,
    model_flops_per_step,
    parameter_count,
)
from simulator.arithmetic.layer_ops import (
    backward_of,
    checkpoint_bytes,
    kv_heads_per_rank,
    layer_forward_ops,
    layer_saved_bytes,
)
from simulator.request.model import MODEL_PRESETS, PUBLISHED_PARAMETERS, ModelSpec
from simulator.request.moe import MoESpec

GPT_PRESETS = sorted(name for name, p in MODEL_PRESETS.items() if p.get("mlp", "gelu") == "gelu")


def preset(name: str) -> tuple[ModelSpec, MoESpec | None]:
    fields = dict(MODEL_PRESETS[name])
    moe = fields.pop("moe", None)
    return ModelSpec(**fields), (MoESpec(**moe) if moe else None)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_count_matches_published_total(name):
    model, moe = preset(name)
    published, source = PUBLISHED_PARAMETERS[name]
    assert parameter_count(model, moe) == pytest.approx(published, rel=0.005), source


def test_every_llama_and_mixtral_preset_has_a_published_total():
    required = {"llama3-8b", "llama3-70b", "llama3-405b", "llama2-7b", "llama2-70b"}
    required |= {"mixtral-8x7b", "mixtral-8x22b"}
    assert required <= set(PUBLISHED_PARAMETERS) and required <= set(MODEL_PRESETS)


def test_mixtral_active_parameters_match_published():
    # Jiang et al. 2024, section 2: 13B active parameters per token (12.9B)
    model, moe = preset("mixtral-8x7b")
    assert active_parameter_count(model, moe) == pytest.approx(12.9e9, rel=0.01)


def test_dense_closed_form_equals_the_ops_weights():
    for name in ("gpt3-13b", "llama3-8b", "llama2-70b"):
        model, _ = preset(name)
        ops = layer_forward_ops(model, 1, 1)
        per_layer = sum(op.weight_params for op in ops)
        embeddings = dense_parameter_count(model) - model.layers * per_layer
        norm = (2 if model.norm == "layernorm" else 1) * model.hidden
        position = model.seq_len * model.hidden if model.position == "learned" else 0
        tables = (1 if model.tie_embeddings else 2) * model.vocab * model.hidden
        assert embeddings == tables + position + norm


@pytest.mark.parametrize("name", GPT_PRESETS)
@pytest.mark.parametrize("global_batch", [1, 64, 1536])
def test_model_flops_equal_megatron_formula(name, global_batch):
    model, _ = preset(name)
    assert model.ffn == 4 * model.hidden
    assert model_flops_per_step(model, global_batch) == pytest.approx(
        megatron_model_flops(model, global_batch), rel=1e-12
    )


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama2-70b"])
def test_swiglu_and_gqa_flops_match_closed_form(name):
    model, _ = preset(name)
    b, s, h, f, a, g, d = 1, model.seq_len, model.hidden, model.ffn, model.heads, model.kv, 128
    assert model.head_dim == d
    tokens = b * s
    forward = sum(op.model_flops for op in layer_forward_ops(model, b, 1))
    qkv = 2 * tokens * h * (a + 2 * g) * d
    proj = 2 * tokens * h * h
    attention = 4 * b * s * s * h
    mlp = 2 * tokens * h * 2 * f + 2 * tokens * f * h  # gate+up, down
    assert forward == pytest.approx(qkv + proj + attention + mlp, rel=1e-12)
    step = model_flops_per_step(model, 1)
    logits = 2 * tokens * h * model.vocab
    assert step == pytest.approx(3 * (model.layers * forward + logits), rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_splits_matmul_flops(tp):
    for name in ("gpt3-13b", "llama3-70b"):
        model, _ = preset(name)
        whole = sum(op.model_flops for op in layer_forward_ops(model, 2, 1))
        shard = sum(op.model_flops for op in layer_forward_ops(model, 2, tp))
        assert shard * tp == pytest.approx(whole, rel=1e-12)


def test_kv_heads_split_or_replicate_over_tp():
    model, _ = preset("llama3-70b")  # 8 KV heads
    assert [kv_heads_per_rank(model, t) for t in (1, 2, 8, 16)] == [8, 4, 1, 1]
    odd = ModelSpec(layers=2, hidden=768, heads=12, kv_heads=6, seq_len=8, vocab=16)
    with pytest.raises(ValueError, match=r"kv_heads\(6\).*tp\(4\)"):
        kv_heads_per_rank(odd, 4)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_backward_is_twice_forward_in_model_flops(attention):
    model, _ = preset("gpt3-6.7b")
    for op in layer_forward_ops(model, 1, 2, attention=attention):
        assert sum(b.model_flops for b in backward_of(op)) == pytest.approx(2 * op.model_flops)


def test_flash_backward_recomputes_the_scores():
    model, _ = preset("gpt3-6.7b")
    (core,) = [op for op in layer_forward_ops(model, 1, 1) if op.name == "attn_core"]
    (bwd,) = backward_of(core)
    assert bwd.flops == pytest.approx(2.5 * core.flops)


def saved(model, b, tp, sp, recompute, attention):
    ops = layer_forward_ops(model, b, tp, sp, attention)
    return layer_saved_bytes(ops, recompute, attention, checkpoint_bytes(model, b, tp, sp))


@pytest.mark.parametrize(
    "tp,sp,recompute",
    [
        (t, sp, r)
        for t, sp, r in itertools.product(
            [1, 2, 4, 8], [False, True], ["none", "selective", "full"]
        )
        if not (sp and t == 1)
    ],
)
@pytest.mark.parametrize("name,b", [("gpt3-175b", 1), ("gpt3-13b", 4)])
def test_unfused_saved_bytes_equal_korthikanti(name, b, tp, sp, recompute):
    model, _ = preset(name)
    expected = korthikanti_activation_bytes(model, b, tp, sp=sp, recompute=recompute)
    assert saved(model, b, tp, sp, recompute, "unfused") == pytest.approx(expected, rel=1e-12)


def test_korthikanti_formula_limiting_cases():
    model, _ = preset("gpt3-175b")
    s, b, h, a = model.seq_len, 1, model.hidden, model.heads
    sbh = s * b * h
    assert korthikanti_activation_bytes(model, b, 1) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert korthikanti_activation_bytes(model, b, 8, sp=True) == pytest.approx(
        sbh / 8 * (34 + 5 * a * s / h)
    )
    assert korthikanti_activation_bytes(model, b, 8, recompute="full") == pytest.approx(2 * sbh)


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
def test_flash_saved_bytes_have_no_quadratic_term(tp, sp):
    """Doubling the sequence doubles flash's saved bytes exactly (no s² term), while
    unfused attention's grow faster."""
    for name in ("gpt3-13b", "llama3-8b"):
        model, _ = preset(name)
        longer = model.model_copy(update={"seq_len": 2 * model.seq_len})
        for recompute in ("none", "selective"):
            short = saved(model, 1, tp, sp, recompute, "flash")
            assert saved(longer, 1, tp, sp, recompute, "flash") == pytest.approx(2 * short)
        unfused = saved(model, 1, tp, sp, "none", "unfused")
        assert saved(longer, 1, tp, sp, "none", "unfused") > 2.5 * unfused


def test_selective_recompute_keeps_flash_inputs():
    model, _ = preset("gpt3-13b")
    assert saved(model, 1, 8, True, "selective", "flash") < saved(
        model, 1, 8, True, "none", "flash"
    )
    assert saved(model, 1, 8, True, "selective", "flash") == pytest.approx(
        korthikanti_activation_bytes(model, 1, 8, sp=True, recompute="selective")
    )


def test_hidden_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match=r"hidden\(100\).*heads\(3\)"):
        ModelSpec(layers=2, hidden=100, heads=3, seq_len=8, vocab=16)
