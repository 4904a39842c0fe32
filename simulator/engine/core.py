"""The engine: replays a Schedule against a modelled cluster on a SimPy clock.

Every (rank, stream) runs its ops in program order; an op waits for its stream
predecessor and its cross-stream ``deps``. Compute ops and blocks contend for nothing,
so a stream times them on its own clock, which may run ahead of SimPy's, as soon as
the instants it waits for are known. Communication is what needs SimPy's clock:

* a ``Collective`` op arrives at the rendezvous of its group — collectives of a group
  are matched by their order on that group (NCCL semantics) — and starts when the last
  member arrives: at that instant its transfers enter the network;
* a ``Send`` or ``Recv`` waits for its partner, matched by (src, dst, tag) in order,
  then for the flow between the two GPUs.

Streams are not SimPy processes: they advance in callbacks, so the event queue holds
only what happens on the network (a transfer's start, a rate change, a completion),
and a stream costs nothing while it computes. Rank ``r`` runs on GPU ``r``. Every op's
``ready``, ``start`` and ``end`` instants are recorded. When the event queue empties
with ops unfinished, the schedule could never finish:
:class:`~simulator.common.errors.DeadlockError` names the stuck ranks and ops.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from simulator.common.errors import DeadlockError, ScenarioError
from simulator.common.vocabulary import ALL_TO_ALL
from simulator.engine.alone import AloneTimes, time_alone
from simulator.engine.blocks import BlockTimer
from simulator.engine.closed_form import evaluate
from simulator.engine.collectives import collective_transfers, measured_in_step
from simulator.engine.compute import ComputeModel
from simulator.engine.network import FlowNetwork
from simulator.schedule.ir import Block, Collective, Compute, Recv, Schedule, Send
from topologies import Cluster

__all__ = ["simulate", "SimulationTimes", "EngineOptions"]


@dataclass
class SimulationTimes:
    """Per-rank lists, indexed by op id, of each op's ready, start and end instants."""

    ready: dict[int, list[float]]
    start: dict[int, list[float]]
    end: dict[int, list[float]]
    step_time: float
    stats: dict[str, int] = field(default_factory=dict)
    collective_choices: dict[str, int] = field(default_factory=dict)
    link_utilisation: Mapping[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Flow fidelity: link id -> [(time, bytes/s carried from then on)]."""
    blocks: BlockTimer | None = None
    """Times of the schedule's block bodies, relative to each block's start."""


class _Rendezvous:
    __slots__ = ("kind", "size", "expected", "arrived", "splits", "start", "members", "begin")

    def __init__(self, kind: str, size: float, expected: int):
        self.kind = kind
        self.size = size
        self.expected = expected
        self.arrived: dict[int, int] = {}  # rank -> op id
        self.splits: dict[int, tuple[float, ...]] = {}
        self.start = math.nan
        self.members: list[tuple[int, int, int]] = []  # (rank, op id, stream index)
        self.begin = 0.0  # when the last member arrived


@dataclass(frozen=True)
class EngineOptions:
    """How the engine times communication.

    ``fidelity``: ``flow`` moves every transfer as flows that share links max–min
    fairly; ``analytic`` times each collective and send/recv in closed form from the
    same NCCL plan, alone on the network. ``algorithm``/``protocol`` pin NCCL's choice
    (None: chosen per call, as NCCL does).
    """

    fidelity: str = "flow"
    algorithm: str | None = None
    protocol: str | None = None
    # analytic fidelity: solve the times directly (closed_form) or replay them in SimPy
    closed_form: bool = True
    # stragglers: (rank, factor) pairs; a rank's compute ops (blocks' too) take factor
    # times as long (:func:`simulator.engine.stragglers.rank_factors`); absent ranks take 1
    rank_factors: tuple[tuple[int, float], ...] = ()
    # CPU ranks sharing cores: (rank, factor) pairs; a communication call takes the
    # largest factor of its members times as long (simulator.engine.core_sharing)
    comm_factors: tuple[tuple[int, float], ...] = ()


class _Engine:
    def __init__(self, schedule: Schedule, cluster: Cluster, options: EngineOptions):
        self.schedule = schedule
        self.cluster = cluster
        self.options = options
        self.factors = dict(options.rank_factors)
        self.comm_factors = dict(options.comm_factors)
        # a CPU device's collectives run on the cores its compute runs on (gloo's threads
        # on a rank's one core): compute and collectives take turns on each rank
        self.shared_cores = cluster.spec.gpu.comm_on_compute_cores
        self.core_free: dict[int, float] = {}  # rank -> when its core's last work ends
        self.core_held: dict[int, int] = {}  # rank -> the collective holding its core
        self.analytic = options.fidelity == "analytic"
        simulated = set(schedule.programs)
        # groups with members that are not simulated: the layout makes them symmetric
        # (folded), so every member arrives when the simulated one does
        self.folded = {
            name for name, members in schedule.groups.items() if not set(members) <= simulated
        }
        # the simulated members of each group, which meet for its calls: all of them, or
        # in a folded group those that stand for the rest (one, or one per EP group)
        self.meeting = {
            name: len(set(members) & simulated) for name, members in schedule.groups.items()
        }
        self.choices: dict[str, int] = {}
        self._plans: dict[tuple, Any] = {}  # (group, kind, bytes) -> NCCL plan, reused
        # SimPy is imported only where an event replay is built: the closed form, which
        # a one-configuration analytic run uses, never needs its clock
        import simpy

        self.env = simpy.Environment()
        self.timeouts = 0  # SimPy events the engine scheduled (the network counts its own)
        self.network = FlowNetwork(self.env, cluster.bandwidths.tolist())
        self.compute = ComputeModel(cluster.spec, schedule.meta)
        self.alone = AloneTimes.of_schedule(cluster, schedule, options.algorithm, options.protocol)
        self.blocks = BlockTimer(
            lambda op, body: self.compute.with_comm(op, body, self.alone.collective),
            self.alone.collective,
            self.compute.host_overhead,
            schedule.body_templates,
            self.factors,
            self.comm_factors,
        )
        self.action_start: dict[int, float] = {}  # rank -> its current action's start
        self.groups = {name: tuple(members) for name, members in schedule.groups.items()}
        self.group_gpus = {name: sorted(members) for name, members in self.groups.items()}
        self.member_sets = {name: frozenset(members) for name, members in self.groups.items()}
        self.ready: dict[int, list[float]] = {}
        self.start: dict[int, list[float]] = {}
        self.end: dict[int, list[float]] = {}
        # streams: (rank, name, ops); per stream its next op, clock and whether its next
        # op is communication under way; per rank, op id -> streams waiting for it
        self.streams: list[tuple[int, str, list]] = []
        self.state: list[tuple] = []  # per stream: rank, ops, its rank's time lists, waiters
        self.heads: list[int] = []
        self.clock: list[float] = []
        self.pending: list[bool] = []
        self.waiters: dict[int, dict[int, list[int]]] = {}
        self.runnable: deque[int] = deque()
        self.collective_seq: dict[int, dict[str, int]] = {}  # rank -> group -> calls
        self.rendezvous: dict[tuple[str, int], _Rendezvous] = {}
        self.channels: dict[tuple[int, int, int], tuple[deque, deque]] = {}
        self.durations: dict[int, float] = {}  # id(compute op) -> seconds
        self.body_ops = 0  # ops inside the blocks run, beyond one per block
        self.blocks_run = 0

    # -- set-up -----------------------------------------------------------------------
    def start_streams(self) -> None:
        world = self.cluster.num_gpus
        for rank, program in sorted(self.schedule.programs.items()):
            if not 0 <= rank < world:
                raise ScenarioError(
                    f"schedule: rank {rank} has no GPU (the cluster has {world} GPUs)"
                )
            n = len(program.ops)
            self.ready[rank] = [math.nan] * n
            self.start[rank] = [math.nan] * n
            self.end[rank] = [math.nan] * n
            self.waiters[rank] = {}
            self.collective_seq[rank] = {}
            by_stream: dict[str, list] = {}
            for op in program.ops:
                by_stream.setdefault(op.stream, []).append(op)
            self.streams += [(rank, stream, ops) for stream, ops in by_stream.items()]
        count = len(self.streams)
        self.heads, self.clock, self.pending = [0] * count, [0.0] * count, [False] * count
        self.state = [
            (rank, ops, self.ready[rank], self.start[rank], self.end[rank], self.waiters[rank])
            for rank, _, ops in self.streams
        ]
        self.runnable.extend(range(count))
        self._drain()

    # -- streams ----------------------------------------------------------------------
    def _drain(self) -> None:
        """Advance every stream that can move on."""
        runnable = self.runnable
        while runnable:
            self._advance(runnable.popleft())

    def _advance(self, index: int) -> None:
        """Run stream ``index`` until it must wait: for a dep whose end is unknown, or
        for a communication op to finish."""
        if self.pending[index]:
            return
        rank, ops, ready, start, end, waiters = self.state[index]
        durations = self.durations
        head, clock, count = self.heads[index], self.clock[index], len(ops)
        while head < count:
            op = ops[head]
            at = clock
            for dep in op.deps:
                t = end[dep]
                if t != t:  # NaN: not finished yet
                    waiters.setdefault(dep, []).append(index)
                    self.heads[index], self.clock[index] = head, clock
                    return
                if t > at:
                    at = t
            if op.points:  # some deps are ops inside blocks: their ends, not the blocks'
                at = clock
                for dep, point in zip(op.deps, op.points, strict=True):
                    t = end[dep] if point < 0 else self._point_end(rank, dep, point)
                    if t > at:
                        at = t
            op_id = op.id
            kind = type(op)
            if self.shared_cores and (kind is Compute or kind is Block):
                # the rank's core runs its collectives' work too: wait for the one in flight
                held = self.core_held.get(rank)
                if held is not None:
                    waiters.setdefault(held, []).append(index)
                    self.heads[index], self.clock[index] = head, clock
                    return
                at = max(at, self.core_free.get(rank, 0.0))
            if kind is Compute:
                if op.host_index == 0:
                    self.action_start[rank] = at
                elif self.compute.host_overhead and rank in self.action_start:
                    # a side stream's op (FSDP2's copy-in) may be issued before the rank's
                    # first action starts: nothing holds it then
                    at = max(
                        at, self.action_start[rank] + op.host_index * self.compute.host_overhead
                    )
                seconds = durations.get(id(op))  # compute ops are shared between peers
                if seconds is None:
                    seconds = durations[id(op)] = self.compute.with_comm(
                        op, self.schedule.programs[rank].ops, self.alone.collective
                    )
                if self.factors:
                    seconds *= self.factors.get(rank, 1.0)
            elif kind is Block:
                seconds = self._block_time(op, rank)
            elif (
                kind is Collective
                and self.analytic
                and op.group in self.folded
                and self.meeting[op.group] == 1
            ):
                seconds = self._folded_time(op)  # every member arrives now, by symmetry
            else:
                self.heads[index], self.clock[index] = head, clock
                ready[op_id] = at
                self.pending[index] = True
                if kind is Collective:
                    self._arrive(rank, op, at, index)
                else:
                    self._post(rank, op, at, index)
                return
            ready[op_id] = start[op_id] = at
            end[op_id] = clock = at + seconds
            if self.shared_cores:
                self.core_free[rank] = clock
            head += 1
            if op_id in waiters:
                self.runnable.extend(waiters.pop(op_id))
        self.heads[index], self.clock[index] = head, clock

    def _finished(self, rendezvous: _Rendezvous) -> None:
        """A communication op ended now: finish it on every member and move on."""
        now, began = self.env.now, rendezvous.start
        heads, clock, pending, runnable = self.heads, self.clock, self.pending, self.runnable
        start, end, all_waiters = self.start, self.end, self.waiters
        members = rendezvous.members
        for rank, op_id, index in members:
            start[rank][op_id] = began
            end[rank][op_id] = clock[index] = now
            if self.core_held.get(rank) == op_id:
                del self.core_held[rank]
                self.core_free[rank] = now
            heads[index] += 1
            pending[index] = False
            waiters = all_waiters[rank]
            if op_id in waiters:
                runnable.extend(waiters.pop(op_id))
        # the streams that waited for this op go first: they compute what the members'
        # next ops wait for, so the members seldom have to stop and be woken again
        runnable.extend(index for _, _, index in members)
        self._drain()

    def _launch(self, rendezvous: _Rendezvous, start_transfers) -> None:
        """The op starts at the last arrival, which may lie ahead of SimPy's clock:
        ``start_transfers()`` puts its transfers on the network now, each held back
        until then (a transfer holds no bandwidth before its latency has passed), and
        they finish the members when they end."""
        rendezvous.start = max(rendezvous.begin, self.env.now)
        start_transfers()

    # -- collectives ------------------------------------------------------------------
    def _arrive(self, rank: int, op: Collective, at: float, index: int) -> None:
        group = op.group
        members = self.member_sets.get(group)
        if members is None:
            raise ScenarioError(f"schedule: rank {rank} op {op.id} uses unknown group {group!r}")
        if rank not in members:
            raise ScenarioError(
                f"schedule: rank {rank} op {op.id} calls a collective on group {group} "
                f"{list(self.groups[group])} that it is not a member of"
            )
        if group in self.folded and self.meeting[group] == 1:
            self._folded_collective(rank, op, at, index)
            return
        sequence = self.collective_seq[rank]
        seq = sequence.get(group, 0)
        sequence[group] = seq + 1
        key = (group, seq)
        rendezvous = self.rendezvous.get(key)
        if rendezvous is None:
            rendezvous = self.rendezvous[key] = _Rendezvous(op.kind, op.bytes, self.meeting[group])
        elif rendezvous.kind != op.kind or (rendezvous.size != op.bytes and op.splits is None):
            first = next(iter(rendezvous.arrived))
            raise ScenarioError(
                f"schedule: collective #{seq} on group {group} does not match: rank {first} "
                f"calls {rendezvous.kind} of {rendezvous.size:g} bytes, rank {rank} calls "
                f"{op.kind} of {op.bytes:g} bytes"
            )
        rendezvous.arrived[rank] = op.id
        rendezvous.members.append((rank, op.id, index))
        if at > rendezvous.begin:
            rendezvous.begin = at
        if op.matrix is not None:  # a folded call: every member's bytes
            rendezvous.splits = dict(self.alone.matrix_splits(op))
        elif op.splits is not None:
            rendezvous.splits[rank] = op.splits
        if len(rendezvous.members) == rendezvous.expected:
            del self.rendezvous[key]
            if self.shared_cores and not self._measured_in_step(group, rendezvous):
                # it starts once its members' cores are free, and holds them
                for member, member_op, _ in rendezvous.members:
                    rendezvous.begin = max(rendezvous.begin, self.core_free.get(member, 0.0))
                    self.core_held[member] = member_op
            self._launch(rendezvous, lambda: self._launch_collective(group, rendezvous))

    def _measured_in_step(self, group: str, rendezvous: _Rendezvous) -> bool:
        """A call measured in a scenario's own step does not take turns with compute:
        its measured time (and the compute ops' beside it) hold their sharing."""
        return measured_in_step(
            self.cluster,
            rendezvous.kind,
            self.group_gpus[group],
            rendezvous.size,
            rendezvous.splits,
        )

    def _point_end(self, rank: int, block_id: int, point: int) -> float:
        """When op ``point`` of a block's body ends, the block having run on ``rank``."""
        body = self.blocks(cast(Block, self.schedule.programs[rank].ops[block_id]), rank)
        return self.start[rank][block_id] + body.end[point]

    def _block_time(self, op: Block, rank: int) -> float:
        """The block's duration on ``rank``: its body's makespan, run at the rank's factors."""
        self.blocks_run += 1
        self.body_ops += len(op.body) - 1
        times = self.blocks(op, rank)
        for name, count in times.choices.items():
            self.choices[name] = self.choices.get(name, 0) + count
        return times.makespan

    def _folded_time(self, op: Collective) -> float:
        """Closed-form time of a folded collective, counted among the choices."""
        seconds, name = self.alone.collective(op)
        self.choices[name] = self.choices.get(name, 0) + 1
        return seconds

    def _folded_collective(self, rank: int, op: Collective, at: float, index: int) -> None:
        """A collective of a folded group: every member arrives now, by symmetry."""
        if not self.analytic and op.group not in self.schedule.images:
            raise ScenarioError(
                f"schedule: group {op.group} has members that are not simulated and the "
                "schedule does not say which groups it stands for"
            )
        rendezvous = _Rendezvous(op.kind, op.bytes, 1)
        rendezvous.members.append((rank, op.id, index))
        rendezvous.begin = at
        # an uneven all-to-all moves every member's bytes, its own and the others'
        splits = None if op.matrix is None else self.alone.matrix_splits(op)
        self._launch(rendezvous, lambda: self._run_transfers(op.group, rendezvous, splits))

    def _image_transfers(self, group: str, kind: str, size: float, planned: tuple) -> tuple:
        """A folded group's collective with its images: ``(choice, seconds alone)`` in
        analytic fidelity (priced by the busiest link of every image's transfers),
        ``(choice, specs)`` in flow (the simulated call's flows carrying the images'
        crossings)."""
        key = ("images", group, kind, size)
        cached = self._plans.get(key)
        if cached is None:
            choice, specs = planned
            images = self.alone.collective_images(group, kind, size, choice, specs)
            if self.analytic:
                cached = self._plans[key] = (choice, images.seconds(self.cluster))
            else:
                cached = self._plans[key] = (choice, images.merged())
        return cached

    def _launch_collective(self, group: str, rendezvous: _Rendezvous) -> None:
        splits = rendezvous.splits if rendezvous.kind == ALL_TO_ALL and rendezvous.splits else None
        self._run_transfers(group, rendezvous, splits)

    def _run_transfers(self, group: str, rendezvous: _Rendezvous, splits) -> None:
        if self.analytic and splits is not None:
            priced = self.alone.uneven(group, splits)
            if priced is not None:
                seconds, name = priced
                self.choices[name] = self.choices.get(name, 0) + 1
                self._after(seconds, rendezvous)
                return
        elif splits is not None:  # flow: the pairs move as one coflow
            coflow = self.alone.uneven_flow(group, splits)
            if coflow is not None:
                spec, name = coflow
                self.choices[name] = self.choices.get(name, 0) + 1
                self._transfer_all([spec], rendezvous)
                return
        key = (group, rendezvous.kind, rendezvous.size)
        planned = None if splits is not None else self._plans.get(key)
        if planned is None:
            planned = collective_transfers(
                self.cluster,
                rendezvous.kind,
                self.group_gpus[group],
                rendezvous.size,
                splits,
                self.options.algorithm,
                self.options.protocol,
            )
            if splits is None:
                self._plans[key] = planned
        imaged = (
            splits is None
            and (self.analytic or group in self.folded)
            and group in self.schedule.images
        )
        if imaged:
            planned = self._image_transfers(group, rendezvous.kind, rendezvous.size, planned)
        choice, specs = planned
        name = f"{rendezvous.kind}/{choice.algorithm}/{choice.protocol}"
        self.choices[name] = self.choices.get(name, 0) + 1
        if self.analytic:
            seconds = specs if imaged else time_alone(self.cluster, specs, choice.latency)
            self._after(seconds, rendezvous)
        else:
            self._transfer_all(specs, rendezvous)

    def _stretch(self, rendezvous: _Rendezvous) -> float:
        """How many times as long a call takes for its members' shared cores (1: none)."""
        if not self.comm_factors:
            return 1.0
        return max(self.comm_factors.get(rank, 1.0) for rank, _, _ in rendezvous.members)

    def _after(self, seconds: float, rendezvous: _Rendezvous) -> None:
        """Finish ``rendezvous`` ``seconds`` (stretched, :meth:`_stretch`) after it starts."""
        delay = rendezvous.start - self.env.now + seconds * self._stretch(rendezvous)
        self.timeouts += 1
        self.env.timeout(delay).callbacks.append(lambda _ev: self._finished(rendezvous))

    def _transfer_all(self, specs: list, rendezvous: _Rendezvous) -> None:
        """Put ``specs`` on the network, from when ``rendezvous`` starts; finish it when
        all have ended."""
        if not specs:
            self._after(0.0, rendezvous)
            return
        wait = rendezvous.start - self.env.now
        left = [len(specs)]
        stretch = self._stretch(rendezvous)

        def one_done() -> None:
            left[0] -= 1
            if not left[0]:
                self._finished(rendezvous)

        for spec in specs:
            self.network.transfer(
                spec.usage, spec.volume * stretch, wait + spec.latency * stretch, one_done
            )

    # -- point to point ---------------------------------------------------------------
    def _post(self, rank: int, op: Send | Recv, at: float, index: int) -> None:
        src, dst = (rank, op.peer) if type(op) is Send else (op.peer, rank)
        if op.peer == rank:
            raise ScenarioError(f"schedule: rank {rank} op {op.id} sends to itself")
        key = (src, dst, op.tag)
        sends, recvs = self.channels.setdefault(key, (deque(), deque()))
        mine, theirs = (sends, recvs) if type(op) is Send else (recvs, sends)
        if not theirs:
            pair = _Rendezvous("p2p", op.bytes, 2)
            pair.members.append((rank, op.id, index))
            pair.begin = at
            mine.append(pair)
            return
        pair = theirs.popleft()
        if not theirs and not mine:
            del self.channels[key]
        if pair.size != op.bytes:
            raise ScenarioError(
                f"schedule: send {src}->{dst} tag {op.tag} carries {pair.size:g} bytes "
                f"but its recv expects {op.bytes:g}"
                if type(op) is Recv
                else f"schedule: send {src}->{dst} tag {op.tag} carries {op.bytes:g} bytes "
                f"but its recv expects {pair.size:g}"
            )
        pair.members.append((rank, op.id, index))
        pair.begin = max(pair.begin, at)
        self._launch(pair, lambda: self._send(pair, src, dst, op.bytes))

    def _send(self, pair: _Rendezvous, src: int, dst: int, size: float) -> None:
        """Start the flow of a matched send/recv pair (analytic: time it, with its
        images beside it)."""
        if self.analytic:
            self._after(self.alone.p2p(src, dst, size), pair)
            return
        key = ("p2p", src, dst, size)
        spec = self._plans.get(key)
        if spec is None:
            (spec,) = self.alone.p2p_images_of(src, dst, size).merged()
            self._plans[key] = spec
        self._transfer_all([spec], pair)

    # -- diagnosis --------------------------------------------------------------------
    def stuck_report(self) -> str | None:
        stuck = sorted(
            ((rank, stream), ops[self.heads[index]].id)
            for index, (rank, stream, ops) in enumerate(self.streams)
            if self.heads[index] < len(ops)
        )
        if not stuck:
            return None
        lines = []
        for (rank, stream), op_id in stuck[:8]:
            op = self.schedule.programs[rank].ops[op_id]
            name = op.label or type(op).__name__
            lines.append(f"rank {rank} {stream}: op {op_id} {name} ({self._waiting_for(rank, op)})")
        more = f"; and {len(stuck) - 8} more" if len(stuck) > 8 else ""
        ranks = sorted({rank for (rank, _), _ in stuck})
        return (
            f"schedule cannot finish: {len(stuck)} streams on ranks {ranks[:16]}"
            f"{'...' if len(ranks) > 16 else ''} are stuck: " + "; ".join(lines) + more
        )

    def _waiting_for(self, rank: int, op) -> str:
        end = self.end[rank]
        pending = [d for d in op.deps if end[d] != end[d]]
        if pending:
            return f"waiting for its deps {pending}"
        if type(op) is Collective:
            members = self.groups[op.group]
            for (group, _seq), rv in self.rendezvous.items():
                if group == op.group and rank in rv.arrived:
                    missing = [m for m in members if m not in rv.arrived]
                    return f"{op.kind} on {op.group}: ranks {missing} never arrived"
            return f"{op.kind} on {op.group}"
        if type(op) is Send:
            return f"send to rank {op.peer} tag {op.tag}: no matching recv"
        return f"recv from rank {op.peer} tag {op.tag}: no matching send"


def simulate(
    schedule: Schedule, cluster: Cluster, options: EngineOptions | None = None
) -> SimulationTimes:
    """Run every rank's program to completion and return the op times."""
    options = options or EngineOptions()
    if options.fidelity == "analytic" and options.closed_form:
        ready, start, end, choices, blocks, counts = evaluate(schedule, cluster, options)
        return SimulationTimes(
            ready=ready,
            start=start,
            end=end,
            step_time=max((max(t, default=0.0) for t in end.values()), default=0.0),
            stats={
                **counts,
                "transfers": 0,
                "rate_recomputations": 0,
                "events": 0,
            },
            collective_choices=choices,
            blocks=blocks,
        )
    engine = _Engine(schedule, cluster, options)
    engine.start_streams()
    engine.env.run()
    report = engine.stuck_report()
    if report is not None:
        raise DeadlockError(report)
    step_time = max((max(times, default=0.0) for times in engine.end.values()), default=0.0)
    return SimulationTimes(
        ready=engine.ready,
        start=engine.start,
        end=engine.end,
        step_time=step_time,
        stats={
            "ops": sum(engine.heads) + engine.body_ops,
            "blocks": engine.blocks_run,
            "transfers": engine.network.transfers_started,
            "rate_recomputations": engine.network.recomputations,
            "events": engine.timeouts + engine.network.timeouts,  # every event is a timeout
        },
        collective_choices=dict(sorted(engine.choices.items())),
        link_utilisation=_Utilisation(engine.network),
        blocks=engine.blocks,
    )


class _Utilisation(Mapping):
    """A flow network's link utilisation, assembled from its rate log when first read."""

    def __init__(self, network: FlowNetwork):
        self._network = network

    def __getitem__(self, link: int) -> list[tuple[float, float]]:
        return self._network.utilisation[link]

    def __iter__(self):
        return iter(self._network.utilisation)

    def __len__(self) -> int:
        return len(self._network.utilisation)

    def carried(self, end: float) -> dict[int, float]:
        """:meth:`~simulator.engine.network.LinkSeries.carried`."""
        return self._network.utilisation.carried(end)

    def peak(self, link: int) -> float:
        """:meth:`~simulator.engine.network.LinkSeries.peak`."""
        return self._network.utilisation.peak(link)
