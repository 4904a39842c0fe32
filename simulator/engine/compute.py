"""Compute time of one op on one GPU.

``time = max(flops / (peak · efficiency), bytes / (hbm_bandwidth · hbm_efficiency))
+ launch_overhead``, a roofline (docs/modelling.md, "Compute"), where the efficiency depends on what
the op is:

* a GEMM (``kind: gemm``, with its ``(m, n, k)`` shape and ``batch``): the shape model
  of :mod:`.gemm` (tile and wave quantisation over the GPU's SMs, short ``k``) on top
  of the preset's ``matmul_efficiency``, or a calibration profile's measured table; an
  FP8 GEMM at the FP8 peak times ``fp8_matmul_efficiency / matmul_efficiency``, and
  times the shape model's ratio between its FP8 and BF16 forms at the op's shape (the
  FP8 form pays ``FP8_K_OVERHEAD_FACTOR`` times the short-k prologue, :mod:`.gemm`);
* fused attention (``kind: attention``, shape ``(s_q, s_kv, d)`` over ``batch``
  heads): the causal rate the recipe's kernel (``training.attention_backend``, by
  default the stack's own) reaches on this kind of GPU at the op's head dimension and
  sequence length, from its published benchmarks (:mod:`.attention_kernels`), half the
  op's FLOPs counted as those benchmarks count them; or, where the GPU gives
  ``attention_efficiency`` (a calibration profile's measurement), that share of the
  peak with the causal mask skipping the key blocks above the diagonal: of ``n =
  s/128`` key blocks per query block, ``(n + 1)/2n`` are computed on average. A
  tabulated rate is taken at the fill of the op's own grid of CTAs (one per query
  block and head) rather than the benchmark's (:func:`.attention_kernels.grid_fill`);
  a measured share fills the SMs in whole waves, as a GEMM's tiles do;
* everything else (elementwise, optimizer): its bytes, at the bandwidth streaming
  kernels reach.

A calibration profile measured at a scenario's shapes (``parasim calibrate --scenario``)
brings ``gpu.op_table``: an op with the same kind, FLOPs, bytes, shape, batch and FP8
flag as a measured one takes the measured time (per-op costs of the framework that ran
it included) instead of the roofline's.

Overlapped communication is not free: NCCL's kernels run one CTA per channel on the
GPU's SMs, so a compute op that the schedule runs beside a collective of its rank
(``beside_comm``: the weight gradient beside the asynchronous TP all-reduce or
reduce-scatter, the input gradient beside SP's input all-gather) gets the SMs NCCL
leaves while they overlap: for ``min(math, collective alone)`` seconds its math runs
``SMs / (SMs − channels)`` slower, with ``NCCL_CHANNELS`` channels (the 16 NCCL opens
on NVSwitch systems, as :mod:`simulator.analysis.memory` counts its buffers). The engines add
:meth:`ComputeModel.interference` with the collectives' alone times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict

from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import ATTENTION, GEMM
from simulator.engine.attention_kernels import grid_fill, resolve_backend, table_for
from simulator.engine.gemm import FP8_K_OVERHEAD_FACTOR, GemmEfficiency, gemm_efficiency
from simulator.engine.grouped_gemm import GROUPED_KINDS, grouped_gemm_seconds
from topologies import ClusterSpec

__all__ = ["ComputeModel", "ATTENTION_BLOCK", "NCCL_CHANNELS", "causal_fraction", "executed_flops"]

# FlashAttention-2/3 tile the query and key sequences in blocks of 128 rows for head
# dimensions up to 128 (flash-attn's kernel traits: kBlockM = 128, kBlockN = 64-128).
ATTENTION_BLOCK = 128
# NCCL's channels on an NVSwitch node, one CTA (one SM) each while a collective runs
# (NCCL's ring on NVLink opens 16-32; 16 is also the count memory.py sizes buffers by).
NCCL_CHANNELS = 16


class _GemmShapeModel(TypedDict):
    """:func:`gemm_efficiency`'s keyword arguments that describe the GPU."""

    base: float
    sm_count: int
    largest_tile: Sequence[int]
    batch: int


def causal_fraction(s_kv: int) -> float:
    """The share of an attention op's score blocks a causal FlashAttention kernel
    computes: of ``n = s_kv/128`` key blocks per query block, ``(n + 1)/2n``."""
    blocks = max(1, math.ceil(s_kv / ATTENTION_BLOCK))
    return (blocks + 1) / (2 * blocks)


def executed_flops(op: Any) -> float:
    """The FLOPs the GPU runs for ``op`` (a compute op or a block of them): an
    attention op's causal share, every other op's own count."""
    if op.type == "block":
        return sum(executed_flops(inner) for inner in op.body if inner.type == "compute")
    if op.kind == ATTENTION and op.shape is not None:
        return op.flops * causal_fraction(op.shape[1])
    return op.flops


class ComputeModel:
    """Times Compute ops for one GPU type, memoising by what decides the time."""

    def __init__(self, spec: ClusterSpec, meta: dict[str, Any] | None = None):
        """``meta``: the schedule's, for what the software stack decides: the host's
        time to issue a kernel (``host_dispatch_s``), the attention kernel
        (``attention_backend``, ``framework``) and how it issues a grouped GEMM's experts
        (``expert_streams``)."""
        meta = meta or {}
        gpu = spec.gpu
        # the tensor-core rate a training step sustains: the datasheet peak, at the clock
        # of the power limit, times the share of a microbenchmark's rate that training
        # keeps (gpu.sustained_fraction)
        sustained = gpu.compute_clock_factor * gpu.sustained_fraction
        self.peak = gpu.peak_flops * sustained
        self.fp8_peak = (gpu.fp8_peak_flops or gpu.peak_flops) * sustained
        self.stream_bandwidth = gpu.hbm_bandwidth * gpu.hbm_efficiency
        self.launch_overhead = gpu.kernel_launch_overhead
        # the host's time to issue a kernel: the GPU's measured figure (a calibration
        # profile's), else the software stack's (simulator.arithmetic.stacks)
        self.host_overhead = gpu.host_overhead or meta.get("host_dispatch_s", 0.0)
        # a grouped GEMM's experts as one kernel (0) or a GEMM each over this many streams
        self.expert_streams = int(meta.get("expert_streams", 0))
        self.matmul_efficiency = gpu.matmul_efficiency
        self.attention_efficiency = gpu.attention_efficiency
        self.attention_table = None
        if self.attention_efficiency is None:
            backend = resolve_backend(
                meta.get("attention_backend", "auto"), meta.get("framework", "megatron"), gpu.name
            )
            self.attention_table = table_for(backend, gpu.name)
            if self.attention_table is None:
                raise ScenarioError(
                    f"cluster.gpu.attention_efficiency: no tabulated {backend} attention "
                    f"benchmark for the {gpu.name} in parasim; give the share of peak_flops "
                    "its fused attention reaches (or calibrate), or another "
                    "training.attention_backend"
                )
        self.sm_count = gpu.sm_count
        # an FP8 GEMM reaches this share of what a bf16 GEMM of its shape reaches (of
        # the FP8 peak rather than the bf16 one): the two dtypes' best microbenchmark
        # rates over the same sweep
        fp8_efficiency = gpu.fp8_matmul_efficiency or gpu.matmul_efficiency
        self.fp8_ratio = fp8_efficiency / gpu.matmul_efficiency
        self.k_overhead = gpu.gemm_k_overhead
        self._fp8_shape_memo: dict[tuple[int, int, int, int], float] = {}
        self.gemm = None
        shaped = gpu.sm_count is not None and gpu.gemm_tile is not None
        if shaped or gpu.gemm_table:
            self.gemm = GemmEfficiency(
                gpu.matmul_efficiency,
                gpu.sm_count,
                gpu.gemm_tile,
                gpu.gemm_table,
                gpu.gemm_k_overhead,
            )
        # measured ops (a profile calibrated at a scenario's shapes) take their own time
        self._memo: dict[tuple, float] = {row.key: row.seconds for row in gpu.op_table}
        self.measured_ops = len(gpu.op_table)

    def duration(self, op) -> float:
        """Seconds ``op`` (a :class:`~simulator.schedule.ir.Compute`) takes alone: its
        measured time when the GPU's ``op_table`` has it, else the roofline's."""
        kernels = getattr(op, "kernels", 1)
        key = (op.kind, op.flops, op.bytes, op.shape, op.batch, op.fp8)
        cached = self._memo.get(key if kernels == 1 else (*key, kernels))
        if cached is not None:
            return cached
        measured = self._memo.get(key) if kernels != 1 else None
        if measured is not None:  # a measured op: its time, its kernels' launches included
            return measured
        seconds = max(self.compute_seconds(op), op.bytes / self.stream_bandwidth)
        seconds += self.launch_overhead * kernels
        self._memo[key if kernels == 1 else (*key, kernels)] = seconds
        return seconds

    def with_comm(self, op, ops, collective_time) -> float:
        """Seconds ``op`` takes with the collectives beside it: ``ops`` is its program
        (or block body), ``collective_time(collective)`` gives ``(seconds alone, name)``."""
        seconds = self.duration(op)
        if op.beside_comm:
            comm = sum(collective_time(ops[i])[0] for i in op.beside_comm)
            seconds += self.interference(op, comm)
        return seconds

    def interference(self, op, comm_seconds: float) -> float:
        """Extra seconds ``op`` takes while collectives lasting ``comm_seconds`` alone run
        beside it: for the overlapped span its math gets ``SMs − NCCL_CHANNELS`` SMs."""
        if self.sm_count is None or self.sm_count <= NCCL_CHANNELS or comm_seconds <= 0:
            return 0.0
        overlapped = min(self.compute_seconds(op), comm_seconds)
        return overlapped * NCCL_CHANNELS / (self.sm_count - NCCL_CHANNELS)

    def compute_seconds(self, op) -> float:
        """The op's math time at the efficiency its kind and shape reach."""
        kind, shape = op.kind, op.shape
        if kind in GROUPED_KINDS:  # an MoE layer's experts as one grouped GEMM
            peak = self.fp8_peak if op.fp8 else self.peak
            gemm = self.gemm
            return grouped_gemm_seconds(
                op,
                peak,
                self.stream_bandwidth,
                base=self.matmul_efficiency * (self.fp8_ratio if op.fp8 else 1.0),
                sm_count=gemm.sm_count if gemm else None,
                largest_tile=gemm.largest_tile if gemm else None,
                k_overhead=self.k_overhead * (FP8_K_OVERHEAD_FACTOR if op.fp8 else 1.0),
                streams=self.expert_streams,
            )
        if kind == GEMM:
            peak = self.fp8_peak * self.fp8_ratio if op.fp8 else self.peak
            if shape is not None and self.gemm is not None:
                m, n, k = shape
                efficiency = self.gemm(m, n, k, op.batch)
                if op.fp8:
                    efficiency *= self._fp8_shape(m, n, k, op.batch)
                return op.flops / (peak * efficiency)
            return op.flops / (peak * self.matmul_efficiency)
        if kind == ATTENTION:
            return self._attention_seconds(op)
        return op.flops / (self.peak * self.matmul_efficiency)

    def _fp8_shape(self, m: int, n: int, k: int, batch: int) -> float:
        """The shape model's FP8 efficiency over its BF16 one at ``(m, n, k)``: the
        longer short-k prologue of FP8 tiles (1 where the GPU has no shape model)."""
        gemm = self.gemm
        if gemm is None or gemm.sm_count is None or gemm.largest_tile is None:
            return 1.0
        key = (m, n, k, batch)
        ratio = self._fp8_shape_memo.get(key)
        if ratio is None:
            shape: _GemmShapeModel = {
                "base": 1.0,
                "sm_count": gemm.sm_count,
                "largest_tile": gemm.largest_tile,
                "batch": batch,
            }
            fp8 = gemm_efficiency(
                m, n, k, k_overhead=self.k_overhead * FP8_K_OVERHEAD_FACTOR, **shape
            )
            ratio = fp8 / gemm_efficiency(m, n, k, k_overhead=self.k_overhead, **shape)
            self._fp8_shape_memo[key] = ratio
        return ratio

    def _attention_seconds(self, op) -> float:
        if self.attention_table is not None:
            # the benchmarks' rate, their FLOPs the causal half of the op's, at the fill
            # of the op's own grid of CTAs rather than the benchmark's
            s_q, s_kv, head_dim = op.shape or (ATTENTION_BLOCK, ATTENTION_BLOCK, 128)
            table = self.attention_table
            if self.sm_count is None or op.shape is None:
                return op.flops * 0.5 / (self.peak * table.efficiency(head_dim, s_kv))
            ctas = op.batch * max(1, math.ceil(s_q / ATTENTION_BLOCK))
            efficiency = table.full_grid_efficiency(head_dim, s_kv) * grid_fill(ctas, self.sm_count)
            return op.flops * 0.5 / (self.peak * efficiency)
        # a measured (or given) share of the peak, the causal mask's skipped blocks aside,
        # its CTAs in whole waves
        efficiency = self.attention_efficiency
        if op.shape is None:
            return op.flops / (self.peak * efficiency)
        s_q, s_kv, _ = op.shape
        causal = causal_fraction(s_kv)
        if self.sm_count is not None:
            ctas = op.batch * max(1, math.ceil(s_q / ATTENTION_BLOCK))
            waves = math.ceil(ctas / self.sm_count)
            efficiency *= ctas / (waves * self.sm_count)
        return op.flops * causal / (self.peak * efficiency)
