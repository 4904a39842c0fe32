"""What a sweep ranks layouts on: ``--objective step | time-to-train | cost | energy``.

``step`` is the step time. The others are the whole run of the scenario's ``run:``
section (its tokens, failures, checkpoints, restarts, price and power) trained at the
layout, as ``parasim plan`` accounts a phase (:func:`simulator.tools.plan.phase_plan`):
``time-to-train`` its expected wall-clock time under failures, ``cost`` that time's
GPU-hours at the price, ``energy`` its energy. A sweep ranks the run as one phase of all
its tokens at the sweep's global batch (a recipe's phases change the batch and the
sequence, which the sweep holds fixed).

Each is at least a constant times the step (:attr:`RunObjective.per_step_second`): the
run's steps (its goodput is at most 1), times the GPUs and the price for the cost, times
every part drawing at least its idle power for the energy. So a lower bound on a
layout's step bounds its objective, and a sweep's best-first search prunes on it as on
the step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.analysis.power import idle_power, parts_of
from simulator.common.errors import ParasimError
from simulator.common.vocabulary import OBJECTIVES
from simulator.request.run_plan import RunSpec
from simulator.request.scenario import Scenario
from simulator.tools.plan import PhasePlan, phase_plan

__all__ = ["OBJECTIVES", "RunObjective"]


@dataclass(frozen=True)
class RunObjective:
    """An objective of the run of ``run`` at the sweep's size: ``per_step_second`` is
    the least it can be per second of a layout's step."""

    name: str
    run: RunSpec | None
    per_step_second: float

    @classmethod
    def of(cls, name: str, scenario: Scenario | None) -> RunObjective:
        """``name`` for the sweep whose base scenario (at its size) is ``scenario``
        (None for the step, which needs none)."""
        if name not in OBJECTIVES:
            raise ParasimError(
                f"--objective: expected one of {', '.join(OBJECTIVES)} (got {name!r})"
            )
        if name == "step":
            return cls(name, None, 1.0)
        assert scenario is not None
        run = scenario.spec.run
        if run is None:
            raise ParasimError(
                f"--objective {name}: the scenario has no run: section (the tokens to "
                "train, failures, checkpoints, price: docs/guide.md, 'The whole run')"
            )
        steps = math.ceil(
            run.tokens / (scenario.spec.training.global_batch * scenario.model.seq_len)
        )
        gpus = scenario.layout.world
        if name == "time-to-train":
            return cls(name, run, float(steps))
        if name == "cost":
            if run.price_per_gpu_hour is None:
                raise ParasimError(
                    "--objective cost: the scenario's run.price_per_gpu_hour is missing"
                )
            return cls(name, run, steps * gpus * run.price_per_gpu_hour / 3600.0)
        gpu = scenario.cluster_spec.gpu
        nodes = math.ceil(gpus / scenario.cluster_spec.gpus_per_node)
        idle = idle_power(gpu, gpus, nodes, run.power.pue, run.power.node_other_w)
        if idle is None:
            raise ParasimError(
                f"--objective energy: the preset's GPU ({gpu.name}) has no tdp_w and "
                "static_power_w to draw power from"
            )
        return cls(name, run, steps * idle)

    def value(
        self, scenario: Scenario, outcome: Mapping[str, Any]
    ) -> tuple[float, PhasePlan | None]:
        """The objective of a simulated candidate (``outcome``: its step time and mean
        breakdown, as the sweep's pool gives them), and its run's plan."""
        step = float(outcome["step_time_s"])
        if self.run is None:
            return step, None
        parts = parts_of(outcome["breakdown_mean_s"], scenario.layout.world)
        phase = phase_plan(scenario, step, parts, self.run.tokens, self.run)
        if self.name == "time-to-train":
            return phase.goodput.wall_mean, phase
        if self.name == "cost":
            price = self.run.price_per_gpu_hour or 0.0
            return phase.gpus * phase.goodput.wall_mean / 3600.0 * price, phase
        assert phase.energy_j is not None
        return phase.energy_j, phase
