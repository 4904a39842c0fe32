"""NCCL's cost model: algorithm and protocol latencies, bandwidth factors, selection.

NCCL chooses, for every collective call, the (algorithm, protocol) pair whose
predicted time ``latency + bytes / algorithm_bandwidth`` is smallest. parasim does the
same with NCCL's own constants (NVIDIA/nccl ``src/graph/tuning.cc``, 2.19 series) and
with bandwidths from the modelled links instead of NCCL's topology search:

* **Latency** (µs): a base latency per (algorithm, protocol) plus a hardware latency
  per step (``hwLat``) for NVLink, PCIe or the network. A ring pays
  ``(steps − inter_steps)·intra + inter_steps·inter``; with several nodes each intra
  step costs at least the network post overhead (1 µs, ×3 for Simple). A tree pays
  ``2·((ppn − 1)·intra + log2(nodes)·inter)``; NVLS pays one NVLink hop (23 µs).
* **Bus bandwidth**: what the links give the algorithm (from the flow model) times the
  protocol's efficiency: LL carries 8 bytes of data per 16 (¼ of the ring's bandwidth
  for all-reduce or several nodes, ⅓ otherwise, capped at NCCL's ``llMaxBws``), LL128
  120 of 128 bytes (0.92; 0.7 with one GPU per node), Simple all of it; trees run at
  0.92 of their links.
  NVLS reaches ``nvls_efficiency`` of the NVLink bandwidth on ``(nCh − 1)/nCh`` of its
  16 channels: NCCL's tuner assumes 0.85 on Hopper and 0.74 on Blackwell
  (``src/graph/tuning.cc``, nvlsEfficiency); a preset may give a measured value.
* **Algorithm bandwidth**: bus bandwidth × ``n/steps`` for a ring, × 0.5 for a tree
  (every byte goes up and down it); NVLS moves each GPU's buffer up to the switch and
  the sum down once, so its algorithm bandwidth is that bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.common.vocabulary import (
    ALGORITHMS,
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    PROTOCOLS,
    REDUCE_SCATTER,
)

__all__ = [
    "ALGORITHMS",
    "PROTOCOLS",
    "CollectiveChoice",
    "latency_seconds",
    "bus_bandwidth",
    "algorithm_bandwidth",
    "ring_steps",
]


# NCCL tuning.cc baseLat (µs), indexed (algorithm, protocol). "direct" (pairwise
# all-to-all and send/recv, which NCCL runs as grouped p2p) takes the ring's values.
_BASE_LAT_US = {
    ("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 0.0,
    ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4,
    ("nvls", "Simple"): 0.0,
}  # fmt: skip
# NCCL tuning.cc hwLat (µs per step), by link type then (algorithm, protocol).
_HW_LAT_US = {
    "nvlink": {
        ("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 28.0,
        ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
        ("nvls", "Simple"): 23.0,
    },
    "pci": {
        ("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 28.0,
        ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7,
    },
    "net": {
        ("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 28.0,
        ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0,
        ("nvls", "Simple"): 18.0,
    },
}  # fmt: skip
# NCCL getNetOverhead: 1 µs on x86 hosts, three times that for Simple.
_NET_OVERHEAD_US = 1.0
# NCCL llMaxBws (GB/s): Ampere/Hopper on one node; Intel hosts on 2 and on more nodes.
_LL_MAX_BUSBW = {1: 87.7e9, 2: 39.0e9, 3: 20.4e9}
_TREE_EFFICIENCY = 0.92


@dataclass(frozen=True, slots=True)
class CollectiveChoice:
    """The (algorithm, protocol) a collective runs with, and its alone-on-the-network cost."""

    algorithm: str
    protocol: str
    latency: float  # seconds
    algbw: float  # bytes/s
    busbw: float  # bytes/s

    def time(self, size: float) -> float:
        return self.latency + (size / self.algbw if size > 0 else 0.0)


def ring_steps(kind: str, n: int) -> int:
    """Steps of NCCL's ring (and of a direct exchange) for ``kind`` on ``n`` ranks."""
    if kind in (ALL_REDUCE, BARRIER):
        return 2 * (n - 1)
    if kind in (ALL_GATHER, REDUCE_SCATTER):
        return n - 1
    if kind in (ALL_TO_ALL, "p2p"):
        return 1
    return n  # broadcast, reduce


def latency_seconds(
    kind: str, algorithm: str, protocol: str, n: int, nodes: int, intra: str = "nvlink"
) -> float:
    """NCCL's latency of one call, in seconds."""
    key = ("ring", protocol) if algorithm in ("direct", "hierarchical") else (algorithm, protocol)
    intra_table = _HW_LAT_US[intra]
    intra_lat = intra_table.get(key, intra_table.get(("ring", protocol), 0.0))
    inter_lat = _HW_LAT_US["net"].get(key, 0.0)
    if nodes > 1 and protocol == "LL":
        intra_lat *= 1.8
    base = _BASE_LAT_US.get(key, 0.0)
    if algorithm == "tree":
        ppn = max(1, n // nodes)
        extra = 2 * ((ppn - 1) * intra_lat + math.log2(nodes) * inter_lat)
    elif algorithm == "nvls":
        extra = intra_lat + (inter_lat if nodes > 1 else 0.0)
    elif algorithm == "direct":
        extra = inter_lat if nodes > 1 else intra_lat
    elif algorithm == "hierarchical":
        extra = inter_lat + intra_lat  # one NVLink hand-off, then the network
    else:
        steps = ring_steps(kind, n)
        if kind == BROADCAST:
            hw = inter_lat if nodes > 1 else intra_lat
            extra = steps * hw
        else:
            if kind in (ALL_REDUCE, BARRIER):
                inter_steps = 2 * nodes if nodes > 1 else 0
            else:
                inter_steps = nodes - 1
            if nodes > 1:
                overhead = _NET_OVERHEAD_US * (3 if protocol == "Simple" else 1)
                intra_lat = max(intra_lat, overhead)
            inter_steps = min(inter_steps, steps)
            extra = (steps - inter_steps) * intra_lat + inter_steps * inter_lat
    return (base + extra) * 1e-6


# NCCL's NVLS runs on 16 channels and loses one to management: busBw × (nCh − 1)/nCh.
NVLS_CHANNELS = 16


def bus_bandwidth(
    kind: str,
    algorithm: str,
    protocol: str,
    link_busbw: float,
    nodes: int,
    ppn: int,
    nvls_efficiency: float = 0.85,
) -> float:
    """The bus bandwidth a protocol reaches on links that give ``link_busbw``; 0 if the
    pair is unavailable."""
    ll_cap = _LL_MAX_BUSBW[min(nodes, 3)]
    if algorithm in ("ring", "direct", "hierarchical"):
        if protocol == "LL":
            share = 0.25 if (nodes > 1 or kind == ALL_REDUCE) else 1.0 / 3.0
            return min(ll_cap, link_busbw * share)
        if protocol == "LL128":
            return link_busbw * (0.7 if ppn < 2 else 0.92)
        return link_busbw
    if algorithm == "tree":
        busbw = link_busbw * _TREE_EFFICIENCY
        if protocol == "LL":
            return min(busbw / 3.8, ll_cap)
        if protocol == "LL128":
            return busbw * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0)
        return busbw
    if algorithm == "nvls":
        if protocol != "Simple":
            return 0.0
        return link_busbw * nvls_efficiency * (NVLS_CHANNELS - 1) / NVLS_CHANNELS
    raise ValueError(f"unknown algorithm {algorithm!r}")


def algorithm_bandwidth(kind: str, algorithm: str, busbw: float, n: int) -> float:
    """NCCL's conversion from bus to algorithm bandwidth."""
    if algorithm == "tree":
        return busbw * 0.5
    if algorithm == "nvls":
        return busbw  # each GPU sends its buffer up once and receives the sum once
    if algorithm in ("direct", "hierarchical"):
        return busbw * n / max(1, n - 1) if kind == ALL_TO_ALL else busbw
    return busbw * n / ring_steps(kind, n) if kind != BROADCAST else busbw
