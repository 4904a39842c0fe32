"""Benchmark: the model's nccl-tests tables per preset, and how long they take.

For every cluster preset (except cpu-localhost) prints the all_reduce, all_gather and
all_to_all bus bandwidth of one node (8 GPUs) and of 16 nodes at a few sizes, with
the algorithm/protocol chosen, and times ``collbench`` and a full-step analytic run of
``scenarios/gpt3-175b.yaml``. Usage::

    python -m benchmarks.bench_collbench
"""

from __future__ import annotations

import time
from pathlib import Path

from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools.collbench import collbench_cluster, collbench_rows
from topologies import preset_names

ROOT = Path(__file__).resolve().parent.parent
SIZES = [8.0, 65536.0, 2**20, 16 * 2**20, 256 * 2**20, 8 * 2**30]
OPS = ("all_reduce", "all_gather", "all_to_all")


def _label(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size:g} B"


def main() -> int:
    for preset in preset_names():
        if preset.startswith("cpu"):
            continue
        for nodes in (1, 16):
            cluster = collbench_cluster(preset, nodes)
            plural = "s" if nodes > 1 else ""
            print(f"\n### {preset}, {nodes} node{plural} ({cluster.num_gpus} GPUs)\n")
            print("| op | " + " | ".join(_label(s) for s in SIZES) + " |")
            print("|---|" + "---|" * len(SIZES))
            for op in OPS:
                if op == "all_to_all" and cluster.num_gpus > 256:
                    continue
                started = time.perf_counter()
                rows = collbench_rows(cluster, op, SIZES)
                elapsed = time.perf_counter() - started
                cells = [f"{r.busbw_GBps:.1f} ({r.algorithm}/{r.protocol})" for r in rows]
                print(f"| {op} busbw GB/s | " + " | ".join(cells) + f" |  <!-- {elapsed:.2f} s -->")
    started = time.perf_counter()
    rows = collbench_rows(
        collbench_cluster("dgx-a100", 16), "all_reduce", [2.0**p for p in range(3, 34)]
    )
    elapsed = time.perf_counter() - started
    print(f"\ncollbench all_reduce, 128 GPUs, 8 B - 8 GiB ({len(rows)} sizes): {elapsed:.2f} s")
    for fidelity in ("analytic", "flow"):
        scenario = load_scenario(
            ROOT / "scenarios" / "gpt3-175b.yaml", [f"simulation.fidelity={fidelity}"]
        )
        started = time.perf_counter()
        run = run_scenario(scenario)
        print(
            f"gpt3-175b step, {fidelity}: {time.perf_counter() - started:.2f} s wall, "
            f"step {run.result.step_time_s:.3f} s, "
            f"{run.result.simulation['simulated_ranks']} ranks simulated"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
