"""The contention analytic fidelity does not see, estimated from its own timeline.

Analytic fidelity times every call alone on the network (with its symmetric images:
:mod:`simulator.engine.alone`). Where two calls of one rank run at once on links they
share, flow fidelity splits the links' bandwidth between them and both take longer;
analytic fidelity lets each run at full speed. A GPU's own links (to its NVSwitch, to
its NIC) carry only that GPU's transfers (``Cluster.links_of_gpu``), so what analytic
misses there is what each simulated rank's own calls ask of them at once: a
tensor-parallel all-reduce beside a data-parallel bucket on NVLink, a context-parallel
ring beside FSDP's gathers, a TP ring across nodes beside pipeline sends on the NIC.

:func:`missed_contention` walks each simulated rank's calls in the analytic timeline
(the calls inside blocks at their instants in the block's run on that rank) and gives
every call the share of each of the rank's links it keeps busy while it moves data:
the seconds its bytes need across the link, spread over its transfer time (1 on the
link that sets its pace). Where the shares of the calls in flight on one link add up
past 1, the link has more to carry than it can, and the excess is time some call loses
in flow: a rank's missed time is the integral over the step of its most overloaded
link's excess. Only links that calls of two streams cross can be overloaded (the calls
of one stream run one after another), so only their calls are walked.

A delay on one pipeline stage holds up the stages that wait for it, through the fill
and the drain, while the ranks of one stage run side by side: the step's estimate is
the largest sum of the missed time over the stages of one pipeline. On the random
scenarios of ``benchmarks/fidelity_gap.py`` (seed 0) the estimate lies between 0.8 and 4
times the gap flow finds, where that gap is over 1%: it is an estimate from above where
the calls slowed were hidden behind compute anyway, and a little below where a slowed
call delays others in turn.

A folded rank stands for its images, whose own links see the same by symmetry.
Simplified: an uneven all-to-all is taken at its even size; links between switches
(a fat tree's leaf and core uplinks) are left to
:mod:`simulator.analysis.oversubscription`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from simulator.engine.blocks import BodyTimes
from simulator.engine.collectives import TransferSpec, collective_transfers, p2p_transfer
from simulator.engine.core import SimulationTimes
from simulator.request.layout import Layout
from simulator.schedule.ir import Block, Collective, Compute, Recv, Schedule, Send
from topologies import Cluster

__all__ = ["MissedContention", "missed_contention", "contention_warnings", "WARN_FRACTION"]

#: The share of the step that missed contention must reach before the result warns.
#: The estimate fell to 0.8 of flow's gap on the random scenarios of
#: benchmarks/fidelity_gap.py, so the warning starts well below the 5% that analytic
#: and flow are held within (docs/modelling.md, "Fidelities").
WARN_FRACTION = 0.02

#: A call's demand on its rank's links: ``({link: seconds its bytes need}, latency)``.
_Need = tuple[dict[int, float], float]


@dataclass(frozen=True)
class MissedContention:
    """What analytic fidelity left out: the largest sum, over the stages of one
    pipeline, of the time the ranks' overloaded links ask for beyond what they carry;
    the rank that lost the most of it; and the axes of the calls that overloaded it."""

    seconds: float
    rank: int
    axes: tuple[str, ...]


def _need_of(cluster: Cluster, specs: list[TransferSpec], own: frozenset[int]) -> dict[int, float]:
    """Seconds each of the ``own`` links needs for ``specs``' bytes across it."""
    need: dict[int, float] = {}
    links = cluster.links
    for spec in specs:
        usage = spec.usage
        # a ring of a thousand GPUs crosses thousands of links, the rank's own a few
        # (the order of a rank's links changes nothing: each is a row of its own)
        crossed = usage if len(usage) <= len(own) else sorted(own)
        for link in (link for link in crossed if link in own and link in usage):
            need[link] = need.get(link, 0.0) + spec.volume * usage[link] / links[link].bandwidth
    return need


class _Demands:
    """Each call's demand on its rank's own links, memoised by what sets it."""

    def __init__(self, cluster: Cluster, schedule: Schedule, algorithm, protocol):
        self.cluster = cluster
        self.groups = {name: sorted(members) for name, members in schedule.groups.items()}
        self.algorithm, self.protocol = algorithm, protocol
        self._memo: dict[tuple, _Need] = {}
        self._own: dict[int, frozenset[int]] = {}

    def own_links(self, rank: int) -> frozenset[int]:
        """The links with ``rank``'s GPU at one end."""
        own = self._own.get(rank)
        if own is None:
            own = self._own[rank] = self.cluster.links_of_gpu(rank)
        return own

    def of(self, rank: int, op: Collective | Send | Recv) -> _Need:
        """The demand of ``op`` on ``rank``'s links."""
        if type(op) is Collective:
            key: tuple = (rank, op.group, op.kind, op.bytes)
        else:
            peer = cast("Send | Recv", op).peer  # not a Collective
            src, dst = (rank, peer) if type(op) is Send else (peer, rank)
            key = (rank, src, dst, op.bytes)
        known = self._memo.get(key)
        if known is None:
            if type(op) is Collective:
                choice, specs = collective_transfers(
                    self.cluster,
                    op.kind,
                    self.groups[op.group],
                    op.bytes,
                    None,
                    self.algorithm,
                    self.protocol,
                )
                latency = choice.latency
            else:
                spec = p2p_transfer(self.cluster, src, dst, op.bytes, self.protocol)
                specs, latency = [spec], spec.latency
            own = self.own_links(rank)
            known = self._memo[key] = (_need_of(self.cluster, specs, own), latency)
        return known


def _axis(op) -> str:
    return op.tags.get("axis", "other")


class _RankCalls:
    """One rank's calls that move data over its own links, gathered by what they ask
    of them (the same call on the same group, the same send to the same peer): which
    streams cross which links, and the calls in flight on the links two streams share."""

    def __init__(self, rank: int, ops: list, demands: _Demands):
        # (demand, axis, stream, ids of the ops that make it), one per distinct call
        plain: dict[tuple, tuple[Any, list[int]]] = {}
        # id(body) -> (body, ids of its blocks)
        blocked: dict[int, tuple[tuple, list[int]]] = {}
        for op in ops:
            kind = type(op)
            if kind is Compute:
                continue
            if kind is Block:
                entry = blocked.get(id(op.body))
                if entry is None:
                    entry = blocked[id(op.body)] = (op.body, [])
                entry[1].append(op.id)
                continue
            # calls alike in group (or peer), size and stream repeat one call
            if kind is Collective:
                key: tuple = (op.group, op.kind, op.bytes, op.stream)
            elif kind is Send or kind is Recv:
                key = (kind is Send, op.peer, op.bytes, op.stream)
            else:
                continue
            found = plain.get(key)
            if found is None:
                found = plain[key] = (op, [])
            found[1].append(op.id)
        self.plain = [
            (need, _axis(op), op.stream, ids)
            for op, ids in plain.values()
            if (need := demands.of(rank, op))[0]
        ]
        # (body, [(body op id, demand, axis, stream)], block ids) of bodies whose calls
        # move data
        self.blocked = []
        for body, ids in blocked.values():
            calls = [
                (inner.id, need, _axis(inner), inner.stream)
                for inner in body
                if type(inner) is Collective and (need := demands.of(rank, inner))[0]
            ]
            if calls:
                self.blocked.append((body, calls, ids))

    def shared_links(self) -> set[int]:
        """The rank's links that calls of two or more streams cross."""
        streams_on: dict[int, set[str]] = {}
        calls = [(need, stream) for need, _, stream, _ in self.plain]
        calls += [(need, stream) for _, inner, _ in self.blocked for _, need, _, stream in inner]
        for need, stream in calls:
            for link in need[0]:
                streams_on.setdefault(link, set()).add(stream)
        return {link for link, streams in streams_on.items() if len(streams) > 1}

    def uses(
        self,
        shared: set[int],
        start: list[float],
        end: list[float],
        body_times: Callable[[Block], BodyTimes] | None,
        ops: list,
    ) -> _Uses:
        """The calls in flight on ``shared`` links, with their shares of each."""
        uses = _Uses(sorted(shared))

        def part(need: _Need) -> list[tuple[int, float]]:
            return [(uses.row[link], s) for link, s in need[0].items() if link in shared]

        starts, ends = np.asarray(start), np.asarray(end)
        for need, axis, _, ids in self.plain:
            links = part(need)
            if links:
                uses.add(starts[ids], ends[ids], need[1], links, axis)
        for _, calls, ids in self.blocked:
            on_shared = [(index, need[1], part(need), axis) for index, need, axis, _ in calls]
            on_shared = [call for call in on_shared if call[2]]
            if not on_shared or body_times is None:
                continue
            # a rank runs every block of one body at its own factors: the same body times
            times, at = body_times(ops[ids[0]]), starts[ids]
            for index, latency, links, axis in on_shared:
                uses.add(at + times.start[index], at + times.end[index], latency, links, axis)
        return uses


class _Uses:
    """Calls in flight on a rank's shared links, as arrays: one entry per call and link."""

    def __init__(self, links: list[int]):
        self.row = {link: i for i, link in enumerate(links)}
        self._parts: list[tuple[np.ndarray, np.ndarray, int, np.ndarray, int]] = []
        self._axes: list[str] = []

    def add(
        self,
        begun: np.ndarray,
        ended: np.ndarray,
        latency: float,
        links: list[tuple[int, float]],
        axis: str,
    ) -> None:
        """Calls of one kind from ``begun`` to ``ended`` (moving data after their
        ``latency``), each needing ``seconds`` of each ``(row, seconds)`` link."""
        moving = ended - begun - latency
        kept = moving > 0
        if not kept.any():
            return
        if axis not in self._axes:
            self._axes.append(axis)
        begun, ended, moving = begun[kept] + latency, ended[kept], moving[kept]
        for row, seconds in links:
            self._parts.append((begun, ended, row, seconds / moving, self._axes.index(axis)))

    def excess(self) -> tuple[float, set[str]]:
        """``∫ max over links of max(0, Σ shares − 1) dt``, and the axes of the calls
        in flight where it is positive."""
        if not self._parts:
            return 0.0, set()
        begins = np.concatenate([part[0] for part in self._parts])
        ends = np.concatenate([part[1] for part in self._parts])
        rows = np.concatenate([np.full(len(part[0]), part[2]) for part in self._parts])
        shares = np.concatenate([part[3] for part in self._parts])
        axes = np.concatenate([np.full(len(part[0]), part[4]) for part in self._parts])
        instants = _distinct(np.concatenate([begins, ends]))
        lo, hi = np.searchsorted(instants, begins), np.searchsorted(instants, ends)
        # each link's change of load at each instant: every start's share added, then
        # every end's taken off, one after another in this order (bincount adds a
        # cell's weights in input order)
        width = len(instants)
        cells = np.concatenate([rows * width + lo, rows * width + hi])
        weights = np.concatenate([shares, -shares])
        change = np.bincount(cells, weights, minlength=len(self.row) * width)
        load = np.cumsum(change.reshape(len(self.row), width), axis=1)[:, :-1]
        # float sums of shares of 1 land a few ulps either side of a full link
        over = np.maximum(0.0, load.max(axis=0) - 1.0 - 1e-9)
        seconds = float(np.sum(over * np.diff(instants)))
        if seconds <= 0:
            return 0.0, set()
        overloaded = np.concatenate([[0], np.cumsum(over > 0)])
        during = overloaded[hi] > overloaded[lo]  # entries in flight over an overload
        return seconds, {self._axes[int(i)] for i in _distinct(axes[during])}


def _distinct(values: np.ndarray) -> np.ndarray:
    """``numpy.unique(values)``: the sorted distinct values, without its check for a
    masked array, which imports ``numpy.ma`` (15 ms of a one-step command) on first use."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def missed_contention(
    cluster: Cluster,
    schedule: Schedule,
    times: SimulationTimes,
    layout: Layout,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> MissedContention:
    """How much contention on the simulated ranks' own links the analytic ``times``
    left out (:class:`MissedContention`; the module's notes say how it is found)."""
    demands = _Demands(cluster, schedule, algorithm, protocol)
    by_pipeline: dict[tuple, float] = {}
    worst: tuple[float, int, set] = (0.0, min(schedule.programs, default=0), set())
    for rank in sorted(schedule.programs):
        calls = _RankCalls(rank, schedule.programs[rank].ops, demands)
        shared = calls.shared_links()
        if not shared:
            continue
        on_rank = None if times.blocks is None else times.blocks.on(rank)
        ops = schedule.programs[rank].ops
        uses = calls.uses(shared, times.start[rank], times.end[rank], on_rank, ops)
        seconds, axes = uses.excess()
        pipeline = tuple(sorted((a, c) for a, c in layout.coords(rank).items() if a != "pp"))
        by_pipeline[pipeline] = by_pipeline.get(pipeline, 0.0) + seconds
        if seconds > worst[0]:
            worst = (seconds, rank, axes)
    total = max(by_pipeline.values(), default=0.0)
    return MissedContention(total, worst[1], tuple(sorted(worst[2])))


def contention_warnings(
    cluster: Cluster,
    schedule: Schedule,
    times: SimulationTimes,
    layout: Layout,
    algorithm: str | None = None,
    protocol: str | None = None,
) -> list[str]:
    """A warning when the contention analytic fidelity left out comes to
    :data:`WARN_FRACTION` of the step or more (none otherwise)."""
    step = times.step_time
    if step <= 0:
        return []
    missed = missed_contention(cluster, schedule, times, layout, algorithm, protocol)
    if missed.seconds < WARN_FRACTION * step:
        return []
    return [
        f"analytic fidelity times each call alone, but {_listed(missed.axes)} calls "
        f"run at once on the links of the same GPUs (rank {missed.rank}, among others), "
        f"asking about {missed.seconds * 1e3:.3g} ms more of them over the step than "
        f"they carry ({missed.seconds / step:.0%} of it): the step is likely longer; flow "
        "fidelity (--set simulation.fidelity=flow) prices their contention"
    ]


def _listed(words: tuple[str, ...]) -> str:
    """``"a, b and c"``."""
    return " and ".join(filter(None, [", ".join(words[:-1]), *words[-1:]]))
