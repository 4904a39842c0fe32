"""How fast a fused attention kernel runs, from its published benchmarks: by backend,
GPU, head dimension and sequence length, with the causal mask.

``training.attention_backend`` names the kernel behind ``attention: flash``; ``auto``
takes the one the run's software stack picks (:func:`resolve_backend`):

* **megatron** (Transformer Engine): cuDNN's fused attention on Hopper and Blackwell,
  FlashAttention-2 on Ampere. Transformer Engine's ``get_attention_backend``
  (``transformer_engine/pytorch/attention/dot_product_attention/utils.py``) disables
  FlashAttention "to give FusedAttention preference on Hopper+ for performance
  reasons" when both can run (compute capability 9.0 and up).
* **torchtitan, fsdp1, deepspeed** (``F.scaled_dot_product_attention``): PyTorch's
  flash backend (``sdpa``), the FlashAttention-2 kernel as PyTorch vendors and builds
  it, which SDPA's ``sdp_utils.cpp`` tries first in PyTorch 2.4 and 2.5.1 to 2.10 (2.5.0
  alone put cuDNN first on H100 and was reverted, pytorch/pytorch#138522; cuDNN first
  again only with cuDNN above 9.15). Where no measurement of it is tabulated (A100),
  the standalone FlashAttention-2's figures stand for it (``fa2``).

Each table holds a kernel's forward-plus-backward TFLOP/s with the causal mask at head
dimension 128 (and 64 where published), over sequence lengths, on the GPU it was
measured on; the FLOPs are counted as the benchmarks count them (the forward
``4·b·s²·h·d`` halved for the causal mask, the backward 2.5 times the forward), so a
causal op's time is half its full FLOPs over the rate. Forward and backward published
apart are combined as ``3.5 / (1/fwd + 2.5/bwd)``. A rate becomes a share of its GPU's
dense BF16 peak (the datasheets': A100 312, H100 and H200 989.4, B200 2,250, GB200
2,500 TFLOP/s) and applies to the GPUs of the same kind, at the run's sustained clock
like every microbenchmark rate (``gpu.sustained_fraction``).

Sources:

* **FlashAttention-2, A100 80GB and H100 80GB SXM5**: the figures
  ``assets/flash2_a100_fwd_bwd_benchmark.png`` and ``flash2_h100_fwd_bwd_benchmark.png``
  of Dao-AILab/flash-attention (commit 0251105a, the README's and the FlashAttention-2
  paper's figures: batch × sequence = 16k tokens, hidden 2048, BF16/FP16), the bar
  labels of the causal panels, head dimension 64 and 128, 512 to 16k.
* **cuDNN, Hopper**: NVIDIA/cudnn-frontend
  ``benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv``
  (cuDNN 9.19.1, H200, GQA 64/8 heads, head dimension 128, batch 1, causal), 2k to 32k;
  512 and 1024 follow parasim's own measurement of cuDNN 9.19 on an H200
  (``benchmarks/kernel_sweep.py``), scaled to the published 2k point.
* **SDPA's flash backend, Hopper**: parasim's own measurement on an H200
  (``benchmarks/kernel_sweep.py``; ``benchmarks/measurements/h200-kernels.json``:
  PyTorch 2.11.0+cu130, 16 heads of head dimension 128, batch × sequence = 16k tokens,
  causal, forward and backward timed together), 512 to 16k. It runs 5% (16k) to 34%
  (512) below the standalone FlashAttention-2's published H100 figures at the same
  shapes.
* **cuDNN and FlashAttention-2, B200**: cudnn-frontend
  ``benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv``
  (commit be6c079: cuDNN 9.13.1, PyTorch 2.9.0, GQA 128/8, head dimension 128, batch 1,
  causal): PyTorch SDPA's cuDNN and flash backends, 512 to 128k.
* **cuDNN and FlashAttention-2, GB200**: cudnn-frontend
  ``benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv``
  (commit b372d39: cuDNN 9.17.0, PyTorch 2.10, GQA 128/8, head dimension 128, batch 1,
  causal): the cuDNN frontend and PyTorch SDPA's flash backend, 512 to 128k. On B200
  and GB200 the ``fa2`` and ``sdpa`` tables are both these SDPA measurements.

Each benchmark launched its own grid of CTAs (one per 128 queries and head: 2,048 in
FlashAttention-2's figures and parasim's sweep, ``s/2`` in the cudnn-frontend H200
table, ``s`` in the Blackwell ones), and a kernel fills the SMs less well the fewer
CTAs it has: a launch of ``G`` CTAs reaches ``G / (G + 1.5·SMs)`` of the full-grid rate
(:func:`grid_fill`, :data:`ATTENTION_TAIL_WAVES`). A table's rate is taken out of its
benchmark's fill and put at the op's, so a run's attention at 8 heads per rank under TP
runs slower than the same sequence at 64 heads.

Between the published points the rate is linear in ``log2(s)`` and in the head
dimension; beyond them it is the nearest point's. Simplified: cuDNN's rate is taken at
head dimension 128 for every head dimension (its published sweeps are at 128 only); a
head dimension above 128 takes FlashAttention-2's rate at 128; SDPA's Hopper rate is
measured at head dimension 128 only and stands for every head dimension; forward and
backward ops each run at the combined rate; the grid's fill is one curve for every
kernel and GPU, fitted on the H200 (the B200's published 512-token rate is a twentieth
of its 32k one, more than its grid of 512 CTAs explains). FlashAttention-3 is not
tabulated: its backward figures are published only as images whose mask we could not
read; name it through ``gpu.attention_efficiency``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ATTENTION_TAIL_WAVES",
    "grid_fill",
    "KernelTable",
    "TABLES",
    "resolve_backend",
    "table_for",
    "combined",
]

#: The fill of a launch's grid: an attention kernel of ``G`` CTAs on ``SMs`` SMs reaches
#: ``G / (G + 1.5·SMs)`` of its full-grid rate. The causal CTAs differ in length (query
#: block ``i`` visits ``i + 1`` key blocks), and the last ones run with the SMs part
#: idle: about one and a half waves of tail. Fitted on parasim's own H200 measurement
#: (benchmarks/measurements/h200-kernels.json, "attention_cases" against the sweep at
#: 2,048 CTAs): seven shapes of validated runs from 192 to 2,048 CTAs, FlashAttention-2
#: and cuDNN alike, within 2.6% on mean |log| (12.7% at worst) where wave quantisation
#: alone is 16% (46%).
ATTENTION_TAIL_WAVES = 1.5


def combined(forward: float, backward: float) -> float:
    """Forward-plus-backward rate from forward and backward rates, the backward doing
    2.5 times the forward's FLOPs (FlashAttention's and cudnn-frontend's count)."""
    return 3.5 / (1.0 / forward + 2.5 / backward)


def grid_fill(ctas: float, sm_count: int) -> float:
    """The share of an attention kernel's full-grid rate that a launch of ``ctas`` CTAs
    reaches on ``sm_count`` SMs: ``ctas / (ctas + ATTENTION_TAIL_WAVES · SMs)``."""
    return ctas / (ctas + ATTENTION_TAIL_WAVES * sm_count)


def _published_ctas(heads: int, tokens: int | None = None):
    """The CTAs of a benchmark's calls: ``heads`` query heads (``heads`` at head
    dimension 128, scaled to keep the hidden size at others), a batch of ``tokens /
    s`` sequences (1 without ``tokens``), one CTA per 128 queries."""

    def ctas(seq_len: int, head_dim: int) -> int:
        batch = max(1, tokens // seq_len) if tokens else 1
        return batch * max(1, heads * 128 // head_dim) * max(1, math.ceil(seq_len / 128))

    return ctas


@dataclass(frozen=True)
class KernelTable:
    """One kernel's causal forward-plus-backward TFLOP/s on one GPU, as published at
    the grid of CTAs its benchmark launched."""

    backend: str
    gpu: str  # the kind of GPU it was measured on: a100 | h100 | b200 | gb200
    peak_flops: float  # that GPU's dense BF16 peak, FLOP/s
    # head dimension -> ((sequence length, TFLOP/s), ...), sequence lengths ascending
    rates: dict[int, tuple[tuple[int, float], ...]]
    sm_count: int  # that GPU's SMs
    # (sequence length, head dimension) -> CTAs of the benchmark's launch
    source_ctas: Callable[[int, int], int]

    def full_grid_efficiency(self, head_dim: int, seq_len: int) -> float:
        """The share of the peak at ``head_dim`` and ``seq_len`` with the grid's fill
        taken out (:func:`grid_fill`): what a launch of unbounded CTAs would reach."""
        fill = grid_fill(self.source_ctas(seq_len, head_dim), self.sm_count)
        return self.efficiency(head_dim, seq_len) / fill

    def efficiency(self, head_dim: int, seq_len: int) -> float:
        """The share of the peak at ``head_dim`` and ``seq_len``."""
        dims = sorted(self.rates)
        low = max([d for d in dims if d <= head_dim], default=dims[0])
        high = min([d for d in dims if d >= head_dim], default=dims[-1])
        at_low = _along(self.rates[low], seq_len)
        if high == low:
            rate = at_low
        else:
            at_high = _along(self.rates[high], seq_len)
            rate = at_low + (at_high - at_low) * (head_dim - low) / (high - low)
        return rate * 1e12 / self.peak_flops


def _along(points: tuple[tuple[int, float], ...], seq_len: int) -> float:
    """The rate at ``seq_len``: linear in log2 between points, the end points' beyond."""
    if seq_len <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:], strict=False):
        if seq_len <= s1:
            t = (math.log2(seq_len) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
            return r0 + (r1 - r0) * t
    return points[-1][1]


_SEQ_FA = (512, 1024, 2048, 4096, 8192, 16384)
_SEQ_2K = (2048, 4096, 8192, 16384, 32768)
_SEQ_B = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _pairs(seqs: tuple[int, ...], rates: tuple[float, ...]) -> tuple[tuple[int, float], ...]:
    return tuple(zip(seqs, rates, strict=True))


def _split(seqs: tuple[int, ...], fwd_bwd: tuple[tuple[float, float], ...]):
    return _pairs(seqs, tuple(combined(f, b) for f, b in fwd_bwd))


# The grids the published benchmarks launched: FlashAttention-2's figures 16k tokens a
# call at hidden 2048 (16 heads of 128, 32 of 64); cudnn-frontend batch 1 with 64 query
# heads (H200) or 128 (B200, GB200)
_FA2_FIGURES = _published_ctas(16, 16384)
_CUDNN_FRONTEND_H200 = _published_ctas(64)
_CUDNN_FRONTEND_BLACKWELL = _published_ctas(128)

# the SMs of the GPUs the tables were measured on, as the presets give them
_HOPPER_SMS = 132  # H100 and H200 (the GH100 die)
_BLACKWELL_SMS = 148  # B200 and GB200

_CUDNN_H100 = _split(_SEQ_2K, ((484, 370), (591, 474), (644, 541), (673, 579), (688, 581)))
# Below 2k, where the published sweep stops, the shape of parasim's own measurement of
# the same cuDNN (9.19, through SDPA's cuDNN backend) on an H200 at 16k tokens per call
# (benchmarks/measurements/h200-kernels.json: 172.7, 267.7 and 377.9 TFLOP/s at 512,
# 1024 and 2048), scaled to the published 2k point: a short sequence gives each CTA
# fewer key blocks to amortise its start over, so the rate falls, not stays.
# The measurement ran 2,048 CTAs at every length, the published table 64 heads at batch
# 1 (s/2 CTAs): each point is set at the table's own grid (grid_fill).
_CUDNN_H200_MEASURED = {512: 172.7, 1024: 267.7, 2048: 377.9}
_CUDNN_H100_SHORT = tuple(
    (
        seq,
        _CUDNN_H100[0][1]
        * _CUDNN_H200_MEASURED[seq]
        / _CUDNN_H200_MEASURED[2048]
        * grid_fill(_CUDNN_FRONTEND_H200(seq, 128), _HOPPER_SMS)
        / grid_fill(_CUDNN_FRONTEND_H200(2048, 128), _HOPPER_SMS),
    )
    for seq in (512, 1024)
)

# PyTorch SDPA's flash backend on Blackwell (cudnn-frontend's tables, see above)
_SDPA_FLASH_B200 = {
    128: _split(
        _SEQ_B,
        (
            (74.6, 83.0),
            (165.5, 107.7),
            (242.4, 186.3),
            (324.9, 256.4),
            (373.4, 298.9),
            (394.5, 320.0),
            (403.7, 330.8),
            (408.7, 335.4),
            (411.0, 336.0),
        ),
    )
}
_SDPA_FLASH_GB200 = {
    128: _split(
        _SEQ_B,
        (
            (163, 146),
            (255, 207),
            (336, 268),
            (387, 311),
            (414, 338),
            (430, 352),
            (438, 360),
            (442, 363),
            (444, 363),
        ),
    )
}

TABLES: tuple[KernelTable, ...] = (
    KernelTable(
        "fa2",
        "a100",
        312e12,
        {
            64: _pairs(_SEQ_FA, (88, 119, 140, 156, 165, 171)),
            128: _pairs(_SEQ_FA, (99, 133, 155, 173, 182, 189)),
        },
        108,
        _FA2_FIGURES,
    ),
    KernelTable(
        "fa2",
        "h100",
        989.4e12,
        {
            64: _pairs(_SEQ_FA, (141, 192, 232, 257, 273, 284)),
            128: _pairs(_SEQ_FA, (163, 221, 265, 294, 308, 328)),
        },
        _HOPPER_SMS,
        _FA2_FIGURES,
    ),
    KernelTable(
        "cudnn",
        "h100",
        989.4e12,
        {128: _CUDNN_H100_SHORT + _CUDNN_H100},
        _HOPPER_SMS,
        _CUDNN_FRONTEND_H200,
    ),
    KernelTable(
        "cudnn",
        "b200",
        2250e12,
        {
            128: _split(
                _SEQ_B,
                (
                    (84.0, 134.2),
                    (254.5, 308.5),
                    (478.9, 371.5),
                    (855.7, 701.3),
                    (1171.3, 942.5),
                    (1332.4, 1074.8),
                    (1419.0, 1108.7),
                    (1382.3, 1073.1),
                    (1355.4, 1047.8),
                ),
            )
        },
        _BLACKWELL_SMS,
        _CUDNN_FRONTEND_BLACKWELL,
    ),
    # on Blackwell FlashAttention-2 is what SDPA's flash backend runs: one table for both
    *(
        KernelTable(
            name, "b200", 2250e12, _SDPA_FLASH_B200, _BLACKWELL_SMS, _CUDNN_FRONTEND_BLACKWELL
        )
        for name in ("fa2", "sdpa")
    ),
    KernelTable(
        "cudnn",
        "gb200",
        2500e12,
        {
            128: _split(
                _SEQ_B,
                (
                    (408, 329),
                    (733, 527),
                    (1069, 655),
                    (1386, 1054),
                    (1584, 1211),
                    (1668, 1304),
                    (1681, 1348),
                    (1573, 1229),
                    (1467, 1188),
                ),
            )
        },
        _BLACKWELL_SMS,
        _CUDNN_FRONTEND_BLACKWELL,
    ),
    # on Blackwell FlashAttention-2 is what SDPA's flash backend runs: one table for both
    *(
        KernelTable(
            name, "gb200", 2500e12, _SDPA_FLASH_GB200, _BLACKWELL_SMS, _CUDNN_FRONTEND_BLACKWELL
        )
        for name in ("fa2", "sdpa")
    ),
    KernelTable(
        "sdpa",
        "h100",
        989.4e12,
        {128: _pairs(_SEQ_FA, (108.0, 166.0, 214.8, 256.1, 284.1, 310.6))},
        _HOPPER_SMS,
        _FA2_FIGURES,  # parasim's sweep ran the FlashAttention-2 figures' grid
    ),
)

# GPU names (cluster.gpu.name) by the kind of GPU whose tables they take, by prefix:
# the H200 and H800 have the H100's tensor cores and clocks, the B100/B300 are left out
_KINDS = (
    ("a100", ("A100", "A800")),
    ("h100", ("H100", "H200", "H800")),
    ("gb200", ("GB200",)),
    ("b200", ("B200",)),
)


def _gpu_kind(name: str) -> str | None:
    upper = name.upper()
    for kind, prefixes in _KINDS:
        if any(upper.startswith(prefix) for prefix in prefixes):
            return kind
    return None


def resolve_backend(backend: str, framework: str, gpu_name: str) -> str:
    """The kernel ``attention_backend`` means for ``framework`` on ``gpu_name``."""
    if backend != "auto":
        return backend
    if framework == "megatron":
        return "cudnn" if _gpu_kind(gpu_name) in ("h100", "b200", "gb200") else "fa2"
    # the PyTorch stacks call SDPA: its flash backend where measured, else FA2's figures
    return "sdpa" if table_for("sdpa", gpu_name) is not None else "fa2"


def table_for(backend: str, gpu_name: str) -> KernelTable | None:
    """The published table of ``backend`` on the kind of GPU ``gpu_name`` is, if any."""
    kind = _gpu_kind(gpu_name)
    return next((t for t in TABLES if t.backend == backend and t.gpu == kind), None)
