"""Calibration at a scenario's own shapes, and the replay executor's own costs.

``parasim calibrate --scenario S`` runs, on every rank at once, the compute ops that
scenario's ranks run (every distinct program of its per-rank schedule, in program order,
with the replay's kernels and buffers: :class:`~hardware.executor.ComputeKernels`), so
each op is timed at its own shape, in the cache state the step leaves it, while the
other ranks load the machine as they do in the step. Where the step communicates, a
buffer of the communication's size is read and written in its place, so the next op
finds the caches as cold as the step leaves them. The first pass warms up; the
mean over the other passes and ranks is each op's time (:func:`time_scenario_ops`; the
mean, because a step is a sum of many such ops and their slow runs count in it).
The spread of the ranks' totals within a pass is the rank-to-rank jitter the model's
stragglers draw from.

A scenario with as many ranks as were started also runs its own step, communication
included, with the replay's executor (:func:`time_scenario_steps`): one warm-up pass
that checks the results, then ten measured ones. Each compute op then takes its time
from there, where the step's communication runs beside it as it does in a replay, and
each communication call is timed from when its last member issued it to when it
completed (:func:`measured_calls`), so it holds what sharing the machine with the
step's compute costs it, but not the wait for a late peer, which the model's own
stragglers and schedule produce. The spread of compute among ranks that run the same
program is the jitter.

:func:`executor_overheads` measures what the replay's executor itself adds: per compute
op (its dependency checks and bookkeeping between kernels) and per collective (issuing
it asynchronously and noticing its completion, beyond the collective's own time in a
tight loop). On a CPU these run on the cores the ops run on, so they add to the step;
on a GPU the host runs ahead of the device and they do not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.common.vocabulary import ALL_REDUCE, ELEMENTWISE
from simulator.engine.collectives import even_equivalent
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule
from simulator.schedule.ir import Collective, Compute, Program, Recv, Schedule, Send

from .executor import ComputeKernels, ProgramExecutor
from .groups import build_groups
from .microbench import timed
from .runtime import Runtime, clock_offset

__all__ = [
    "op_key",
    "scenario_schedules",
    "distinct_programs",
    "time_scenario_ops",
    "time_scenario_steps",
    "measured_calls",
    "scenario_collective_sizes",
    "scenario_uneven_all_to_alls",
    "executor_overheads",
]

#: Passes over the scenario's programs: the first warms up, the others are measured.
PASSES = 4
#: Passes of a scenario's own step: one warm-up and ten measured, as a replay measures
#: (its collectives' times are heavy-tailed on a shared CPU: fewer passes leave their
#: mean to a few slow calls).
STEP_PASSES = 11
#: Trivial ops per executor-overhead measurement.
OVERHEAD_OPS = 200


def op_key(op: Compute) -> tuple:
    """What decides a compute op's time in the model (:class:`topologies.spec.MeasuredOp`)."""
    return (op.kind, op.flops, op.bytes, op.shape, op.batch, op.fp8)


def scenario_schedules(paths: Iterable[str | Path], overrides: list[str]) -> list[Schedule]:
    """The plain per-rank schedule of each scenario (every op of every rank)."""
    return [per_rank_schedule(load_scenario(path, overrides)) for path in paths]


def distinct_programs(schedules: list[Schedule]) -> list[list]:
    """Every distinct program (ranks with the same ops in the same order count once):
    its compute ops and the sizes of its communication, in program order."""
    seen: dict[tuple, list] = {}
    for schedule in schedules:
        for rank in sorted(schedule.programs):
            ops = [
                op
                for op in schedule.programs[rank].ops
                if type(op) in (Compute, Collective, Send, Recv)
            ]
            key = tuple(op_key(op) if type(op) is Compute else (op.type, op.bytes) for op in ops)
            seen.setdefault(key, ops)
    return list(seen.values())


def time_scenario_steps(
    runtime: Runtime,
    schedule: Schedule,
    peak_flops: float,
    memory_bandwidth: float,
    passes: int = STEP_PASSES,
) -> tuple[dict[tuple, list[float]], list[float], list[list[tuple[int, float, float]]]]:
    """Run the scenario's own step on its own ranks, communication included, with the
    replay's executor: the first pass warms up and checks the results, the others are
    measured. Returns this rank's compute ops' times by :func:`op_key`, its compute
    total per measured pass, and per measured pass each communication op's
    ``(op id, issued, completed)`` on the common clock (seconds)."""
    executor = ProgramExecutor(
        schedule, runtime, build_groups(schedule, runtime), peak_flops, memory_bandwidth
    )
    executor.run_step(verify=True)
    offset = clock_offset(runtime)
    ops = schedule.programs[runtime.rank].ops
    samples: dict[tuple, list[float]] = {}
    totals: list[float] = []
    calls: list[list[tuple[int, float, float]]] = []
    for _ in range(passes - 1):
        times = executor.run_step()
        origin = times.origin - offset
        total = 0.0
        issued = []
        for op in ops:
            if type(op) is Compute:
                seconds = times.end[op.id] - times.start[op.id]
                samples.setdefault(op_key(op), []).append(seconds)
                total += seconds
            elif type(op) in (Collective, Send, Recv):
                issued.append((op.id, origin + times.start[op.id], origin + times.end[op.id]))
        totals.append(total)
        calls.append(issued)
    return samples, totals, calls


def measured_calls(
    schedule: Schedule, calls: dict[int, list[list[tuple[int, float, float]]]], per_node: int
) -> list[dict]:
    """Each communication call of ``schedule`` timed in its own step
    (:func:`time_scenario_steps`; ``calls[rank]`` as it returned them): from when its
    last member issued it to when the last one saw it complete, so that waiting for a
    late peer is not counted. The mean over its occurrences and passes of each call of
    one kind, scope, member count and size (an uneven all-to-all: the size of the even
    one its busiest member stands for, as the simulator prices it)."""
    matched: dict[tuple, list[tuple[int, int]]] = {}  # call -> [(rank, op id)]
    sizes: dict[tuple, tuple[str, int, float]] = {}
    for rank in sorted(schedule.programs):
        sequence: dict[tuple, int] = {}
        for op in schedule.programs[rank].ops:
            if type(op) is Collective:
                channel: tuple = ("collective", op.group)
            elif type(op) is Send:
                channel = ("p2p", rank, op.peer, op.tag)
            elif type(op) is Recv:
                channel = ("p2p", op.peer, rank, op.tag)
            else:
                continue
            index = sequence.get(channel, 0)
            sequence[channel] = index + 1
            key = (*channel, index)
            matched.setdefault(key, []).append((rank, op.id))
            if type(op) is Collective:
                sizes.setdefault(key, (op.kind, len(schedule.groups[op.group]), op.bytes))
            else:
                sizes.setdefault(key, ("p2p", 2, op.bytes))
    by_id = {
        rank: [{op_id: (begin, end) for op_id, begin, end in issued} for issued in passes]
        for rank, passes in calls.items()
    }
    passes = min(len(p) for p in by_id.values())
    seconds: dict[tuple, list[float]] = {}
    for key, members in matched.items():
        kind, ranks, size = sizes[key]
        if key[0] == "collective" and kind == "all_to_all":
            size = _all_to_all_size(schedule, key[1], members) or size
        nodes = {rank // per_node for rank, _ in members}
        scope = "intra_node" if len(nodes) == 1 else "inter_node"
        for index in range(passes):
            times = [by_id[rank][index][op_id] for rank, op_id in members]
            elapsed = max(end for _, end in times) - max(begin for begin, _ in times)
            if elapsed > 0:
                seconds.setdefault((kind, scope, ranks, size), []).append(elapsed)
    return [
        {
            "kind": kind,
            "scope": scope,
            "ranks": ranks,
            "bytes": size,
            "seconds": statistics.fmean(v),
        }
        for (kind, scope, ranks, size), v in sorted(seconds.items())
    ]


def _all_to_all_size(schedule: Schedule, group: str, members: list[tuple[int, int]]) -> float:
    """An uneven all-to-all's size as the simulator prices it (0 for an even one)."""
    splits = {}
    for rank, op_id in members:
        op = schedule.programs[rank].ops[op_id]
        assert isinstance(op, Collective)
        if op.splits is None:
            return 0.0
        splits[rank] = op.splits
    return even_equivalent(splits, sorted(schedule.groups[group]))


def time_scenario_ops(
    runtime: Runtime, kernels: ComputeKernels, programs: list[list[Compute]], passes: int = PASSES
) -> tuple[dict[tuple, list[float]], list[float]]:
    """Every op's times (over the measured passes) and this rank's total per measured
    pass. Every rank runs every program, so the ranks' totals compare like for like."""
    samples: dict[tuple, list[float]] = {}
    totals = []
    traffic = _Traffic(runtime.device)
    for index in range(passes):
        dist.barrier()
        total = 0.0
        for ops in programs:
            for op in ops:
                if type(op) is not Compute:
                    # the communication's data passes through the caches between the
                    # ops, as in the step: the next op must not find them warmer
                    traffic.touch(op.bytes)
                    continue
                seconds = _time_one(runtime, kernels, op)
                total += seconds
                if index > 0:
                    samples.setdefault(op_key(op), []).append(seconds)
        if index > 0:
            totals.append(total)
    return samples, totals


class _Traffic:
    """Buffers the size of each communication op, read and written in its place."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[int, torch.Tensor] = {}

    def touch(self, size: float) -> None:
        numel = max(1, int(size // 4))
        buffer = self.buffers.get(numel)
        if buffer is None:
            buffer = self.buffers[numel] = torch.ones(numel, device=self.device)
        buffer.mul_(1.0)


def _time_one(runtime: Runtime, kernels: ComputeKernels, op: Compute) -> float:
    if runtime.is_cuda:
        stream = torch.cuda.current_stream(runtime.device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        kernels.run(op)
        end.record(stream)
        end.synchronize()
        return begin.elapsed_time(end) / 1e3
    started = time.perf_counter()
    kernels.run(op)
    return time.perf_counter() - started


def scenario_collective_sizes(schedules: list[Schedule], ranks: int) -> dict[str, list[float]]:
    """Per collective kind, the sizes in bytes the scenarios' collectives of ``ranks``
    members move (even ones: an uneven all-to-all is timed by the replay as it runs)."""
    sizes: dict[str, set[float]] = {}
    for schedule in schedules:
        for program in schedule.programs.values():
            for op in program.ops:
                if type(op) is Collective and op.splits is None:
                    if len(schedule.groups[op.group]) == ranks:
                        sizes.setdefault(op.kind, set()).add(float(op.bytes))
    return {kind: sorted(values) for kind, values in sizes.items()}


def scenario_uneven_all_to_alls(
    schedules: list[Schedule], ranks: int
) -> list[tuple[tuple[float, ...], ...]]:
    """The distinct uneven all-to-alls the scenarios' groups of ``ranks`` members run:
    for each call, every member's bytes to every member, in member order."""
    cases: dict[tuple, None] = {}
    for schedule in schedules:
        calls: dict[str, dict[int, list[tuple[float, ...]]]] = {}
        for rank, program in schedule.programs.items():
            for op in program.ops:
                if type(op) is Collective and op.kind == "all_to_all" and op.splits is not None:
                    calls.setdefault(op.group, {}).setdefault(rank, []).append(op.splits)
        for group, by_rank in calls.items():
            members = sorted(schedule.groups[group])
            if len(members) != ranks or set(by_rank) != set(members):
                continue
            for index in range(min(len(by_rank[m]) for m in members)):
                cases.setdefault(tuple(tuple(by_rank[m][index]) for m in members), None)
    return list(cases)


def executor_overheads(runtime: Runtime) -> dict[str, float]:
    """Seconds the replay executor adds per compute op and per collective (0 on a GPU,
    whose host runs ahead of the device)."""
    if runtime.is_cuda:
        return {"compute_op_s": 0.0, "collective_s": 0.0}
    world = tuple(range(runtime.world))
    trivial = [
        Compute(i, "compute", 0.0, 0.0, ELEMENTWISE, deps=(i - 1,) if i else ())
        for i in range(OVERHEAD_OPS)
    ]
    compute_s = _per_op(runtime, trivial, {})
    if runtime.world < 2:
        return {"compute_op_s": compute_s, "collective_s": 0.0}
    element = 4.0
    ring = [
        Collective(i, "c", ALL_REDUCE, "all", element, deps=(i - 1,) if i else ())
        for i in range(OVERHEAD_OPS // 4)
    ]
    in_executor = _per_op(runtime, ring, {"all": world})
    buffer = torch.ones(1, dtype=torch.float32)
    alone = timed(runtime, lambda: dist.all_reduce(buffer), OVERHEAD_OPS // 4)
    return {"compute_op_s": compute_s, "collective_s": max(0.0, in_executor - alone)}


def _per_op(runtime: Runtime, ops: list, groups: dict[str, tuple[int, ...]]) -> float:
    """Median over a few steps of the step's wall time per op, for a program of ``ops``
    on every rank run by the replay's executor (the ops do no compute, so the rates it
    is given never matter)."""
    schedule = Schedule(
        programs={rank: Program(rank, list(ops)) for rank in range(runtime.world)},
        groups=groups,
    )
    handles = {name: dist.new_group(list(members)) for name, members in groups.items()}
    executor = ProgramExecutor(schedule, runtime, handles, peak_flops=1.0, memory_bandwidth=1.0)
    per_op = []
    for step in range(4):
        times = executor.run_step()
        if step == 0:
            continue  # warm-up
        wall = max(times.end)
        per_op.append(wall / len(ops))
    return statistics.median(per_op)
