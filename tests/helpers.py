"""Helpers for building small clusters and hand-written schedules in tests."""

from __future__ import annotations

from typing import Any

from topologies import Cluster, build_cluster, load_cluster_spec

FREE_NETWORK = {
    "nvswitch": {"latency": 0},
    "nic": {"latency": 0},
    "network": {"switch_latency": 0},
    "gpu": {"kernel_launch_overhead": 0},
    # sends and receives take no time at all: no NCCL latency, unbounded bandwidth
    "calibration": {
        "comm": {
            "p2p": {
                "intra_node": {"alpha": 0, "bandwidth": 1e30},
                "inter_node": {"alpha": 0, "bandwidth": 1e30},
            }
        }
    },
}


def cluster(preset: str = "dgx-a100", nodes: int = 1, **overrides: Any) -> Cluster:
    return build_cluster(load_cluster_spec({"preset": preset, "nodes": nodes, **overrides}))


def seconds_to_flops(cluster: Cluster, seconds: float) -> float:
    """FLOPs of a GEMM that takes ``seconds`` on the cluster's GPU (no launch overhead)."""
    gpu = cluster.spec.gpu
    return seconds * gpu.peak_flops * gpu.matmul_efficiency
