"""Whole-model totals: parameters and model FLOPs per step, dense or mixture of experts.

Both are sums over the ops of :mod:`simulator.arithmetic.layer_ops` and
:mod:`simulator.arithmetic.moe` (parameters also in closed form,
:func:`dense_parameter_count`), so the numbers a run reports are the ones its schedule
runs.
"""

from __future__ import annotations

from simulator.arithmetic.layer_ops import (
    FP8_GEMMS,
    OpCost,
    attention_core_names,
    backward_of,
    embedding_op,
    final_norm_op,
    layer_forward_ops,
    logits_forward_op,
)
from simulator.arithmetic.moe import (
    expert_ffn,
    expert_ops,
    moe_layer_parameters,
    moe_layer_parameters_per_rank,
    router_op,
)
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec, is_moe_layer, moe_layers
from simulator.request.recipe import Recipe

__all__ = [
    "attention_parameter_count",
    "mlp_parameter_count",
    "layer_parameter_count",
    "dense_parameter_count",
    "parameter_count",
    "active_parameter_count",
    "model_flops_per_step",
    "pipeline_rank_parameters",
    "layer_parameters",
    "unit_parameters",
    "layer_fp8_parameters",
]


def _norm_parameters(model: ModelSpec) -> int:
    return (2 if model.norm == "layernorm" else 1) * model.hidden


def attention_parameter_count(model: ModelSpec) -> int:
    """QKV and output projections (and their biases): ``h·(a + 2g)·d + a·d·h``."""
    h, d = model.hidden, model.head_dim
    assert d is not None  # set by ModelSpec's validator
    qkv_width = (model.heads + 2 * model.kv) * d
    biases = qkv_width + h if model.bias else 0
    return h * qkv_width + model.heads * d * h + biases


def mlp_parameter_count(model: ModelSpec, ffn: int | None = None) -> int:
    """One MLP of width ``ffn``: ``2hf`` (GELU) or ``3hf`` (SwiGLU), plus biases."""
    h, f = model.hidden, ffn if ffn is not None else model.ffn
    if model.mlp == "swiglu":
        return 3 * h * f + ((2 * f + h) if model.bias else 0)
    return 2 * h * f + ((f + h) if model.bias else 0)


def layer_parameter_count(model: ModelSpec) -> int:
    """Parameters of one dense layer: attention, MLP and two norms (``12h² + 13h`` for
    the GPT block with ``f = 4h``)."""
    return (
        attention_parameter_count(model) + mlp_parameter_count(model) + 2 * _norm_parameters(model)
    )


def dense_parameter_count(model: ModelSpec) -> int:
    """All parameters of a dense model: layers, token (and learned position) embeddings,
    the final norm, and an untied output layer when ``tie_embeddings`` is false."""
    h = model.hidden
    embeddings = model.vocab * h + (model.seq_len * h if model.position == "learned" else 0)
    output = 0 if model.tie_embeddings else model.vocab * h
    return (
        model.layers * layer_parameter_count(model) + embeddings + output + _norm_parameters(model)
    )


def parameter_count(model: ModelSpec, moe: MoESpec | None = None) -> int:
    """All parameters; an MoE layer holds its router and every expert instead of the
    dense MLP."""
    total = dense_parameter_count(model)
    if moe is not None:
        per_layer = moe_layer_parameters(moe, model.hidden, model.ffn, model.mlp, model.bias)
        total += len(moe_layers(moe, model.layers)) * (per_layer - mlp_parameter_count(model))
    return total


def active_parameter_count(model: ModelSpec, moe: MoESpec | None = None) -> int:
    """Parameters one token passes through: the router, ``top_k`` experts and the shared
    experts per MoE layer (the "active" count MoE papers quote)."""
    if moe is None:
        return parameter_count(model)
    width = expert_ffn(moe, model.hidden, model.ffn)
    active_mlp = moe.top_k * mlp_parameter_count(model, width)
    if moe.shared_experts:  # every token passes the shared experts too
        active_mlp += mlp_parameter_count(model, width * moe.shared_experts)
    per_layer = model.hidden * moe.experts + active_mlp - mlp_parameter_count(model)
    return dense_parameter_count(model) + len(moe_layers(moe, model.layers)) * per_layer


def _with_backward(op: OpCost) -> float:
    return op.model_flops + sum(b.model_flops for b in backward_of(op))


def model_flops_per_step(
    model: ModelSpec, global_batch: int, moe: MoESpec | None = None, kept: float = 1.0
) -> float:
    """Model FLOPs of one training step summed from the per-op costs (forward plus
    backward, matmuls only, no recompute). For a mixture of experts an MoE layer counts
    its router and the ``top_k`` experts each token visits instead of the dense MLP;
    ``kept`` is the share of those expert assignments the experts process (a capacity
    factor drops the rest, which then cost no FLOPs)."""
    ops = layer_forward_ops(model, 1, 1)
    per_layer = sum(_with_backward(op) for op in ops)
    per_sequence = model.layers * per_layer + _with_backward(logits_forward_op(model, 1, 1))
    if moe is not None:
        tokens = model.seq_len
        mlp = sum(_with_backward(op) for op in ops if op.name in ("fc1", "fc2"))
        experts = expert_ops(
            moe,
            model.hidden,
            # a mean count: fractional when kept < 1; only the FLOPs are read from it
            tokens * moe.top_k * kept,  # type: ignore[arg-type]
            model_ffn=model.ffn,
            router_tokens=tokens,
            mlp=model.mlp,
            bias=model.bias,
        )
        moe_layer = sum(_with_backward(op) for op in experts)
        per_sequence += len(moe_layers(moe, model.layers)) * (moe_layer - mlp)
    return global_batch * per_sequence


def attention_core_flops_per_step(model: ModelSpec, global_batch: int, attention: str) -> float:
    """The part of :func:`model_flops_per_step` that is the attention core (the scores
    and their product with V, forward plus backward, the full ``s²`` of them)."""
    core = set(attention_core_names(attention))
    ops = [op for op in layer_forward_ops(model, 1, 1, attention=attention) if op.name in core]
    return global_batch * model.layers * sum(_with_backward(op) for op in ops)


def layer_parameters(recipe: Recipe, model: ModelSpec, moe: MoESpec | None, layer: int) -> int:
    """Parameters of ``layer`` on one rank: its TP shard, and for an MoE layer the router
    and the rank's ``E/ep`` experts instead of the dense MLP."""
    layout = recipe.layout
    ops = layer_forward_ops(model, 1, layout.tp)
    count = sum(op.weight_params for op in ops)
    if moe is not None and is_moe_layer(moe, layer):
        dense_mlp = sum(op.weight_params for op in ops if op.name in ("fc1", "fc2"))
        count += (
            moe_layer_parameters_per_rank(
                moe, model.hidden, layout.ep, layout.tp, model.ffn, model.mlp, model.bias
            )
            - dense_mlp
        )
    return count


def layer_fp8_parameters(recipe: Recipe, model: ModelSpec, moe: MoESpec | None, layer: int) -> int:
    """Parameters of ``layer`` on one rank that an FP8 recipe keeps in FP8 (its
    :data:`~simulator.arithmetic.layer_ops.FP8_GEMMS`: every linear weight but the
    router's)."""
    layout = recipe.layout
    ops = layer_forward_ops(model, 1, layout.tp)
    moe_layer = moe is not None and is_moe_layer(moe, layer)
    dense = ("qkv", "proj") if moe_layer else FP8_GEMMS
    count = sum(op.weight_params for op in ops if op.name in dense)
    if moe_layer:
        assert moe is not None  # moe_layer says so
        router = router_op(moe, model.hidden, 1).weight_params
        count += (
            moe_layer_parameters_per_rank(
                moe, model.hidden, layout.ep, layout.tp, model.ffn, model.mlp, model.bias
            )
            - router
        )
    return count


def unit_parameters(recipe: Recipe, model: ModelSpec, moe: MoESpec | None, layer: int) -> int:
    """Parameters of the sharding unit around ``layer`` on one rank (what full sharding
    gathers and reduce-scatters at once): the layer, with the embedding in the first
    layer's unit and the final norm and output layer in the last one's. Summed over a
    pipeline rank's layers this is :func:`pipeline_rank_parameters`."""
    count = layer_parameters(recipe, model, moe, layer)
    tp = recipe.layout.tp
    if layer == 0:
        count += embedding_op(model, 1, tp).weight_params
    if layer == recipe.layers - 1:
        count += final_norm_op(model, 1).weight_params
        # an untied output layer, or Megatron-LM's copy of the tied word embeddings on
        # the last stage when it is not on the first stage's rank
        if not model.tie_embeddings or recipe.placement.rank_of(recipe.stages - 1) != 0:
            count += logits_forward_op(model, 1, tp).weight_params
    return count


def pipeline_rank_parameters(
    recipe: Recipe, model: ModelSpec, moe: MoESpec | None, pipeline_rank: int
) -> int:
    """Parameters held by one rank of pipeline rank ``pipeline_rank``: its TP shard of the
    layers of every stage it holds (:meth:`Recipe.rank_layers`), plus the embedding on
    the first stage and the norm and logits on the last. An MoE layer holds the router
    and its ``E/ep`` experts instead of the dense MLP."""
    layout = recipe.layout
    tp = layout.tp
    ops = layer_forward_ops(model, 1, tp)
    layers = recipe.rank_layers(pipeline_rank)
    count = sum(op.weight_params for op in ops) * len(layers)
    if moe is not None:
        dense_mlp = sum(op.weight_params for op in ops if op.name in ("fc1", "fc2"))
        experts = moe_layer_parameters_per_rank(
            moe, model.hidden, layout.ep, tp, model.ffn, model.mlp, model.bias
        )
        count += sum(experts - dense_mlp for layer in layers if is_moe_layer(moe, layer))
    if pipeline_rank == 0:
        count += embedding_op(model, 1, tp).weight_params
    if pipeline_rank == recipe.placement.rank_of(recipe.stages - 1):
        count += final_norm_op(model, 1).weight_params
        # an untied output layer, or Megatron-LM's copy of the tied word embeddings on
        # the last stage when it is not on the first stage's rank
        if not model.tie_embeddings or recipe.placement.rank_of(recipe.stages - 1) != 0:
            count += logits_forward_op(model, 1, tp).weight_params
    return count
