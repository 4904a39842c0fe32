"""Model math for a GPT-style dense transformer.

Everything here is plain arithmetic on the model's shape, so a reader can check each
number by hand. One transformer layer, for a micro-batch of ``b`` sequences of ``s``
tokens, hidden size ``h``, ``a`` heads, MLP width ``f`` and tensor-parallel degree
``t``, runs these ops (forward; backward mirrors them):

==============  ===========  =================================  ==========================
op              kind         FLOPs per TP rank (forward)        GEMM shape (m, n, k)
==============  ===========  =================================  ==========================
ln1, ln2        elementwise  (not counted in model FLOPs)
qkv             gemm         ``2·bs·h·3h/t``                    ``(bs, 3h/t, h)``
attn_core       attention    ``4·b·s²·h/t`` (QKᵀ and AV)
proj            gemm         ``2·bs·(h/t)·h``                   ``(bs, h, h/t)``
fc1             gemm         ``2·bs·h·f/t``                     ``(bs, f/t, h)``
gelu            elementwise
fc2             gemm         ``2·bs·(f/t)·h``                   ``(bs, h, f/t)``
==============  ===========  =================================  ==========================

A GEMM's backward is two GEMMs of the forward's FLOPs: the input gradient (``dgrad``)
and the weight gradient (``wgrad``); the attention core's backward is twice its
forward. The logits layer is a GEMM ``(bs, V/t, h)``. With ``f = 4h`` the per-op sums
give Megatron-LM's model FLOPs per step, ``72·B·L·s·h²·(1 + s/6h + V/12Lh)``
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21, eq. 3); :func:`megatron_model_flops` states that formula
so the tests can hold the two together.

HBM traffic is counted for 2-byte (bf16) tensors: a GEMM reads both operands and
writes its result once; the attention core is FlashAttention-style (reads Q, K, V,
writes O; the ``s×s`` scores never reach HBM); an elementwise op reads and writes
its activations once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "ModelSpec",
    "MODEL_PRESETS",
    "OpCost",
    "layer_forward_ops",
    "logits_forward_op",
    "backward_of",
    "parameter_count",
    "layer_parameter_count",
    "model_flops_per_step",
    "megatron_model_flops",
    "activation_bytes_per_layer",
]

ACT_BYTES = 2  # bf16/fp16 activations and weights


class ModelSpec(BaseModel):
    """Shape of a GPT-style decoder-only transformer."""

    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    vocab: int = Field(gt=0)
    ffn_hidden: int | None = Field(default=None, gt=0)
    activation: Literal["gelu"] = "gelu"

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if hidden is not None and hidden % heads:
            raise ValueError(f"hidden({hidden}) is not divisible by heads({heads})")
        return heads

    @model_validator(mode="after")
    def _default_ffn(self) -> ModelSpec:
        if self.ffn_hidden is None:
            self.ffn_hidden = 4 * self.hidden
        return self

    @property
    def ffn(self) -> int:
        assert self.ffn_hidden is not None
        return self.ffn_hidden


# Published shapes. GPT-3: Brown et al. 2020, table 2.1 (seq 2048, vocab 50257, padded to
# 51200 as Megatron-LM does for tensor-parallel divisibility). GPT-2: Radford et al. 2019.
# Megatron 530B and 1T: Narayanan et al. SC'21 table 1 / Smith et al. 2022 (MT-NLG).
MODEL_PRESETS: dict[str, dict] = {
    "gpt2-small": dict(layers=12, hidden=768, heads=12, seq_len=1024, vocab=50304),
    "gpt2-xl": dict(layers=48, hidden=1600, heads=25, seq_len=1024, vocab=50304),
    "gpt3-1.3b": dict(layers=24, hidden=2048, heads=16, seq_len=2048, vocab=51200),
    "gpt3-6.7b": dict(layers=32, hidden=4096, heads=32, seq_len=2048, vocab=51200),
    "gpt3-13b": dict(layers=40, hidden=5120, heads=40, seq_len=2048, vocab=51200),
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200),
    "mt-nlg-530b": dict(layers=105, hidden=20480, heads=128, seq_len=2048, vocab=51200),
    "megatron-1t": dict(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200),
    # A 70B-class dense decoder with LLaMA-2-70B's depth, width, heads, context and
    # vocabulary (Touvron et al. 2023, table 1), but parasim's GPT block (GELU MLP of
    # 4h, full multi-head attention): about 65 B parameters.
    "dense-70b": dict(layers=80, hidden=8192, heads=64, seq_len=4096, vocab=32000),
}


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op of one TP rank for one micro-batch."""

    name: str
    kind: str  # gemm | attention | elementwise
    flops: float
    bytes: float
    model_flops: float  # counted in Megatron's model FLOPs (matmuls only)
    shape: tuple[int, int, int] | None = None  # GEMM (m, n, k)
    weight_params: int = 0  # parameters whose gradient this op's wgrad produces


def _gemm(name: str, m: int, n: int, k: int, bias: bool = True) -> OpCost:
    """A GEMM ``(m, k) @ (k, n)``; its weight (and bias) has ``n·k (+ n)`` parameters."""
    flops = 2.0 * m * n * k
    traffic = ACT_BYTES * (m * k + k * n + m * n)
    params = n * k + (n if bias else 0)
    return OpCost(name, "gemm", flops, traffic, flops, (m, n, k), weight_params=params)


def _elementwise(
    name: str, elements: float, flops_per_element: float, passes: float, params: int = 0
) -> OpCost:
    """An elementwise op touching ``elements`` values ``passes`` times (reads + writes)."""
    return OpCost(
        name,
        "elementwise",
        flops_per_element * elements,
        ACT_BYTES * elements * passes,
        0.0,
        weight_params=params,
    )


def layer_forward_ops(
    model: ModelSpec, micro_batch: int, tp: int, sp: bool = False
) -> list[OpCost]:
    """The forward ops of one transformer layer on one TP rank, in execution order.

    The two TP all-reduces fall after ``proj`` and after ``fc2``; the schedule builder
    inserts them (Megatron-LM's ``g`` operator). With sequence parallelism (``sp``)
    the norms, dropout and residual adds work on ``1/tp`` of the sequence.
    """
    b, s, h, f = micro_batch, model.seq_len, model.hidden, model.ffn
    tokens = b * s
    sequence_share = tokens / tp if sp else tokens
    local_heads_width = h // tp
    attn_flops = 4.0 * b * s * s * h / tp
    attn = OpCost(
        "attn_core",
        "attention",
        attn_flops,
        ACT_BYTES * 4.0 * tokens * local_heads_width,  # read Q, K, V; write O
        attn_flops,
    )
    return [
        _elementwise("ln1", sequence_share * h, 8, 2, params=2 * h),
        _gemm("qkv", tokens, 3 * h // tp, h),
        attn,
        _gemm("proj", tokens, h, h // tp),
        _elementwise("residual1", sequence_share * h, 2, 3),  # dropout + residual add
        _elementwise("ln2", sequence_share * h, 8, 2, params=2 * h),
        _gemm("fc1", tokens, f // tp, h),
        _elementwise("gelu", tokens * f / tp, 8, 2),
        _gemm("fc2", tokens, h, f // tp),
        _elementwise("residual2", sequence_share * h, 2, 3),
    ]


def logits_forward_op(model: ModelSpec, micro_batch: int, tp: int) -> OpCost:
    """The output (logits) GEMM of the last stage, vocabulary split across TP ranks."""
    return _gemm("logits", micro_batch * model.seq_len, model.vocab // tp, model.hidden, bias=False)


def backward_of(op: OpCost) -> list[OpCost]:
    """Backward ops of a forward op: dgrad and wgrad for a GEMM, 2× for attention,
    1× (read grad and input, write grad) for elementwise ops."""
    if op.kind == "gemm":
        assert op.shape is not None
        m, n, k = op.shape
        dgrad = _gemm(f"{op.name}.dgrad", m, k, n, bias=False)
        wgrad = _gemm(f"{op.name}.wgrad", k, n, m, bias=False)
        return [replace(dgrad, weight_params=0), replace(wgrad, weight_params=op.weight_params)]
    if op.kind == "attention":
        return [
            OpCost(f"{op.name}.bwd", "attention", 2 * op.flops, 2 * op.bytes, 2 * op.model_flops)
        ]
    # Reads the output gradient and the saved input, writes the input gradient.
    return [
        OpCost(f"{op.name}.bwd", op.kind, op.flops, op.bytes * 1.5, 0.0, None, op.weight_params)
    ]


def layer_parameter_count(model: ModelSpec) -> int:
    """Parameters of one layer: QKV, projection, two MLP matrices, their biases and two
    layer norms (``12h² + 13h`` when ``f = 4h``)."""
    h, f = model.hidden, model.ffn
    weights = 3 * h * h + h * h + 2 * h * f
    biases = 3 * h + h + f + h
    norms = 4 * h
    return weights + biases + norms


def parameter_count(model: ModelSpec) -> int:
    """All parameters: layers, token and position embeddings (tied with the logits
    layer) and the final layer norm."""
    h = model.hidden
    return model.layers * layer_parameter_count(model) + (model.vocab + model.seq_len) * h + 2 * h


def model_flops_per_step(model: ModelSpec, global_batch: int, moe: Any = None) -> float:
    """Model FLOPs of one training step summed from the per-op costs (forward plus
    backward, matmuls only, no recompute). For a mixture of experts (``moe``, a
    :class:`simulator.moe.MoESpec`) an MoE layer counts its router and the ``top_k``
    experts each token visits instead of the dense MLP."""

    def with_backward(op: OpCost) -> float:
        return op.model_flops + sum(b.model_flops for b in backward_of(op))

    ops = layer_forward_ops(model, 1, 1)
    per_layer = sum(with_backward(op) for op in ops)
    logits = logits_forward_op(model, 1, 1)
    per_sequence = model.layers * per_layer + with_backward(logits)
    if moe is not None:
        from .moe import expert_ops, moe_layers

        tokens = model.seq_len
        mlp = sum(with_backward(op) for op in ops if op.name in ("fc1", "fc2"))
        experts = expert_ops(
            moe, model.hidden, tokens * moe.top_k, model_ffn=model.ffn, router_tokens=tokens
        )
        moe_layer = sum(with_backward(op) for op in experts)
        per_sequence += len(moe_layers(moe, model.layers)) * (moe_layer - mlp)
    return global_batch * per_sequence


def megatron_model_flops(model: ModelSpec, global_batch: int) -> float:
    """Megatron-LM's closed form ``72·B·L·s·h²·(1 + s/6h + V/12Lh)`` (valid for f = 4h)."""
    B, L, s, h, V = global_batch, model.layers, model.seq_len, model.hidden, model.vocab
    return 72.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def activation_bytes_per_layer(
    model: ModelSpec, micro_batch: int, tp: int, sp: bool = False, recompute: str = "none"
) -> float:
    """Activation memory one layer keeps for backward, per micro-batch, on one TP rank.

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
    (2022), table 2: ``sbh(34 + 5as/h)`` without parallelism, ``sbh(10 + 24/t + 5as/ht)``
    with TP, ``(sbh/t)(34 + 5as/h)`` with TP+SP, ``2sbh`` with full recompute (the
    layer's input only); selective recompute drops the ``5as/h`` attention term.
    """
    s, b, h, a, t = model.seq_len, micro_batch, model.hidden, model.heads, tp
    sbh = float(s * b * h)
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    attention_term = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return sbh / t * (34.0 + attention_term)
    return sbh * (10.0 + 24.0 / t + attention_term / t)
