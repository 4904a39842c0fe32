"""An uneven all-to-all alone on the network, priced in arrays, and its coflow.

An MoE layer's dispatch and combine are all-to-alls whose every pair moves its own
bytes: NCCL runs each pair as a send/recv, so the call is one flow per pair, each
planned as a send/recv of its size (:func:`~simulator.engine.collectives.plan_p2p`),
and alone on the network it takes the latest latency plus its busiest link's bytes over
the link's bandwidth (:func:`~simulator.engine.alone.time_alone`). On 32 ranks that is
about a thousand plans per call and an MoE step makes thousands of calls, so here the
pairs are planned by class: NCCL's plan of a send/recv reads of its route only whether
it stays in a node and its slowest link's rate, and of its size only which protocol is
cheapest. Each group's routes are found once, all pairs at once; each call picks every
pair's protocol, volume and latency in arrays and sums the links' loads in the order
pair-by-pair planning adds them, so the time is the same to the bit
(tests/test_uneven.py). Flow fidelity moves the same pairs as one coflow whose weight on
each link is the load found here (:func:`uneven_coflow`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.engine.collectives import TransferSpec, plan_options
from simulator.engine.nccl import CollectiveChoice
from topologies import Cluster

__all__ = ["uneven_all_to_all", "uneven_coflow"]


@dataclass(frozen=True)
class _Routes:
    """Every ordered pair of a group's members (source-major, the pair ``i, j`` at
    ``i·n + j``, none from a member to itself), their crossings and their classes."""

    pair: np.ndarray  # per crossing: the pair's index
    link: np.ndarray  # per crossing: the link
    kind: np.ndarray  # per pair: its class's index in ``classes``
    classes: list[list[tuple[CollectiveChoice, float]]]  # (choice, rate) of each class
    simple: bool  # no route crosses a link twice


def _routes(cluster: Cluster, gpus: Sequence[int], protocol: str | None) -> _Routes:
    """The routes and plan classes of every pair of ``gpus`` (memoised on the cluster)."""
    key = ("uneven-routes", tuple(gpus), protocol)
    known = cluster.plan_cache.get(key)
    if isinstance(known, _Routes):
        return known
    members = np.asarray(gpus, dtype=np.int64)
    n = len(members)
    src = np.repeat(members, n)
    dst = np.tile(members, n)
    off = src != dst
    pair, link = cluster.route_arrays(src[off], dst[off])
    # back to the full n·n numbering, the diagonal left out
    full = np.flatnonzero(off)
    pair = full[pair]
    share = cluster.bandwidths[link]
    starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    rate = np.full(n * n, np.nan)
    rate[pair[starts]] = np.minimum.reduceat(share, starts)
    inside = src // cluster.gpus_per_node == dst // cluster.gpus_per_node
    kind = np.full(n * n, -1, dtype=np.int64)
    classes: list[list[tuple[CollectiveChoice, float]]] = []
    index: dict[tuple[bool, float], int] = {}
    for p in np.flatnonzero(off).tolist():
        class_key = (bool(inside[p]), float(rate[p]))
        found = index.get(class_key)
        if found is None:
            found = index[class_key] = len(classes)
            options = plan_options(cluster, "p2p", [int(src[p]), int(dst[p])], "direct", protocol)
            classes.append([(choice, candidate_rate) for choice, _, candidate_rate in options])
        kind[p] = found
    simple = len(np.unique(pair * len(cluster.links) + link)) == len(pair)
    routes = _Routes(pair, link, kind, classes, simple)
    cluster.plan_cache[key] = routes
    return routes


@dataclass(frozen=True)
class _Priced:
    """An uneven all-to-all's pairs planned: NCCL's choice of the first pair that moves
    bytes, the latest pair's latency, and every link's load (bytes per crossing summed
    over the pairs that cross it, in pair order) with the pairs' mean volume."""

    first: CollectiveChoice
    latency: float
    links: np.ndarray  # the loaded links, ascending
    load: np.ndarray  # their loads
    mean_volume: float


def _priced(
    cluster: Cluster,
    gpus: Sequence[int],
    splits: Mapping[int, Sequence[float]],
    protocol: str | None,
) -> _Priced | None:
    """Every pair of the call planned in arrays; None where a pair's plan is not NCCL's
    own (a calibrated send/recv), a route crosses a link twice, or no pair moves bytes."""
    if cluster.spec.calibration is not None:
        return None
    n = len(gpus)
    matrix = np.array([splits[gpu] for gpu in gpus], dtype=float).reshape(n * n)
    np.fill_diagonal(matrix.reshape(n, n), 0.0)
    moving = np.flatnonzero(matrix > 0)
    if not len(moving):
        return None
    routes = _routes(cluster, gpus, protocol)
    if not routes.simple:
        return None
    sizes = matrix[moving]
    kinds = routes.kind[moving]
    volume = np.empty(len(moving))
    latency = np.empty(len(moving))
    first: CollectiveChoice | None = None
    for number, options in enumerate(routes.classes):
        chosen = np.flatnonzero(kinds == number)
        if not len(chosen):
            continue
        size = sizes[chosen]
        # the cheapest option for each size, the first of equals (as plan_collective)
        best_cost = np.full(len(chosen), np.inf)
        best = np.zeros(len(chosen), dtype=np.int64)
        for option, (choice, _) in enumerate(options):
            cost = choice.latency + size / choice.algbw
            better = cost < best_cost - 1e-15
            best_cost = np.where(better, cost, best_cost)
            best = np.where(better, option, best)
        for option, (choice, rate) in enumerate(options):
            taken = best == option
            volume[chosen[taken]] = rate * size[taken] / choice.algbw
            latency[chosen[taken]] = choice.latency
        if chosen[0] == 0:
            first = options[int(best[0])][0]
    assert first is not None  # the first pair that moves bytes is in some class
    # each pair's crossings, in pair order: the loads add up as pair-by-pair planning
    # adds them
    position = np.full(n * n, -1, dtype=np.int64)
    position[moving] = np.arange(len(moving))
    at = position[routes.pair]
    kept = at >= 0
    links = routes.link[kept]
    load = np.bincount(links, volume[at[kept]])
    used = np.flatnonzero(load > 0)
    return _Priced(first, float(latency.max()), used, load[used], float(volume.mean()))


def uneven_all_to_all(
    cluster: Cluster,
    gpus: Sequence[int],
    splits: Mapping[int, Sequence[float]],
    protocol: str | None = None,
) -> tuple[CollectiveChoice, float] | None:
    """The choice of the first pair that moves bytes and the seconds of the uneven
    all-to-all on ``gpus`` (``splits[src][j]``: bytes from GPU ``src`` to ``gpus[j]``)
    alone on the network; None where a pair's plan is not NCCL's own (a calibrated
    send/recv), a route crosses a link twice, or no pair moves bytes."""
    priced = _priced(cluster, gpus, splits, protocol)
    if priced is None:
        return None
    busiest = float((priced.load / cluster.bandwidths[priced.links]).max())
    return priced.first, priced.latency + busiest


def uneven_coflow(
    cluster: Cluster,
    gpus: Sequence[int],
    splits: Mapping[int, Sequence[float]],
    protocol: str | None = None,
) -> tuple[CollectiveChoice, TransferSpec] | None:
    """The uneven all-to-all of :func:`uneven_all_to_all` as one coflow for the flow
    network: its pairs advance together, each in proportion to its bytes, so the call
    crosses each link as many times as its load there holds the pairs' mean volume (a
    fractional multiplicity: on a link the call weighs as much as the pairs crossing it,
    against other traffic, as an even all-to-all's pairs do). Alone it ends when
    :func:`uneven_all_to_all` says; beside other traffic it slows where it shares a
    link. None where that function cannot price it."""
    priced = _priced(cluster, gpus, splits, protocol)
    if priced is None:
        return None
    unit = priced.mean_volume
    usage = dict(zip(priced.links.tolist(), (priced.load / unit).tolist(), strict=True))
    return priced.first, TransferSpec(usage, unit, priced.latency)
