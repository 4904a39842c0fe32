"""The result of one step, simulated or measured: a typed value, and ``result.json``.

:class:`StepResult` is what :func:`simulator.run.simulate.run_scenario` returns (in a
``RunResult``), what ``parasim replay`` measures, and what the reports, sweep, scale,
explain and compare read. Its parts are dataclasses too; dicts are left only where the
keys are open-ended (time per category, per phase, per axis, memory per term, the
engine's statistics). :meth:`StepResult.to_json` gives ``result.json``'s content and
:meth:`StepResult.from_json` reads it back, so a file written by an earlier run loads
into the same type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "StepResult",
    "ClusterSummary",
    "ModelSummary",
    "LayoutSummary",
    "Breakdown",
    "RankAccount",
    "StageMemory",
    "MemoryEstimate",
    "MoESummary",
    "LinkUse",
    "MeasuredRun",
]


@dataclass
class ClusterSummary:
    name: str
    nodes: int
    gpus: int
    gpu: str
    peak_flops_per_gpu: float
    # the GPUs' power limit, watts, when the scenario sets one (None: the TDP)
    power_limit_w: float | None = None


@dataclass
class ModelSummary:
    name: str
    parameters: int
    active_parameters: int


@dataclass
class LayoutSummary:
    """The layout and batch of the step, as ``result.json`` records them."""

    tp: int
    pp: int
    dp: int
    placement: list[str]
    schedule: str
    micro_batch: int
    microbatches: int
    global_batch: int
    recompute: str
    attention: str
    # the whole recipe in its text form (Recipe.__str__): every knob that differs from
    # its default, e.g. "tp8 pp8 dp2 sp mb1x32 1f1b rc=full [tp,dp,pp] L96"
    recipe: str = ""


@dataclass
class Breakdown:
    """Where the step's time went: on the critical rank, and the mean over ranks."""

    critical_rank: int
    critical: dict[str, float]
    mean: dict[str, float]


@dataclass
class RankAccount:
    """One rank's time: its categories, exposed communication by axis, compute by
    phase, and when it finished."""

    rank: int
    node: int
    tp: int
    dp: int
    pp: int
    end_s: float
    breakdown: dict[str, float]
    exposed_comm_by_axis: dict[str, float]
    compute_by_phase: dict[str, float]
    # the rank's context-parallel coordinate (None without context parallelism)
    cp: int | None = None
    # how many ranks the row stands for, itself among them (a folded run simulates one
    # rank of each class), and the grid coordinates they share (those of this rank alone
    # in a run that simulated every rank); StepResult.rank_figures reads any rank's row
    ranks: int = 1
    class_coords: dict[str, int] = field(default_factory=dict)


@dataclass
class StageMemory:
    """Peak memory of every rank of one pipeline rank, by term."""

    stage: int
    parameters: int
    in_flight_microbatches: int
    terms_bytes: dict[str, float]
    total_bytes: float
    dominant: str


@dataclass
class MemoryEstimate:
    """Peak bytes per GPU (the worst pipeline rank's), the capacity, and the verdict."""

    peak_bytes_per_gpu: float
    peak_stage: int
    capacity_bytes: float
    oom: bool
    dominant_term: str
    per_stage: list[StageMemory]


@dataclass
class MoESummary:
    """Token routing over every MoE layer and micro-batch the step ran."""

    experts: int
    top_k: int
    ep: int
    routing: str
    token_assignments: int
    dropped_fraction: float
    imbalance_mean: float
    imbalance_max: float


@dataclass
class LinkUse:
    """One of the busiest links: what it carried over the step."""

    link: str
    bandwidth_Bps: float
    bytes: float
    mean_utilisation: float
    peak_utilisation: float


@dataclass
class MeasuredRun:
    """How a measured step was measured (``parasim replay``)."""

    backend: str
    device: str
    torch: str
    warmup_steps: int
    step_times_s: list[float]
    step_shown: int
    verified_collectives: bool
    # the median step and the spread of the measured steps: (highest - lowest) / median
    median_s: float | None = None
    spread: float | None = None
    # the machine while it ran: its 1-minute load average just before the ranks started,
    # its cores, the cores each rank was pinned to (empty: not pinned) and each rank's
    # CPU time over wall time through the measured steps (below 1: waiting, on its
    # peers or for a core)
    load_average_1m: float | None = None
    # processes that wanted a core just before the ranks started, other than parasim's
    runnable_before: float | None = None
    cpu_count: int | None = None
    pinned_cpus: list[list[int]] = field(default_factory=list)
    cpu_per_wall: list[float] = field(default_factory=list)
    # the share of the machine's CPU time its hypervisor gave other guests while the
    # steps ran (Linux's "steal"; None where /proc/stat does not say)
    steal_fraction: float | None = None
    # one fixed GEMM's time on rank 0 just before the measured steps (the calibration
    # records the same probe: their ratio is how much slower the machine ran)
    probe_s: float | None = None


@dataclass
class StepResult:
    """One training step's numbers (``result.json``)."""

    parasim_version: str
    scenario: str
    fidelity: str
    cluster: ClusterSummary
    model: ModelSummary
    layout: LayoutSummary
    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    tflops_per_gpu: float
    mfu: float
    hardware_tflops_per_gpu: float
    hfu: float
    breakdown: Breakdown
    per_rank: list[RankAccount]
    memory: MemoryEstimate
    moe: MoESummary | None
    warnings: list[str]
    # the engine's statistics (ops, events, folded, collective choices, …): open-ended
    simulation: dict[str, Any]
    busiest_links: list[LinkUse]
    measured: MeasuredRun | None = field(default=None)
    # what stragglers cost (gpu.jitter > 0): this step's time minus the same step's with
    # every rank's compute at the mean
    straggler_s: float = 0.0
    # the --set overrides the scenario file was run with
    overrides: list[str] = field(default_factory=list)
    # how far the step time can be trusted (simulator.analysis.trust): multipliers
    # ``low``/``high`` on it at ``level``, the runs they come from, and why the run is
    # outside what was validated (None when it is not)
    interval: dict[str, Any] | None = None

    def grid_coords(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s coordinates on the run's grid (``cp`` with context
        parallelism; ``ep_group``, its EP group among its stage's, with experts), from
        the layout's placement, innermost axis first."""
        layout = self.layout
        if not 0 <= rank < self.cluster.gpus:
            raise ValueError(f"rank {rank} is out of range 0..{self.cluster.gpus - 1}")
        sizes = {"tp": layout.tp, "dp": layout.dp, "pp": layout.pp}
        sizes["cp"] = self.cluster.gpus // (layout.tp * layout.dp * layout.pp)
        coords, stride = {}, 1
        for axis in layout.placement:
            coords[axis] = rank // stride % sizes[axis]
            stride *= sizes[axis]
        if self.moe is not None:  # the rank's EP group among its stage's
            coords["ep_group"] = coords["dp"] // self.moe.ep
        return coords

    def rank_figures(self, rank: int) -> RankAccount:
        """Rank ``rank``'s figures: the row of the ranks it is one of (its class: in a
        folded run, the ranks of its pipeline stage, and of its EP group with experts),
        under its own rank, node and coordinates."""
        coords = self.grid_coords(rank)
        folded = bool(self.simulation.get("folded"))
        for row in self.per_rank:
            # a file from before rows said their class: a folded row stands for its stage
            shared = row.class_coords or ({"pp": row.pp} if folded else {"rank": row.rank})
            if all({**coords, "rank": rank}.get(axis) == value for axis, value in shared.items()):
                per_node = self.cluster.gpus // self.cluster.nodes
                return dataclasses.replace(
                    row,
                    rank=rank,
                    node=rank // per_node,
                    tp=coords["tp"],
                    dp=coords["dp"],
                    pp=coords["pp"],
                    cp=coords.get("cp", row.cp),
                )
        raise ValueError(f"rank {rank}: no row of per_rank stands for it")

    def to_json(self) -> dict[str, Any]:
        """``result.json``'s content (a measured step's has a ``measured`` section)."""
        data = dataclasses.asdict(self)
        data["network"] = {"busiest_links": data.pop("busiest_links")}
        for row in data["per_rank"]:
            if row["cp"] is None:
                del row["cp"]
        if self.measured is None:
            del data["measured"]
        if self.interval is not None:
            low, high = self.interval["low"], self.interval["high"]
            data["step_time_interval_s"] = [self.step_time_s * low, self.step_time_s * high]
            data["tokens_per_s_interval"] = [self.tokens_per_s / high, self.tokens_per_s / low]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepResult:
        """Read ``result.json``'s content back."""
        memory = dict(data["memory"])
        memory["per_stage"] = [StageMemory(**row) for row in memory["per_stage"]]
        return cls(
            parasim_version=data["parasim_version"],
            scenario=data["scenario"],
            fidelity=data["fidelity"],
            cluster=ClusterSummary(**data["cluster"]),
            model=ModelSummary(**data["model"]),
            layout=LayoutSummary(**data["layout"]),
            step_time_s=data["step_time_s"],
            tokens_per_s=data["tokens_per_s"],
            model_flops_per_step=data["model_flops_per_step"],
            hardware_flops_per_step=data["hardware_flops_per_step"],
            tflops_per_gpu=data["tflops_per_gpu"],
            mfu=data["mfu"],
            hardware_tflops_per_gpu=data["hardware_tflops_per_gpu"],
            hfu=data["hfu"],
            breakdown=Breakdown(**data["breakdown"]),
            per_rank=[RankAccount(**row) for row in data["per_rank"]],
            memory=MemoryEstimate(**memory),
            moe=MoESummary(**data["moe"]) if data.get("moe") else None,
            warnings=list(data["warnings"]),
            simulation=dict(data["simulation"]),
            busiest_links=[LinkUse(**row) for row in data["network"]["busiest_links"]],
            measured=MeasuredRun(**data["measured"]) if data.get("measured") else None,
            overrides=list(data.get("overrides", [])),
            straggler_s=float(data.get("straggler_s", 0.0)),
            interval=dict(data["interval"]) if data.get("interval") else None,
        )
