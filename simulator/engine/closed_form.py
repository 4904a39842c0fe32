"""Analytic fidelity without an event queue: every op's times in closed form.

With no contention (analytic fidelity) every op's duration is known in advance: the
roofline for compute, NCCL's closed-form time for a collective or a send/recv. So the
step is a longest-path problem over the ops' dependencies, and this module solves it
directly: it walks each (rank, stream) in program order, and an op gets its times as
soon as its stream predecessor and its deps have theirs —

* compute, blocks (see :mod:`.blocks`) and folded collectives: ``start = ready``,
  ``end = start + duration``;
* a collective of simulated members: ``start`` = the last member's arrival;
* a send/recv pair (matched by (src, dst, tag), in order): ``start`` = the later of the
  two being posted.

An op that waits for a point inside a block (``Op.points``) waits for that body op's
end in the block's run: the block's start plus the body op's end in the body's run on
that rank (its compute and calls stretched by the rank's factors, as the block was).

It gives the same times as the SimPy engine in analytic fidelity (a test holds them
together) for a fraction of the cost, since no event is scheduled.
"""

from __future__ import annotations

import math
from collections import deque

from simulator.common.errors import DeadlockError, ScenarioError
from simulator.engine.alone import AloneTimes
from simulator.engine.blocks import BlockTimer
from simulator.engine.compute import ComputeModel
from simulator.schedule.ir import Block, Collective, Compute, Schedule, Send
from topologies import Cluster

__all__ = ["evaluate"]


def evaluate(schedule: Schedule, cluster: Cluster, options) -> tuple:
    """``(ready, start, end, choices, block_times, counts)`` per rank and op id, for
    analytic fidelity; ``block_times`` times the bodies of the schedule's blocks and
    ``counts`` says how many ops (a block's body op by op) and blocks ran."""
    compute = ComputeModel(cluster.spec, schedule.meta)
    simulated = set(schedule.programs)
    folded = {n for n, m in schedule.groups.items() if not set(m) <= simulated}
    choices: dict[str, int] = {}
    alone = AloneTimes.of_schedule(cluster, schedule, options.algorithm, options.protocol)
    plan, p2p_time = alone.collective, alone.p2p

    def collective_time(op: Collective, splits=None) -> float:
        seconds, name = plan(op, splits)
        choices[name] = choices.get(name, 0) + 1
        return seconds

    host = compute.host_overhead
    factors = dict(options.rank_factors)
    comm_factors = dict(options.comm_factors)
    block_times = BlockTimer(
        lambda op, body: compute.with_comm(op, body, plan),
        plan,
        host,
        schedule.body_templates,
        factors,
        comm_factors,
    )
    beside: dict[int, float] = {}  # id(compute op) -> its time with the comm beside it

    def compute_time(rank: int, op: Compute) -> float:
        """The op's time, with the collectives beside it (shared ops: memoised)."""
        if not op.beside_comm:
            return compute.duration(op)
        seconds = beside.get(id(op))
        if seconds is None:
            seconds = beside[id(op)] = compute.with_comm(op, schedule.programs[rank].ops, plan)
        return seconds

    def stretch(ranks) -> float:
        """How many times as long a call of ``ranks`` takes for their shared cores."""
        return max(comm_factors.get(r, 1.0) for r in ranks) if comm_factors else 1.0

    action_start: dict[int, float] = {}  # rank -> start of its current action's first op
    runs: dict[int, list] = {}  # id(body) -> [block, times it ran]

    def block_time(rank: int, op: Block) -> float:
        """The block's duration on ``rank``: its body's makespan at the rank's factors."""
        run = runs.get(id(op.body))
        if run is None:
            run = runs[id(op.body)] = [op, 0]
        run[1] += 1
        return block_times(op, rank).makespan

    def point_end(rank: int, block_id: int, point: int) -> float:
        """When op ``point`` of a block's body ends, the block having run on ``rank``."""
        body = block_times(schedule.programs[rank].ops[block_id], rank)
        return start[rank][block_id] + body.end[point]

    ready, start, end = {}, {}, {}
    streams: list[tuple[int, list]] = []
    for rank, program in sorted(schedule.programs.items()):
        if not 0 <= rank < cluster.num_gpus:
            raise ScenarioError(
                f"schedule: rank {rank} has no GPU (the cluster has {cluster.num_gpus} GPUs)"
            )
        n = len(program.ops)
        ready[rank], start[rank], end[rank] = [math.nan] * n, [math.nan] * n, [math.nan] * n
        by_stream: dict[str, list] = {}
        for op in program.ops:
            by_stream.setdefault(op.stream, []).append(op)
        streams += [(rank, ops) for ops in by_stream.values()]
    heads = [0] * len(streams)
    clock = [0.0] * len(streams)  # end of each stream's last op
    pending: list[bool] = [False] * len(streams)  # head op posted, waiting for partners
    rendezvous: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    sequence: dict[tuple[str, int], int] = {}
    channels: dict[tuple[int, int, int], list] = {}

    # streams that can move on, and streams waiting for an op of their rank to finish
    runnable: deque[int] = deque(range(len(streams)))
    waiters: dict[int, dict[int, list[int]]] = {rank: {} for rank in schedule.programs}

    def woken(rank: int, op_id: int) -> None:
        waiting = waiters[rank].pop(op_id, None)
        if waiting is not None:
            runnable.extend(waiting)

    def finish(rank: int, op_id: int, begin: float, stop: float, index: int) -> None:
        start[rank][op_id], end[rank][op_id] = begin, stop
        clock[index] = stop
        heads[index] += 1
        if pending[index]:
            pending[index] = False
            if index != current:
                runnable.append(index)
        if op_id in waiters[rank]:
            woken(rank, op_id)

    current = -1
    while runnable:
        index = current = runnable.popleft()
        rank, ops = streams[index]
        done, issued, begun, waits = end[rank], ready[rank], start[rank], waiters[rank]
        count = len(ops)
        while heads[index] < count and not pending[index]:
            op = ops[heads[index]]
            at = clock[index]
            blocker = -1
            if op.points:  # some deps are ops inside blocks: their ends, not the blocks'
                for dep, point in zip(op.deps, op.points, strict=True):
                    t = done[dep]
                    if t != t:
                        blocker = dep
                        break
                    if point >= 0:
                        t = point_end(rank, dep, point)
                    if t > at:
                        at = t
            else:
                for dep in op.deps:
                    t = done[dep]
                    if t != t:  # NaN: not finished yet
                        blocker = dep
                        break
                    if t > at:
                        at = t
            if blocker >= 0:
                waits.setdefault(blocker, []).append(index)
                break
            op_id = op.id
            kind = type(op)
            if kind is Compute:
                if op.host_index == 0:
                    action_start[rank] = at
                elif host:
                    at = max(at, action_start[rank] + op.host_index * host)
            issued[op_id] = at
            if kind is Compute or kind is Block:
                if kind is Compute:
                    stop = at + compute_time(rank, op)
                    if factors:  # stragglers, shared cores: this rank's compute runs slower
                        stop = at + (stop - at) * factors.get(rank, 1.0)
                else:  # its body's ops stretched by the rank's factors
                    stop = at + block_time(rank, op)
                begun[op_id], done[op_id] = at, stop
                clock[index] = stop
                heads[index] += 1
                if op_id in waits:
                    woken(rank, op_id)
                continue
            if kind is Collective and op.group in folded:
                finish(rank, op.id, at, at + collective_time(op) * stretch((rank,)), index)
            elif kind is Collective:
                members = schedule.groups[op.group]
                seq = sequence.get((op.group, rank), 0)
                sequence[(op.group, rank)] = seq + 1
                arrived = rendezvous.setdefault((op.group, seq), {})
                arrived[rank] = (op.id, index)
                pending[index] = True
                if len(arrived) == len(members):
                    del rendezvous[(op.group, seq)]
                    splits = {
                        r: schedule.programs[r].ops[i].splits for r, (i, _) in arrived.items()
                    }
                    uneven = op.kind == "all_to_all" and all(v is not None for v in splits.values())
                    begin = max(ready[r][i] for r, (i, _) in arrived.items())
                    seconds = collective_time(op, splits if uneven else None)
                    stop = begin + seconds * stretch(arrived)
                    for r, (i, k) in arrived.items():
                        finish(r, i, begin, stop, k)
            else:
                sending = kind is Send
                src, dst = (rank, op.peer) if sending else (op.peer, rank)
                key = (src, dst, op.tag)
                # [side posted first, its posts in order]: one side waits at a time
                waiting = channels.get(key)
                pending[index] = True
                if waiting is None or waiting[0] is sending:
                    if waiting is None:
                        channels[key] = [sending, deque([(rank, op_id, index)])]
                    else:
                        waiting[1].append((rank, op_id, index))
                    continue
                other_rank, other_id, other_index = waiting[1].popleft()
                if not waiting[1]:
                    del channels[key]
                begin = max(at, ready[other_rank][other_id])
                stop = begin + p2p_time(src, dst, op.bytes) * stretch((src, dst))
                finish(rank, op_id, begin, stop, index)
                finish(other_rank, other_id, begin, stop, other_index)
    stuck = [(rank, ops[heads[i]]) for i, (rank, ops) in enumerate(streams) if heads[i] < len(ops)]
    if stuck:
        names = "; ".join(
            f"rank {r} {op.stream}: op {op.id} {op.label or type(op).__name__}"
            for r, op in stuck[:8]
        )
        raise DeadlockError(f"schedule cannot finish: {len(stuck)} streams are stuck: {names}")
    counts = {"ops": schedule.num_ops, "blocks": 0}
    for op, count in runs.values():
        for name, calls in block_times(op).choices.items():
            choices[name] = choices.get(name, 0) + calls * count
        counts["ops"] += (len(op.body) - 1) * count
        counts["blocks"] += count
    return ready, start, end, dict(sorted(choices.items())), block_times, counts
