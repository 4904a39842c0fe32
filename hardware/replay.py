"""Replay a scenario's training step on real devices and measure it.

Under torchrun (one process per rank)::

    torchrun --nnodes N --nproc-per-node G -m hardware.replay SCENARIO --out DIR

Every rank builds the step's plain per-rank Schedule IR (every op of every rank, never
folded or blocked, whatever the scenario's ``simulation`` settings say), creates the process
groups, runs warm-up steps (the first one checks every collective's result), then the
measured steps, timing every op. Rank 0 gathers the times, picks the median step and
writes ``result.json`` (the simulator's keys, ``fidelity: measured``, plus a
``measured`` section), ``trace.json`` and ``timeline.html`` to DIR.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.analysis.result import MeasuredRun
from simulator.engine.core import SimulationTimes
from simulator.report.outputs import write_run_outputs
from simulator.request.scenario import load_scenario
from simulator.run.simulate import RunResult, assemble_result, per_rank_schedule

from .executor import ProgramExecutor
from .groups import build_groups
from .runtime import HardwareError, Watchdog, init_runtime, run_rank

__all__ = ["replay", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hardware.replay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("scenario")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-verify", dest="verify", action="store_false")
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
    )
    watchdog = Watchdog(runtime.rank, runtime.timeout_s, executor.describe_current)
    for step in range(args.warmup):
        executor.run_step(verify=args.verify and step == 0, watchdog=watchdog)
    measured = [executor.run_step(watchdog=watchdog) for _ in range(args.steps)]
    watchdog.stop()
    payload = [(t.ready, t.start, t.end) for t in measured]
    gathered: list | None = [None] * runtime.world if runtime.rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if runtime.rank == 0:
        assert gathered is not None
        step_times = [
            max(max(gathered[r][i][2]) for r in range(runtime.world)) for i in range(args.steps)
        ]
        median = statistics.median_low(step_times)
        chosen = step_times.index(median)
        times = SimulationTimes(
            ready={r: gathered[r][chosen][0] for r in range(runtime.world)},
            start={r: gathered[r][chosen][1] for r in range(runtime.world)},
            end={r: gathered[r][chosen][2] for r in range(runtime.world)},
            step_time=median,
            stats={"ops": schedule.num_ops},
        )
        result = assemble_result(scenario, schedule, times, "measured")
        result.measured = MeasuredRun(
            backend=runtime.backend,
            device=runtime.device_name(),
            torch=torch.__version__,
            warmup_steps=args.warmup,
            step_times_s=step_times,
            step_shown=chosen,
            verified_collectives=bool(args.verify and args.warmup > 0),
        )
        run = RunResult(scenario=scenario, schedule=schedule, times=times, result=result)
        write_run_outputs(run, args.out, title=f"{scenario.name}: measured step")
        print(f"parasim: measured step time {median:.6g} s (median of {args.steps})")
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    run_rank(lambda: replay(args))


if __name__ == "__main__":
    main()
