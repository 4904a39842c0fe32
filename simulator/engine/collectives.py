"""Collectives and send/recv as NCCL runs them, turned into flows on the cluster's links.

For each call :func:`plan_collective` builds the candidate algorithms on the group's
GPUs, prices every (algorithm, protocol) pair with NCCL's cost model
(:mod:`simulator.engine.nccl`) and keeps the cheapest, unless the scenario pins one.
The chosen plan is one network *transfer* (a coflow, see
:mod:`simulator.engine.network`) whose link crossings are the algorithm's, and whose
volume is set so that alone on the network it takes exactly NCCL's
``latency + size / algbw``; under contention it shares the links max–min fairly.

Algorithms, with ``n`` ranks on ``nodes`` nodes (``ppn`` per node):

* **ring** (all-reduce, all-gather, reduce-scatter, broadcast): members ordered by GPU,
  a node's GPUs consecutive. With several nodes NCCL runs one ring per rail
  (channel): ring ``r`` visits each node's GPUs rotated by ``r`` and leaves the node
  from a different GPU, so every NIC of the group carries ``1/R`` of the traffic.
  Bus bandwidth = ``R`` × the rate of the ring's most loaded link.
* **tree** (all-reduce, several nodes): NCCL's double binary tree; latency grows with
  ``log2(nodes)``, bandwidth is half the bus bandwidth of the same links (every byte
  goes up and down the tree).
* **nvls** (all-reduce inside one node whose switch reduces in-network): each GPU sends
  and receives its buffer once through the switch.
* **direct** (all-to-all, send/recv): every pair at once.
* **hierarchical** (all-to-all across nodes): over NVLink to the GPU on the
  destination's rail, then one message per remote node along each rail.

A calibration profile replaces NCCL's latency and bandwidth with the fitted ``α`` and
``B`` for its (kind, scope).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import cast

import numpy as np

from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    REDUCE_SCATTER,
)
from simulator.engine.nccl import (
    ALGORITHMS,
    PROTOCOLS,
    CollectiveChoice,
    algorithm_bandwidth,
    bus_bandwidth,
    latency_seconds,
    ring_steps,
)
from topologies import Cluster

__all__ = [
    "TransferSpec",
    "Plan",
    "available_algorithms",
    "algorithm_steps",
    "bus_factor",
    "plan_collective",
    "plan_p2p",
    "collective_transfers",
    "p2p_transfer",
    "ring_edges",
    "candidate_edges",
    "route_usage",
    "plan_options",
    "scope_of",
]


@dataclass(frozen=True, slots=True)
class TransferSpec:
    """What the network must move: link crossings, bytes per crossing, start latency."""

    usage: Mapping[int, float]
    volume: float
    latency: float


@dataclass(frozen=True, slots=True)
class Plan:
    """How one collective runs: NCCL's choice and the transfers that carry it."""

    choice: CollectiveChoice
    transfers: list[TransferSpec]


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: ``busbw = algbw × factor``."""
    if kind == ALL_REDUCE:
        return 2 * (n - 1) / n
    if kind in (
        ALL_GATHER,
        REDUCE_SCATTER,
        ALL_TO_ALL,
    ):
        return (n - 1) / n
    return 1.0  # broadcast, p2p


def algorithm_steps(kind: str, n: int) -> int:
    """Latency-bound steps of the ring model (``α`` is paid once per step)."""
    return ring_steps(kind, n)


def ring_edges(gpus: list[int]) -> list[tuple[int, int]]:
    """Directed edges of the ring through ``gpus`` in order, closing back to the first."""
    return [(gpus[i], gpus[(i + 1) % len(gpus)]) for i in range(len(gpus))]


def scope_of(cluster: Cluster, gpus: list[int]) -> str:
    """``intra_node`` when every GPU is on one node, ``inter_node`` otherwise."""
    first = cluster.node_of(gpus[0])
    return "intra_node" if all(cluster.node_of(g) == first for g in gpus) else "inter_node"


def _by_node(cluster: Cluster, gpus: list[int]) -> list[list[int]]:
    """``gpus`` in order, in runs of one node each (GPUs are numbered node-major)."""
    ordered = sorted(gpus)
    for end in (ordered[0], ordered[-1]):
        cluster.node_of(end)  # checks the range, so all between are in it
    per_node = cluster.gpus_per_node
    nodes: dict[int, list[int]] = {}
    for gpu in ordered:
        nodes.setdefault(gpu // per_node, []).append(gpu)
    return list(nodes.values())


#: Above this many pairs (or links) a transfer's crossings are counted with arrays.
_ARRAY_PAIRS = 32


def route_usage(cluster: Cluster, edges: list[tuple[int, int]]) -> dict[int, int]:
    """How often the routes of ``edges`` cross each link, links in the order the routes
    first reach them."""
    if len(edges) <= _ARRAY_PAIRS:
        usage: Counter[int] = Counter()
        for src, dst in edges:
            usage.update(cluster.route(src, dst).links)
        return dict(usage)
    pairs = np.array(edges, dtype=np.int64)
    _, links = cluster.route_arrays(pairs[:, 0], pairs[:, 1])
    unique, first, counts = np.unique(links, return_index=True, return_counts=True)
    order = np.argsort(first)
    return dict(zip(unique[order].tolist(), counts[order].tolist(), strict=True))


def _rate(cluster: Cluster, usage: Mapping[int, float]) -> float:
    """Rate of a transfer alone on the network: its most loaded link's share."""
    if len(usage) <= _ARRAY_PAIRS:
        return min(cluster.links[link].bandwidth / mult for link, mult in usage.items())
    links = np.fromiter(usage.keys(), np.int64, len(usage))
    crossings = np.fromiter(usage.values(), np.float64, len(usage))
    return float((cluster.bandwidths[links] / crossings).min())


def _rings(
    cluster: Cluster, gpus: list[int], nodes: list[list[int]]
) -> tuple[list[tuple[int, int]], int]:
    """Edges of NCCL's rings over ``gpus`` (on ``nodes``, :func:`_by_node`) and how many
    rings (channels) share the data (memoised on the cluster: a group's calls of every
    kind run on the same rings)."""
    if len(nodes) == 1:
        return ring_edges(nodes[0]), 1
    key = ("rings", tuple(gpus))
    known = cluster.plan_cache.get(key)
    if known is not None:
        return cast("tuple[list[tuple[int, int]], int]", known)
    rail = cluster.rails_of(np.array([g for local in nodes for g in local])).tolist()
    starts = list(accumulate((len(local) for local in nodes), initial=0))
    rails = min(len(set(rail[a:b])) for a, b in pairwise(starts))
    edges = []
    for r in range(rails):
        order = [g for local in nodes for g in local[r:] + local[:r]]
        edges += ring_edges(order)
    cluster.plan_cache[key] = (edges, rails)
    return edges, rails


@dataclass(frozen=True, slots=True)
class _Candidate:
    algorithm: str
    usage: Mapping[int, float]
    link_busbw: float
    # concurrent phases of a multi-phase algorithm: (usage, bytes per crossing per byte)
    phases: tuple[tuple[dict[int, int], float], ...] = ()


def _hierarchical_all_to_all(cluster: Cluster, nodes: list[list[int]], n: int) -> _Candidate:
    """Two-level all-to-all (PXN-style): over NVLink a GPU hands each local peer the
    data bound for that peer's rail on every node, then each GPU sends one aggregated
    message per remote node along its own rail. The phases pipeline, so the slower
    one sets the time."""
    ppn = len(nodes[0])
    intra = [(a, b) for local in nodes for a in local for b in local if a != b]
    inter = [
        (local_a[i], local_b[i])
        for local_a in nodes
        for local_b in nodes
        if local_a is not local_b
        for i in range(ppn)
    ]
    phases = (
        (route_usage(cluster, intra), len(nodes) / n),  # to each local peer: its rail's share
        (route_usage(cluster, inter), ppn / n),  # to each remote rail peer: ppn senders' share
    )
    algbw = 1.0 / max(coef / _rate(cluster, usage) for usage, coef in phases)
    usage = dict(Counter(phases[0][0]) + Counter(phases[1][0]))
    return _Candidate("hierarchical", usage, algbw * (n - 1) / n, phases)


def candidate_edges(
    cluster: Cluster,
    kind: str,
    algorithm: str,
    gpus: list[int],
    groups: list[list[int]] | None = None,
) -> list[tuple[int, int]] | None:
    """The GPU pairs (``gpus`` sorted, on ``groups``, :func:`_by_node`) whose routes
    carry ``algorithm``'s ``kind``, each once per crossing; None for the two-phase
    hierarchical all-to-all and an algorithm ``kind`` does not run as."""
    if kind == ALL_TO_ALL:
        return [(a, b) for a in gpus for b in gpus if a != b] if algorithm == "direct" else None
    if kind == "p2p":
        return [(gpus[0], gpus[1])] if algorithm == "direct" else None
    if kind == BROADCAST:
        return ring_edges(sorted(gpus))[:-1] if algorithm == "ring" else None
    if algorithm == "nvls":
        return list(zip(gpus, gpus[1:] + gpus[:1], strict=True))
    if algorithm in ("ring", "tree"):
        return _rings(cluster, gpus, _by_node(cluster, gpus) if groups is None else groups)[0]
    return None


def _candidates(
    cluster: Cluster, kind: str, gpus: list[int], groups: list[list[int]] | None = None
) -> list[_Candidate]:
    """The algorithms ``kind`` can run on ``gpus`` (on ``groups``, :func:`_by_node`),
    each with the links it crosses."""
    n = len(gpus)
    groups = _by_node(cluster, gpus) if groups is None else groups
    nodes = len(groups)

    def usage_of(algorithm: str) -> dict[int, int]:
        edges = candidate_edges(cluster, kind, algorithm, gpus, groups)
        assert edges is not None
        return route_usage(cluster, edges)

    if kind == ALL_TO_ALL:
        usage = usage_of("direct")
        candidates = [_Candidate("direct", usage, (n - 1) * _rate(cluster, usage))]
        if nodes > 1 and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
            candidates.append(_hierarchical_all_to_all(cluster, groups, n))
        return candidates
    if kind in ("p2p", BROADCAST):
        algorithm = "direct" if kind == "p2p" else "ring"
        usage = usage_of(algorithm)
        return [_Candidate(algorithm, usage, _rate(cluster, usage))]
    edges, rings = _rings(cluster, gpus, groups)
    # the rings' crossings and rate, for every kind that runs on them (memoised)
    known = cluster.plan_cache.get(("ring-usage", tuple(gpus)))
    if known is None:
        usage = route_usage(cluster, edges)
        known = cluster.plan_cache[("ring-usage", tuple(gpus))] = (usage, _rate(cluster, usage))
    usage, rate = cast("tuple[dict[int, int], float]", known)
    ring_busbw = rings * rate
    candidates = [_Candidate("ring", usage, ring_busbw)]
    if kind in (ALL_REDUCE, BARRIER) and nodes > 1:
        candidates.append(_Candidate("tree", usage, ring_busbw))
    if kind in (ALL_REDUCE, BARRIER) and nodes == 1 and cluster.has_nvls and n > 2:
        up_down = usage_of("nvls")
        candidates.append(_Candidate("nvls", up_down, _rate(cluster, up_down)))
    return candidates


def available_algorithms(cluster: Cluster, kind: str, gpus: list[int]) -> list[str]:
    """The algorithms ``kind`` can run on ``gpus`` (what a pinned algorithm may name)."""
    if len(gpus) <= 1:
        return []
    return sorted({c.algorithm for c in _candidates(cluster, kind, sorted(gpus))})


#: The protocol of a call whose time was measured in a scenario's own step: that time
#: already holds what the step did beside it (compute sharing its CPU core).
MEASURED_IN_STEP = "measured"


def measured_in_step(
    cluster: Cluster, kind: str, gpus: list[int], size: float, splits: dict | None = None
) -> bool:
    """Whether a call of ``kind`` on ``gpus`` was measured in a scenario's own step."""
    if kind == ALL_TO_ALL and splits:
        size = even_equivalent(splits, sorted(gpus))
    return plan_collective(cluster, kind, gpus, size).choice.protocol == MEASURED_IN_STEP


def _calibrated_choice(
    cluster: Cluster, kind: str, gpus: list[int], algorithm: str, size: float | None = None
) -> CollectiveChoice | None:
    """The profile's choice for ``kind`` on ``gpus``: its fit, or, for a call of a size
    measured in a scenario's own step, that measurement (as the fit's latency and the
    bandwidth that makes up the rest of the measured time)."""
    calibration = cluster.spec.calibration
    if calibration is None or kind not in calibration.comm:
        return None
    fit = getattr(calibration.comm[kind], scope_of(cluster, gpus))
    if fit is None:
        return None
    n = len(gpus)
    factor = bus_factor(kind, n)
    latency = ring_steps(kind, n) * fit.alpha
    algbw = fit.bandwidth / factor
    measured = fit.measured(n, size) if size else None
    if measured is None:
        return CollectiveChoice(algorithm, "calibrated", latency, algbw, algbw * factor)
    latency = min(latency, measured / 2)
    algbw = size / (measured - latency)
    return CollectiveChoice(algorithm, MEASURED_IN_STEP, latency, algbw, algbw * factor)


_PLAN_CACHE_SIZE = 100_000


def plan_collective(
    cluster: Cluster,
    kind: str,
    gpus: list[int],
    size: float,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> Plan:
    """NCCL's choice for ``kind`` of ``size`` bytes on ``gpus``, and its transfer
    (memoised on the cluster: a step asks for the same few plans thousands of times,
    and a sweep reuses one cluster for every layout). A collective's members are a set,
    taken in GPU order; a send/recv's two (``p2p``) are ``[src, dst]``, in that order:
    its direction is its route's."""
    gpus = list(gpus) if kind == "p2p" else sorted(gpus)
    key = (kind, tuple(gpus), size, algorithm, protocol)
    plan = cluster.plan_cache.get(key)
    if plan is None:
        if len(cluster.plan_cache) >= _PLAN_CACHE_SIZE:
            cluster.plan_cache.clear()  # uneven all-to-alls ask for many one-off sizes
        plan = cluster.plan_cache[key] = _plan_collective(
            cluster, kind, gpus, size, algorithm, protocol
        )
    return plan


def plan_options(
    cluster: Cluster, kind: str, gpus: list[int], algorithm: str | None, protocol: str | None
) -> list[tuple[CollectiveChoice, _Candidate, float]]:
    """Every (algorithm, protocol) ``kind`` can run on ``gpus`` within the pins, each
    with its latency and bandwidth, the candidate that carries it and that candidate's
    rate alone (:func:`_rate`): none of it depends on the size or the pins, so a
    group's calls of every size share it (memoised on the cluster) and a pin picks
    from it."""
    key = ("choices", kind, tuple(gpus))
    choices = cluster.plan_cache.get(key)
    if choices is None:
        choices = cluster.plan_cache[key] = _all_choices(cluster, kind, gpus)
    if algorithm is None and protocol is None:
        return choices
    return [
        entry
        for entry in choices
        if (algorithm is None or entry[0].algorithm == algorithm)
        and (protocol is None or entry[0].protocol == protocol)
    ]


def _all_choices(
    cluster: Cluster, kind: str, gpus: list[int]
) -> list[tuple[CollectiveChoice, _Candidate, float]]:
    """:func:`_choices` without pins: each candidate's protocols in turn."""
    n = len(gpus)
    groups = _by_node(cluster, gpus)
    nodes, ppn = len(groups), max(len(g) for g in groups)
    intra = cluster.intra_node_link
    choices = []
    for candidate in _candidates(cluster, kind, gpus, groups):
        rate = _rate(cluster, candidate.usage)
        for proto in PROTOCOLS:
            busbw = bus_bandwidth(
                kind,
                candidate.algorithm,
                proto,
                candidate.link_busbw,
                nodes,
                ppn,
                cluster.nvls_efficiency,
            )
            if busbw <= 0:
                continue
            algbw = algorithm_bandwidth(kind, candidate.algorithm, busbw, n)
            latency = latency_seconds(kind, candidate.algorithm, proto, n, nodes, intra)
            choice = CollectiveChoice(candidate.algorithm, proto, latency, algbw, busbw)
            choices.append((choice, candidate, rate))
    return choices


def _plan_collective(
    cluster: Cluster,
    kind: str,
    gpus: list[int],
    size: float,
    algorithm: str | None,
    protocol: str | None,
) -> Plan:
    n = len(gpus)
    if n <= 1:
        return Plan(CollectiveChoice("none", "none", 0.0, float("inf"), float("inf")), [])
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r} (one of {', '.join(PROTOCOLS)})")
    best: tuple[float, CollectiveChoice, _Candidate, float] | None = None
    for choice, candidate, rate in plan_options(cluster, kind, gpus, algorithm, protocol):
        cost = choice.time(size)
        if best is None or cost < best[0] - 1e-15:
            best = (cost, choice, candidate, rate)
    if best is None:
        # a pinned algorithm (or protocol) this collective cannot run: the pin applies
        # where it can, and here parasim keeps its own choice; the run's result warns
        # (simulator.run.simulate.pin_warnings)
        if algorithm is not None:
            return _plan_collective(cluster, kind, gpus, size, None, protocol)
        if protocol is not None:
            return _plan_collective(cluster, kind, gpus, size, None, None)
        groups = _by_node(cluster, gpus)
        raise ValueError(f"{kind} on {n} ranks ({len(groups)} nodes): no algorithm can run it")
    _, choice, candidate, rate = best
    calibrated = _calibrated_choice(cluster, kind, gpus, candidate.algorithm, size)
    if calibrated is not None:
        choice = calibrated
    if kind == BARRIER or size <= 0:
        return Plan(choice, [TransferSpec({}, 0.0, choice.latency)])
    if candidate.phases:
        link_algbw = algorithm_bandwidth(kind, "direct", candidate.link_busbw, n)
        scale = link_algbw / choice.algbw  # the protocol's overhead, spread over the phases
        transfers = [
            TransferSpec(usage, coef * size * scale, choice.latency)
            for usage, coef in candidate.phases
        ]
        return Plan(choice, transfers)
    # volume per crossing so that alone the transfer takes size / algbw at its rate
    volume = rate * size / choice.algbw
    return Plan(choice, [TransferSpec(candidate.usage, volume, choice.latency)])


def plan_p2p(
    cluster: Cluster, src: int, dst: int, size: float, protocol: str | None = None
) -> Plan:
    """A send/recv pair: NCCL's p2p on the route from ``src`` to ``dst``."""
    return plan_collective(cluster, "p2p", [src, dst], size, "direct", protocol)


def collective_transfers(
    cluster: Cluster,
    kind: str,
    gpus: list[int],
    size: float,
    splits: dict[int, tuple[float, ...]] | None = None,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> tuple[CollectiveChoice, list[TransferSpec]]:
    """NCCL's choice and the transfers of one collective (uneven all-to-all: a flow per
    pair; with a calibrated all-to-all fit, the fit at the size of its busiest member)."""
    if kind == ALL_TO_ALL and splits is not None and len(gpus) > 1:
        if _calibrated_choice(cluster, kind, sorted(gpus), "direct") is not None:
            size = even_equivalent(splits, gpus)
            plan = plan_collective(cluster, kind, gpus, size, algorithm, protocol)
            return plan.choice, plan.transfers
        index = {gpu: i for i, gpu in enumerate(gpus)}
        specs = []
        choice = None
        for src in gpus:
            for dst in gpus:
                volume = splits[src][index[dst]] if src != dst else 0.0
                if volume <= 0:
                    continue
                plan = plan_p2p(cluster, src, dst, volume, protocol)
                choice = choice or plan.choice
                specs += plan.transfers
        return choice or plan_p2p(cluster, gpus[0], gpus[1], 0.0).choice, specs
    plan = plan_collective(cluster, kind, gpus, size, algorithm, protocol)
    return plan.choice, plan.transfers


def even_equivalent(splits: dict[int, tuple[float, ...]], gpus: list[int]) -> float:
    """The size of the even all-to-all whose members move as much as the busiest member
    of this uneven one: an even all-to-all of ``S`` bytes sends and receives
    ``S·(n−1)/n`` per member, and the uneven one ends with its busiest member."""
    n = len(gpus)
    busiest = 0.0
    for i, gpu in enumerate(gpus):
        sent = sum(v for j, v in enumerate(splits[gpu]) if j != i)
        received = sum(splits[other][i] for j, other in enumerate(gpus) if j != i)
        busiest = max(busiest, sent, received)
    return busiest * n / (n - 1)


def p2p_transfer(
    cluster: Cluster, src: int, dst: int, size: float, protocol: str | None = None
) -> TransferSpec:
    """The flow of one send/recv pair (zero bytes: its latency only)."""
    plan = plan_p2p(cluster, src, dst, size, protocol)
    return plan.transfers[0] if plan.transfers else TransferSpec({}, 0.0, plan.choice.latency)
