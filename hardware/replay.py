"""Replay a scenario's training step on real devices and measure it.

Under torchrun (one process per rank)::

    torchrun --nnodes N --nproc-per-node G -m hardware.replay SCENARIO --out DIR

Every rank builds the step's plain per-rank Schedule IR (every op of every rank, never
folded or blocked, whatever the scenario's ``simulation`` settings say), creates the process
groups, runs warm-up steps (the first one checks every collective's result), then the
measured steps (10 by default), timing every op. Rank 0 gathers the times, puts every
rank's step on one clock that begins when the last rank leaves the step's opening
barrier (:func:`common_clock`; across nodes the clocks are aligned first,
:func:`~hardware.runtime.clock_offset`), picks the median step and writes
``result.json`` (the simulator's keys, ``fidelity: measured``, plus a ``measured``
section with every step's time, the spread, how busy the machine was as the ranks
started, the cores each rank was pinned to, each rank's CPU time over wall time, the
CPU time the hypervisor stole and a speed probe), ``trace.json`` and the pages to DIR;
a busy or disturbed machine is named in the warnings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simulator.analysis.result import MeasuredRun
from simulator.engine.core import SimulationTimes
from simulator.report.outputs import write_run_outputs
from simulator.request.scenario import load_scenario
from simulator.run.simulate import RunResult, assemble_result, per_rank_schedule
from simulator.traces.kineto import REPLAY_FOLDER

from .executor import ProgramExecutor
from .groups import build_groups
from .microbench import speed_probe
from .runtime import (
    HardwareError,
    Watchdog,
    clock_offset,
    init_runtime,
    machine_cores,
    run_rank,
)

__all__ = ["replay", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hardware.replay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("scenario")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-verify", dest="verify", action="store_false")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record the measured steps with torch.profiler: one trace per rank in "
        f"{REPLAY_FOLDER}/",
    )
    parser.add_argument(
        "--ifname",
        help="network interface the ranks connect over between nodes (sets "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME), e.g. ib0",
    )
    return parser


def replay(args: argparse.Namespace) -> int:
    runtime = init_runtime(ifname=args.ifname)
    scenario = load_scenario(args.scenario, args.overrides)
    if scenario.layout.world != runtime.world:
        raise HardwareError(
            f"scenario {scenario.name} needs {scenario.layout.world} ranks "
            f"({scenario.layout.describe()}) but {runtime.world} were started"
        )
    if args.steps < 1 or args.warmup < 0:
        raise HardwareError(
            f"--steps must be >= 1 and --warmup >= 0 (got {args.steps}, {args.warmup})"
        )
    schedule = per_rank_schedule(scenario)
    groups = build_groups(schedule, runtime)
    gpu = scenario.cluster_spec.gpu
    executor = ProgramExecutor(
        schedule,
        runtime,
        groups,
        peak_flops=gpu.peak_flops * gpu.matmul_efficiency,
        memory_bandwidth=gpu.hbm_bandwidth,
        labelled=args.profile,
    )
    watchdog = Watchdog(runtime.rank, runtime.timeout_s, executor.describe_current)
    for step in range(args.warmup):
        executor.run_step(verify=args.verify and step == 0, watchdog=watchdog)
    offset = clock_offset(runtime)
    probe = speed_probe(runtime)
    wall, cpu, ticks = time.perf_counter(), time.process_time(), cpu_ticks()
    with _profiler(args, runtime, scenario):
        measured = []
        for step in range(args.steps):
            # the span torch.profiler's own step() names, so a reader finds the steps
            with (
                torch.profiler.record_function(f"ProfilerStep#{step}")
                if args.profile
                else (contextlib.nullcontext())
            ):
                measured.append(executor.run_step(watchdog=watchdog))
    cpu_per_wall = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    steal = steal_fraction(ticks, cpu_ticks())
    watchdog.stop()
    payload = {
        "steps": [(t.ready, t.start, t.end, t.origin - offset) for t in measured],
        "cpu_per_wall": cpu_per_wall,
        "cpus": sorted(os.sched_getaffinity(0)) if os.environ.get("PARASIM_CPUS") else [],
    }
    gathered: list | None = [None] * runtime.world if runtime.rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if runtime.rank == 0:
        assert gathered is not None
        _write_measured(args, scenario, schedule, runtime, gathered, steal, probe)
    return 0


@contextlib.contextmanager
def _profiler(args, runtime, scenario) -> Iterator[Any]:
    """With ``--profile``, torch.profiler around the measured steps (shapes recorded, as
    ``parasim calibrate --from-trace`` reads them), this rank's trace written to
    ``kineto/rank<r>.pt.trace.json.gz`` after them, with what a trace does not say of
    the machine (its cores, the rank's node size) under ``parasim``; else nothing."""
    if not args.profile:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if runtime.is_cuda:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as profiler:
        profiler.add_metadata_json(
            "parasim",
            json.dumps(
                {
                    "scenario": scenario.name,
                    "torch": torch.__version__,
                    "cores": machine_cores(),
                    "per_node": runtime.local_world,
                    "device": runtime.device_name(),
                }
            ),
        )
        yield profiler
    folder = args.out / REPLAY_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(folder / f"rank{runtime.rank}.pt.trace.json.gz"))


def common_clock(steps: list[tuple]) -> tuple[list[tuple], float]:
    """One step of every rank on a common clock: ``steps[r]`` is rank ``r``'s
    ``(ready, start, end, origin)``, its times from its own origin and the origin on the
    common clock. The step begins when the last rank leaves the opening barrier (the
    latest origin), so the skew of the barrier is not counted in the step; an earlier
    rank's ops are moved back by its lead, and whatever it did before that moment
    starts at 0. Returns each rank's ``(ready, start, end)`` and the step time."""
    begin = max(origin for *_, origin in steps)
    shifted = []
    for ready, start, end, origin in steps:
        lead = begin - origin
        shifted.append(
            (
                [max(0.0, t - lead) for t in ready],
                [max(0.0, t - lead) for t in start],
                [max(0.0, t - lead) for t in end],
            )
        )
    return shifted, max((max(end) for _, _, end in shifted if end), default=0.0)


def cpu_ticks() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``'s first line), or None."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_fraction(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of CPU time stolen by the hypervisor between two readings."""
    if not before or not after or len(before) < 8:
        return None
    spent = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(spent[:8])  # user nice system idle iowait irq softirq steal
    return spent[7] / total if total > 0 else 0.0


def _write_measured(
    args, scenario, schedule, runtime, gathered: list[dict], steal: float | None, probe: float
) -> None:
    """Rank 0: the median step as a result, trace and pages in ``args.out``."""
    world = runtime.world
    steps = [
        common_clock([gathered[r]["steps"][i] for r in range(world)]) for i in range(args.steps)
    ]
    step_times = [step_time for _, step_time in steps]
    median = statistics.median_low(step_times)
    chosen = step_times.index(median)
    shifted = steps[chosen][0]
    times = SimulationTimes(
        ready={r: shifted[r][0] for r in range(world)},
        start={r: shifted[r][1] for r in range(world)},
        end={r: shifted[r][2] for r in range(world)},
        step_time=median,
        stats={"ops": schedule.num_ops},
    )
    result = assemble_result(scenario, schedule, times, "measured")
    load, runnable = _load_before(), _runnable_before()
    cores = machine_cores()
    spread = (max(step_times) - min(step_times)) / median if median > 0 else 0.0
    result.measured = MeasuredRun(
        backend=runtime.backend,
        device=runtime.device_name(),
        torch=torch.__version__,
        warmup_steps=args.warmup,
        step_times_s=step_times,
        step_shown=chosen,
        verified_collectives=bool(args.verify and args.warmup > 0),
        median_s=median,
        spread=spread,
        load_average_1m=load,
        cpu_count=cores,
        pinned_cpus=[gathered[r]["cpus"] for r in range(world)],
        cpu_per_wall=[gathered[r]["cpu_per_wall"] for r in range(world)],
        steal_fraction=steal,
        probe_s=probe,
        runnable_before=runnable,
    )
    if runnable is not None and cores and runnable > max(0.5, BUSY_RUNNABLE_PER_CORE * cores):
        result.warnings.append(
            f"the machine was busy when the ranks started ({runnable:.1f} other processes "
            f"wanted a core, on {cores} cores): they took CPU time from this measurement"
        )
    if steal is not None and steal > BUSY_STEAL:
        result.warnings.append(
            f"the hypervisor gave {steal:.0%} of this machine's CPU time to other guests "
            "while the steps ran: they ran slower than the machine does alone"
        )
    run = RunResult(scenario=scenario, schedule=schedule, times=times, result=result)
    write_run_outputs(run, args.out, title=f"{scenario.name}: measured step")
    print(
        f"parasim: measured step time {median:.6g} s (median of {args.steps}; "
        f"spread {100 * spread:.0f}%: {min(step_times):.6g} to {max(step_times):.6g} s)"
    )


#: Above this many other runnable processes per core when the ranks start, the machine
#: is called busy in the result's warnings.
BUSY_RUNNABLE_PER_CORE = 0.25
#: Above this share of CPU time stolen by the hypervisor, the measurement is called
#: disturbed in the warnings.
BUSY_STEAL = 0.05


def _runnable_before() -> float | None:
    """Other processes that wanted a core as the launcher started the ranks (under
    torchrun, unknown: None)."""
    recorded = os.environ.get("PARASIM_RUNNABLE")
    return float(recorded) if recorded else None


def _load_before() -> float | None:
    """The 1-minute load average the launcher saw before it started the ranks (or, under
    torchrun, now)."""
    recorded = os.environ.get("PARASIM_LOAD_1M")
    if recorded:
        return float(recorded)
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    run_rank(lambda: replay(args))


if __name__ == "__main__":
    main()
