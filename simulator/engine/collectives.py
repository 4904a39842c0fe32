"""Collective algorithms as flows on the cluster's links.

Each collective becomes one or more network transfers (see
:mod:`simulator.engine.network`). Members are ordered by GPU id, so a ring visits the
GPUs of one node consecutively and then moves to the next node, as NCCL's rings do.
With ``n`` members, buffer size ``S`` (nccl-tests' convention, see the Schedule IR),
per-step latency ``α`` (the slowest ring edge's route latency) and link bandwidth
``B``, alone on the network:

===============  ==============================  ====================================
collective       algorithm                       time
===============  ==============================  ====================================
all_reduce       ring (reduce-scatter+all-gather) ``2(n−1)·α + 2(n−1)/n · S/B``
all_gather       ring                            ``(n−1)·α + (n−1)/n · S/B``
reduce_scatter   ring                            ``(n−1)·α + (n−1)/n · S/B``
broadcast        pipelined chain from member 0   ``(n−1)·α + S/B``
all_to_all       direct: every pair at once      ``α + S/n / B`` per pair (uneven
                                                 ``splits``: one flow per pair)
barrier          all-reduce of nothing           ``2(n−1)·α``
===============  ==============================  ====================================

Tree, hierarchical and NVLS algorithms and NCCL's protocol choice are not modelled
here (see docs/modelling.md). A calibration profile replaces ``α`` and ``B`` per
collective kind and scope with measured fits (:func:`calibrated`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from topologies import Cluster

__all__ = [
    "TransferSpec",
    "algorithm_steps",
    "bus_factor",
    "collective_transfers",
    "p2p_transfer",
    "ring_edges",
    "scope_of",
]


@dataclass(frozen=True, slots=True)
class TransferSpec:
    """What the network must move: link crossings, bytes per crossing, start latency."""

    usage: dict[int, int]
    volume: float
    latency: float


def ring_edges(gpus: list[int]) -> list[tuple[int, int]]:
    """Directed edges of the ring through ``gpus`` in order, closing back to the first."""
    return [(gpus[i], gpus[(i + 1) % len(gpus)]) for i in range(len(gpus))]


def _usage_and_latency(
    cluster: Cluster, edges: list[tuple[int, int]]
) -> tuple[dict[int, int], float]:
    usage: Counter[int] = Counter()
    latency = 0.0
    for src, dst in edges:
        route = cluster.route(src, dst)
        usage.update(route.links)
        latency = max(latency, route.latency)
    return dict(usage), latency


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: ``busbw = algbw × factor``."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, p2p


def algorithm_steps(kind: str, n: int) -> int:
    """Latency-bound steps of the algorithm (``α`` is paid once per step)."""
    if kind in ("all_reduce", "barrier"):
        return 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "broadcast"):
        return n - 1
    return 1  # all_to_all (direct) and p2p


def scope_of(cluster: Cluster, gpus: list[int]) -> str:
    """``intra_node`` when every GPU is on one node, ``inter_node`` otherwise."""
    first = cluster.node_of(gpus[0])
    return "intra_node" if all(cluster.node_of(g) == first for g in gpus) else "inter_node"


def calibrated(cluster: Cluster, kind: str, gpus: list[int], spec: TransferSpec) -> TransferSpec:
    """Apply a calibration profile's fit for (kind, scope), if the cluster has one.

    The step latency becomes the fitted ``α`` and the volume is scaled by
    ``B_links / B_fit``, so that alone on the network the transfer takes the fitted
    ``steps·α + factor·S/B_fit``; under contention it still shares the links.
    """
    calibration = cluster.spec.calibration
    if calibration is None or kind not in calibration.comm:
        return spec
    fit = getattr(calibration.comm[kind], scope_of(cluster, gpus))
    if fit is None:
        return spec
    link_bandwidth = min(cluster.links[link].bandwidth for link in spec.usage)
    return TransferSpec(
        spec.usage,
        spec.volume * link_bandwidth / fit.bandwidth,
        algorithm_steps(kind, len(gpus)) * fit.alpha,
    )


def collective_transfers(
    cluster: Cluster,
    kind: str,
    gpus: list[int],
    size: float,
    splits: dict[int, tuple[float, ...]] | None = None,
) -> list[TransferSpec]:
    """The transfers that carry one collective among ``gpus`` (sorted by the caller)."""
    specs = _algorithm_transfers(cluster, kind, gpus, size, splits)
    return [calibrated(cluster, kind, gpus, spec) for spec in specs if spec.usage]


def p2p_transfer(cluster: Cluster, src: int, dst: int, size: float) -> TransferSpec:
    """The flow of one send/recv pair along the route from ``src`` to ``dst``."""
    route = cluster.route(src, dst)
    spec = TransferSpec(dict.fromkeys(route.links, 1), size, route.latency)
    return calibrated(cluster, "p2p", [src, dst], spec)


def _algorithm_transfers(
    cluster: Cluster,
    kind: str,
    gpus: list[int],
    size: float,
    splits: dict[int, tuple[float, ...]] | None,
) -> list[TransferSpec]:
    n = len(gpus)
    if n <= 1:
        return []
    if kind in ("all_reduce", "barrier"):
        usage, alpha = _usage_and_latency(cluster, ring_edges(gpus))
        volume = 0.0 if kind == "barrier" else 2 * (n - 1) / n * size
        return [TransferSpec(usage, volume, 2 * (n - 1) * alpha)]
    if kind in ("all_gather", "reduce_scatter"):
        usage, alpha = _usage_and_latency(cluster, ring_edges(gpus))
        return [TransferSpec(usage, (n - 1) / n * size, (n - 1) * alpha)]
    if kind == "broadcast":
        usage, alpha = _usage_and_latency(cluster, ring_edges(gpus)[:-1])
        return [TransferSpec(usage, size, (n - 1) * alpha)]
    if kind == "all_to_all":
        pairs = [(src, dst) for src in gpus for dst in gpus if src != dst]
        if splits is None:
            usage, alpha = _usage_and_latency(cluster, pairs)
            return [TransferSpec(usage, size / n, alpha)]
        specs = []
        index = {gpu: i for i, gpu in enumerate(gpus)}
        for src, dst in pairs:
            route = cluster.route(src, dst)
            volume = splits[src][index[dst]]
            specs.append(TransferSpec(dict(Counter(route.links)), volume, route.latency))
        return specs
    raise ValueError(f"unknown collective kind {kind!r}")
