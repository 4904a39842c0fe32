"""Flow-level network: transfers share links max–min fairly.

A *transfer* crosses a set of directed links, each ``multiplicity`` times, and moves
``volume`` bytes on every crossing at one common rate. A point-to-point flow crosses
each link of its route once. A ring collective is one transfer whose crossings are all
the ring's edges: NCCL's ring is pipelined in chunks, and every step waits for the
slowest edge, so the whole ring advances at the rate of its most loaded link.

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

from collections.abc import Callable, Iterable

import simpy

__all__ = ["FlowNetwork", "Transfer"]

_RELATIVE_TOLERANCE = 1e-12


class Transfer:
    """One flow or coflow in flight."""

    __slots__ = ("id", "usage", "remaining", "rate", "updated_at", "version", "done")

    def __init__(
        self, tid: int, usage: tuple[tuple[int, int], ...], volume: float, done: Callable[[], None]
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
        self._crossings: dict[int, tuple[dict[int, int], tuple[tuple[int, int], ...]]] = {}
        # (time, usage, change of the transfer's rate), in time order
        self._rate_log: list[tuple[float, tuple[tuple[int, int], ...], float]] = []
        self._utilisation: tuple[int, dict[int, list[tuple[float, float]]]] = (0, {})

    @property
    def utilisation(self) -> dict[int, list[tuple[float, float]]]:
        """Link id -> ``[(time, bytes/s carried from then on)]``, for every link used."""
        logged, series = self._utilisation
        if logged == len(self._rate_log):
            return series
        loads: dict[int, float] = {}
        series = {}
        bandwidths = self.bandwidths
        for now, usage, change in self._rate_log:
            for link, mult in usage:
                load = loads.get(link, 0.0) + mult * change
                if abs(load) <= 1e-9 * bandwidths[link]:
                    load = 0.0  # rounding left by rates that came and went
                loads[link] = load
                points = series.get(link)
                if points is None:
                    series[link] = [(now, load)]
                    continue
                when, carried = points[-1]
                if when == now:
                    points[-1] = (now, load)
                elif carried != load:
                    points.append((now, load))
        self._utilisation = (len(self._rate_log), series)
        return series

    def transfer(
        self, usage: dict[int, int], volume: float, latency: float, done: Callable[[], None]
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
            self._rate_log.append((self.env.now, transfer.usage, rate))
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
        self._rate_log.append((self.env.now, transfer.usage, -transfer.rate))
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
            log.append((now, t.usage, rate - t.rate))
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
    weight = dict.fromkeys(links, 0)
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
