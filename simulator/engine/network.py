"""Flow-level network: transfers share links max–min fairly.

A *transfer* crosses a set of directed links, each ``multiplicity`` times, and moves
``volume`` bytes on every crossing at one common rate (an uneven all-to-all's coflow
crosses a link a fraction of times: its load there over its pairs' mean volume). A
point-to-point flow crosses each link of its route once. A ring collective is one
transfer whose crossings are all the ring's edges: NCCL's ring is pipelined in chunks,
and every step waits for the slowest edge, so the whole ring advances at the rate of its
most loaded link.

Rates follow max–min fairness (progressive filling): all unfrozen transfers raise
their rate together; a link saturates when ``Σ multiplicity · rate`` reaches its
bandwidth, freezing the transfers that cross it. Max–min allocations decompose over
the connected components of the transfer–link graph, so a change (a transfer starting
or finishing) only recomputes the component it touches; transfers whose rate does not
change keep their scheduled completion.

A transfer first waits its ``latency`` (it holds no bandwidth then), then moves its
volume: alone on links of bandwidth ``B`` it takes ``latency + volume / B``.

Every change of a transfer's rate is logged, and :attr:`FlowNetwork.utilisation`
turns the log into each link's carried rate over the step (once, when asked), so
reports can show each link's utilisation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import simpy

__all__ = ["FlowNetwork", "LinkSeries", "Transfer"]

#: A rate log entry: (time, crossings ``(link, multiplicity)``, change of the transfer's
#: rate, 1 as the transfer starts to move and -1 as it ends, else 0).
_Logged = tuple[float, tuple[tuple[int, float], ...], float, int]


class LinkSeries(Mapping[int, list[tuple[float, float]]]):
    """Each used link's carried rate over time, as a mapping: link id ->
    ``[(time, bytes/s carried from then on)]``, in time order, a point only where the
    load changes, exactly zero while the link carries nothing. Made from the rate log
    when asked, link by link: a flow run on a big cluster logs tens of millions of link
    crossings, and a summary needs every link's bytes (:meth:`carried`, summed per
    transfer's crossings) but only the busiest links' series."""

    def __init__(self, log: Sequence[_Logged]) -> None:
        self._log = log
        index: dict[int, int] = {}
        self._usages: list[tuple[tuple[int, float], ...]] = []
        entries = []
        for _, usage, _, _ in log:
            known = index.get(id(usage))
            if known is None:
                known = index[id(usage)] = len(self._usages)
                self._usages.append(usage)
            entries.append(known)
        self._entry_usage = np.array(entries, dtype=np.int64)
        self._on: dict[int, list[int]] = {}  # link -> the usages that cross it
        for number, usage in enumerate(self._usages):
            for link, _ in usage:
                self._on.setdefault(link, []).append(number)

    def __getitem__(self, link: int) -> list[tuple[float, float]]:
        usages = self._on[link]  # KeyError for a link nothing crossed
        mult = {number: dict(self._usages[number])[link] for number in usages}
        rows = np.flatnonzero(np.isin(self._entry_usage, usages))
        points: list[tuple[float, float]] = []
        load, moving = 0.0, 0
        for row in rows.tolist():
            now, _, change, started = self._log[row]
            moving += started
            load = 0.0 if moving == 0 else load + mult[int(self._entry_usage[row])] * change
            if points and points[-1][0] == now:
                points[-1] = (now, load)
                if len(points) > 1 and points[-2][1] == load:
                    points.pop()
            elif not points or points[-1][1] != load:
                points.append((now, load))
        return points

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._on))

    def __len__(self) -> int:
        return len(self._on)

    def carried(self, end: float) -> dict[int, float]:
        """Bytes each link carried over ``[0, end]``: every rate change times the time
        left from it to ``end``, summed per transfer's crossings, then per link."""
        log = self._log
        times = np.array([entry[0] for entry in log])
        changes = np.array([entry[2] for entry in log])
        weights = np.where(times <= end, changes * np.maximum(0.0, end - times), 0.0)
        per_usage = np.bincount(self._entry_usage, weights, minlength=len(self._usages))
        links = [link for usage in self._usages for link, _ in usage]
        amounts = [
            per_usage[number] * mult
            for number, usage in enumerate(self._usages)
            for _, mult in usage
        ]
        carried = np.bincount(links, amounts) if links else np.zeros(0)
        return {link: float(carried[link]) for link in sorted(self._on)}

    def peak(self, link: int) -> float:
        """The highest rate ``link`` carried."""
        return max(load for _, load in self[link])


_RELATIVE_TOLERANCE = 1e-12


class Transfer:
    """One flow or coflow in flight."""

    __slots__ = ("id", "usage", "remaining", "rate", "updated_at", "version", "done")

    def __init__(
        self,
        tid: int,
        usage: tuple[tuple[int, float], ...],
        volume: float,
        done: Callable[[], None],
    ):
        self.id = tid
        self.usage = usage  # ((link_id, multiplicity), ...)
        self.remaining = volume
        self.rate = 0.0
        self.updated_at = 0.0
        self.version = 0
        self.done = done


class FlowNetwork:
    """Links with per-direction bandwidths, shared max–min fairly by active transfers."""

    def __init__(self, env: simpy.Environment, bandwidths: list[float]):
        self.env = env
        self.bandwidths = bandwidths
        self._on_link: list[dict[int, Transfer]] = [{} for _ in bandwidths]
        self._next_id = 0
        self.transfers_started = 0
        self.recomputations = 0
        self.timeouts = 0  # SimPy events this network scheduled
        # id(usage) -> (usage, its crossings sorted by link); keeps the dict alive
        self._crossings: dict[int, tuple[Mapping[int, float], tuple[tuple[int, float], ...]]] = {}
        # (time, usage, change of the transfer's rate, 1 as it starts to move and -1 as
        # it ends, else 0), in time order
        self._rate_log: list[_Logged] = []
        self._utilisation: tuple[int, LinkSeries | None] = (0, None)

    @property
    def utilisation(self) -> LinkSeries:
        """Each used link's carried rate over time (:class:`LinkSeries`), from the log."""
        logged, series = self._utilisation
        if logged != len(self._rate_log) or series is None:
            series = LinkSeries(self._rate_log)
            self._utilisation = (len(self._rate_log), series)
        return series

    def transfer(
        self, usage: Mapping[int, float], volume: float, latency: float, done: Callable[[], None]
    ) -> None:
        """Start a transfer now; ``done()`` is called when its last byte arrives."""
        self.transfers_started += 1
        if volume <= 0 or not usage:
            self._after(latency, lambda _ev: done())
            return
        tid = self._next_id
        self._next_id += 1
        cached = self._crossings.get(id(usage))
        if cached is None or cached[0] is not usage:  # plans share their usage dicts
            cached = self._crossings[id(usage)] = (usage, tuple(sorted(usage.items())))
        transfer = Transfer(tid, cached[1], volume, done)
        if latency > 0:
            self._after(latency, lambda _ev: self._activate(transfer))
        else:
            self._activate(transfer)

    def _after(self, delay: float, callback) -> None:
        self.timeouts += 1
        event = self.env.timeout(delay)
        event.callbacks.append(callback)

    def _activate(self, transfer: Transfer) -> None:
        transfer.updated_at = self.env.now
        alone = True
        for link, _ in transfer.usage:
            on_link = self._on_link[link]
            if on_link:
                alone = False
            on_link[transfer.id] = transfer
        if alone:  # its own component: the rate its busiest link allows
            self.recomputations += 1
            bandwidths = self.bandwidths
            rate = min(bandwidths[link] / mult for link, mult in transfer.usage)
            transfer.rate = rate
            transfer.version += 1
            version = transfer.version
            delay = transfer.remaining / rate
            self._after(delay, lambda _ev: self._finish(transfer, version))
            self._rate_log.append((self.env.now, transfer.usage, rate, 1))
            return
        self._rebalance([transfer])

    def _finish(self, transfer: Transfer, version: int) -> None:
        if version != transfer.version:
            return  # its rate changed since this completion was scheduled
        neighbours: dict[int, Transfer] = {}
        for link, _ in transfer.usage:
            on_link = self._on_link[link]
            del on_link[transfer.id]
            neighbours.update(on_link)
        transfer.remaining = 0.0
        transfer.done()
        self._rate_log.append((self.env.now, transfer.usage, -transfer.rate, -1))
        if neighbours:
            self._rebalance(neighbours.values())

    def _component(self, seeds: Iterable[Transfer]) -> tuple[list[Transfer], list[int]]:
        members: dict[int, Transfer] = {}
        links: dict[int, None] = {}
        stack = list(seeds)
        for t in stack:
            members[t.id] = t
        while stack:
            t = stack.pop()
            for link, _ in t.usage:
                if link in links:
                    continue
                links[link] = None
                for other in self._on_link[link].values():
                    if other.id not in members:
                        members[other.id] = other
                        stack.append(other)
        ordered = [members[k] for k in sorted(members)]
        return ordered, sorted(links)

    def _rebalance(self, seeds: Iterable[Transfer]) -> None:
        self.recomputations += 1
        now = self.env.now
        transfers, links = self._component(seeds)
        for t in transfers:
            if t.rate > 0:
                t.remaining -= t.rate * (now - t.updated_at)
            t.updated_at = now
        rates = _max_min_rates(transfers, links, self.bandwidths)
        log = self._rate_log
        for t in transfers:
            rate = rates[t.id]
            if t.rate > 0 and abs(rate - t.rate) <= _RELATIVE_TOLERANCE * t.rate:
                continue  # unchanged: its scheduled completion still holds
            log.append((now, t.usage, rate - t.rate, 0 if t.rate > 0 else 1))
            t.rate = rate
            t.version += 1
            version = t.version
            delay = max(t.remaining, 0.0) / rate
            self._after(delay, lambda _ev, t=t, v=version: self._finish(t, v))


def _max_min_rates(
    transfers: list[Transfer], links: list[int], bandwidths: list[float]
) -> dict[int, float]:
    """Progressive filling with per-link multiplicities."""
    residual = {link: bandwidths[link] for link in links}
    weight = dict.fromkeys(links, 0.0)
    for t in transfers:
        for link, mult in t.usage:
            weight[link] += mult
    rates: dict[int, float] = {}
    unfrozen = {t.id: t for t in transfers}
    while unfrozen:
        level = min(residual[link] / weight[link] for link in weight if weight[link] > 0)
        saturated = {
            link
            for link in weight
            if weight[link] > 0 and residual[link] / weight[link] <= level * (1 + 1e-12)
        }
        frozen = [t for t in unfrozen.values() if any(link in saturated for link, _ in t.usage)]
        for t in frozen:
            rates[t.id] = level
            del unfrozen[t.id]
            for link, mult in t.usage:
                residual[link] -= level * mult
                weight[link] -= mult
    return rates
