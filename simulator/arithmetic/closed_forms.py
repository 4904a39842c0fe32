"""Published closed forms that the per-op sums must reproduce in their limiting cases:
Megatron-LM's model FLOPs and Korthikanti et al.'s activation memory (tests hold the
op sums of :mod:`simulator.arithmetic.layer_ops` to them)."""

from __future__ import annotations

from simulator.request.model import ModelSpec

__all__ = ["megatron_model_flops", "korthikanti_activation_bytes"]


def megatron_model_flops(model: ModelSpec, global_batch: int) -> float:
    """Megatron-LM's closed form ``72·B·L·s·h²·(1 + s/6h + V/12Lh)`` (Narayanan et al.,
    SC'21, eq. 3 without recompute; valid for the GPT block with ``f = 4h``)."""
    B, L, s, h, V = global_batch, model.layers, model.seq_len, model.hidden, model.vocab
    return 72.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def korthikanti_activation_bytes(
    model: ModelSpec, micro_batch: int, tp: int, sp: bool = False, recompute: str = "none"
) -> float:
    """Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
    (2022), table 2, per layer and micro-batch on one TP rank, for the GPT block with
    unfused attention: ``sbh(34 + 5as/h)`` alone, ``sbh(10 + 24/t + 5as/ht)`` with TP,
    ``(sbh/t)(34 + 5as/h)`` with TP+SP, ``2sbh`` (÷t with SP) with full recompute;
    selective recompute drops the ``5as/h`` term."""
    s, b, h, a, t = model.seq_len, micro_batch, model.hidden, model.heads, tp
    sbh = float(s * b * h)
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    attention_term = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return sbh / t * (34.0 + attention_term)
    return sbh * (10.0 + 24.0 / t + attention_term / t)
