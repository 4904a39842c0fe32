"""What a kernel of a real trace is, in parasim's op kinds, from its name.

GPU kernels are named by the library that wrote them, and the families are stable
enough to read:

- **GEMM**: cuBLAS/cuBLASLt (``sm90_xmma_gemm_…``, ``ampere_bf16_s16816gemm_…``,
  ``volta_sgemm_…``, ``cublasLt…``), CUTLASS (``cutlass_80_tensorop_…``,
  ``cutlass::Kernel…``), Hopper's ``nvjet_…`` and anything naming a ``gemm``;
- **attention**: FlashAttention (``flash_fwd_kernel``, ``flash_bwd_…``), PyTorch's
  memory-efficient kernels (``fmha_cutlassF…``), cuDNN's fused attention
  (``cudnn_generated_fort_native_sdpa…``);
- **norm**: layer and RMS norms (``vectorized_layer_norm_kernel``, ``rms_norm…``);
- **optimizer**: ``multi_tensor_apply_kernel`` and fused Adam/AdamW/SGD kernels;
- **elementwise**: PyTorch's elementwise, reduction, softmax, copy, index and fill
  kernels (``vectorized_elementwise_kernel``, ``reduce_kernel``, ``softmax…``,
  ``CatArrayBatchedCopy``…);
- **communication**: NCCL's kernels, by collective, algorithm and protocol:
  ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL`` (NCCL 2.19 on),
  ``ncclKernel_AllReduce_RING_LL_Sum_float`` (before), ``ncclDevKernel_SendRecv``.

A CPU run has no kernels: its compute is the host's ATen ops, classified by op name
(``aten::mm`` a GEMM, ``aten::_scaled_dot_product_flash_attention`` attention...), and
its communication gloo's worker-thread ranges (``gloo:all_reduce``).

Anything else is **unknown**: reported by name and total time, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    REDUCE_SCATTER,
)

__all__ = [
    "COMMUNICATION",
    "FAMILIES",
    "KernelClass",
    "classify_cpu_op",
    "classify_kernel",
    "collective_of",
]

GEMM_FAMILY = "gemm"
ATTENTION_FAMILY = "attention"
NORM_FAMILY = "norm"
OPTIMIZER_FAMILY = "optimizer"
ELEMENTWISE_FAMILY = "elementwise"
COPY_FAMILY = "copy"
COMMUNICATION = "communication"
UNKNOWN = "unknown"
#: Every family, in the order reports list them.
FAMILIES = (
    GEMM_FAMILY,
    ATTENTION_FAMILY,
    NORM_FAMILY,
    ELEMENTWISE_FAMILY,
    OPTIMIZER_FAMILY,
    COPY_FAMILY,
    COMMUNICATION,
    UNKNOWN,
)


@dataclass(frozen=True, slots=True)
class KernelClass:
    """A kernel's family, and for NCCL's its collective, algorithm and protocol (as
    parasim names them: ``all_reduce``, ``ring``, ``LL128``) and data type, where the
    name says."""

    family: str
    collective: str | None = None
    algorithm: str | None = None
    protocol: str | None = None
    dtype: str | None = None


_NCCL_COLLECTIVES = {
    "allreduce": ALL_REDUCE,
    "allgather": ALL_GATHER,
    "reducescatter": REDUCE_SCATTER,
    "broadcast": BROADCAST,
    "bcast": BROADCAST,
    "reduce": ALL_REDUCE,  # NCCL's reduce: the all-reduce family's kernel
    "alltoall": ALL_TO_ALL,
    "sendrecv": "p2p",
    "send": "p2p",
    "recv": "p2p",
}
_NCCL_ALGORITHMS = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvlstree": "nvls",
    "collnet": "collnet",
    "collnetdirect": "collnet",
    "collnetchain": "collnet",
    "pat": "pat",
}
_NCCL_PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_NCCL_DTYPES = {
    "f32": "float32",
    "float": "float32",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "double": "float64",
    "i8": "int8",
    "int8_t": "int8",
    "u8": "uint8",
    "uint8_t": "uint8",
    "i32": "int32",
    "int32_t": "int32",
    "u32": "uint32",
    "i64": "int64",
    "int64_t": "int64",
    "u64": "uint64",
    "f8e4m3": "float8_e4m3",
    "f8e5m2": "float8_e5m2",
}


def _nccl(name: str) -> KernelClass | None:
    """NCCL's kernel ``name`` read, or None where it is not NCCL's."""
    if not name.startswith(("ncclKernel_", "ncclDevKernel_", "ncclDevFunc_")):
        return None
    words = name.split("(")[0].split("_")[1:]
    collective = algorithm = protocol = dtype = None
    for word in words:
        low = word.lower()
        if collective is None and low in _NCCL_COLLECTIVES:
            collective = _NCCL_COLLECTIVES[low]
        elif low in _NCCL_ALGORITHMS:
            algorithm = _NCCL_ALGORITHMS[low]
        elif low in _NCCL_PROTOCOLS:
            protocol = _NCCL_PROTOCOLS[low]
        elif low in _NCCL_DTYPES:
            dtype = _NCCL_DTYPES[low]
    if collective == "p2p":
        algorithm = algorithm or "direct"
    return KernelClass(COMMUNICATION, collective, algorithm, protocol, dtype)


_GEMM = re.compile(
    r"gemm|xmma|cutlass|nvjet|cublas|s16816|s1688|h16816|h884|hmma|wgmma|_gemv|gemv2|dot_kernel"
    r"|splitkreduce|matmul",
    re.IGNORECASE,
)
#: Kernels named like GEMMs that are not (FBGEMM's embedding and quantisation kernels).
_NOT_GEMM = re.compile(r"fbgemm", re.IGNORECASE)
_ATTENTION = re.compile(r"flash|fmha|attention|_sdpa|sdpa_|mha_", re.IGNORECASE)
_NORM = re.compile(
    r"layer_?norm|rms_?norm|batch_?norm|group_?norm|_norm_kernel|bn_fw|bn_bw|cudnn::bn_"
    r"|gammabetabackward|moments",
    re.IGNORECASE,
)
_OPTIMIZER = re.compile(r"multi_tensor_apply|adam|sgd_|lamb|lion|_foreach_", re.IGNORECASE)
_ELEMENTWISE = re.compile(
    r"elementwise|reduce_kernel|softmax|catarray|copy|fill|index|gather|scatter|embedding"
    r"|dropout|gelu|silu|swiglu|relu|rotary|rope|cross_entropy|nll_loss|cumsum|sort|topk"
    r"|transpose|permute|cast|convert|where|masked|arange|clamp|cunn_|vectorized|unrolled"
    r"|triton_|fused_|distribution_|bernoulli|uniform|normal_|pool|nchwtonhwc|nhwctonchw"
    r"|upsample|pad|im2col|col2im|bucketize|bounds_check|cub::|radix|histogram|unique"
    r"|quantize|dequant|fp8rowwise|qparam",
    re.IGNORECASE,
)


def classify_kernel(name: str, category: str = "kernel") -> KernelClass:
    """The family of a GPU kernel (or of a ``gpu_memcpy``/``gpu_memset``)."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return KernelClass(COPY_FAMILY)
    nccl = _nccl(name)
    if nccl is not None:
        return nccl
    if _ATTENTION.search(name):
        return KernelClass(ATTENTION_FAMILY)
    if _GEMM.search(name) and not _NOT_GEMM.search(name):
        return KernelClass(GEMM_FAMILY)
    if _NORM.search(name):
        return KernelClass(NORM_FAMILY)
    if _OPTIMIZER.search(name):
        return KernelClass(OPTIMIZER_FAMILY)
    if _ELEMENTWISE.search(name):
        return KernelClass(ELEMENTWISE_FAMILY)
    return KernelClass(UNKNOWN)


# -- a CPU run's ops -------------------------------------------------------------------

#: ATen ops that are GEMMs, with the positions of their two matrices in ``Input Dims``
#: (``aten::linear``'s weight is ``(n, k)``: transposed).
GEMM_OPS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1),
    "aten::matmul": (0, 1),
    "aten::bmm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::baddbmm": (1, 2),
    "aten::addbmm": (1, 2),
    "aten::linear": (0, 1),
    "aten::_scaled_mm": (0, 1),
}
ATTENTION_OPS = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math",
        "aten::_flash_attention_forward",
        "aten::_flash_attention_backward",
        "aten::_efficient_attention_forward",
        "aten::_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)
_GLOO = re.compile(r"^gloo:(\w+)$")
_GLOO_COLLECTIVES = {
    "all_reduce": ALL_REDUCE,
    "allreduce": ALL_REDUCE,
    "all_gather": ALL_GATHER,
    "allgather": ALL_GATHER,
    "_allgather_base": ALL_GATHER,
    "reduce_scatter": REDUCE_SCATTER,
    "_reduce_scatter_base": REDUCE_SCATTER,
    "all_to_all": ALL_TO_ALL,
    "alltoall": ALL_TO_ALL,
    "alltoall_base": ALL_TO_ALL,
    "broadcast": BROADCAST,
    "barrier": BARRIER,
    "send": "p2p",
    "recv": "p2p",
}


def collective_of(name: str) -> str | None:
    """The collective a gloo worker range (``gloo:all_reduce``) or a c10d call names."""
    found = _GLOO.match(name)
    if found is None:
        return None
    return _GLOO_COLLECTIVES.get(found.group(1))


def classify_cpu_op(name: str) -> KernelClass:
    """The family of a CPU run's ATen op (its compute runs there, not in kernels)."""
    if name in GEMM_OPS:
        return KernelClass(GEMM_FAMILY)
    if name in ATTENTION_OPS:
        return KernelClass(ATTENTION_FAMILY)
    collective = collective_of(name)
    if collective is not None:
        return KernelClass(COMMUNICATION, collective, "direct" if collective == "p2p" else "ring")
    base = name.removeprefix("aten::")
    if _NORM.search(base):
        return KernelClass(NORM_FAMILY)
    if _OPTIMIZER.search(base):
        return KernelClass(OPTIMIZER_FAMILY)
    if name.startswith("aten::"):
        return KernelClass(ELEMENTWISE_FAMILY)
    return KernelClass(UNKNOWN)
