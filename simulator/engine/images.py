"""Every image of a folded call at once: the images' transfers as arrays.

A folded schedule simulates one rank of each class and stands it for its images (the
same call on the ranks it stands for, :mod:`simulator.engine.alone`). Pricing a call
with its images sums every image's crossings per link: a pipeline send on 131,072
GPUs has 8,192 images of eight links each. The images are nearly always the simulated
call moved across the cluster, the same plan on GPUs placed alike, so here they are
made from one plan per class of images and every image's routes are found at once
(:meth:`~topologies.cluster.Cluster.route_arrays`), in arrays:

- a send/recv's images fall into classes by what NCCL's plan of a send/recv reads of
  its route (whether it stays in a node, its slowest link's rate): one plan per class;
- a collective's images must split into nodes as the simulated group does (the same
  members, by rank in the group, on one node) and meet as many rails on each, so that
  the pinned algorithm's crossings are the simulated group's pairs, member for
  member; they fall into classes by their rate alone (the busiest link's share), and
  the plan of each class, made for its first image, must carry the pairs found here
  (checked) or the images are planned one by one as before.

The loads come out in the order per-image planning adds them (the images in their
order, each link's crossings once per image), so the times are the same to the bit
(tests/test_folded_images.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.common.vocabulary import ALL_TO_ALL, BARRIER, BROADCAST
from simulator.engine.collectives import (
    TransferSpec,
    candidate_edges,
    collective_transfers,
    p2p_transfer,
    route_usage,
)
from simulator.engine.nccl import CollectiveChoice
from topologies import Cluster

__all__ = ["ImageLoads", "collective_image_loads", "p2p_image_loads"]


@dataclass(frozen=True)
class ImageLoads:
    """All images' transfers of one call (one transfer per image): per image and link,
    the image's position in the call's images, the link, how often the image's transfer
    crosses it and the transfer's bytes per crossing, image by image; the
    simulated call's own transfer and position; and the latest latency of them all."""

    own: TransferSpec
    own_image: int
    crossed: Crossings
    volume: np.ndarray
    latency: float

    @property
    def image(self) -> np.ndarray:
        return self.crossed.image

    @property
    def link(self) -> np.ndarray:
        return self.crossed.link

    @property
    def crossings(self) -> np.ndarray:
        return self.crossed.counts

    def seconds(self, cluster: Cluster) -> float:
        """The time of every image at once alone on the network: the latest latency
        plus the busiest link's bytes over its bandwidth (as
        :func:`~simulator.engine.alone.time_alone` on every image's transfer, its loads
        summed per link in the same order)."""
        link = self.crossed.link
        if not len(link):
            return self.latency
        load = np.bincount(link, self.volume * self.crossed.counts)
        return self.latency + float((load[link] / cluster.bandwidths[link]).max())

    def merged(self) -> list[TransferSpec]:
        """The simulated call's transfer carrying the other images' crossings of its
        links (as :func:`~simulator.engine.alone.with_images`)."""
        others = self.image != self.own_image
        added = np.bincount(self.link[others], self.crossings[others])
        usage = {
            link: mult + (int(added[link]) if link < len(added) else 0)
            for link, mult in self.own.usage.items()
        }
        return [TransferSpec(usage, self.own.volume, self.own.latency)]


@dataclass(frozen=True)
class Crossings:
    """Each image's links and how often its pairs cross each, by image (``image``,
    ``link``, ``counts``: one entry per image and link; a route crosses a link once),
    and each image's rate alone (``rate``: its busiest link's share of the bandwidth):
    what a call's loads need of its images, whatever its size."""

    image: np.ndarray
    link: np.ndarray
    counts: np.ndarray
    rate: np.ndarray


def _crossings(
    cluster: Cluster, src: np.ndarray, dst: np.ndarray, pairs_per_image: int, images: int
) -> Crossings:
    """The :class:`Crossings` of ``images`` images of ``pairs_per_image`` pairs each
    (``src``/``dst``, image by image)."""
    pair, link = cluster.route_arrays(src, dst)
    if pairs_per_image == 1:  # one route an image: each of its links once, route order
        image, counts = pair, np.ones(len(pair), dtype=np.int64)
    else:
        key = (pair // pairs_per_image) * len(cluster.links) + link
        unique, counts = np.unique(key, return_counts=True)
        image, link = np.divmod(unique, len(cluster.links))
    share = cluster.bandwidths[link] / counts
    starts = np.flatnonzero(np.r_[True, image[1:] != image[:-1]])
    if len(starts) != images:
        raise ValueError("an image crosses no link")
    rate = np.minimum.reduceat(share, starts)
    return Crossings(image, link, counts, rate)


def p2p_image_loads(
    cluster: Cluster,
    src: int,
    dst: int,
    size: float,
    sources: Sequence[int],
    destinations: Sequence[int],
    protocol: str | None,
) -> ImageLoads:
    """A send/recv from ``src`` to ``dst`` and its images (pairs of ``sources`` and
    ``destinations``), its own first, then the others in their order."""
    own = p2p_transfer(cluster, src, dst, size, protocol)
    a, b, crossed, first, number = _p2p_layout(cluster, src, dst, sources, destinations)
    volume = np.empty(len(a))
    volume[0], latency = own.volume, own.latency
    for kind, index in enumerate(first):  # the others' classes, each planned for its first
        plan = p2p_transfer(cluster, int(a[index]), int(b[index]), size, protocol)
        latency = max(latency, plan.latency)
        volume[1:][number == kind] = plan.volume
    return ImageLoads(own, 0, crossed, volume[crossed.image], latency)


def _p2p_layout(
    cluster: Cluster,
    src: int,
    dst: int,
    sources: Sequence[int],
    destinations: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, Crossings, list[int], np.ndarray]:
    """What of :func:`p2p_image_loads` holds for sends of every size (memoised on the
    cluster): the pairs, own first; their :class:`Crossings`; the first pair of each
    class of the others (in a node or not, their rate) and each other's class."""
    key = ("p2p-layout", src, dst, id(sources), id(destinations))
    known = cluster.plan_cache.get(key)
    if known is not None and known[0] is sources and known[1] is destinations:
        return known[2]
    a, b = np.asarray(sources, dtype=np.int64), np.asarray(destinations, dtype=np.int64)
    others = ~((a == src) & (b == dst))
    a = np.r_[src, a[others]]
    b = np.r_[dst, b[others]]
    crossed = _crossings(cluster, a, b, 1, len(a))
    inside = a // cluster.gpus_per_node == b // cluster.gpus_per_node
    # a class is a rate and whether the pair stays in a node: one integer code each
    _, rate_code = np.unique(crossed.rate[1:], return_inverse=True)
    code = rate_code.reshape(-1) * 2 + inside[1:]
    _, first, number = np.unique(code, return_index=True, return_inverse=True)
    layout = (a, b, crossed, (first + 1).tolist(), number.reshape(-1))
    cluster.plan_cache[key] = (sources, destinations, layout)
    return layout


def collective_image_loads(
    cluster: Cluster,
    kind: str,
    own: Sequence[int],
    images: Sequence[Sequence[int]],
    size: float,
    choice: CollectiveChoice,
    own_specs: Sequence[TransferSpec],
) -> ImageLoads | None:
    """``kind`` of ``size`` bytes on ``own`` (sorted; its plan's ``choice`` and
    transfers ``own_specs``) and on each of ``images`` (the groups it stands for, ``own``
    among them) as the same algorithm and protocol; None where the images cannot be made
    from one plan per class (the module says when)."""
    algorithm, protocol = choice.algorithm, choice.protocol
    if kind == BARRIER or size <= 0 or len(own_specs) != 1:
        return None
    (own_spec,) = own_specs
    layout = _image_layout(cluster, kind, algorithm, own, images, own_spec)
    if layout is None:
        return None
    mine, crossed, others = layout
    rate = crossed.rate
    volume = np.full(len(rate), own_spec.volume)  # the own's class: the own's plan
    latency = own_spec.latency
    for key, group in others.items():
        made, specs = collective_transfers(cluster, kind, group, size, None, algorithm, protocol)
        if (made.algorithm, made.protocol) != (algorithm, protocol) or len(specs) != 1:
            return None
        volume[rate == key] = specs[0].volume
        latency = max(latency, specs[0].latency)
    return ImageLoads(own_spec, mine, crossed, volume[crossed.image], latency)


def _image_layout(
    cluster: Cluster,
    kind: str,
    algorithm: str,
    own: Sequence[int],
    images: Sequence[Sequence[int]],
    own_spec: TransferSpec,
) -> tuple[int, Crossings, dict[float, list[int]]] | None:
    """What of :func:`collective_image_loads` holds for calls of every size (memoised on
    the cluster): the own's place among the images; the images' crossings and rates
    (:func:`_crossings`); and a group of each class of rate but the own's, whose plan
    carries the pairs found here (checked). None where the images are not placed alike
    or a class's plan is not made of the own's pairs (remembered too)."""
    # the ring kinds share their rings' pairs, so their images' layout
    family = kind if kind in (ALL_TO_ALL, BROADCAST) else "ring"
    key = ("image-layout", family, algorithm, tuple(own), id(images))
    known = cluster.plan_cache.get(key)
    if known is not None and known[0] is images:  # kept alive with its layout
        return known[1]
    cluster.plan_cache[key] = (images, None)  # unless found below
    members = np.sort(np.asarray(images, dtype=np.int64), axis=1)
    if members.ndim != 2 or members.shape[1] != len(own):
        return None
    mine = np.flatnonzero((members == np.asarray(own)).all(axis=1))
    edges = candidate_edges(cluster, kind, algorithm, list(own))
    if not len(mine) or not edges:
        return None
    nodes = members // cluster.gpus_per_node
    rails = cluster.rails_of(members)
    # where a node ends and where a node's next member is on another rail: the rings
    # NCCL builds read nothing else of the members' places
    pattern = np.concatenate([nodes[:, 1:] != nodes[:, :-1], rails[:, 1:] != rails[:, :-1]], axis=1)
    if not (pattern == pattern[mine[0]]).all():
        return None
    position = {gpu: i for i, gpu in enumerate(own)}
    first = np.array([position[a] for a, _ in edges])
    second = np.array([position[b] for _, b in edges])
    count = len(members)
    crossed = _crossings(
        cluster, members[:, first].ravel(), members[:, second].ravel(), len(edges), count
    )
    image, link, counts, rate = crossed.image, crossed.link, crossed.counts, crossed.rate
    at_own = image == mine[0]
    if dict(zip(link[at_own].tolist(), counts[at_own].tolist(), strict=True)) != own_spec.usage:
        return None
    # one group of every other class, its plan's pairs checked against the own's
    others: dict[float, list[int]] = {}
    own_rate = float(rate[mine[0]])
    for index in np.unique(rate, return_index=True)[1].tolist():
        class_rate = float(rate[index])
        if class_rate == own_rate:
            continue
        group = members[index].tolist()
        pairs = [(group[position[a]], group[position[b]]) for a, b in edges]
        usage = collective_transfers(cluster, kind, group, 1.0, None, algorithm, None)[1]
        if len(usage) != 1 or usage[0].usage != route_usage(cluster, pairs):
            return None
        others[class_rate] = group
    found = (int(mine[0]), crossed, others)
    cluster.plan_cache[key] = (images, found)
    return found
