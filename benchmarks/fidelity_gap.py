"""How far analytic fidelity lands from flow, over random valid scenarios.

Analytic fidelity times every call alone on the network (its symmetric images aside,
:mod:`simulator.engine.alone`); flow fidelity moves every transfer as flows that share
links. Where the two part by more than a few per cent the analytic result should say
so in a warning that points to flow (docs/modelling.md, "Fidelities"). This command
draws scenarios as a user might write them (a datacenter cluster preset of 1 to 8
nodes, a model preset, a random layout, batch, recompute, sharding, dtype, pipeline
schedule and placement), keeps those parasim accepts and that flow simulates in
seconds, runs each in both fidelities and prints, per scenario, the analytic step's
gap to flow's and whether the analytic result warned; then how many parted by more
than ``--threshold`` and how many of those warned.

    python -m benchmarks.fidelity_gap --scenarios 50 --seed 0
    python -m benchmarks.fidelity_gap --scenarios 50 --write out/gaps   # the YAML of each

The draws depend on ``--seed`` alone, so a run is repeatable.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulator.common.errors import ParasimError
from simulator.common.vocabulary import CP_KINDS, GRID_AXES, PROTOCOLS, RECOMPUTE_MODES
from simulator.request.scenario import Scenario, scenario_from_dict
from simulator.run.simulate import estimated_ops, run_scenario
from topologies import TopologyError

__all__ = ["Gap", "draw_scenario", "measure", "FLOW_WARNING", "main"]

ROOT = Path(__file__).resolve().parent.parent

#: Cluster presets of datacenter GPUs, and the node counts drawn.
CLUSTERS = ("dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200")
NODES = (1, 2, 4, 8)
#: Model presets small enough for a flow step of up to 64 GPUs in seconds.
MODELS = ("gpt2-small", "gpt2-xl", "gpt3-1.3b", "gpt3-6.7b", "llama2-7b", "llama3-8b")
DEGREES = (1, 2, 4, 8, 16)
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1")
SHARDING = ("none", "optimizer", "gradients", "full")
#: A step estimated above this many ops in flow fidelity is drawn again (seconds each).
MAX_FLOW_OPS = 300_000
#: The words every warning that points from analytic fidelity to flow's holds.
FLOW_WARNING = "simulation.fidelity=flow"


@dataclass(frozen=True)
class Gap:
    """One scenario's steps in both fidelities, and whether analytic's warned."""

    name: str
    recipe: str
    analytic_s: float
    flow_s: float
    warned: bool
    raw: dict[str, Any]

    @property
    def gap(self) -> float:
        """``(analytic - flow) / flow``: negative where analytic is faster."""
        return (self.analytic_s - self.flow_s) / self.flow_s


def _draw_raw(rng: random.Random, index: int) -> dict[str, Any]:
    """One scenario's fields, drawn with ``rng`` (not yet checked)."""
    preset, nodes = rng.choice(CLUSTERS), rng.choice(NODES)
    world = nodes * 8
    tp, cp, pp = rng.choice(DEGREES), rng.choice((1, 1, 2)), rng.choice(DEGREES)
    dp = max(1, world // (tp * cp * pp))
    micro = rng.choice((1, 2, 4))
    schedule = rng.choice(SCHEDULES)
    microbatches = rng.choice((1, 2, 4, 8)) * pp
    model = rng.choice(MODELS)
    training: dict[str, Any] = {
        "global_batch": dp * micro * microbatches,
        "micro_batch": micro,
        "recompute": rng.choice(RECOMPUTE_MODES),
        "sharding": rng.choice(SHARDING),
    }
    if preset != "dgx-a100" and rng.random() < 0.3:
        training["dtype"] = "fp8"
    if training["sharding"] != "none" and rng.random() < 0.3:
        training["param_gather_overlap"] = True
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "schedule": schedule}
    if schedule == "interleaved-1f1b":
        parallel["virtual_stages"] = 2
    if cp > 1:
        parallel["cp"], parallel["cp_kind"] = cp, rng.choice(CP_KINDS)
    if tp > 1 and rng.random() < 0.3:
        parallel["sp"] = True
    if rng.random() < 0.4:
        axes = list(GRID_AXES if cp > 1 else ("tp", "dp", "pp"))
        rng.shuffle(axes)
        parallel["placement"] = axes
    simulation: dict[str, Any] = {"fidelity": "analytic", "seed": rng.randrange(1000)}
    if rng.random() < 0.2:
        simulation["protocol"] = rng.choice(PROTOCOLS)
    return {
        "name": f"gap-{index}-{model}-{preset}",
        "cluster": {"preset": preset, "nodes": nodes},
        "model": {"preset": model},
        "training": training,
        "parallel": parallel,
        "simulation": simulation,
    }


def draw_scenario(rng: random.Random, index: int) -> tuple[dict[str, Any], Scenario]:
    """A scenario parasim accepts and flow simulates in seconds: drawn again until one
    is (the raw fields and the scenario, in analytic fidelity)."""
    while True:
        raw = _draw_raw(rng, index)
        try:
            scenario = scenario_from_dict(raw, source="fidelity-gap", base_dir=ROOT)
        except (ParasimError, TopologyError):
            continue
        flow = scenario_from_dict(
            {**raw, "simulation": {**raw["simulation"], "fidelity": "flow"}},
            source="fidelity-gap",
            base_dir=ROOT,
        )
        if estimated_ops(flow) <= MAX_FLOW_OPS:
            return raw, scenario


def measure(raw: dict[str, Any], scenario: Scenario) -> Gap:
    """Both fidelities' steps of one scenario."""
    analytic = run_scenario(scenario, numbers_only=True).result
    flow_raw = {**raw, "simulation": {**raw["simulation"], "fidelity": "flow"}}
    flow_scenario = scenario_from_dict(flow_raw, source="fidelity-gap", base_dir=ROOT)
    flow = run_scenario(flow_scenario, numbers_only=True).result
    return Gap(
        name=raw["name"],
        recipe=str(scenario.recipe),
        analytic_s=analytic.step_time_s,
        flow_s=flow.step_time_s,
        warned=any(FLOW_WARNING in warning for warning in analytic.warnings),
        raw=raw,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity_gap", description=__doc__)
    parser.add_argument("--scenarios", type=int, default=50, help="scenarios to draw (50)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument(
        "--threshold", type=float, default=0.05, help="the gap that calls for a warning (0.05)"
    )
    parser.add_argument("--write", type=Path, help="write each scenario's YAML into this folder")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    gaps = []
    for index in range(args.scenarios):
        raw, scenario = draw_scenario(rng, index)
        gap = measure(raw, scenario)
        gaps.append(gap)
        far = abs(gap.gap) > args.threshold
        print(
            f"{gap.name:<34} {gap.recipe:<48} analytic {gap.analytic_s * 1e3:9.2f} ms  "
            f"flow {gap.flow_s * 1e3:9.2f} ms  {gap.gap:+7.1%}  "
            f"{'warned' if gap.warned else ('NOT WARNED' if far else '-')}",
            flush=True,
        )
        if args.write:
            args.write.mkdir(parents=True, exist_ok=True)
            (args.write / f"{gap.name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    far = [g for g in gaps if abs(g.gap) > args.threshold]
    warned = [g for g in far if g.warned]
    print(
        f"{len(gaps)} scenarios (seed {args.seed}) in {time.perf_counter() - started:.0f} s: "
        f"{len(far)} part from flow by more than {args.threshold:.0%} (largest "
        f"{max((abs(g.gap) for g in gaps), default=0.0):.1%}), {len(warned)} of them warned; "
        f"{sum(g.warned for g in gaps)} warned in all"
    )
    return 0 if len(warned) == len(far) else 1


if __name__ == "__main__":
    raise SystemExit(main())
