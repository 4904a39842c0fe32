"""The energy of a simulated step: the power model integrated over its timeline.

Each rank's step is cut into what it did (the accounting's categories,
:mod:`simulator.analysis.metrics`), and each part draws its own power:

- **compute**: the board at its power limit (``gpu.power_limit_w``, default its TDP,
  ``gpu.tdp_w``): a GEMM-heavy load runs the board into its limit
  (:mod:`topologies.clocks`);
- **exposed communication**: the board's static power (``gpu.static_power_w``) and
  the share of its switching power NCCL's kernels use: their channels' share of the SMs
  (16 of ``gpu.sm_count``, :data:`simulator.engine.compute.NCCL_CHANNELS`; a quarter
  where the preset gives no SM count);
- **waiting** (pipeline bubbles, imbalance stalls, other idle): the static power alone.

Each node's other parts (CPUs, NICs, NVLink switches, fans) draw ``node_other_w`` for
the whole step (default :data:`NODE_OTHER_W`: the node's datasheet maximum less its
GPUs' TDP), and the facility multiplies it all by its PUE. So a step's energy is

``PUE · (Σ_ranks Σ_parts P_part · t_part + nodes · P_other · t_step)``

and bubbles and exposed communication cost power too, less than compute.

Simplified: a board computing draws its limit whatever the kernel (attention and
elementwise kernels draw less); the node's other parts draw their maximum throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from simulator.analysis.result import StepResult
from simulator.engine.compute import NCCL_CHANNELS
from topologies.spec import GPUSpec

__all__ = [
    "NODE_OTHER_W",
    "StepEnergy",
    "energy_of",
    "gpu_powers",
    "idle_power",
    "node_other_power",
    "parts_of",
    "rank_seconds",
    "step_energy",
]

#: A node's power beyond its GPUs, by the GPU name of its preset: the system's datasheet
#: maximum less its GPUs' TDPs. DGX A100 6.5 kW less 8 × 400 W; DGX H100 and DGX H200
#: 10.2 kW less 8 × 700 W; DGX B200 14.3 kW less 8 × 1,000 W (NVIDIA's DGX datasheets);
#: GB200 NVL72 about 120 kW a rack less 72 × 1,200 W (NVIDIA's rack figure).
NODE_OTHER_W: dict[str, float] = {
    "A100": 6_500.0 - 8 * 400.0,
    "H100": 10_200.0 - 8 * 700.0,
    "H200": 10_200.0 - 8 * 700.0,
    "GB200": 120_000.0 - 72 * 1_200.0,
    "B200": 14_300.0 - 8 * 1_000.0,
}
#: NCCL's share of the switching power where the preset gives no SM count.
COMM_SHARE_DEFAULT = 0.25


def node_other_power(gpu: GPUSpec) -> float:
    """A node's power beyond its GPUs for ``gpu``'s preset (0 where none is known)."""
    return next((watts for key, watts in NODE_OTHER_W.items() if key in gpu.name), 0.0)


@dataclass(frozen=True)
class StepEnergy:
    """A step's energy in joules, by part (the GPUs computing, communicating, waiting;
    the nodes' other parts) before the PUE, and the whole with it."""

    compute_j: float
    communication_j: float
    waiting_j: float
    node_other_j: float
    pue: float

    @property
    def total_j(self) -> float:
        return self.pue * (
            self.compute_j + self.communication_j + self.waiting_j + self.node_other_j
        )

    def to_json(self) -> dict[str, float]:
        return {
            "compute_j": self.compute_j,
            "communication_j": self.communication_j,
            "waiting_j": self.waiting_j,
            "node_other_j": self.node_other_j,
            "pue": self.pue,
            "total_j": self.total_j,
        }


def gpu_powers(gpu: GPUSpec) -> tuple[float, float, float] | None:
    """Watts of one board computing, communicating and waiting (None where the preset
    gives no TDP and static power: a CPU process's)."""
    if gpu.tdp_w is None or gpu.static_power_w is None:
        return None
    limit = gpu.power_limit_w or gpu.tdp_w
    share = NCCL_CHANNELS / gpu.sm_count if gpu.sm_count else COMM_SHARE_DEFAULT
    static = gpu.static_power_w
    return limit, static + share * (limit - static), static


#: The accounting's categories a rank draws its idle power in.
WAITING = ("bubble", "imbalance_stall", "other")


def parts_of(breakdown: Mapping[str, float], ranks: float = 1.0) -> dict[str, float]:
    """``ranks`` ranks' seconds of one breakdown (the accounting's categories) by what
    the power model tells apart: ``compute``, ``exposed_comm``, ``waiting``."""
    return {
        "compute": ranks * breakdown.get("compute", 0.0),
        "exposed_comm": ranks * breakdown.get("exposed_comm", 0.0),
        "waiting": ranks * sum(breakdown.get(name, 0.0) for name in WAITING),
    }


def rank_seconds(result: StepResult) -> dict[str, float]:
    """The step's seconds over every rank (:func:`parts_of` each row, its ranks)."""
    parts = {"compute": 0.0, "exposed_comm": 0.0, "waiting": 0.0}
    for row in result.per_rank:
        for name, seconds in parts_of(row.breakdown, row.ranks).items():
            parts[name] += seconds
    return parts


def step_energy(
    result: StepResult, gpu: GPUSpec, nodes: int, pue: float, node_other_w: float | None
) -> StepEnergy | None:
    """The energy of ``result``'s step (None where the GPU's power is not known)."""
    return energy_of(rank_seconds(result), result.step_time_s, gpu, nodes, pue, node_other_w)


def energy_of(
    parts: dict[str, float],
    step: float,
    gpu: GPUSpec,
    nodes: int,
    pue: float,
    node_other_w: float | None,
) -> StepEnergy | None:
    """The energy of a step of ``step`` seconds whose ranks spent ``parts``
    (:func:`rank_seconds`), None where the GPU's power is not known."""
    powers = gpu_powers(gpu)
    if powers is None:
        return None
    computing, communicating, waiting = powers
    other = node_other_power(gpu) if node_other_w is None else node_other_w
    return StepEnergy(
        compute_j=computing * parts["compute"],
        communication_j=communicating * parts["exposed_comm"],
        waiting_j=waiting * parts["waiting"],
        node_other_j=nodes * other * step,
        pue=pue,
    )


def idle_power(
    gpu: GPUSpec, gpus: int, nodes: int, pue: float, node_other_w: float | None
) -> float | None:
    """Watts of the whole cluster with every rank waiting (a checkpoint's write, a
    restart): a second of :func:`energy_of` spent idle; None where the GPU's power is
    not known."""
    energy = energy_of(parts_of({"other": 1.0}, gpus), 1.0, gpu, nodes, pue, node_other_w)
    return None if energy is None else energy.total_j
