"""What each software stack runs for a transformer block's elementwise ops, and what
its host spends issuing kernels.

``training.framework`` names the stack; ``training.compile`` says whether
``torch.compile`` runs on the model. The GEMMs and the attention core are the same
math in every stack (:mod:`simulator.arithmetic.layer_ops`); what differs is how the
small ops between them run:

* **megatron** (Megatron-Core with Transformer Engine, as ``layer_ops`` describes
  every op): the norm, the activation, the rotary embedding and Megatron's
  bias-dropout-add each run as one fused kernel (TE's ``LayerNormLinear``/RMSNorm,
  ``bias_swiglu_impl`` / TE's fused SwiGLU, TE's ``fused_rope``, Megatron's
  ``bias_dropout_add_fused_train``); the query, key and value projections are one
  GEMM, and so are the MLP's gate and up projections.
* **torchtitan** (its Llama model, ``torchtitan/models/llama3/model/model.py``, eager):
  the norm is ``nn.RMSNorm``, whose eager kernel in PyTorch 2.4–2.7 is the composite
  ``x * rsqrt(mean(x²) + eps) * w`` computed in fp32 (``aten/src/ATen/native/
  layer_norm.cpp``, ``rms_norm_symint``: an upcast, a square, a mean, an add and
  rsqrt, two multiplies and a downcast); the rotary embedding multiplies Q and K as
  complex fp32 numbers (``apply_rotary_emb``: ``.float()``, ``view_as_complex`` times
  ``freqs_cis``, ``view_as_real``, ``type_as``); SwiGLU is ``F.silu(w1(x)) * w3(x)``
  (two GEMMs, a silu and a multiply); the loss is ``F.cross_entropy`` on the logits
  cast to fp32.
* **fsdp1** and **deepspeed** wrap a Hugging Face Transformers Llama-style model
  (``transformers/models/llama/modeling_llama.py``): ``LlamaRMSNorm`` (``.to(float32)``,
  ``pow(2).mean``, ``rsqrt``, multiply, ``.to(input_dtype)``, times the weight), the
  ``rotate_half`` rotary embedding (``q * cos + rotate_half(q) * sin``: a slice, a
  negation, a concatenation, two multiplies and an add for each of Q and K), the MLP
  ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` and the loss on ``logits.float()``.

Each eager chain becomes one :class:`~simulator.arithmetic.layer_ops.OpCost` with the
kernel count and the HBM bytes of all its kernels (``kernels``, ``backward_kernels``),
and the bytes autograd saves for its backward. With ``compile``, Inductor fuses each
chain into one kernel that reads its inputs and writes its outputs once, as the fused
kernels do: the ops are Megatron's, a kernel each (the partitioner recomputes cheap
pointwise ops in the backward instead of saving them, so the saved bytes are the fused
kernels' too). The loss is not among them: the stacks compile their blocks, and the
loss stays the eager chain unless ``training.cross_entropy`` names a fused kernel
(``fused``: Apex's xentropy, a compiled loss, a Triton kernel; ``te``: Transformer
Engine's).

**Host dispatch.** Every kernel an eager stack launches costs the host the trip from
Python through the dispatcher and autograd to ``cudaLaunchKernel``: about 1 µs of
Python, 1 µs of pybind11, 1–3 µs of autograd recording, 1–2 µs of the ATen
dispatcher and 1–3 µs of launch, 5–25 µs in all by one public breakdown
(jiahuanglin.xyz, "From PyTorch op to kernel launch"); the PyTorch documentation of
CUDA graphs ("CUDA Graphs", torch.cuda docs) names the same CPU overhead as the reason
graphs exist. :data:`EAGER_DISPATCH_S` = 14 µs a kernel for the eager stacks is
measured: on the hosts of two H200 nodes (16-core Xeon virtual machines, PyTorch 2.11),
issuing a small op recorded by autograd took 13.2 and 14.6 µs, 11.3 and 12.5 µs without
autograd (``benchmarks/kernel_sweep.py``, section ``host``; benchmarks/RESULTS.md).
Inside real module code a kernel costs the host more, 41–53 µs, as the modules' Python
issues no kernel of its own (an eager Llama-2-7B block's 134 kernels forward and
backward took 7.1 ms to issue; a torchtitan-style MoE block's 215 took 8.9 ms, against
10.3 ms of GPU work: near host-bound). Simplified: the model charges the bare op's
cost per kernel it counts, and counts fewer kernels than an MoE block issues. Kernels
an Inductor-compiled graph launches from its generated wrapper pay no dispatcher and
no autograd recording per op, only the launcher and the driver:
:data:`COMPILED_DISPATCH_S` = 3 µs (a whole compiled call of one kernel took 48 and 55
µs on the same hosts, most of it the call's guards and wrapper, which this per-kernel
figure spreads over a block's kernels: simplified). A kernel starts no
earlier than the host has issued it; a model whose kernels are shorter than that
becomes host-bound (the engine's ``host_index``). A calibration profile's
``gpu.host_overhead`` replaces the stack's figure. Megatron-Core's host is taken to
stay ahead (0): its few fused kernels per layer are long at the sizes it is run at; a
host-bound Megatron run (a very small model) is described by setting
``gpu.host_overhead``.

Simplified: the separate Q, K, V (and gate, up) GEMMs of the PyTorch stacks keep the
fused GEMM's shape (their FLOPs and bytes are the same; a narrower GEMM's lower
efficiency is not modelled), counted as that many kernels; torch.compile's fusion of a
residual add into the following norm is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.common.vocabulary import FRAMEWORKS

__all__ = [
    "Kernels",
    "Stack",
    "STACKS",
    "EAGER_DISPATCH_S",
    "COMPILED_DISPATCH_S",
    "EAGER_BF16_CROSS_ENTROPY",
    "FUSED_CROSS_ENTROPY",
    "FUSED_FP32_CROSS_ENTROPY",
    "TE_CROSS_ENTROPY",
    "stack_of",
    "restack",
    "loss_peak_bytes",
]

EAGER_DISPATCH_S = 14e-6
COMPILED_DISPATCH_S = 3e-6


@dataclass(frozen=True)
class Kernels:
    """An elementwise chain as a stack runs it, per element of the op's tensor:
    ``forward`` and ``backward`` kernel counts, HBM bytes moved by all of them
    (``forward_bytes``, ``backward_bytes``), bytes saved for the backward, and the
    bytes held beyond those at the chain's busiest moment (``peak``: its inputs and
    intermediates while a kernel runs, forward or backward)."""

    forward: int
    forward_bytes: float
    backward: int
    backward_bytes: float
    saved: float
    peak: float = 0.0


# torchtitan's and the Hugging Face model's RMSNorm in eager mode, per element of x
# (bf16 in and out, fp32 inside). Forward: upcast (read 2, write 4), square (4, 4),
# mean (4 read), add eps and rsqrt (per row: nothing per element), x * rstd (4, 4),
# downcast (4, 2), times the weight (2, 2): 7 kernels, 36 B. Autograd keeps the fp32
# x (for the square's and the multiply's backward) and the bf16 normalised x (for the
# weight's gradient): 6 B. Backward: the weight product (dy·w: 2+2, and the weight
# gradient's dy·x̂ reduction: 4), the downcast's upcast (2, 4), the rstd product (4,
# 4, and its row reduction 8), the square's 2x·g (8, 4), the sum of the two paths (8,
# 4) and the downcast of dx (4, 2): about 10 kernels, 64 B.
EAGER_RMSNORM = Kernels(7, 36.0, 10, 64.0, 6.0)
# torchtitan's complex rotary embedding, per element of Q or K: .float() (2, 4), the
# complex product with freqs_cis (4, 4), type_as (4, 2): 3 kernels, 20 B, nothing
# saved but the (shared) frequencies; the backward is the same chain conjugated.
TITAN_ROPE = Kernels(3, 20.0, 3, 20.0, 0.0)
# The Hugging Face rotate_half embedding, per element of Q or K: q·cos (2, 2), the
# negated half (1, 1), the concatenation (2, 2), its product with sin (2, 2) and the
# add (4, 2): 5 kernels, 18 B; the backward mirrors it (the slice and concatenation
# backward are copies): 5 kernels, 18 B.
HF_ROPE = Kernels(5, 18.0, 5, 18.0, 0.0)
# SwiGLU as silu(gate) * up, per output element: silu (2, 2), multiply (4, 2): 2
# kernels, 10 B; autograd keeps gate, up and silu(gate): 6 B. Backward: dy·up (4, 2),
# dy·silu (4, 2), silu's backward (4, 2): 3 kernels, 18 B.
EAGER_SWIGLU = Kernels(2, 10.0, 3, 18.0, 6.0)
# GeLU MLPs in eager PyTorch: F.gelu (2, 2), its backward (4, 2); saves its input.
EAGER_GELU = Kernels(1, 4.0, 1, 6.0, 2.0)
# Cross-entropy on logits cast to fp32, per logit: the cast (2, 4), log_softmax (a
# max and sum pass reading 4 + 4, writing 4), the NLL gather (nothing per element):
# 3 kernels, 18 B; it keeps the fp32 log-probabilities (4 B). Backward: NLL's
# scatter into zeros (4), log_softmax's backward (8, 4), the cast back (4, 2): 3
# kernels, 22 B. Its busiest moment is log_softmax's backward: the gradient NLL wrote
# (4) and the one it writes (4) beside the saved log-probabilities: 8 B beyond them
# (the forward holds the bf16 logits and their fp32 copy beside its output: 6).
EAGER_CROSS_ENTROPY = Kernels(3, 18.0, 3, 22.0, 4.0, peak=8.0)
# F.cross_entropy straight on bf16 logits (``eager-bf16``: fms-fsdp's train loop on the
# fms LLaMA's logits, which it does not upcast: fms_fsdp/utils/train_utils.py at
# ed74fd5): log_softmax reads the row twice and writes bf16 log-probabilities (2 + 2 +
# 2), which it keeps (2); the NLL gather is per row. Backward: NLL's scatter into
# zeros (2), log_softmax's backward (2 + 2 read, 2 written): 2 kernels, 8 B; its
# busiest moment holds those two bf16 gradients beside the kept output: 4.
EAGER_BF16_CROSS_ENTROPY = Kernels(1, 6.0, 2, 8.0, 2.0, peak=4.0)
# One fused softmax-cross-entropy kernel pair, per logit (``training.cross_entropy:
# fused``): Apex's xentropy as flash-attention's training scripts run it
# (training/src/losses/cross_entropy_apex.py at flash-attention 4a6eaa9f, with
# inplace_backward), or the loss under torch.compile (OLMo-core's compile_loss,
# torchtune's compile): the forward reads the bf16 logits twice (the row's max, then
# the sum of exponentials) and keeps them (2 B) with one log-sum-exp per row, to
# recompute the softmax in the backward, which reads them once and writes their
# gradient once: 4 B each way. Beyond the kept logits it holds only the bf16 gradient
# it writes (2; Apex's inplace_backward writes it over the logits, none).
FUSED_CROSS_ENTROPY = Kernels(1, 4.0, 1, 4.0, 2.0, peak=2.0)
# The fused pair on logits the model casts to fp32 before the loss (``fused-fp32``:
# torchtune's decoder ends in ``self.output(h).float()``, torchtune/modules/
# transformer.py at 1814feb17, and its recipes wrap the loss in torch.compile,
# ``training.compile_loss``): the eager cast (2 + 4) and the fused forward reading the
# fp32 logits twice (8), which it keeps (4); the backward reads them and writes the
# fp32 gradient (4 + 4), cast back to bf16 (4 + 2). Beyond the kept logits its
# backward holds the fp32 gradient and its bf16 cast: 6.
FUSED_FP32_CROSS_ENTROPY = Kernels(2, 14.0, 2, 14.0, 4.0, peak=6.0)
# Transformer Engine's Triton cross-entropy (``te``; Megatron-Core's
# --cross-entropy-loss-fusion --cross-entropy-fusion-impl te;
# transformer_engine/pytorch/triton/cross_entropy.py at TE d0067d0): the forward's
# online-softmax kernel reads the logits (2), its second kernel reads them again and
# writes their gradient in fp32 (2 + 4), which it keeps for the backward (4); the
# backward scales that gradient in place (4 + 4) and autograd casts it to the logits'
# bf16 (4 + 2): 8 B in 2 kernels, 14 B in 2. Beyond the kept gradient it holds the
# bf16 logits in the forward (Megatron's GPTModel.forward still refers to them) and
# the bf16 gradient in the backward: 2.
TE_CROSS_ENTROPY = Kernels(2, 8.0, 2, 14.0, 4.0, peak=2.0)
# Megatron-Core's own vocabulary-parallel cross-entropy (``layer_ops.loss_op``; the
# stacks' ``loss`` is None): it casts the logits to fp32 and turns that copy into the
# softmax in place, which it keeps (4); beyond it the bf16 logits while it runs, and
# the gradient cast back to their bf16 in the backward: 2 B per logit.
VOCAB_PARALLEL_LOSS_PEAK = 2.0


@dataclass(frozen=True)
class Stack:
    """The choices of one framework (with or without torch.compile) that decide the
    elementwise kernels and the host's dispatch cost."""

    framework: str
    compiled: bool
    norm: Kernels | None  # None: the fused kernel of layer_ops
    rope: Kernels | None
    swiglu: Kernels | None
    gelu: Kernels | None
    loss: Kernels | None
    # GEMMs the fused QKV and gate-up GEMMs are issued as
    qkv_kernels: int
    fc1_kernels: int
    dispatch_s: float  # host seconds to issue one kernel

    @property
    def fused(self) -> bool:
        """Every elementwise chain is one kernel (Megatron's, or compiled)."""
        return all(k is None for k in (self.norm, self.rope, self.swiglu, self.gelu, self.loss))


def _stack(framework: str, compiled: bool) -> Stack:
    pytorch = framework != "megatron"
    eager = pytorch and not compiled
    # the PyTorch stacks compile their blocks, not the loss (torchtitan's apply_compile
    # wraps each TransformerBlock; fms-fsdp's and HF trainers' loss runs outside the
    # compiled model): F.cross_entropy on fp32 logits either way
    rope = TITAN_ROPE if framework == "torchtitan" else HF_ROPE
    return Stack(
        framework=framework,
        compiled=compiled,
        norm=EAGER_RMSNORM if eager else None,
        rope=rope if eager else None,
        swiglu=EAGER_SWIGLU if eager else None,
        gelu=EAGER_GELU if eager else None,
        loss=EAGER_CROSS_ENTROPY if pytorch else None,
        qkv_kernels=3 if pytorch else 1,
        fc1_kernels=2 if pytorch else 1,
        dispatch_s=0.0 if not pytorch else COMPILED_DISPATCH_S if compiled else EAGER_DISPATCH_S,
    )


STACKS = {
    (framework, compiled): _stack(framework, compiled)
    for framework in FRAMEWORKS
    for compiled in (False, True)
}


_LOSSES = {
    "eager-bf16": EAGER_BF16_CROSS_ENTROPY,
    "fused": FUSED_CROSS_ENTROPY,
    "fused-fp32": FUSED_FP32_CROSS_ENTROPY,
    "te": TE_CROSS_ENTROPY,
}


def stack_of(framework: str, compiled: bool = False, cross_entropy: str = "auto") -> Stack:
    """The :class:`Stack` of a framework, compiled or not, with its loss's kernels
    (``training.cross_entropy``; ``auto``: the stack's own)."""
    stack = STACKS[(framework, compiled)]
    if cross_entropy == "auto":
        return stack
    return replace(stack, loss=_LOSSES[cross_entropy])


def loss_peak_bytes(stack: Stack) -> float:
    """Bytes per logit the stack's loss holds at its busiest moment beyond what it
    saves for the backward (the memory model's ``transient`` term)."""
    return VOCAB_PARALLEL_LOSS_PEAK if stack.loss is None else stack.loss.peak


def _chain(op, kernels: Kernels, elements: float):
    return replace(
        op,
        bytes=kernels.forward_bytes * elements,
        backward_bytes=kernels.backward_bytes * elements,
        saved_bytes=kernels.saved * elements,
        kernels=kernels.forward,
        backward_kernels=kernels.backward,
    )


def restack(ops: list, stack: Stack) -> list:
    """``ops`` (one layer's, or the last stage's head) as ``stack`` runs them."""
    if stack.fused and stack.qkv_kernels == 1 and stack.fc1_kernels == 1:
        return ops
    result = []
    for op in ops:
        name = op.name
        if stack.norm is not None and name in ("ln1", "ln2", "final_ln"):
            # a fused norm moves 4 B per element (layer_ops._norm)
            op = _chain(op, stack.norm, op.bytes / 4.0)
        elif stack.rope is not None and name == "rope":
            op = _chain(op, stack.rope, op.bytes / 4.0)
        elif stack.swiglu is not None and name.endswith("swiglu"):
            op = _chain(op, stack.swiglu, op.bytes / 6.0)
        elif stack.gelu is not None and name.endswith("gelu"):
            op = _chain(op, stack.gelu, op.bytes / 4.0)
        elif stack.loss is not None and name == "loss":
            op = _chain(op, stack.loss, op.bytes / 38.0)
        elif name == "qkv" and stack.qkv_kernels > 1:
            op = replace(op, kernels=stack.qkv_kernels, backward_kernels=stack.qkv_kernels)
        elif name == "fc1" and stack.fc1_kernels > 1:
            op = replace(op, kernels=stack.fc1_kernels, backward_kernels=stack.fc1_kernels)
        result.append(op)
    return result
