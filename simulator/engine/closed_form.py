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
from typing import Any, cast

from simulator.common.errors import DeadlockError, ScenarioError
from simulator.common.vocabulary import ALL_TO_ALL
from simulator.engine.alone import AloneTimes
from simulator.engine.blocks import BlockTimer
from simulator.engine.compute import ComputeModel
from simulator.schedule.ir import Block, Collective, Compute, Recv, Schedule, Send
from topologies import Cluster

__all__ = ["evaluate"]


def evaluate(schedule: Schedule, cluster: Cluster, options: Any) -> tuple:
    """``(ready, start, end, choices, block_times, counts)`` per rank and op id, for
    analytic fidelity; ``block_times`` times the bodies of the schedule's blocks and
    ``counts`` says how many ops (a block's body op by op) and blocks ran."""
    return _ClosedForm(schedule, cluster, options).run()


class _ClosedForm:
    """One step's longest-path walk (see the module docstring): each op kind has its
    method, a compute op or block its duration (:meth:`compute_time`,
    :meth:`block_time`), a collective its rendezvous (:meth:`collective`), a send or
    receive its match (:meth:`point_to_point`); :meth:`run` walks the streams."""

    def __init__(self, schedule: Schedule, cluster: Cluster, options: Any):
        self.schedule = schedule
        self.compute = compute = ComputeModel(cluster.spec, schedule.meta)
        simulated = set(schedule.programs)
        self.folded = {n for n, m in schedule.groups.items() if not set(m) <= simulated}
        # the simulated members of each group, which meet for its calls: all of them, or
        # in a folded group those that stand for the rest (one, or one per EP group)
        self.meeting = {n: len(set(m) & simulated) for n, m in schedule.groups.items()}
        self.choices: dict[str, int] = {}
        alone = AloneTimes.of_schedule(cluster, schedule, options.algorithm, options.protocol)
        self.plan, self.p2p_time = plan, _ = alone.collective, alone.p2p
        self.host = compute.host_overhead
        self.factors = dict(options.rank_factors)
        self.comm_factors = dict(options.comm_factors)
        self.block_times = BlockTimer(
            lambda op, body: compute.with_comm(op, body, plan),
            plan,
            self.host,
            schedule.body_templates,
            self.factors,
            self.comm_factors,
        )
        self.beside: dict[int, float] = {}  # id(compute op) -> its time with the comm beside it
        self.action_start: dict[int, float] = {}  # rank -> its current action's first op start
        self.runs: dict[int, list] = {}  # id(body) -> [block, times it ran]
        self.ready: dict[int, list[float]] = {}
        self.start: dict[int, list[float]] = {}
        self.end: dict[int, list[float]] = {}
        self.streams: list[tuple[int, list]] = []
        for rank, program in sorted(schedule.programs.items()):
            if not 0 <= rank < cluster.num_gpus:
                raise ScenarioError(
                    f"schedule: rank {rank} has no GPU (the cluster has {cluster.num_gpus} GPUs)"
                )
            n = len(program.ops)
            self.ready[rank], self.start[rank], self.end[rank] = (
                [math.nan] * n,
                [math.nan] * n,
                [math.nan] * n,
            )
            by_stream: dict[str, list] = {}
            for op in program.ops:
                by_stream.setdefault(op.stream, []).append(op)
            self.streams += [(rank, ops) for ops in by_stream.values()]
        count = len(self.streams)
        self.heads = [0] * count
        self.clock = [0.0] * count  # end of each stream's last op
        self.pending: list[bool] = [False] * count  # head op posted, waiting for partners
        self.rendezvous: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        self.sequence: dict[tuple[str, int], int] = {}
        self.channels: dict[tuple[int, int, int], list] = {}
        # streams that can move on, and streams waiting for an op of their rank to finish
        self.runnable: deque[int] = deque(range(count))
        self.waiters: dict[int, dict[int, list[int]]] = {rank: {} for rank in schedule.programs}
        self.current = -1

    # -- durations ----------------------------------------------------------------------
    def collective_time(self, op: Collective, splits: Any = None) -> float:
        seconds, name = self.plan(op, splits)
        self.choices[name] = self.choices.get(name, 0) + 1
        return seconds

    def compute_time(self, rank: int, op: Compute) -> float:
        """The op's time, with the collectives beside it (shared ops: memoised)."""
        if not op.beside_comm:
            return self.compute.duration(op)
        seconds = self.beside.get(id(op))
        if seconds is None:
            ops = self.schedule.programs[rank].ops
            seconds = self.beside[id(op)] = self.compute.with_comm(op, ops, self.plan)
        return seconds

    def stretch(self, ranks: Any) -> float:
        """How many times as long a call of ``ranks`` takes for their shared cores."""
        comm = self.comm_factors
        return max(comm.get(r, 1.0) for r in ranks) if comm else 1.0

    def block_time(self, rank: int, op: Block) -> float:
        """The block's duration on ``rank``: its body's makespan at the rank's factors."""
        run = self.runs.get(id(op.body))
        if run is None:
            run = self.runs[id(op.body)] = [op, 0]
        run[1] += 1
        return self.block_times(op, rank).makespan

    def point_end(self, rank: int, block_id: int, point: int) -> float:
        """When op ``point`` of a block's body ends, the block having run on ``rank``."""
        body = self.block_times(cast(Block, self.schedule.programs[rank].ops[block_id]), rank)
        return self.start[rank][block_id] + body.end[point]

    # -- ops that wait for partners ----------------------------------------------------
    def woken(self, rank: int, op_id: int) -> None:
        waiting = self.waiters[rank].pop(op_id, None)
        if waiting is not None:
            self.runnable.extend(waiting)

    def finish(self, rank: int, op_id: int, begin: float, stop: float, index: int) -> None:
        self.start[rank][op_id], self.end[rank][op_id] = begin, stop
        self.clock[index] = stop
        self.heads[index] += 1
        if self.pending[index]:
            self.pending[index] = False
            if index != self.current:
                self.runnable.append(index)
        if op_id in self.waiters[rank]:
            self.woken(rank, op_id)

    def collective(self, rank: int, op: Collective, at: float, index: int) -> None:
        """A collective posted at ``at``: folded, it runs at once; else it starts when
        its last member arrives, and every member ends together."""
        folded = op.group in self.folded
        if folded and self.meeting[op.group] == 1:
            self.finish(
                rank, op.id, at, at + self.collective_time(op) * self.stretch((rank,)), index
            )
            return
        schedule = self.schedule
        seq = self.sequence.get((op.group, rank), 0)
        self.sequence[(op.group, rank)] = seq + 1
        arrived = self.rendezvous.setdefault((op.group, seq), {})
        arrived[rank] = (op.id, index)
        self.pending[index] = True
        if len(arrived) < self.meeting[op.group]:
            return
        del self.rendezvous[(op.group, seq)]
        begin = max(self.ready[r][i] for r, (i, _) in arrived.items())
        if op.matrix is not None:  # every member's bytes (AloneTimes.collective)
            seconds = self.collective_time(op)
        else:
            splits = {
                r: cast(Collective, schedule.programs[r].ops[i]).splits
                for r, (i, _) in arrived.items()
            }
            uneven = (
                not folded and op.kind == ALL_TO_ALL and all(v is not None for v in splits.values())
            )
            seconds = self.collective_time(op, splits if uneven else None)
        stop = begin + seconds * self.stretch(arrived)
        for r, (i, k) in arrived.items():
            self.finish(r, i, begin, stop, k)

    def point_to_point(self, rank: int, op: Send | Recv, at: float, index: int) -> None:
        """A send or receive posted at ``at``, matched with its partner by (src, dst,
        tag) in order: the pair starts when the later of the two is posted."""
        sending = type(op) is Send
        src, dst = (rank, op.peer) if sending else (op.peer, rank)
        key = (src, dst, op.tag)
        # [side posted first, its posts in order]: one side waits at a time
        channels = self.channels
        waiting = channels.get(key)
        self.pending[index] = True
        if waiting is None or waiting[0] is sending:
            if waiting is None:
                channels[key] = [sending, deque([(rank, op.id, index)])]
            else:
                waiting[1].append((rank, op.id, index))
            return
        other_rank, other_id, other_index = waiting[1].popleft()
        if not waiting[1]:
            del channels[key]
        begin = max(at, self.ready[other_rank][other_id])
        stop = begin + self.p2p_time(src, dst, op.bytes) * self.stretch((src, dst))
        finish = self.finish
        finish(rank, op.id, begin, stop, index)
        finish(other_rank, other_id, begin, stop, other_index)

    # -- the walk ----------------------------------------------------------------------
    def run(self) -> tuple:
        """Walk the streams until every op has its times (compute and blocks inline: the
        hot path)."""
        streams, heads, clock, pending = self.streams, self.heads, self.clock, self.pending
        ready, start, end, runnable = self.ready, self.start, self.end, self.runnable
        host, factors, action_start = self.host, self.factors, self.action_start
        compute_time, block_time, point_end = self.compute_time, self.block_time, self.point_end
        collective, point_to_point = self.collective, self.point_to_point
        woken = self.woken
        while runnable:
            index = self.current = runnable.popleft()
            rank, ops = streams[index]
            done, issued, begun, waits = end[rank], ready[rank], start[rank], self.waiters[rank]
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
                    elif host and rank in action_start:
                        # a side stream's op (FSDP2's copy-in) may be issued before the
                        # rank's first action starts: nothing holds it then
                        at = max(at, action_start[rank] + op.host_index * host)
                issued[op_id] = at
                if kind is Compute or kind is Block:
                    if kind is Compute:
                        stop = at + compute_time(rank, op)
                        if factors:  # stragglers, shared cores: this rank's compute is slower
                            stop = at + (stop - at) * factors.get(rank, 1.0)
                    else:  # its body's ops stretched by the rank's factors
                        stop = at + block_time(rank, op)
                    begun[op_id], done[op_id] = at, stop
                    clock[index] = stop
                    heads[index] += 1
                    if op_id in waits:
                        woken(rank, op_id)
                elif kind is Collective:
                    collective(rank, op, at, index)
                else:
                    point_to_point(rank, op, at, index)
        self.check_finished()
        return ready, start, end, *self.totals()

    def check_finished(self) -> None:
        """Refuse a schedule some of whose streams never finished (a deadlock)."""
        heads = self.heads
        stuck = [
            (rank, ops[heads[i]])
            for i, (rank, ops) in enumerate(self.streams)
            if heads[i] < len(ops)
        ]
        if stuck:
            names = "; ".join(
                f"rank {r} {op.stream}: op {op.id} {op.label or type(op).__name__}"
                for r, op in stuck[:8]
            )
            raise DeadlockError(f"schedule cannot finish: {len(stuck)} streams are stuck: {names}")

    def totals(self) -> tuple[dict[str, int], BlockTimer, dict[str, int]]:
        """The algorithms chosen (the blocks' bodies' calls counted as often as the
        blocks ran), the block timer, and how many ops and blocks ran."""
        choices = self.choices
        counts = {"ops": self.schedule.num_ops, "blocks": 0}
        for op, count in self.runs.values():
            for name, calls in self.block_times(op).choices.items():
                choices[name] = choices.get(name, 0) + calls * count
            counts["ops"] += (len(op.body) - 1) * count
            counts["blocks"] += count
        return dict(sorted(choices.items())), self.block_times, counts
