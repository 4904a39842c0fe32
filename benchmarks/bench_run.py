"""Benchmark: wall time of ``parasim run`` on a scenario, and simulated ops per second.

Times each stage of a run (building the Schedule IR, the SimPy replay, the time
accounting, writing the outputs) and, in the same process, a bare SimPy loop of
timeouts, so the engine's speed can be read as a ratio that does not depend on how
busy the machine is. Usage::

    python -m benchmarks.bench_run [SCENARIO ...] [--repeat N]

Prints a markdown table to paste into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import simpy

from simulator.analysis.metrics import account_step
from simulator.common.files import write_json
from simulator.engine.core import simulate
from simulator.report import write_chrome_trace, write_timeline_html
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, make_trace, run_scenario, trace_ranks

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCENARIOS = [ROOT / "scenarios" / "gpt3-175b.yaml"]


def bare_simpy_events_per_second(events: int = 500_000) -> float:
    """Timeouts per second of the simplest SimPy process: the engine's ceiling."""
    env = simpy.Environment()

    def loop():
        for _ in range(events):
            yield env.timeout(1.0)

    env.process(loop())
    start = time.perf_counter()
    env.run()
    return events / (time.perf_counter() - start)


def bench_scenario(path: Path) -> dict[str, float]:
    scenario = load_scenario(path)
    t0 = time.perf_counter()
    schedule = build_schedule(scenario)
    t1 = time.perf_counter()
    times = simulate(schedule, scenario.cluster)
    t2 = time.perf_counter()
    account_step(schedule, times, scenario.layout, scenario.cluster_spec.gpus_per_node)
    t3 = time.perf_counter()
    run = run_scenario(scenario)
    t4 = time.perf_counter()
    ranks, _ = trace_ranks(run)
    trace = make_trace(run, ranks)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_json(out / "result.json", run.result.to_json())
        write_chrome_trace(trace, out / "trace.json")
        write_timeline_html(trace, out / "timeline.html", title=scenario.name)
    t5 = time.perf_counter()
    ops = schedule.num_ops
    return {
        "ops": ops,
        "build_s": t1 - t0,
        "simulate_s": t2 - t1,
        "account_s": t3 - t2,
        "run_s": t4 - t3,
        "outputs_s": t5 - t4,
        "ops_per_s": ops / (t4 - t3),
        "sim_ops_per_s": ops / (t2 - t1),
        "step_time_s": run.result.step_time_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT_SCENARIOS)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    bare = bare_simpy_events_per_second()
    print(
        f"machine: {platform.node()} · {platform.processor() or platform.machine()} · "
        f"Python {sys.version.split()[0]} · simpy {simpy.__version__}"
    )
    print(f"bare SimPy timeout loop: {bare:,.0f} events/s")
    print()
    print(
        "| scenario | ops | build | simulate | accounting | whole run | outputs | "
        "ops/s (run) | sim ops/s ÷ bare SimPy events/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.scenarios:
        best = min((bench_scenario(path) for _ in range(args.repeat)), key=lambda r: r["run_s"])
        print(
            f"| {path.stem} | {best['ops']:,} | {best['build_s']:.2f} s | "
            f"{best['simulate_s']:.2f} s | "
            f"{best['account_s']:.2f} s | {best['run_s']:.2f} s | {best['outputs_s']:.2f} s | "
            f"{best['ops_per_s']:,.0f} | {best['sim_ops_per_s'] / bare:.2f} |"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory (max RSS): {peak_mib:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
