"""How fast a grouped GEMM runs: many small per-expert GEMMs in one kernel.

A mixture-of-experts layer runs its local experts as one *grouped* GEMM: ``groups``
problems ``(m_g, n, k)`` that share ``n`` and ``k`` but each have their own weight and
their own (ragged, data-dependent) row count ``m_g`` — Megatron-Core's
``--moe-grouped-gemm`` (Transformer Engine's ``GroupedLinear``), torchtitan's
``torch._grouped_mm``, DeepSeek's DeepGEMM "m-grouped" kernels. A persistent kernel
walks the tiles of all groups, so the tile and wave arithmetic of :mod:`.gemm` holds
over the sum of the groups' tiles, with two differences this module models:

* **no split-K**: grouped kernels tile only the output (CUTLASS's grouped and
  pointer-array kernels, DeepGEMM's m-grouped contiguous and masked layouts), so a
  group with few tiles cannot borrow idle SMs by splitting its reduction;
* **the weights stream per group**: every group reads its own ``n × k`` weight, used by
  only ``⌈m_g/Mt⌉`` row-tiles. When ``m_g`` shrinks each weight byte feeds fewer
  FLOPs, and the loads no longer hide behind the math: part of the weight stream
  shows. This module charges ``WEIGHT_STREAM_EXPOSED`` of it on top of the math,
  ``flops/(peak·efficiency) + WEIGHT_STREAM_EXPOSED · weight_bytes/stream_bandwidth``.

Grounding (DeepGEMM README, "Grouped GEMMs for MoE models", commit 55ab91f of
deepseek-ai/DeepGEMM, March 2025, FP8 on H800 SXM5, whose dense FP8 peak is the H100
SXM's 1979 TFLOP/s): with the total rows fixed at 1024 and split over 1, 2 and 4 groups
(masked layout), ``n=4096, k=7168`` runs at 1233, 1040 and 932 TFLOP/s, and
``n=7168, k=2048`` at 925, 916 and 815; the contiguous layout with 4096–8192 rows per
group reaches 1214–1346. The tile model alone (the DGX-H100 preset's base 0.66, 132
SMs, 256×128 tiles) gives the same speed for all three splits, since 256-row groups
tile exactly; with the weight stream ``WEIGHT_STREAM_EXPOSED = 0.4`` exposed it gives
1130/1051/924 and 925/871/781 TFLOP/s (within 8%, mean 3.5%), and 1176/1121 for the
contiguous rows (−13% and −8%, of which the dense model's own error is −9%/−6%).

**Transformer Engine's loop.** Megatron-Core's ``--moe-grouped-gemm`` runs TE's
``GroupedLinear``, which is not one kernel: ``nvte_multi_tensor_gemm`` issues one
cuBLASLt GEMM per expert, round-robin over 4 compute streams (TransformerEngine
d0067d0, ``common/gemm/cublaslt_gemm.cu``; the CUTLASS grouped kernel only with
``NVTE_USE_CUTLASS_GROUPED_GEMM=1`` on Hopper). With ``streams`` given, the tile and
wave arithmetic holds over the tiles of ``streams`` experts at a time rather than over
all of them, so a few short experts leave SMs idle that one grouped kernel would fill.
Measured on one H200 (``benchmarks/kernel_sweep.py``, section ``expert_loop``: the
loop captured in a CUDA graph, 4 streams) against ``torch._grouped_mm`` at the
Qwen3-30B-A3B experts' shapes: 16 experts of 2048 rows run the loop at 584–712 TFLOP/s,
one grouped kernel at 575–707; 16 experts of 512 rows at 419 against 586. The model
gives the loop 585–693 and 520 there (within 7% at 2048 rows; 24% fast at 512 rows,
where the measured streams barely overlap: one stream ran at 393).

The row count of each group reaches this module through the op's ``shape``: a
``grouped_gemm`` op is ``batch`` groups of ``(m, n, k)`` with ``m`` the mean padded rows
per group and each group's weight ``n × k``; a ``grouped_gemm_wgrad`` op computes each
group's weight gradient, ``(k_in, n_out, m)`` with the short per-group rows as its
reduction and the ``shape[0] × shape[1]`` gradient per group written once.
Simplified: the groups' ragged sizes are folded into their mean (a rank's imbalance
between experts still shows as the rows it received); there is no per-group
scheduling cost beyond the tile prologue ``K_OVERHEAD`` of :mod:`.gemm`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.common.vocabulary import GROUPED_GEMM_WGRAD
from simulator.engine.gemm import K_OVERHEAD, TILE_REUSE_CONSTANT, tile_shapes

__all__ = [
    "GROUPED_KINDS",
    "WEIGHT_STREAM_EXPOSED",
    "grouped_gemm_efficiency",
    "grouped_weight_elements",
    "grouped_gemm_seconds",
]

#: Op kinds timed here: the forward and input-gradient GEMMs (per-group ``n × k``
#: weight), and the weight-gradient GEMM (per-group ``shape[0] × shape[1]`` output).
GROUPED_KINDS = ("grouped_gemm", "grouped_gemm_wgrad")
#: Share of the per-group weight stream that shows beside the math: fitted to the
#: DeepGEMM README's grouped-GEMM table (commit 55ab91f, H800), see the module docstring.
WEIGHT_STREAM_EXPOSED = 0.4


def _reuse(tile: tuple[int, int]) -> float:
    return tile[0] * tile[1] / (tile[0] + tile[1])


def grouped_gemm_efficiency(
    m: int,
    n: int,
    k: int,
    groups: int,
    *,
    base: float,
    sm_count: int,
    largest_tile: Sequence[int],
    k_overhead: float = K_OVERHEAD,
    streams: int = 0,
) -> float:
    """Fraction of peak the math of ``groups`` GEMMs ``(m, n, k)`` in one grouped
    kernel reaches: tile quantisation of each group's short ``m``, waves over all the
    groups' tiles, tile reuse and the per-tile prologue of :mod:`.gemm`, no split-K.
    ``streams`` > 0: one GEMM per group over that many streams, the waves over
    ``streams`` groups' tiles at a time (Transformer Engine's loop)."""
    if min(m, n, k, groups) <= 0:
        return base
    if streams > 0:
        groups = min(groups, streams)
    largest = (int(largest_tile[0]), int(largest_tile[1]))
    best = 0.0
    for tm, tn in tile_shapes(largest):
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        useful = (m * n) / (tiles_m * tm * tiles_n * tn)
        relative = (1 + TILE_REUSE_CONSTANT / _reuse(largest)) / (
            1 + TILE_REUSE_CONSTANT / _reuse((tm, tn))
        )
        ctas = groups * tiles_m * tiles_n
        waves = math.ceil(ctas / sm_count)
        occupancy = ctas / (waves * sm_count)
        best = max(best, useful * relative * occupancy * k / (k + k_overhead))
    return base * best


def grouped_weight_elements(kind: str, shape: tuple[int, int, int], groups: int) -> int:
    """Elements of the per-group operand every group streams once: its weight
    (``n × k``) for ``grouped_gemm``, its weight gradient for ``grouped_gemm_wgrad``."""
    m, n, k = shape
    per_group = m * n if kind == GROUPED_GEMM_WGRAD else n * k
    return groups * per_group


def grouped_gemm_seconds(
    op,
    peak: float,
    stream_bandwidth: float,
    *,
    base: float,
    sm_count: int | None,
    largest_tile: Sequence[int] | None,
    k_overhead: float = K_OVERHEAD,
    streams: int = 0,
) -> float:
    """Seconds of a grouped-GEMM op (a Compute with ``kind`` in :data:`GROUPED_KINDS`,
    ``shape`` and ``batch`` groups): its math at :func:`grouped_gemm_efficiency` (the
    base efficiency alone without SMs and a tile) plus the exposed share of its
    per-group weight stream (1 byte per element on FP8 tensor cores, else 2)."""
    efficiency = base
    if op.shape is None:
        return op.flops / (peak * efficiency)
    m, n, k = op.shape
    if sm_count is not None and largest_tile is not None:
        efficiency = grouped_gemm_efficiency(
            m,
            n,
            k,
            op.batch,
            base=base,
            sm_count=sm_count,
            largest_tile=largest_tile,
            k_overhead=k_overhead,
            streams=streams,
        )
    element = 1 if op.fp8 else 2
    weights = grouped_weight_elements(op.kind, op.shape, op.batch) * element
    return op.flops / (peak * efficiency) + WEIGHT_STREAM_EXPOSED * weights / stream_bandwidth
