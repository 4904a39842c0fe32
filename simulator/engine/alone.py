"""Communication times alone on the network: analytic fidelity's cost of each call.

A collective or send/recv whose transfers have the network to themselves takes its
plan's latency plus the time its busiest link needs for the bytes crossing it. The
closed-form solver, the SimPy engine in analytic fidelity and block bodies all time
communication this way; :class:`AloneTimes` memoises it per group, kind and size.

"Alone" means without the step's other calls, not without the call's own images: one
collective of a stage has images, the same collective of every symmetric group of the
stage (the DP groups of all TP ranks, say), and they run at the same moment. Analytic
fidelity prices a call with all its images' transfers: the busiest link of them all,
so an oversubscribed spine or core slows it as it slows flow fidelity. Flow fidelity,
which moves a folded call's transfers as flows, adds the images' crossings to the
links the simulated call shares with them instead (:func:`with_images`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from simulator.common.vocabulary import ALL_TO_ALL
from simulator.engine.collectives import TransferSpec, collective_transfers, p2p_transfer
from simulator.engine.images import ImageLoads, collective_image_loads, p2p_image_loads
from simulator.engine.uneven import uneven_all_to_all, uneven_coflow
from simulator.schedule.ir import Collective, Schedule
from topologies import Cluster

__all__ = ["AloneTimes", "ListedImages", "time_alone", "with_images"]


def time_alone(cluster: Cluster, specs: Sequence[TransferSpec], latency: float) -> float:
    """Seconds for ``specs``, started together with nothing else on the network: the
    latest latency plus the busiest link's bytes over its bandwidth (``latency`` when
    there is nothing to move). A call with many crossings (a folded call's images)
    sums its links' loads with arrays (:func:`_busiest_by_arrays`), to the same bits."""
    if not specs:
        return latency
    moving = [spec for spec in specs if spec.volume > 0]
    if sum(len(spec.usage) for spec in moving) > _ARRAY_CROSSINGS:
        busiest = _busiest_by_arrays(cluster, moving)
    else:
        load: dict[int, float] = {}
        for spec in moving:
            for link, mult in spec.usage.items():
                load[link] = load.get(link, 0.0) + spec.volume * mult
        links = cluster.links
        busiest = max(
            (volume / links[link].bandwidth for link, volume in load.items()), default=0.0
        )
    return max(spec.latency for spec in specs) + busiest


#: Above this many link crossings in all, a call's link loads are summed with arrays.
_ARRAY_CROSSINGS = 64


def _busiest_by_arrays(cluster: Cluster, specs: Sequence[TransferSpec]) -> float:
    """The busiest link's seconds for ``specs`` (each with bytes to move): every
    crossing's bytes added up per link in the order :func:`time_alone`'s loop adds
    them (``numpy.bincount`` sums in input order), over the link's bandwidth."""
    cache = cluster.plan_cache
    columns = []
    for spec in specs:
        key = ("usage-arrays", id(spec.usage))
        known = cache.get(key)
        if known is None or known[0] is not spec.usage:  # kept alive with its arrays
            known = cache[key] = (
                spec.usage,
                np.fromiter(spec.usage.keys(), np.int64, len(spec.usage)),
                np.fromiter(spec.usage.values(), float, len(spec.usage)),
            )
        columns.append(known)
    bandwidth = cluster.bandwidths
    links = np.concatenate([column[1] for column in columns])
    volumes = np.concatenate(
        [spec.volume * column[2] for spec, column in zip(specs, columns, strict=True)]
    )
    load = np.bincount(links, volumes, minlength=len(bandwidth))
    return float((load[links] / bandwidth[links]).max()) if len(links) else 0.0


def with_images(specs: list[TransferSpec], image_specs: list[list[TransferSpec]]) -> list:
    """The transfers of a folded op, standing for its images too.

    Every image of the op (the same op on the ranks the simulated one stands for) runs
    at the same time and, by symmetry, at the same rate, so each transfer keeps its own
    links with the crossings of all images added where images share them. Links only
    one image crosses need no copy: by symmetry they carry what the simulated image's
    own links carry."""
    if any(len(other) != len(specs) for other in image_specs):
        return [spec for other in image_specs for spec in other]  # no alignment
    merged = []
    for index, spec in enumerate(specs):
        usage = dict(spec.usage)
        for other in image_specs:
            if other is specs:
                continue
            for link, mult in other[index].usage.items():
                if link in usage:
                    usage[link] += mult
        merged.append(TransferSpec(usage, spec.volume, spec.latency))
    return merged


class ListedImages:
    """A call's images planned one by one (:class:`~simulator.engine.images.ImageLoads`'
    counterpart where the images cannot be made from one plan per class): the
    transfers of each image, ``own`` the simulated call's, among them."""

    def __init__(self, images: list[list[TransferSpec]], own: list[TransferSpec], latency: float):
        self.images, self.own, self.latency = images, own, latency

    def seconds(self, cluster: Cluster) -> float:
        """Every image's transfers at once, alone on the network (:func:`time_alone`)."""
        return time_alone(cluster, [spec for image in self.images for spec in image], self.latency)

    def merged(self) -> list[TransferSpec]:
        """The simulated call's transfers carrying its images' crossings (:func:`with_images`)."""
        return with_images(self.own, self.images)


#: What a folded call's images come to: arrays, or the images planned one by one.
Images = ImageLoads | ListedImages


class AloneTimes:
    """Times of collectives and send/recv pairs alone on ``cluster`` (memoised).

    ``groups`` maps group names to member GPUs; ``algorithm``/``protocol`` pin NCCL's
    choice (None: NCCL's own); ``images`` and ``rank_images`` are a folded schedule's
    (:class:`~simulator.schedule.ir.Schedule`): the groups and ranks each simulated one
    stands for, priced together with it (:func:`with_images`)."""

    def __init__(
        self,
        cluster: Cluster,
        groups: Mapping[str, Sequence[int]],
        algorithm: str | None = None,
        protocol: str | None = None,
        images: Mapping[str, Sequence[Sequence[int]]] | None = None,
        rank_images: Mapping[int, Sequence[int]] | None = None,
    ):
        self.cluster = cluster
        self.group_gpus = {name: sorted(members) for name, members in groups.items()}
        self.algorithm = algorithm
        self.protocol = protocol
        self.images = images or {}
        self.rank_images = rank_images or {}
        # collective() keys -> (seconds, name), p2p() keys -> seconds
        self._memo: dict[tuple, Any] = {}
        self._placements: dict[Any, tuple] = {}
        self._arrays: dict[int, tuple[Any, np.ndarray]] = {}

    @classmethod
    def of_schedule(
        cls,
        cluster: Cluster,
        schedule: Schedule,
        algorithm: str | None = None,
        protocol: str | None = None,
    ) -> AloneTimes:
        """The alone times of ``schedule``'s groups, with its images."""
        return cls(
            cluster, schedule.groups, algorithm, protocol, schedule.images, schedule.rank_images
        )

    def matrix_splits(self, op: Collective) -> dict[int, tuple[float, ...]]:
        """A folded call's ``matrix`` as splits: each member GPU's bytes to each member
        (memoised per matrix: the calls that move the same bytes share it)."""
        known = self._memo.get(("matrix", id(op.matrix), op.group))
        if known is None or known[0] is not op.matrix:  # kept alive with its splits
            rows = map(tuple, op.matrix.tolist())
            splits = dict(zip(self.group_gpus[op.group], rows, strict=True))
            known = self._memo[("matrix", id(op.matrix), op.group)] = (op.matrix, splits)
        return known[1]

    def collective(self, op: Collective, splits=None) -> tuple[float, str]:
        """``(seconds, "kind/algorithm/protocol")`` of ``op`` (``splits``: an uneven
        all-to-all's bytes per member and peer, not memoised; a folded call's are its
        ``matrix``)."""
        if splits is None and op.matrix is not None:
            splits = self.matrix_splits(op)
        key = (op.group, op.kind, op.bytes)
        cached: tuple[float, str] | None = None if splits is not None else self._memo.get(key)
        if cached is None and splits is None:
            # the same call on the same GPUs and images costs the same in every step
            # on this cluster (a sweep's candidates share it)
            shared = ("alone", op.kind, op.bytes, *self._placed(op.group))
            shared += (self.algorithm, self.protocol)
            cached = cast("tuple[float, str] | None", self.cluster.plan_cache.get(shared))
            if cached is not None:
                self._memo[key] = cached
        if cached is None and splits is not None and op.kind == ALL_TO_ALL:
            cached = self.uneven(op.group, splits)
        if cached is None:
            choice, specs = collective_transfers(
                self.cluster,
                op.kind,
                self.group_gpus[op.group],
                op.bytes,
                splits,
                self.algorithm,
                self.protocol,
            )
            if splits is None and op.group in self.images:
                images = self.collective_images(op.group, op.kind, op.bytes, choice, specs)
                seconds = images.seconds(self.cluster)
            else:
                seconds = time_alone(self.cluster, specs, choice.latency)
            cached = (seconds, f"{op.kind}/{choice.algorithm}/{choice.protocol}")
            if splits is None:
                self._memo[key] = self.cluster.plan_cache[shared] = cached
        return cached

    def _placed(self, group: str) -> tuple:
        """``group``'s members and images (the groups it stands for), moved toward GPU 0
        as far as the cluster's symmetry allows
        (:meth:`~topologies.cluster.Cluster.symmetric_shift`): a key under which the
        same call on groups that are moves of one another (a pipeline's stages, say)
        is priced once."""
        known = self._placements.get(group)
        if known is None:
            own, images = self.group_gpus[group], self.images.get(group)
            known = self._placements[group] = self._moved_together(own, images)
        return known

    def _placed_pair(self, src: int, dst: int) -> tuple:
        """A send/recv's two GPUs and the ranks each stands for, moved as
        :meth:`_placed` moves a group's."""
        key = ("p2p", src, dst)
        known = self._placements.get(key)
        if known is None:
            sources, destinations = self.rank_images.get(src), self.rank_images.get(dst)
            known = self._placements[key] = self._moved_together(src, dst, sources, destinations)
        return known

    def _moved_together(self, *parts: int | Sequence[Any] | None) -> tuple:
        """Keys of ``parts`` (a GPU, GPUs, groups of as many GPUs each; None) all moved
        by the one shift their lowest GPU allows: each part's shape and numbers' bytes
        (the parts themselves where groups differ in size, unmoved)."""
        try:
            arrays = [None if part is None else self._array(part) for part in parts]
        except ValueError:  # groups of different sizes: no array, no move
            return parts
        lowest = min(int(array.min()) for array in arrays if array is not None and array.size)
        shift = self.cluster.symmetric_shift(lowest)
        return tuple(
            None if array is None else (array.shape, (array - shift).tobytes()) for array in arrays
        )

    def _array(self, gpus: int | Sequence[Any]) -> np.ndarray:
        """``gpus`` as an array (memoised while it lives: a rank's images are both ends
        of its sends and its receives)."""
        known = self._arrays.get(id(gpus))
        if known is None or known[0] is not gpus:
            known = self._arrays[id(gpus)] = (gpus, np.asarray(gpus, dtype=np.int64))
        return known[1]

    def uneven(self, group: str, splits) -> tuple[float, str] | None:
        """``(seconds, name)`` of an uneven all-to-all on ``group`` priced in arrays
        (:func:`uneven_all_to_all`; None where it cannot be), memoised by its bytes: a
        layer's dispatch runs again as the combine's gradient."""
        return self._uneven(group, splits, uneven_all_to_all)

    def uneven_flow(self, group: str, splits) -> tuple[TransferSpec, str] | None:
        """``(coflow, name)`` of an uneven all-to-all on ``group`` for the flow network
        (:func:`uneven_coflow`; None where it cannot be), memoised by its bytes."""
        return self._uneven(group, splits, uneven_coflow)

    def _uneven(self, group: str, splits, plan: Callable[..., Any]) -> Any:
        """``(what plan gives, "all_to_all/algorithm/protocol")`` of the uneven
        all-to-all on ``group`` (None where ``plan`` cannot give it), memoised."""
        gpus = self.group_gpus[group]
        bytes_moved = tuple(tuple(splits[gpu]) for gpu in gpus)
        key = (plan.__name__, group, bytes_moved, self.protocol)
        cached = self._memo.get(key)
        if cached is None:
            planned = plan(self.cluster, gpus, splits, self.protocol)
            if planned is None:
                return None
            choice, what = planned
            name = f"{ALL_TO_ALL}/{choice.algorithm}/{choice.protocol}"
            cached = self._memo[key] = (what, name)
        return cached

    def p2p(self, src: int, dst: int, size: float) -> float:
        """Seconds of a send/recv of ``size`` bytes from GPU ``src`` to ``dst`` (and its
        images beside it)."""
        key = ("p2p", src, dst, size)
        cached: float | None = self._memo.get(key)
        if cached is None:
            shared = ("alone-p2p", size, *self._placed_pair(src, dst), self.protocol)
            cached = cast("float | None", self.cluster.plan_cache.get(shared))
            if cached is None:
                cached = self.cluster.plan_cache[shared] = self.p2p_images_of(
                    src, dst, size
                ).seconds(self.cluster)
            self._memo[key] = cached
        return cached

    def _private(self, specs: list[TransferSpec]) -> bool:
        """Whether ``specs`` cross only links that touch a GPU of their own."""
        is_gpu_link = self.cluster.is_gpu_link
        return all(is_gpu_link(link) for spec in specs for link in spec.usage)

    def collective_images(
        self, group: str, kind: str, size: float, choice: Any, specs: list[TransferSpec]
    ) -> Images:
        """``group``'s collective (its plan's ``choice`` and transfers ``specs``) and its
        images: made from one plan per class where they can be
        (:func:`~simulator.engine.images.collective_image_loads`), else planned one by
        one (:meth:`image_transfers`)."""
        own = self.group_gpus[group]
        if not self._private(specs):
            images = self.images.get(group, (own,))
            loads = collective_image_loads(self.cluster, kind, own, images, size, choice, specs)
            if loads is not None:
                return loads
        return ListedImages(
            self.image_transfers(group, kind, size, choice, specs), specs, choice.latency
        )

    def p2p_images_of(self, src: int, dst: int, size: float) -> Images:
        """A send/recv and its images: made from one plan per class
        (:func:`~simulator.engine.images.p2p_image_loads`) where it has images to move
        data beside it, else its own transfer alone."""
        images = self.rank_images
        if size > 0 and src in images and dst in images:
            own = p2p_transfer(self.cluster, src, dst, size, self.protocol)
            if not self._private([own]):
                return p2p_image_loads(
                    self.cluster, src, dst, size, images[src], images[dst], self.protocol
                )
        listed = self.p2p_images(src, dst, size)
        return ListedImages(listed, listed[0], listed[0][0].latency)

    def image_transfers(
        self, group: str, kind: str, size: float, choice: Any, specs: list[TransferSpec]
    ) -> list[list[TransferSpec]]:
        """The transfers of ``group``'s collective and of each of its images, ``specs``
        (the group's own) among them; ``specs`` alone when they only cross links with
        one of the group's GPUs at an end (an NVSwitch node), which no image shares."""
        own = self.group_gpus[group]
        if self._private(specs):
            return [specs]
        return [
            specs
            if sorted(members) == own
            else collective_transfers(
                self.cluster, kind, sorted(members), size, None, choice.algorithm, choice.protocol
            )[1]
            for members in self.images.get(group, (own,))
        ]

    def p2p_images(self, src: int, dst: int, size: float) -> list[list[TransferSpec]]:
        """The transfer of a send/recv and of each of its images (the first is its own).

        NCCL's plan of a send/recv depends on its route only through whether it stays
        in a node and its slowest link's rate: the images' plans are made once per such
        class, and each image takes its own route's links (:meth:`_p2p_like`)."""
        own = [p2p_transfer(self.cluster, src, dst, size, self.protocol)]
        images = self.rank_images
        if src not in images or dst not in images or self._private(own):
            return [own]
        classes: dict[tuple[bool, float], TransferSpec] = {}
        others = [
            [self._p2p_like(a, b, size, classes)]
            for a, b in zip(images[src], images[dst], strict=True)
            if (a, b) != (src, dst)
        ]
        return [own, *others]

    def _p2p_like(
        self, a: int, b: int, size: float, classes: dict[tuple[bool, float], TransferSpec]
    ) -> TransferSpec:
        """:func:`p2p_transfer` from ``a`` to ``b``, its plan taken from the first pair of
        its class in ``classes`` (in a node or not, and the rate of its slowest link:
        all :func:`~simulator.engine.collectives.plan_p2p` reads of a route), its usage
        its own route's."""
        cluster = self.cluster
        usage = dict(Counter(cluster.route_links(a, b)))
        links = cluster.links
        rate = min(links[link].bandwidth / mult for link, mult in usage.items())
        key = (cluster.node_of(a) == cluster.node_of(b), rate)
        known = classes.get(key)
        if known is None:
            known = classes[key] = p2p_transfer(cluster, a, b, size, self.protocol)
        return TransferSpec(usage, known.volume, known.latency)
