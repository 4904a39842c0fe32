"""Compute time of one op on one GPU: the roofline rule of DESIGN.md.

``time = max(flops / (peak · efficiency), bytes / hbm_bandwidth) + launch_overhead``

``efficiency`` is the GPU's ``matmul_efficiency`` for GEMMs (and the elementwise and
optimizer ops, whose time is set by their bytes anyway) and its
``attention_efficiency`` for the fused attention core; both come from the cluster
preset or a calibration profile.
"""

from __future__ import annotations

from topologies import ClusterSpec

__all__ = ["ComputeModel"]


class ComputeModel:
    """Times Compute ops for one GPU type, memoising by (kind, flops, bytes)."""

    def __init__(self, spec: ClusterSpec):
        gpu = spec.gpu
        self.peak = gpu.peak_flops
        self.hbm_bandwidth = gpu.hbm_bandwidth
        self.launch_overhead = gpu.kernel_launch_overhead
        self.efficiency = {
            "gemm": gpu.matmul_efficiency,
            "attention": gpu.attention_efficiency,
        }
        self._default_efficiency = gpu.matmul_efficiency
        self._memo: dict[tuple[str, float, float], float] = {}

    def duration(self, kind: str, flops: float, traffic: float) -> float:
        key = (kind, flops, traffic)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        efficiency = self.efficiency.get(kind, self._default_efficiency)
        seconds = max(flops / (self.peak * efficiency), traffic / self.hbm_bandwidth)
        seconds += self.launch_overhead
        self._memo[key] = seconds
        return seconds
