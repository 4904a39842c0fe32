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

Every change of a link's carried rate is recorded (:attr:`FlowNetwork.utilisation`),
so reports can show each link's utilisation over the step.
"""

from __future__ import annotations

from collections.abc import Iterable

import simpy

__all__ = ["FlowNetwork", "Transfer"]

_RELATIVE_TOLERANCE = 1e-12


class Transfer:
    """One flow or coflow in flight."""

    __slots__ = ("id", "usage", "remaining", "rate", "updated_at", "version", "done")

    def __init__(self, tid: int, usage: tuple[tuple[int, int], ...], volume: float, done):
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
        # link id -> [(time, bytes/s carried from then on)], only for links ever used
        self.utilisation: dict[int, list[tuple[float, float]]] = {}

    def transfer(self, usage: dict[int, int], volume: float, latency: float) -> simpy.Event:
        """Start a transfer now; the returned event fires when its last byte arrives."""
        done = self.env.event()
        self.transfers_started += 1
        if volume <= 0 or not usage:
            self._after(latency, lambda _ev: done.succeed())
            return done
        tid = self._next_id
        self._next_id += 1
        transfer = Transfer(tid, tuple(sorted(usage.items())), volume, done)
        if latency > 0:
            self._after(latency, lambda _ev: self._activate(transfer))
        else:
            self._activate(transfer)
        return done

    def _after(self, delay: float, callback) -> None:
        event = self.env.timeout(delay)
        event.callbacks.append(callback)

    def _activate(self, transfer: Transfer) -> None:
        transfer.updated_at = self.env.now
        for link, _ in transfer.usage:
            self._on_link[link][transfer.id] = transfer
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
        transfer.done.succeed()
        idle = {link: 0.0 for link, _ in transfer.usage if not self._on_link[link]}
        self._record(idle)
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
        for t in transfers:
            rate = rates[t.id]
            if t.rate > 0 and abs(rate - t.rate) <= _RELATIVE_TOLERANCE * t.rate:
                continue  # unchanged: its scheduled completion still holds
            t.rate = rate
            t.version += 1
            version = t.version
            delay = max(t.remaining, 0.0) / rate
            self._after(delay, lambda _ev, t=t, v=version: self._finish(t, v))
        loads = dict.fromkeys(links, 0.0)
        for t in transfers:
            for link, mult in t.usage:
                loads[link] += mult * t.rate
        self._record(loads)

    def _record(self, loads: dict[int, float]) -> None:
        """Note the rate (bytes/s) each link carries from now on, where it changed."""
        now = self.env.now
        for link, load in loads.items():
            series = self.utilisation.setdefault(link, [])
            if series and series[-1][0] == now:
                series[-1] = (now, load)
            elif not series or series[-1][1] != load:
                series.append((now, load))


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
