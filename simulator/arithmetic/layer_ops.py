"""The ops one transformer block runs, as frameworks and kernels run them.

One layer, for a micro-batch of ``b`` sequences of ``s`` tokens on one of ``t``
tensor-parallel ranks (hidden ``h``, ``a`` query heads and ``g`` key/value heads of
dimension ``d = h/a``, MLP width ``f``), runs these forward ops (``T = b·s`` tokens;
norms, dropout and residuals work on ``T/t`` tokens with sequence parallelism):

==============  ===========  ==========================================  =================
op              kind         what it is                                  saves for backward
==============  ===========  ==========================================  =================
ln1             elementwise  layer/RMS norm (Apex/TE fused kernel)        its input
qkv             gemm         ``(T, (a+2g)·d/t, h)``                       its input
rope            elementwise  rotary embedding of Q and K (fused)          —
attn_core       attention    FlashAttention (``flash``)                   Q, K, V, log-sum-exp
attn_qk         gemm ×b·a/t  ``QKᵀ``: ``(s, s, d)`` per head (``unfused``) Q, K
attn_softmax    elementwise  fused scale-mask-softmax over ``b·a·s²/t``   its output
attn_dropout    elementwise  dropout of the probabilities                 the mask (1 byte)
attn_av         gemm ×b·a/t  ``P·V``: ``(s, d, s)`` per head               P (after dropout), V
proj            gemm         ``(T, h, a·d/t)``                            its input
residual1       elementwise  bias-dropout-add (fused)                     the mask (1 byte)
ln2             elementwise  layer/RMS norm                               its input
fc1             gemm         ``(T, f/t, h)``; SwiGLU: ``(T, 2f/t, h)``    its input
gelu / swiglu   elementwise  bias-GELU or SwiGLU (fused)                  its input
fc2             gemm         ``(T, h, f/t)``                              its input
residual2       elementwise  bias-dropout-add                             the mask
==============  ===========  ==========================================  =================

With sequence parallelism the inputs saved by ``qkv`` and ``fc1`` are the ``1/t``
sequence shards: Megatron-LM all-gathers them again in the backward. Summed, the saved
bytes of the GPT block with unfused attention are Korthikanti et al.'s
``sbh(10 + 24/t + 5as/ht)`` (and its SP, selective and full-recompute cases, see
:func:`layer_saved_bytes`); FlashAttention keeps no ``s²`` term. Memory
(:mod:`simulator.analysis.memory`) sums these same ops, so time and memory cannot disagree.

FLOPs are ``2mnk`` per GEMM; model FLOPs count the matmuls (the attention core's
``4·b·s²·h/t`` in full, as Megatron-LM's formula does), hardware FLOPs every op as it
runs (FlashAttention's backward recomputes the scores: 2.5× its forward, against 2×
for model FLOPs). HBM bytes are those of the fused kernels frameworks run: a GEMM reads
both operands and writes its result; an elementwise op reads and writes its tensors
(``passes`` bytes per element, listed at each constructor). A GEMM's backward is two
GEMMs of the forward's FLOPs: the input gradient (``dgrad``) and the weight gradient
(``wgrad``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simulator.arithmetic.stacks import Stack, restack
from simulator.common.vocabulary import ATTENTION, ELEMENTWISE, GEMM, ComputeKind
from simulator.request.model import ModelSpec

__all__ = [
    "ACT_BYTES",
    "OpCost",
    "kv_heads_per_rank",
    "layer_forward_ops",
    "FP8_GEMMS",
    "fp8_ops",
    "activation_op",
    "mlp_forward_ops",
    "backward_of",
    "attention_core_names",
    "embedding_op",
    "final_norm_op",
    "logits_forward_op",
    "loss_op",
    "loss_elements",
    "layer_saved_bytes",
    "checkpoint_bytes",
]

ACT_BYTES = 2  # bf16 activations and weights


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op of one TP rank for one micro-batch.

    ``shape`` is a GEMM's ``(m, n, k)`` (``batch`` of them for a batched GEMM), or the
    attention kernel's ``(s_q, s_kv, head_dim)`` over ``batch = b·heads``.
    ``saved_bytes`` is what the op keeps for its backward; ``backward_bytes`` the HBM
    traffic of an elementwise op's backward kernel.
    """

    name: str
    kind: ComputeKind
    flops: float
    bytes: float
    model_flops: float
    shape: tuple[int, int, int] | None = None
    weight_params: int = 0  # parameters whose gradient this op's backward produces
    batch: int = 1
    saved_bytes: float = 0.0
    backward_bytes: float = 0.0
    fp8: bool = False  # a GEMM on FP8 tensor cores (its backward's GEMMs too)
    # kernels the op runs as (an eager chain of elementwise kernels, a GEMM issued as
    # several: simulator.arithmetic.stacks), forward and in its backward
    kernels: int = 1
    backward_kernels: int = 1


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """Key/value heads on one TP rank: ``g/t`` when ``t`` divides ``g``, else one (each
    rank keeps a copy of the one KV head its query heads share, as Megatron-LM replicates
    KV heads when ``t > g``). Raises ``ValueError`` when neither divides the other."""
    g = model.kv
    if g % tp == 0:
        return g // tp
    if tp % g == 0:
        return 1
    raise ValueError(f"kv_heads({g}) is neither divisible by tp({tp}) nor a divisor of it")


def _gemm(
    name: str,
    m: int,
    n: int,
    k: int,
    *,
    bias: bool = False,
    saved: float | None = None,
    batch: int = 1,
) -> OpCost:
    """``batch`` GEMMs ``(m, k) @ (k, n)``; the weight (and bias) has ``n·k (+ n)``
    parameters when ``batch`` is 1. By default it saves its input ``(m, k)`` for the
    weight gradient."""
    flops = 2.0 * batch * m * n * k
    traffic = ACT_BYTES * batch * (m * k + k * n + m * n)
    params = n * k + (n if bias else 0) if batch == 1 else 0
    if saved is None:
        saved = ACT_BYTES * batch * m * k
    return OpCost(name, GEMM, flops, traffic, flops, (m, n, k), params, batch, saved)


def _elementwise(
    name: str,
    elements: float,
    flops_per_element: float,
    forward_passes: float,
    backward_passes: float,
    saved_per_element: float = 0.0,
    params: int = 0,
) -> OpCost:
    """An elementwise kernel over ``elements`` values moving ``forward_passes`` bytes per
    element (its backward ``backward_passes``) and saving ``saved_per_element`` bytes."""
    return OpCost(
        name,
        ELEMENTWISE,
        flops_per_element * elements,
        forward_passes * elements,
        0.0,
        weight_params=params,
        saved_bytes=saved_per_element * elements,
        backward_bytes=backward_passes * elements,
    )


def _norm(name: str, model: ModelSpec, elements: float) -> OpCost:
    """Fused layer/RMS norm: reads x, writes y (4 B/element); its backward reads dy and
    x and writes dx (6 B/element); it saves its input (the per-row statistics are
    negligible). The weight (and bias) is replicated over TP ranks."""
    params = (2 if model.norm == "layernorm" else 1) * model.hidden
    flops = 8 if model.norm == "layernorm" else 4
    return _elementwise(name, elements, flops, 4, 6, ACT_BYTES, params)


def _residual(name: str, model: ModelSpec, elements: float) -> OpCost:
    """Megatron-LM's fused bias-dropout-add: reads the branch and the residual, writes
    the sum and a 1-byte mask (7 B/element), saves the mask; its backward reads the
    gradient and the mask and writes the branch's gradient (5 B/element). Without
    dropout, a residual add (6 B/element forward; the backward adds the two gradient
    paths, 6 B/element)."""
    if model.dropout:
        return _elementwise(name, elements, 3, 7, 5, 1)
    return _elementwise(name, elements, 1, 6, 6, 0)


def attention_core_names(attention: str, cp: int = 1, cp_kind: str = "ring") -> tuple[str, ...]:
    """The ops selective recompute reruns: the attention core (a context-parallel
    ring's blocks)."""
    if cp > 1 and cp_kind == "ring":
        return tuple(f"attn_ring{j}" for j in range(cp))
    if attention == "flash":
        return ("attn_core",)
    return ("attn_qk", "attn_softmax", "attn_dropout", "attn_av")


def _attention_core(
    model: ModelSpec, b: int, tp: int, attention: str, local_heads: int, kv_local: int
) -> list[OpCost]:
    s, d = model.seq_len, model.head_dim
    assert d is not None  # set by ModelSpec's validator
    tokens = b * s
    if attention == "flash":
        # FlashAttention: reads Q, K, V, writes O and the fp32 log-sum-exp; the s×s scores
        # stay on chip. It saves Q, K, V and the log-sum-exp (O is the projection's input).
        flops = 4.0 * b * s * s * local_heads * d
        qkv_elements = tokens * (local_heads + 2 * kv_local) * d
        traffic = ACT_BYTES * (qkv_elements + tokens * local_heads * d)
        lse = 4.0 * b * local_heads * s
        saved = ACT_BYTES * qkv_elements + lse
        return [
            OpCost(
                "attn_core",
                ATTENTION,
                flops,
                traffic,
                flops,
                (s, s, d),
                0,
                b * local_heads,
                saved,
            )
        ]
    # Megatron-LM's path before FlashAttention: K and V expanded to every query head
    # (GQA), two batched GEMMs over b·a/t heads, a fused scale-mask-softmax and a dropout
    # over the b·a·s²/t scores, each through HBM.
    heads = b * local_heads
    scores = float(heads * s * s)
    ops = [
        _gemm("attn_qk", s, s, d, batch=heads, saved=2 * ACT_BYTES * heads * s * d),
        # reads the scores, writes the probabilities (its backward: reads P and dP,
        # writes dS); saves P
        _elementwise("attn_softmax", scores, 5, 4, 6, ACT_BYTES),
    ]
    if model.dropout:
        # reads P, writes the dropped P and a 1-byte mask; saves the mask
        ops.append(_elementwise("attn_dropout", scores, 2, 5, 5, 1))
    # P·V saves V and its input P: the dropped copy with dropout, else softmax's output
    probs = ACT_BYTES * scores if model.dropout else 0.0
    ops.append(_gemm("attn_av", s, d, s, batch=heads, saved=probs + ACT_BYTES * heads * s * d))
    return ops


def activation_op(mlp: str, elements: float, prefix: str = "") -> OpCost:
    """An MLP's fused activation over ``elements`` outputs. SwiGLU reads the gate and up
    halves and writes the output (6 B/element), its backward reads dy and both halves
    and writes both gradients (10 B/element), and it saves its two-half input.
    Bias-GELU reads x and writes y (4 B/element), its backward reads dy and x and writes
    dx (6 B/element), and it saves its input."""
    if mlp == "swiglu":
        return _elementwise(f"{prefix}swiglu", elements, 4, 6, 10, 2 * ACT_BYTES)
    return _elementwise(f"{prefix}gelu", elements, 8, 4, 6, ACT_BYTES)


def mlp_forward_ops(
    model: ModelSpec, tokens: int, ffn: int, tp: int, *, input_shard: int = 1
) -> list[OpCost]:
    """``fc1``, the activation and ``fc2`` of one MLP of width ``ffn`` on ``tokens``
    tokens (split over ``tp`` ranks as Megatron's column- and row-parallel pair; with
    SwiGLU ``fc1`` is the gate and up projections in one GEMM); ``fc1`` saves
    ``1/input_shard`` of its input (the SP shard)."""
    h, f = model.hidden, ffn // tp
    fc1_input = ACT_BYTES * tokens * h / input_shard
    width = 2 * f if model.mlp == "swiglu" else f
    return [
        _gemm("fc1", tokens, width, h, bias=model.bias, saved=fc1_input),
        activation_op(model.mlp, tokens * f),
        _gemm("fc2", tokens, h, f, bias=model.bias),
    ]


#: :func:`layer_forward_ops` by the model's field values and the other arguments: a
#: sweep asks for the same few layers thousands of times (every candidate's memory,
#: parameter counts and schedule start from them). Cleared when it grows past
#: :data:`_OPS_CACHE_SIZE` entries.
_OPS_CACHE: dict[tuple, list[OpCost]] = {}
_OPS_CACHE_SIZE = 1024


def layer_forward_ops(
    model: ModelSpec,
    micro_batch: int,
    tp: int,
    sp: bool = False,
    attention: str = "flash",
    cp: int = 1,
    cp_kind: str = "ring",
    fp8: bool = False,
    stack: Stack | None = None,
) -> list[OpCost]:
    """The forward ops of one transformer layer on one TP rank, in execution order
    (:func:`_layer_forward_ops`, remembered: the same arguments give equal ops), as
    ``stack`` runs them (:mod:`simulator.arithmetic.stacks`; None: Megatron-Core's
    fused kernels)."""
    key: tuple | None
    try:  # the model's values as they are now (a model changed since is another key)
        key = (
            type(model),
            tuple(model.__dict__.values()),
            micro_batch,
            tp,
            sp,
            attention,
            cp,
            cp_kind,
            fp8,
            stack,
        )
        ops = _OPS_CACHE.get(key)
    except TypeError:  # a value that does not hash
        key, ops = None, None
    if ops is None:
        ops = _layer_forward_ops(model, micro_batch, tp, sp, attention, cp, cp_kind, fp8)
        if stack is not None:
            ops = restack(ops, stack)
        if key is not None:
            if len(_OPS_CACHE) >= _OPS_CACHE_SIZE:
                _OPS_CACHE.clear()
            _OPS_CACHE[key] = ops
    return list(ops)  # the ops are frozen; the list is the caller's


def _layer_forward_ops(
    model: ModelSpec,
    micro_batch: int,
    tp: int,
    sp: bool,
    attention: str,
    cp: int,
    cp_kind: str,
    fp8: bool,
) -> list[OpCost]:
    """The forward ops of one transformer layer on one TP rank, in execution order.

    The two TP all-reduces fall after ``proj`` and after ``fc2`` (Megatron-LM's ``g``
    operator); the schedule builder inserts them. With sequence parallelism (``sp``)
    the norms, dropout and residual adds work on ``1/tp`` of the sequence.

    With ``fp8`` the linear layers run as :func:`fp8_ops` makes them.

    With context parallelism (``cp`` > 1) ``model`` is the rank's view, its ``seq_len``
    the rank's ``1/cp`` of the sequence, and every op but attention works on it.
    Attention is FlashAttention over the whole sequence: with ``ring``, ``cp`` blocks
    ``attn_ring0 … attn_ring{cp-1}`` of the local queries against one rank's keys each
    (two chunks per rank balance the causal mask, so each block computes about half its
    scores, as the compute model's causal factor takes); with ``ulysses``, one
    ``attn_core`` over the full sequence for ``1/cp`` of the rank's heads.
    """
    if fp8:
        return fp8_ops(layer_forward_ops(model, micro_batch, tp, sp, attention, cp, cp_kind))
    if cp > 1:
        return _context_parallel_ops(model, micro_batch, tp, sp, cp, cp_kind)
    b, s, h, d = micro_batch, model.seq_len, model.hidden, model.head_dim
    assert d is not None  # set by ModelSpec's validator
    tokens = b * s
    shard = tp if sp else 1
    share = tokens / shard
    local_heads = model.heads // tp
    kv_local = kv_heads_per_rank(model, tp)
    qkv_width = (local_heads + 2 * kv_local) * d
    ops = [
        _norm("ln1", model, share * h),
        _gemm("qkv", tokens, qkv_width, h, bias=model.bias, saved=ACT_BYTES * share * h),
    ]
    if model.position == "rope":
        # fused rotary embedding: reads and writes Q and K (4 B/element both ways)
        ops.append(_elementwise("rope", tokens * (local_heads + kv_local) * d, 6, 4, 4))
    ops += _attention_core(model, b, tp, attention, local_heads, kv_local)
    ops += [
        _gemm("proj", tokens, h, local_heads * d, bias=model.bias),
        _residual("residual1", model, share * h),
        _norm("ln2", model, share * h),
        *mlp_forward_ops(model, tokens, model.ffn, tp, input_shard=shard),
        _residual("residual2", model, share * h),
    ]
    return ops


def _context_parallel_ops(
    model: ModelSpec, micro_batch: int, tp: int, sp: bool, cp: int, cp_kind: str
) -> list[OpCost]:
    ops = layer_forward_ops(model, micro_batch, tp, sp, "flash")
    at = next(i for i, op in enumerate(ops) if op.name == "attn_core")
    local = ops[at]
    if cp_kind == "ring":
        blocks = [replace(local, name=f"attn_ring{j}", saved_bytes=0.0) for j in range(cp)]
        blocks[0] = replace(blocks[0], saved_bytes=local.saved_bytes)
        return [*ops[:at], *blocks, *ops[at + 1 :]]
    # Ulysses: the whole sequence, 1/cp of the rank's heads (the same bytes in and out)
    full = model.model_copy(update={"seq_len": model.seq_len * cp})
    heads, kv = model.heads // tp // cp, kv_heads_per_rank(model, tp) // cp
    (core,) = _attention_core(full, micro_batch, tp, "flash", heads, kv)
    return [*ops[:at], core, *ops[at + 1 :]]


# The linear layers FP8 recipes run on FP8 tensor cores (Transformer Engine's Linear and
# LayerNormLinear in each block, torchtitan's float8 conversion of the blocks' nn.Linear):
# the QKV, projection and MLP GEMMs and the experts' (routed and shared). Attention, the
# router and the
# output layer stay in bf16.
FP8_GEMMS = ("qkv", "proj", "fc1", "fc2", "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2")


def fp8_ops(ops: list[OpCost]) -> list[OpCost]:
    """``ops`` as an FP8 recipe runs them (Transformer Engine's delayed scaling): each
    FP8 GEMM runs on FP8 tensor cores and saves its input in FP8 (half the bytes), and
    before it a fused cast-and-amax kernel reads its bf16 input and writes FP8 (its
    backward: the output gradient's cast for the backward GEMMs)."""
    result: list[OpCost] = []
    for op in ops:
        if op.kind != GEMM or op.name not in FP8_GEMMS or op.shape is None:
            result.append(op)
            continue
        m, n, k = op.shape
        inputs, grads = float(op.batch * m * k), float(op.batch * m * n)
        cast = _elementwise(f"{op.name}.cast", inputs, 2, 3, 0)  # bf16 in, FP8 out
        result.append(replace(cast, backward_bytes=3.0 * grads, saved_bytes=0.0))
        result.append(replace(op, fp8=True, saved_bytes=op.saved_bytes / ACT_BYTES))
    return result


def backward_of(op: OpCost) -> list[OpCost]:
    """Backward ops of a forward op: dgrad and wgrad for a GEMM (for a batched GEMM, the
    gradients of both operands), FlashAttention's backward kernel (2.5× the forward's
    FLOPs: it recomputes the scores), an elementwise op's backward kernel. Remembered
    per op (ops are frozen values; every rank of a layout asks for the same ones)."""
    return list(_backward_of(op))


@functools.lru_cache(maxsize=4096)
def _backward_of(op: OpCost) -> tuple[OpCost, ...]:
    return tuple(_backward_ops(op))


def _backward_ops(op: OpCost) -> list[OpCost]:
    if op.kind == GEMM:
        assert op.shape is not None
        m, n, k = op.shape
        if op.batch > 1:  # dA = dC·Bᵀ, dB = Aᵀ·dC, per head
            first = _gemm(f"{op.name}.dgrad_a", m, k, n, batch=op.batch, saved=0.0)
            second = _gemm(f"{op.name}.dgrad_b", k, n, m, batch=op.batch, saved=0.0)
            return [first, second]
        dgrad = _gemm(f"{op.name}.dgrad", m, k, n, saved=0.0)
        wgrad = _gemm(f"{op.name}.wgrad", k, n, m, saved=0.0)
        return [
            replace(dgrad, weight_params=0, fp8=op.fp8, kernels=op.backward_kernels),
            replace(wgrad, weight_params=op.weight_params, fp8=op.fp8, kernels=op.backward_kernels),
        ]
    if op.kind == ATTENTION:
        # reads Q, K, V, O, dO and the log-sum-exp, writes dQ, dK, dV
        return [
            OpCost(
                f"{op.name}.bwd",
                ATTENTION,
                2.5 * op.flops,
                2.0 * op.bytes,
                2.0 * op.model_flops,
                op.shape,
                0,
                op.batch,
            )
        ]
    return [
        OpCost(
            f"{op.name}.bwd",
            op.kind,
            op.flops,
            op.backward_bytes or 1.5 * op.bytes,
            0.0,
            None,
            op.weight_params,
            kernels=op.backward_kernels,
        )
    ]


def embedding_op(model: ModelSpec, micro_batch: int, tp: int) -> OpCost:
    """Token embedding lookup (vocabulary split over TP ranks), plus the learned position
    embedding and the embedding dropout where the model has them. Its backward builds
    the dense gradient of the local table (``torch`` embedding backward: zeroed, then
    scattered into, then accumulated into the fp32 main gradient: about 12 bytes per
    table element) from the output gradient."""
    tokens = micro_batch * model.seq_len
    elements = tokens * model.hidden
    table = model.vocab // tp * model.hidden
    params = table + (model.seq_len * model.hidden if model.position == "learned" else 0)
    passes = 4 + (2 if model.position == "learned" else 0) + (3 if model.dropout else 0)
    return OpCost(
        "embedding",
        ELEMENTWISE,
        elements,
        passes * elements,
        0.0,
        weight_params=params,
        saved_bytes=elements if model.dropout else 0.0,
        backward_bytes=12.0 * table + 6.0 * elements,
    )


def final_norm_op(model: ModelSpec, micro_batch: int, shard: int = 1) -> OpCost:
    """The last stage's norm (on ``1/shard`` of the sequence with SP)."""
    return _norm("final_ln", model, micro_batch * model.seq_len * model.hidden / shard)


def logits_forward_op(model: ModelSpec, micro_batch: int, tp: int, shard: int = 1) -> OpCost:
    """The output (logits) GEMM of the last stage, vocabulary split across TP ranks; it
    saves its (SP-sharded) input."""
    tokens = micro_batch * model.seq_len
    saved = ACT_BYTES * tokens * model.hidden / shard
    return _gemm("logits", tokens, model.vocab // tp, model.hidden, saved=saved)


def loss_elements(model: ModelSpec, micro_batch: int, tp: int) -> float:
    """Logits one rank's loss reads per micro-batch (the vocabulary split over TP)."""
    return micro_batch * model.seq_len * model.vocab / tp


def loss_op(model: ModelSpec, micro_batch: int, tp: int) -> OpCost:
    """Megatron-LM's vocabulary-parallel cross-entropy over the local logits in fp32:
    cast (6 B/element), max (4), subtract (8), exp (8), sum (4), normalise (8) = 38
    B/element; it keeps the fp32 softmax (4 B/element) for the backward, which scales it
    in place and casts the gradient to bf16 (14 B/element)."""
    return _elementwise("loss", loss_elements(model, micro_batch, tp), 6, 38, 14, 4)


def checkpoint_bytes(model: ModelSpec, micro_batch: int, tp: int, sp: bool = False) -> float:
    """What full recompute keeps of a layer: its input, ``2sbh`` (÷t with SP)."""
    return ACT_BYTES * micro_batch * model.seq_len * model.hidden / (tp if sp else 1)


def layer_saved_bytes(
    ops: list[OpCost], recompute: str, attention: str, checkpoint: float
) -> float:
    """Activation bytes one layer keeps for backward, from its ops' saved tensors.

    ``none``: every op's. ``selective``: the attention core is rerun in the backward,
    so its saved tensors give way to its inputs Q, K and V (what the checkpoint keeps:
    the QKV projection's output, K and V not yet expanded to every query head).
    ``full``: only the layer's input (``checkpoint``)."""
    if recompute == "full":
        return checkpoint
    if recompute == "none":
        return sum(op.saved_bytes for op in ops)
    core = set(attention_core_names(attention)) | {
        op.name for op in ops if op.name.startswith("attn_ring")
    }
    kept = sum(op.saved_bytes for op in ops if op.name not in core)
    qkv = next(op for op in ops if op.name == "qkv")
    assert qkv.shape is not None  # a GEMM's
    m, n, _ = qkv.shape
    return kept + ACT_BYTES * m * n
