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

from simulator.common.vocabulary import BARRIER
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
    crosses it and the transfer's bytes per crossing, sorted by image then link; the
    simulated call's own transfer and position; and the latest latency of them all."""

    own: TransferSpec
    own_image: int
    image: np.ndarray
    link: np.ndarray
    crossings: np.ndarray
    volume: np.ndarray
    latency: float

    def seconds(self, cluster: Cluster) -> float:
        """The time of every image at once alone on the network: the latest latency
        plus the busiest link's bytes over its bandwidth (as
        :func:`~simulator.engine.alone.time_alone` on every image's transfer)."""
        if not len(self.link):
            return self.latency
        load = np.bincount(self.link, self.volume * self.crossings)
        bandwidth = cluster.bandwidths
        return self.latency + float((load[self.link] / bandwidth[self.link]).max())

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


def _crossings(
    cluster: Cluster, src: np.ndarray, dst: np.ndarray, pairs_per_image: int, images: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each image's links and how often its pairs cross each (sorted by image, then
    link), and each image's rate alone (its busiest link's share of the bandwidth)."""
    pair, link = cluster.route_arrays(src, dst)
    key = (pair // pairs_per_image) * len(cluster.links) + link
    unique, counts = np.unique(key, return_counts=True)
    image, link = np.divmod(unique, len(cluster.links))
    share = cluster.bandwidths[link] / counts
    starts = np.flatnonzero(np.r_[True, image[1:] != image[:-1]])
    if len(starts) != images:
        raise ValueError("an image crosses no link")
    rate = np.minimum.reduceat(share, starts)
    return image, link, counts, rate


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
    a, b = np.asarray(sources, dtype=np.int64), np.asarray(destinations, dtype=np.int64)
    others = ~((a == src) & (b == dst))
    a = np.r_[src, a[others]]
    b = np.r_[dst, b[others]]
    image, link, counts, rate = _crossings(cluster, a, b, 1, len(a))
    inside = a // cluster.gpus_per_node == b // cluster.gpus_per_node
    volume = np.empty(len(a))
    volume[0], latency = own.volume, own.latency
    plans: dict[tuple[bool, float], TransferSpec] = {}
    for index in range(1, len(a)):
        key = (bool(inside[index]), float(rate[index]))
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = p2p_transfer(cluster, int(a[index]), int(b[index]), size, protocol)
            latency = max(latency, plan.latency)
        volume[index] = plan.volume
    return ImageLoads(own, 0, image, link, counts, volume[image], latency)


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
    image, link, counts, rate = _crossings(
        cluster, members[:, first].ravel(), members[:, second].ravel(), len(edges), count
    )
    (own_spec,) = own_specs
    at_own = image == mine[0]
    if dict(zip(link[at_own].tolist(), counts[at_own].tolist(), strict=True)) != own_spec.usage:
        return None
    volume = np.empty(count)
    latency = own_spec.latency
    plans: dict[float, TransferSpec] = {}
    for index in range(count):
        if index == mine[0]:
            volume[index] = own_spec.volume
            continue
        key = float(rate[index])
        plan = plans.get(key)
        if plan is None:
            group = members[index].tolist()
            made, specs = collective_transfers(
                cluster, kind, group, size, None, algorithm, protocol
            )
            pairs = [(group[position[a]], group[position[b]]) for a, b in edges]
            if (
                (made.algorithm, made.protocol) != (algorithm, protocol)
                or len(specs) != 1
                or specs[0].usage != route_usage(cluster, pairs)
            ):
                return None
            plan = plans[key] = specs[0]
            latency = max(latency, plan.latency)
        volume[index] = plan.volume
    return ImageLoads(own_spec, int(mine[0]), image, link, counts, volume[image], latency)
