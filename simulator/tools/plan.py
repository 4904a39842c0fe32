"""The whole run: ``parasim plan SCENARIO``.

For each phase of the scenario's ``run:`` (:mod:`simulator.request.run_plan`) one step
is simulated (phases with the same overrides share it): the phase takes
``ceil(tokens / tokens per step)`` steps, its training time their sum. Its checkpoint
follows from its layout's sharding (:mod:`simulator.analysis.checkpoint`), its interval
from the run's (``auto``: Daly's optimum for the phase's failure rate and checkpoint
cost), and its wall time under failures from a seeded Monte Carlo
(:mod:`simulator.tools.goodput`). Energy follows each phase's simulated step
(:mod:`simulator.analysis.power`), plus the GPUs and nodes idle while checkpoints block
and jobs restart, and the work lost redone at the step's power. Cost is the GPU-hours of
wall time at ``price_per_gpu_hour``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simulator.analysis.checkpoint import CheckpointWrite, checkpoint_write
from simulator.analysis.power import StepEnergy, energy_of, idle_power, rank_seconds
from simulator.analysis.result import StepResult
from simulator.arithmetic.counts import parameter_count
from simulator.common.errors import ScenarioError
from simulator.request.run_plan import RunSpec
from simulator.request.scenario import Scenario, load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools.goodput import Goodput, optimal_interval, simulate_goodput

__all__ = ["PhasePlan", "RunPlan", "phase_plan", "plan_run"]


@dataclass
class PhasePlan:
    """One phase of the run: its step, tokens, steps, time, checkpoint, goodput and
    energy."""

    name: str
    overrides: list[str]
    recipe: str
    gpus: int
    nodes: int
    tokens: float
    tokens_per_step: int
    steps: int
    step_s: float
    checkpoint: CheckpointWrite
    goodput: Goodput
    energy: StepEnergy | None
    energy_j: float | None
    timeline: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def train_s(self) -> float:
        """Training time without failures or checkpoints: its steps' sum."""
        return self.steps * self.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "set": list(self.overrides),
            "recipe": self.recipe,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "tokens": self.tokens,
            "tokens_per_step": self.tokens_per_step,
            "steps": self.steps,
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "train_s": self.train_s,
            "gpu_hours_train": self.gpus * self.train_s / 3600,
            "checkpoint": self.checkpoint.to_json(),
            "goodput": self.goodput.to_json(),
            "step_energy": self.energy.to_json() if self.energy else None,
            "energy_j": self.energy_j,
        }


@dataclass
class RunPlan:
    """The run: its phases, and what they add up to."""

    scenario: str
    tokens: float
    phases: list[PhasePlan]
    price_per_gpu_hour: float | None
    failures_per_gpu_hour: float
    warnings: list[str] = field(default_factory=list)

    @property
    def train_s(self) -> float:
        return sum(p.train_s for p in self.phases)

    @property
    def wall_s(self) -> float:
        return sum(p.goodput.wall_mean for p in self.phases)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of wall time (what a cluster bills)."""
        return sum(p.gpus * p.goodput.wall_mean for p in self.phases) / 3600

    @property
    def goodput(self) -> float:
        return self.train_s / self.wall_s if self.wall_s > 0 else 1.0

    @property
    def cost(self) -> float | None:
        if self.price_per_gpu_hour is None:
            return None
        return self.gpu_hours * self.price_per_gpu_hour

    @property
    def energy_j(self) -> float | None:
        values = [p.energy_j for p in self.phases]
        return None if any(v is None for v in values) else sum(v or 0.0 for v in values)

    def to_json(self) -> dict[str, Any]:
        energy = self.energy_j
        cost = self.cost
        return {
            "scenario": self.scenario,
            "tokens": self.tokens,
            "train_s": self.train_s,
            "wall_s": self.wall_s,
            "wall_p10_s": sum(p.goodput.wall_p10 for p in self.phases),
            "wall_p90_s": sum(p.goodput.wall_p90 for p in self.phases),
            "goodput": self.goodput,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_train": sum(p.gpus * p.train_s for p in self.phases) / 3600,
            "failures_per_gpu_hour": self.failures_per_gpu_hour,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "cost": cost,
            "cost_per_million_tokens": cost / self.tokens * 1e6 if cost is not None else None,
            "energy_j": energy,
            "energy_mwh": energy / 3.6e9 if energy is not None else None,
            "energy_per_token_j": energy / self.tokens if energy is not None else None,
            "phases": [p.to_json() for p in self.phases],
            "warnings": list(self.warnings),
        }


def _sharded(scenario: Scenario, run: RunSpec) -> bool:
    said = run.checkpoint.sharded
    return scenario.recipe.shards_optimizer if said == "auto" else bool(said)


def _phase(
    base: Scenario,
    path: str,
    overrides: list[str],
    name: str,
    tokens: float,
    run: RunSpec,
    simulated: StepResult | None = None,
) -> PhasePlan:
    """One phase planned: its step simulated (``simulated``: the step of ``base``, given
    where the phase runs it), then accounted (:func:`phase_plan`)."""
    scenario = load_scenario(path, overrides) if overrides and simulated is None else base
    if simulated is None:
        simulated = run_scenario(scenario, numbers_only=True).result
    return phase_plan(
        scenario,
        simulated.step_time_s,
        rank_seconds(simulated),
        tokens,
        run,
        name,
        overrides,
        simulated.model.parameters,
        simulated.layout.recipe,
    )


def phase_plan(
    scenario: Scenario,
    step: float,
    parts: dict[str, float],
    tokens: float,
    run: RunSpec,
    name: str = "all",
    overrides: list[str] | None = None,
    parameters: float | None = None,
    recipe: str | None = None,
) -> PhasePlan:
    """A phase of ``tokens`` trained at ``scenario``'s layout, whose step takes ``step``
    seconds and its ranks ``parts`` (:func:`~simulator.analysis.power.rank_seconds`):
    its checkpoint, its goodput under the run's failures, its energy."""
    spec = scenario.cluster_spec
    layout = scenario.layout
    if parameters is None:
        parameters = parameter_count(scenario.model, scenario.moe)
    tokens_per_step = scenario.spec.training.global_batch * scenario.model.seq_len
    steps = math.ceil(tokens / tokens_per_step)
    nic = spec.nic
    write = checkpoint_write(
        parameters,
        scenario.recipe.optimizer_state_bytes,
        layout,
        spec.gpus_per_node,
        run.checkpoint.bandwidth_per_node,
        _sharded(scenario, run),
        run.checkpoint.asynchronous,
        nic.pcie_bandwidth if nic is not None else None,
    )
    gpus = layout.world
    rate = run.failures.rate_per_gpu_hour(spec.gpus_per_node) * gpus / 3600.0
    mtbf = 1.0 / rate if rate > 0 else math.inf
    interval = run.checkpoint.interval
    if interval == "auto":
        interval = optimal_interval(write.stall_s, mtbf)
    work = steps * step
    timeline: list[tuple[float, float, str]] = []
    goodput = simulate_goodput(
        work, rate, interval, write.stall_s, run.restart, run.trials, run.seed, timeline
    )
    nodes = math.ceil(gpus / spec.gpus_per_node)
    energy = energy_of(parts, step, spec.gpu, nodes, run.power.pue, run.power.node_other_w)
    energy_j = None
    if energy is not None:
        idle_w = idle_power(spec.gpu, gpus, nodes, run.power.pue, run.power.node_other_w)
        assert idle_w is not None
        per_second = energy.total_j / step
        # training and the work redone at the step's power; checkpoints and restarts idle
        energy_j = per_second * (work + goodput.lost) + idle_w * (
            goodput.checkpointing + goodput.restarting
        )
    return PhasePlan(
        name=name,
        overrides=list(overrides or []),
        recipe=recipe or str(scenario.recipe),
        gpus=gpus,
        nodes=nodes,
        tokens=tokens,
        tokens_per_step=tokens_per_step,
        steps=steps,
        step_s=step,
        checkpoint=write,
        goodput=goodput,
        energy=energy,
        energy_j=energy_j,
        timeline=timeline,
    )


def plan_run(
    path: str, overrides: list[str] | None = None, simulated: StepResult | None = None
) -> RunPlan:
    """The plan of the run the scenario at ``path`` describes (``run:``), with
    ``overrides`` applied to every phase before its own (``simulated``: the scenario's
    step with them, simulated already, for the phases that run it)."""
    overrides = list(overrides or [])
    base = load_scenario(path, overrides)
    run = base.spec.run
    if run is None:
        raise ScenarioError(
            f"{path}: run: is missing (the tokens to train, and the phases, failures, "
            "checkpoints and price of the run: docs/guide.md, 'The whole run')"
        )
    phases = run.phases or []
    planned = []
    if not phases:
        planned.append(_phase(base, path, overrides, "all", run.tokens, run, simulated))
    for phase in phases:
        sets = [*overrides, *phase.set]
        same = simulated if not phase.set else None
        planned.append(_phase(base, path, sets, phase.name, phase.tokens, run, same))
    warnings = [
        f"phase {p.name}: no GPU power in its preset ({base.cluster_spec.gpu.name}): no energy"
        for p in planned
        if p.energy is None
    ]
    return RunPlan(
        scenario=base.name,
        tokens=run.tokens,
        phases=planned,
        price_per_gpu_hour=run.price_per_gpu_hour,
        failures_per_gpu_hour=run.failures.rate_per_gpu_hour(base.cluster_spec.gpus_per_node),
        warnings=warnings,
    )
