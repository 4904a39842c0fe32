"""Whole-model totals: parameters and model FLOPs per step, dense or mixture of experts.

Both are sums over the ops of :mod:`simulator.layer_ops` and :mod:`simulator.moe`
(parameters also in closed form, :func:`simulator.model.dense_parameter_count`), so
the numbers a run reports are the ones its schedule runs.
"""

from __future__ import annotations

from .layer_ops import OpCost, backward_of, layer_forward_ops, logits_forward_op
from .model import ModelSpec, dense_parameter_count, mlp_parameter_count
from .moe import MoESpec, expert_ffn, expert_ops, moe_layer_parameters, moe_layers

__all__ = ["parameter_count", "active_parameter_count", "model_flops_per_step"]


def parameter_count(model: ModelSpec, moe: MoESpec | None = None) -> int:
    """All parameters; an MoE layer holds its router and every expert instead of the
    dense MLP."""
    total = dense_parameter_count(model)
    if moe is not None:
        per_layer = moe_layer_parameters(moe, model.hidden, model.ffn, model.mlp, model.bias)
        total += len(moe_layers(moe, model.layers)) * (per_layer - mlp_parameter_count(model))
    return total


def active_parameter_count(model: ModelSpec, moe: MoESpec | None = None) -> int:
    """Parameters one token passes through: the router and ``top_k`` experts per MoE
    layer (the "active" count MoE papers quote)."""
    if moe is None:
        return parameter_count(model)
    active_mlp = moe.top_k * mlp_parameter_count(model, expert_ffn(moe, model.hidden, model.ffn))
    per_layer = model.hidden * moe.experts + active_mlp - mlp_parameter_count(model)
    return dense_parameter_count(model) + len(moe_layers(moe, model.layers)) * per_layer


def _with_backward(op: OpCost) -> float:
    return op.model_flops + sum(b.model_flops for b in backward_of(op))


def model_flops_per_step(model: ModelSpec, global_batch: int, moe: MoESpec | None = None) -> float:
    """Model FLOPs of one training step summed from the per-op costs (forward plus
    backward, matmuls only, no recompute). For a mixture of experts an MoE layer counts
    its router and the ``top_k`` experts each token visits instead of the dense MLP."""
    ops = layer_forward_ops(model, 1, 1)
    per_layer = sum(_with_backward(op) for op in ops)
    per_sequence = model.layers * per_layer + _with_backward(logits_forward_op(model, 1, 1))
    if moe is not None:
        tokens = model.seq_len
        mlp = sum(_with_backward(op) for op in ops if op.name in ("fc1", "fc2"))
        experts = expert_ops(
            moe,
            model.hidden,
            tokens * moe.top_k,
            model_ffn=model.ffn,
            router_tokens=tokens,
            mlp=model.mlp,
            bias=model.bias,
        )
        moe_layer = sum(_with_backward(op) for op in experts)
        per_sequence += len(moe_layers(moe, model.layers)) * (moe_layer - mlp)
    return global_batch * per_sequence
