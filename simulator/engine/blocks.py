"""Times of a Block's body: one pipeline action's ops, relative to the block's start.

A block's body only waits for its own ops (its collectives are on folded groups, timed
alone in analytic fidelity), so its ops' times relative to the block's start are the
same every time the body runs on one rank: a longest path over the body in program
order, where an op starts when its stream predecessor and its deps have finished.
:class:`BlockTimer` computes that once per body and rank factors and hands it to the
closed-form solver, the SimPy engine, the time accounting and the trace, which all see
the same instants.

A rank whose compute runs slower (a straggler, ``EngineOptions.rank_factors``) or
whose calls do (CPU cores shared, ``EngineOptions.comm_factors``) runs the body with
its compute ops and its collectives stretched by those factors, as the same ops run op
by op: the block lasts the stretched body's makespan, and the accounting finds the
extra time in the ops that took it (compute, or exposed communication).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from simulator.schedule.ir import Block, Collective, Compute

__all__ = ["BlockTimer", "BodyTimes"]


@dataclass(frozen=True)
class BodyTimes:
    """Per body op (by local id) its ready, start and end, seconds after the block
    starts; ``makespan`` is the block's duration."""

    ready: list[float]
    start: list[float]
    end: list[float]
    makespan: float
    choices: dict[str, int]


class BlockTimer:
    """Body times, memoised per body and per rank factors (bodies are shared between
    blocks, and ranks mostly share their factors).

    ``compute_time(op, body)`` gives a compute op's duration with the body's collectives
    that run beside it, ``collective_time(op)`` a collective's alone as ``(seconds,
    "kind/algorithm/protocol")``. A compute op starts no earlier than the host issued it:
    ``host_index × host_overhead`` after the block (its pipeline action) starts.
    ``compute_factors`` and ``comm_factors`` (rank -> factor; absent ranks take 1)
    stretch a rank's compute ops and its collectives.
    """

    def __init__(
        self,
        compute_time: Callable[[Compute, tuple], float],
        collective_time: Callable[[Collective], tuple[float, str]],
        host_overhead: float = 0.0,
        templates: Mapping[int, tuple[tuple, tuple]] | None = None,
        compute_factors: Mapping[int, float] | None = None,
        comm_factors: Mapping[int, float] | None = None,
    ):
        self._compute_time = compute_time
        self._host_overhead = host_overhead
        self._collective_time = collective_time
        self._compute_factors = dict(compute_factors or {})
        self._comm_factors = dict(comm_factors or {})
        # id(body) -> (body, {(compute factor, comm factor): its times})
        self._cache: dict[int, tuple[tuple, dict[tuple[float, float], BodyTimes]]] = {}
        # a search's bodies retargeted from another stage's (Schedule.body_templates)
        self._templates = templates or {}
        self._same: dict[tuple, bool] = {}

    def _same_cost(self, op: Collective, base: Collective) -> bool:
        """Whether ``op`` costs what ``base`` does, and runs the same algorithm (the
        same call on another group: memoised per pair of groups)."""
        key = (op.group, base.group, op.kind, op.bytes)
        same = self._same.get(key)
        if same is None:
            same = self._same[key] = self._collective_time(op) == self._collective_time(base)
        return same

    def scales(self, rank: int | None) -> tuple[float, float]:
        """``(compute factor, comm factor)`` of ``rank`` (None: ``(1, 1)``)."""
        if rank is None:
            return 1.0, 1.0
        return self._compute_factors.get(rank, 1.0), self._comm_factors.get(rank, 1.0)

    def __call__(self, block: Block, rank: int | None = None) -> BodyTimes:
        """The times of ``block``'s body run by ``rank`` (None: at factor 1)."""
        return self._times(block.body, self.scales(rank))

    def on(self, rank: int) -> Callable[[Block], BodyTimes]:
        """The body times of ``rank``'s blocks, as a function of the block."""
        scales = self.scales(rank)
        return lambda block: self._times(block.body, scales)

    def _times(self, body: tuple, scales: tuple[float, float]) -> BodyTimes:
        cached = self._cache.get(id(body))
        if cached is None or cached[0] is not body:
            cached = self._cache[id(body)] = (body, {})
        known = cached[1].get(scales)
        if known is not None:
            return known
        template = self._templates.get(id(body))
        if template is not None and template[0] is body:
            # the same compute ops as the body it came from, its collectives on other
            # groups: where each of them costs what its counterpart does (the same
            # algorithm too), every op's times are the same
            if all(
                self._same_cost(op, base)
                for op, base in zip(body, template[1], strict=True)
                if op is not base
            ):
                times = cached[1][scales] = self._times(template[1], scales)
                return times
        times = cached[1][scales] = self._solve(body, scales)
        return times

    def _solve(self, body: tuple, scales: tuple[float, float]) -> BodyTimes:
        """The longest path over ``body`` with its compute and collectives stretched by
        ``scales``."""
        compute_factor, comm_factor = scales
        n = len(body)
        ready, start, end = [0.0] * n, [0.0] * n, [0.0] * n
        clock: dict[str, float] = {}
        choices: dict[str, int] = {}
        for op in body:
            at = max([clock.get(op.stream, 0.0), *(end[d] for d in op.deps)])
            if type(op) is Compute:
                # the host issues the action's ops one per host_overhead from its start
                at = max(at, op.host_index * self._host_overhead)
                seconds = self._compute_time(op, body) * compute_factor
            elif type(op) is Collective:
                seconds, name = self._collective_time(op)
                seconds *= comm_factor
                choices[name] = choices.get(name, 0) + 1
            else:
                raise TypeError(f"a block body holds compute and collectives, not {op.type}")
            ready[op.id], start[op.id], end[op.id] = at, at, at + seconds
            clock[op.stream] = at + seconds
        return BodyTimes(ready, start, end, max(end, default=0.0), choices)
