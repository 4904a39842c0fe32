"""Times of a Block's body: one pipeline action's ops, relative to the block's start.

A block's body only waits for its own ops (its collectives are on folded groups, timed
alone in analytic fidelity), so its ops' times relative to the block's start are the
same every time the body runs: a longest path over the body in program order, where an
op starts when its stream predecessor and its deps have finished. :class:`BlockTimer`
computes that once per body and hands it to the closed-form solver, the SimPy engine,
the time accounting and the trace, which all see the same instants.
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
    """Body times, memoised per body (bodies are shared between blocks).

    ``compute_time(op, body)`` gives a compute op's duration with the body's collectives
    that run beside it, ``collective_time(op)`` a collective's alone as ``(seconds,
    "kind/algorithm/protocol")``. A compute op starts no earlier than the host issued it:
    ``host_index × host_overhead`` after the block (its pipeline action) starts.
    """

    def __init__(
        self,
        compute_time: Callable[[Compute, tuple], float],
        collective_time: Callable[[Collective], tuple[float, str]],
        host_overhead: float = 0.0,
        templates: Mapping[int, tuple[tuple, tuple]] | None = None,
    ):
        self._compute_time = compute_time
        self._host_overhead = host_overhead
        self._collective_time = collective_time
        self._cache: dict[int, tuple[tuple, BodyTimes]] = {}
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

    def __call__(self, block: Block) -> BodyTimes:
        return self._times(block.body)

    def _times(self, body: tuple) -> BodyTimes:
        cached = self._cache.get(id(body))
        if cached is not None and cached[0] is body:
            return cached[1]
        template = self._templates.get(id(body))
        if template is not None and template[0] is body:
            # the same compute ops as the body it came from, its collectives on other
            # groups: where each of them costs what its counterpart does (the same
            # algorithm too), every op's times are the same
            times = self._times(template[1])
            if all(
                self._same_cost(op, base)
                for op, base in zip(body, template[1], strict=True)
                if op is not base
            ):
                self._cache[id(body)] = (body, times)
                return times
        n = len(body)
        ready, start, end = [0.0] * n, [0.0] * n, [0.0] * n
        clock: dict[str, float] = {}
        choices: dict[str, int] = {}
        for op in body:
            at = max([clock.get(op.stream, 0.0), *(end[d] for d in op.deps)])
            if type(op) is Compute:
                # the host issues the action's ops one per host_overhead from its start
                at = max(at, op.host_index * self._host_overhead)
                seconds = self._compute_time(op, body)
            elif type(op) is Collective:
                seconds, name = self._collective_time(op)
                choices[name] = choices.get(name, 0) + 1
            else:
                raise TypeError(f"a block body holds compute and collectives, not {op.type}")
            ready[op.id], start[op.id], end[op.id] = at, at, at + seconds
            clock[op.stream] = at + seconds
        times = BodyTimes(ready, start, end, max(end, default=0.0), choices)
        self._cache[id(body)] = (body, times)
        return times
