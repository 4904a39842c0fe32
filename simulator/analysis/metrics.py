"""Time accounting: split every rank's step time into disjoint categories.

The compute stream is the rank's main timeline. Time it spends running ops is
``compute``. Every gap in it is explained by walking back the chain of ops it waited
for: the next compute op became ready when its *binding* predecessor (the one that
finished last among its stream predecessor and its deps) finished; if that was a
communication op, the part of the gap when the transfer ran is ``exposed_comm`` (per
axis; ``bubble`` for pipeline sends and receives), the part when the op had arrived
but its peers had not is ``imbalance_stall`` (``bubble`` for a pipeline receive
waiting for its sender), and the part before the op was even issued is explained by
*its* binding predecessor, and so on. After the rank's last op, it idles until the
slowest rank finishes: ``bubble`` in a pipeline (the flush), ``imbalance_stall``
otherwise. Whatever no op explains is ``other``. The categories are intervals that
partition ``[0, step_time]``, so they add up to the step time. A block (one pipeline
action) is accounted as its body is, run by the rank the block is on (a straggler's
compute stretched, shared cores' calls too), once per body and rank factors: its
compute, and its exposed TP communication.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.analysis.result import Breakdown, RankAccount
from simulator.engine.blocks import BodyTimes
from simulator.engine.core import SimulationTimes
from simulator.request.layout import Layout
from simulator.schedule.ir import Block, Collective, Compute, Schedule

__all__ = ["CATEGORIES", "account_rank", "account_step"]

CATEGORIES = ("compute", "exposed_comm", "bubble", "imbalance_stall", "other")


def _stream_previous(ops: list) -> list[int]:
    """The op before each op on its stream (-1 for the first of its stream)."""
    last_on_stream: dict[str, int] = {}
    previous = []
    for op in ops:
        stream = op.stream
        previous.append(last_on_stream.get(stream, -1))
        last_on_stream[stream] = op.id
    return previous


def account_rank(
    ops: list,
    ready: list[float],
    start: list[float],
    end: list[float],
    step_time: float,
    pipelined: bool,
    blocks: Callable[[Block], BodyTimes] | None = None,
    _bodies: dict[int, tuple] | None = None,
    intervals: list[tuple[str, float, float]] | None = None,
) -> dict[str, Any]:
    """Breakdown of one rank: categories (seconds), exposed comm per axis, compute per phase.
    ``blocks`` times the bodies of the rank's blocks as they ran on this rank
    (``BlockTimer.on(rank)``). With ``intervals`` (a list), every
    stretch of the compute stream that is not compute is appended to it as
    ``(category, start, end)``, so a timeline can draw the bubbles and stalls."""
    bodies = {} if _bodies is None else _bodies

    def add(category: str, lo: float, hi: float) -> None:
        totals[category] += hi - lo
        if intervals is not None:
            intervals.append((category, lo, hi))

    totals = dict.fromkeys(CATEGORIES, 0.0)
    exposed: dict[str, float] = {}
    by_phase: dict[str, float] = {}
    previous = _stream_previous(ops)

    def binding(op_id: int) -> int | None:
        """Of the op's stream predecessor and deps, the one that finished last (the
        first of them on a tie): ``max`` of them by ``(end, -id)``, spelled out. A dep
        on a point inside a block finished when that body op did."""
        best = previous[op_id]
        latest = end[best] if best >= 0 else None
        op = ops[op_id]
        points = op.points
        for index, dep in enumerate(op.deps):
            finished = end[dep]
            if points and points[index] >= 0:
                finished = _point_end(ops[dep], start[dep], points[index], blocks)
            if latest is None or finished > latest or (finished == latest and dep < best):
                best, latest = dep, finished
        return None if latest is None else best

    def explain(op_id: int | None, lo: float, hi: float) -> None:
        while op_id is not None and hi > lo:
            op = ops[op_id]
            if type(op) is Compute or type(op) is Block:
                break
            axis = op.tags.get("axis", "other")
            begun = max(lo, start[op_id])
            if hi > begun:
                if axis == "pp":
                    add("bubble", begun, hi)
                else:
                    add("exposed_comm", begun, hi)
                    exposed[axis] = exposed.get(axis, 0.0) + hi - begun
                hi = begun
            issued = max(lo, ready[op_id])
            if hi > issued:
                waiting = "imbalance_stall" if type(op) is Collective and axis != "pp" else "bubble"
                add(waiting, issued, hi)
                hi = issued
            op_id = binding(op_id)
        if hi > lo:
            add("other", lo, hi)

    cursor = 0.0
    for op in ops:
        if op.stream != "compute":
            continue
        if start[op.id] > cursor:
            explain(binding(op.id), cursor, start[op.id])
        cursor = end[op.id]
        if type(op) is Block:
            inner = _body_breakdown(op, blocks, bodies)
            for category, seconds in inner["breakdown"].items():
                totals[category] += seconds
            for axis, seconds in inner["exposed_comm_by_axis"].items():
                exposed[axis] = exposed.get(axis, 0.0) + seconds
            for phase, seconds in inner["compute_by_phase"].items():
                by_phase[phase] = by_phase.get(phase, 0.0) + seconds
            continue
        duration = end[op.id] - start[op.id]
        totals["compute"] += duration
        phase = op.tags.get("phase", "fwd")
        by_phase[phase] = by_phase.get(phase, 0.0) + duration
    rank_end = max(end, default=0.0)
    if rank_end > cursor:  # the first op to end last
        explain(list(end).index(rank_end), cursor, rank_end)
    if step_time > rank_end:
        add("bubble" if pipelined else "imbalance_stall", rank_end, step_time)
    return {
        "end_s": rank_end,
        "breakdown": totals,
        "exposed_comm_by_axis": dict(sorted(exposed.items())),
        "compute_by_phase": dict(sorted(by_phase.items())),
    }


def _point_end(
    block: Block, begun: float, point: int, blocks: Callable[[Block], BodyTimes] | None
) -> float:
    """When op ``point`` of ``block``'s body ended, the block having begun at ``begun``
    on the rank ``blocks`` times bodies for."""
    if blocks is None:
        raise ValueError("accounting a schedule with blocks needs their body times")
    return begun + blocks(block).end[point]


def _body_breakdown(
    block: Block, blocks: Callable[[Block], BodyTimes] | None, cache: dict
) -> dict[str, Any]:
    """A block's accounting: its body's as it ran on the rank (``blocks``), as if the
    body were a rank of its own. One body run at one rank's factors has one
    ``BodyTimes``; a body retargeted from another stage's, with the same times
    (``BlockTimer`` hands out the one ``BodyTimes``), accounts the same: its ops differ
    only in their groups. So the accounting is memoised by the times."""
    if blocks is None:
        raise ValueError("accounting a schedule with blocks needs their body times")
    times = blocks(block)
    cached = cache.get(id(times))
    if cached is None or cached[0] is not times or len(cached[2]) != len(block.body):
        row = account_rank(
            list(block.body), times.ready, times.start, times.end, times.makespan, False
        )
        cached = cache[id(times)] = (times, row, block.body)
    return cached[1]


def account_step(
    schedule: Schedule,
    times: SimulationTimes,
    layout: Layout,
    gpus_per_node: int,
    idle: dict[int, list[tuple[str, float, float]]] | None = None,
) -> tuple[Breakdown, list[RankAccount]]:
    """Per-rank breakdowns, the critical rank's and the mean over ranks. With ``idle``
    (a dict), each rank's idle stretches (``account_rank``'s ``intervals``) are put in
    it by rank."""
    per_rank = []
    bodies: dict[int, tuple] = {}
    folded = len(schedule.programs) < layout.world
    for rank in sorted(schedule.programs):
        if idle is not None:
            idle[rank] = []
        row = account_rank(
            schedule.programs[rank].ops,
            times.ready[rank],
            times.start[rank],
            times.end[rank],
            times.step_time,
            pipelined=layout.pp > 1,
            blocks=None if times.blocks is None else times.blocks.on(rank),
            _bodies=bodies,
            intervals=None if idle is None else idle[rank],
        )
        # the rank's grid coordinates, by RankAccount's fields (tp, dp, pp and cp), and
        # the ranks it stands for: a folded rank, its pipeline stage's with its own cp
        coords: dict[str, Any] = layout.coords(rank)
        if folded:
            ranks = len(schedule.rank_images.get(rank, (rank,)))
            shared: dict[str, int] = {a: coords[a] for a in ("pp", "cp") if a in coords}
            stage = layout.world // (layout.pp * layout.cp)
            if schedule.meta.get("moe") is not None and layout.ep > 1 and ranks < stage:
                shared["ep_group"] = coords["dp"] // layout.ep  # a folded MoE rank's group
        else:
            ranks, shared = 1, dict(coords)
        per_rank.append(
            RankAccount(
                rank=rank,
                node=rank // gpus_per_node,
                **coords,
                **row,
                ranks=ranks,
                class_coords=shared,
            )
        )
    critical = max(per_rank, key=lambda r: (r.end_s, -r.rank))
    count = len(per_rank)
    mean = {c: sum(r.breakdown[c] for r in per_rank) / count for c in CATEGORIES}
    return Breakdown(critical.rank, dict(critical.breakdown), mean), per_rank
