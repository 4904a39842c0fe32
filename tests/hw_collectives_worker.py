"""A rank program with every op type, replayed for real by tests/test_hardware.py.

Run by the launcher as ``python -m tests.hw_collectives_worker``: every rank builds
the same hand-written schedule (all collective kinds, an uneven all-to-all, a
send/recv ring), executes it with result verification, and rank 0 writes the number
of timed ops to ``$PARASIM_TEST_OUT``.
"""

from __future__ import annotations

import math
import os

import torch.distributed as dist

from hardware.executor import ProgramExecutor
from hardware.groups import build_groups
from hardware.runtime import init_runtime, run_rank
from simulator.schedule.ir import Collective, Compute, Program, Recv, Schedule, Send


def _adder(ops: list):
    def add(op_type, *fields, **kw) -> int:
        ops.append(op_type(len(ops), *fields, **kw))
        return len(ops) - 1

    return add


def build(world: int) -> Schedule:
    everyone = tuple(range(world))
    programs = {}
    for rank in range(world):
        ops: list = []
        add = _adder(ops)
        gemm = add(Compute, "compute", 2 * 64**3, 0, "gemm", "gemm", shape=(64, 64, 64))
        for kind in (
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "broadcast",
            "barrier",
        ):
            add(Collective, "comm", kind, "world", 4096.0 * world, kind, deps=(gemm,))
        # uneven all-to-all: rank r sends (r + j + 1) * 64 bytes to member j
        splits = tuple(float((rank + j + 1) * 64) for j in range(world))
        add(Collective, "comm", "all_to_all", "world", sum(splits), "a2a.uneven", splits=splits)
        right, left = (rank + 1) % world, (rank - 1) % world
        add(Send, "send", right, 8192.0, 7, "send.right")
        recv = add(Recv, "recv", left, 8192.0, 7, "recv.left")
        add(Compute, "compute", 0, 1 << 20, "elementwise", "copy", deps=(recv,))
        programs[rank] = Program(rank, ops)
    return Schedule(programs, {"world": everyone})


def main() -> int:
    runtime = init_runtime()
    schedule = build(runtime.world)
    groups = build_groups(schedule, runtime)
    executor = ProgramExecutor(schedule, runtime, groups, peak_flops=1e11, memory_bandwidth=1e10)
    executor.run_step(verify=True)
    times = executor.run_step(verify=True)
    timed = sum(
        1 for s, e in zip(times.start, times.end, strict=True) if math.isfinite(s) and e >= s
    )
    counts = [None] * runtime.world if runtime.rank == 0 else None
    dist.gather_object((timed, len(times.end)), counts, dst=0)
    if runtime.rank == 0:
        with open(os.environ["PARASIM_TEST_OUT"], "w") as f:
            f.write(repr(counts))
    return 0


if __name__ == "__main__":
    run_rank(main)
