"""Simulate one training step of a scenario and assemble ``result.json``.

This is the whole path from scenario to numbers in one place: build the Schedule IR
for every rank, replay it on the modelled cluster, account every rank's time, estimate
memory, and compute the headline figures (docs/guide.md, "One step, end to end").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from simulator.analysis.contention import contention_warnings
from simulator.analysis.links import link_summary
from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import account_rank, account_step
from simulator.analysis.oversubscription import oversubscription_warnings
from simulator.analysis.result import (
    ClusterSummary,
    LayoutSummary,
    LinkUse,
    ModelSummary,
    MoESummary,
    StepResult,
)
from simulator.analysis.trace import OpRecord, Trace
from simulator.analysis.trust import trust_interval
from simulator.arithmetic.counts import (
    active_parameter_count,
    model_flops_per_step,
    parameter_count,
)
from simulator.arithmetic.moe import loads_equal
from simulator.common.collector import fewer_collections
from simulator.common.errors import ParasimError
from simulator.common.machine import machine_memory
from simulator.common.version import __version__
from simulator.engine.compute import executed_flops
from simulator.engine.core import EngineOptions, SimulationTimes, simulate
from simulator.engine.core_sharing import share_cores
from simulator.engine.stragglers import rank_factors
from simulator.request.scenario import (
    MAX_WORLD,
    Scenario,
    ScenarioSpec,
    SimulationSpec,
    apply_overrides,
    read_scenario_file,
    scenario_model,
)
from simulator.schedule.ir import Block, Compute, Schedule
from simulator.schedule.step import LoweringPlan, build_step
from topologies import TopologyError, load_cluster_spec

__all__ = [
    "RunResult",
    "run_scenario",
    "simulate_step",
    "finish_step",
    "SimulatedStep",
    "assemble_result",
    "build_schedule",
    "per_rank_schedule",
    "folds",
    "idle_intervals",
    "make_trace",
    "representative_ranks",
    "trace_ranks",
    "StepSize",
    "step_size",
    "scenario_size",
    "request_size",
    "size_problem",
    "advice",
    "check_size",
    "check_request_size",
    "would_fold",
]

# Above this many ops, trace.json and the timeline keep a representative set of ranks.
FULL_TRACE_OP_LIMIT = 300_000
# A trace of more than this many ops over more than MAX_TRACE_STAGES pipeline stages
# keeps the ranks of that many stages, evenly spaced: a deep pipeline's middle stages
# run alike, and each op costs its files about ten microseconds to write (the 1T GPT's
# trace in benchmarks/RESULTS.md). --full-trace keeps every one.
STAGE_CAP_OPS = 100_000
MAX_TRACE_STAGES = 16
# Flow fidelity folds symmetric ranks by default above this many ranks: every rank of a
# 512-GPU step in flow takes minutes, and a dense model's ranks of one stage run alike.
FLOW_FOLD_WORLD = 512


@dataclass
class RunResult:
    scenario: Scenario
    schedule: Schedule
    times: SimulationTimes
    result: StepResult
    #: each rank's idle stretches of its compute stream, ``(category, start, end)``, as
    #: the time accounting found them (None when the run kept numbers only)
    idle: dict[int, list[tuple[str, float, float]]] | None = None
    #: the scenario's whole run planned on this step (``simulator.tools.plan.RunPlan``),
    #: where the scenario has a ``run:`` and its report shows it; None otherwise
    plan: Any = None


def build_schedule(
    scenario: Scenario, numbers_only: bool = False, labelled: bool = True
) -> Schedule:
    """The Schedule IR of one training step of ``scenario``: folded to one rank per
    pipeline stage when :func:`folds` says so, and in blocks of whole pipeline actions
    in analytic fidelity. Without ``labelled`` (a run whose outputs name no op: its
    result alone) the stages of one shape share their block bodies' lowering
    (``build_step``'s ``share_bodies``), so that every stage's ops carry the first one's
    labels, and the step's numbers are the same to the last digit. With
    ``numbers_only`` (a search) the actions that hand gradients to data parallelism are
    also written in blocks of layers where bodies hold their times (``layer_blocks``),
    which moves the numbers by float rounding."""
    fold = folds(scenario)
    analytic = scenario.spec.simulation.fidelity == "analytic"
    plan = LoweringPlan(
        fold=fold,
        blocks=fold and analytic,
        images=analytic,
        share_bodies=numbers_only or not labelled,
        layer_blocks=numbers_only and bodies_hold_times(scenario),
        alike_copies=True,
    )
    return build_step(
        scenario.recipe,
        scenario.model,
        moe=scenario.moe,
        seed=scenario.spec.simulation.seed,
        gpus_per_node=scenario.cluster_spec.gpus_per_node,
        plan=plan,
    )


def bodies_hold_times(scenario: Scenario) -> bool:
    """Whether a block body's times hold wherever it runs: a body does not hold its
    pipeline action's host issue times, nor a rank's straggler factor or shared cores."""
    gpu = scenario.cluster_spec.gpu
    return gpu.host_overhead == 0 and gpu.jitter == 0 and gpu.devices_per_core == 1


def per_rank_schedule(scenario: Scenario) -> Schedule:
    """The plain Schedule IR of one step: a program for every rank, op by op, neither
    folded nor blocked, whatever ``simulation`` asks of the simulator. This is what the
    hardware replays, so a measured step runs every op of every rank."""
    return build_step(
        scenario.recipe,
        scenario.model,
        moe=scenario.moe,
        seed=scenario.spec.simulation.seed,
        gpus_per_node=scenario.cluster_spec.gpus_per_node,
    )


def folds(scenario: Scenario) -> bool:
    """Whether the step simulates one rank per pipeline stage for its symmetric peers
    (``simulation.fold``; by default always in analytic fidelity, and in flow fidelity
    above ``FLOW_FOLD_WORLD`` ranks). A MoE step folds one rank per stage and EP group,
    which runs the busiest member's experts in each layer and micro-batch (its EP
    groups route apart); a context-parallel one never folds: its ring passes K/V
    between ranks of one stage."""
    layout = scenario.layout
    return would_fold(
        scenario.spec.simulation,
        scenario.moe is not None,
        layout.cp,
        layout.world,
        _alike(scenario),
    )


def _alike(scenario: Scenario) -> bool:
    """Whether the ranks of each EP group receive alike (True without experts)."""
    return loads_equal(scenario.moe, scenario.training.micro_batch * scenario.model.seq_len)


def would_fold(
    simulation: SimulationSpec, moe: bool, cp: int, world: int, alike: bool = True
) -> bool:
    """:func:`folds` from the scenario's parts, before its ranks are laid out (``alike``:
    the ranks of an EP group receive alike; a MoE step whose do not folds only when
    ``simulation.fold`` asks: its step time is exact, but every rank's figures are its
    group's busiest member's)."""
    if cp > 1:
        return False
    if moe and not alike and simulation.fold is None:
        return False
    if simulation.fold is not None:
        return simulation.fold
    return simulation.fidelity == "analytic" or world > FLOW_FOLD_WORLD


# The size guard (run_scenario, and the commands before they load a scenario): what a
# step costs before it is built. Ops: an upper bound on the ops one layer's forward and
# backward pass puts on a rank (compute, TP collectives, sends; blocks only make it
# smaller), each about 350 bytes to hold and about 9 us to simulate op by op, 0.4 us in
# analytic blocks. GPUs: the modelled cluster holds every GPU (its links are arithmetic
# on its number, but every image of a folded call is priced, and in flow fidelity
# every link's load is logged): Llama 3 405B (tp 8, pp 16) on 1,048,576 GPUs took 4.3 s
# and 0.71 GB in analytic fidelity and 110 s and 1.9 GB in flow, with another job on the
# second core (2-core VM, 2026-12-05), about 4 us and 0.7 KB, and 100 us and 1.8 KB, a
# GPU; the figures below allow half as much again. The measurements behind the op
# figures are in benchmarks/RESULTS.md ("What a step costs to hold and to simulate"). A
# step estimated above half the machine's memory or above MAX_STEP_SECONDS is refused
# without force.
OPS_PER_LAYER_PASS = 40
BYTES_PER_OP = 400
# An MoE layer's pass puts more ops on a rank (router, permutes, the all-to-alls, the
# expert GEMMs) and its all-to-alls hold a split per EP peer: Qwen3-235B-A22B's recipe
# cut to 8 layers built 1.26× the dense estimate's ops at EP 64 and 1.13× at EP 8
# (Qwen3-30B-A3B), held at 768 and 445 bytes an op through the simulation (2-core VM,
# 2026-12-04). Hence 52 ops a pass and 6 bytes an op for each EP rank; without them the
# full Qwen3-235B step was let through at 11.5 GiB and outgrew 23.5 GiB.
OPS_PER_MOE_LAYER_PASS = 52
BYTES_PER_OP_PER_EP_RANK = 6
SECONDS_PER_OP = 1e-5
SECONDS_PER_BLOCKED_OP = 5e-7
BYTES_PER_GPU = 2.5e3
SECONDS_PER_GPU = 1.5e-4  # flow fidelity
SECONDS_PER_GPU_ANALYTIC = 1e-5
#: The longest a single step may be estimated to take (s): a user waits for one step
#: of ``parasim run`` or ``explain``, and a larger one is a mistake more often than not.
MAX_STEP_SECONDS = 600.0


@dataclass(frozen=True)
class StepSize:
    """What one step costs to simulate, estimated before it is built: ``ops`` on its
    simulated ranks (one per pipeline stage where ``folded``, in analytic blocks where
    ``blocked``) and the ``gpus`` of its modelled cluster."""

    ops: float
    gpus: int
    folded: bool = False
    blocked: bool = False
    ep: int = 0  # the EP peers an MoE all-to-all holds a split for (0: no MoE layers)
    analytic: bool = False

    @property
    def seconds_per_gpu(self) -> float:
        """What each GPU of the modelled cluster adds to the time (s)."""
        return SECONDS_PER_GPU_ANALYTIC if self.analytic else SECONDS_PER_GPU

    @property
    def bytes(self) -> float:
        """The memory the step holds while it is simulated."""
        per_op = BYTES_PER_OP + BYTES_PER_OP_PER_EP_RANK * self.ep
        return self.ops * per_op + self.gpus * BYTES_PER_GPU

    @property
    def seconds(self) -> float:
        """The time the step takes to simulate, building its cluster included."""
        per_op = SECONDS_PER_BLOCKED_OP if self.blocked else SECONDS_PER_OP
        return self.ops * per_op + self.gpus * self.seconds_per_gpu

    def describe(self) -> str:
        """``about 4.8e+03 ops on the simulated ranks and 1,000,000 GPUs in the modelled
        cluster: about 7 GiB and 13 minutes``."""
        return (
            f"about {self.ops:.3g} ops on the simulated ranks and {self.gpus:,} GPUs in the "
            f"modelled cluster: about {self.bytes / 2**30:.3g} GiB and "
            f"{_duration(self.seconds)}"
        )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.3g} hours"


def step_size(
    world: int,
    pp: int,
    layers: int,
    microbatches: int,
    folded: bool,
    analytic: bool,
    *,
    moe: bool = False,
    ep: int = 1,
    ep_groups: int = 1,
    alike: bool = True,
) -> StepSize:
    """The :class:`StepSize` of a step of ``microbatches`` over ``pp`` stages of
    ``layers`` layers on ``world`` GPUs; ``folded``: one rank per stage is simulated
    (:func:`folds`; a MoE step's whose EP ranks do not receive ``alike``, one per stage
    and each of its ``ep_groups`` EP groups),
    in blocks when ``analytic`` too and dense or ``alike`` (:func:`build_schedule`); ``moe``:
    the layers are MoE layers (every one, to bound) over EP groups of ``ep``, whose ranks
    receive ``alike``."""
    ranks = (pp * (ep_groups if moe and not alike else 1)) if folded else world
    per_pass = OPS_PER_MOE_LAYER_PASS if moe else OPS_PER_LAYER_PASS
    ops = ranks * (layers / pp) * (microbatches * per_pass + 10)
    blocked = folded and analytic and (alike or not moe)
    return StepSize(ops, world, folded, blocked, ep if moe else 0, analytic)


def scenario_size(scenario: Scenario) -> StepSize:
    """The :class:`StepSize` of one step of ``scenario``."""
    layout = scenario.layout
    analytic = scenario.spec.simulation.fidelity == "analytic"
    layers, micro = scenario.model.layers, scenario.microbatches
    return step_size(
        layout.world,
        layout.pp,
        layers,
        micro,
        folds(scenario),
        analytic,
        moe=scenario.moe is not None,
        ep=layout.ep,
        ep_groups=layout.dp // layout.ep,
        alike=_alike(scenario),
    )


def estimated_ops(scenario: Scenario) -> float:
    """An upper bound on the ops of the step's simulated ranks, before building it."""
    return scenario_size(scenario).ops


def request_size(raw: Any, base_dir: str | Path | None = None) -> StepSize | None:
    """The :class:`StepSize` of the scenario ``raw`` (a parsed YAML mapping, overrides
    applied) from its fields alone, before its ranks are laid out (which costs O(world));
    None where the fields do not resolve (loading the scenario then says why)."""
    try:
        spec = ScenarioSpec(**raw)
        cluster = load_cluster_spec(spec.cluster, prefix="cluster", base_dir=base_dir)
        model, moe = scenario_model(spec)
    except (ParasimError, TopologyError, ValidationError, TypeError):
        return None
    parallel, training = spec.parallel, spec.training
    world = cluster.nodes * cluster.gpus_per_node
    grid = parallel.tp * parallel.cp * parallel.pp
    dp = parallel.dp if parallel.dp is not None else world // grid
    if world > MAX_WORLD or dp < 1 or grid * dp != world:
        return None  # the scenario's own checks refuse it before laying it out
    microbatches = max(1, training.global_batch // (dp * training.micro_batch))
    alike = loads_equal(moe, training.micro_batch * model.seq_len)
    folded = would_fold(spec.simulation, moe is not None, parallel.cp, world, alike)
    analytic = spec.simulation.fidelity == "analytic"
    return step_size(
        world,
        parallel.pp,
        model.layers,
        microbatches,
        folded,
        analytic,
        moe=moe is not None,
        ep=parallel.ep,
        ep_groups=max(1, dp // parallel.ep),
        alike=alike,
    )


def size_problem(size: StepSize, steps: str = "the step") -> str | None:
    """Why a step of ``size`` is too large to simulate on this machine, as the start of
    an error line (``the step is too large to simulate here: ...``); None if it is not."""
    available = machine_memory()
    if size.seconds <= MAX_STEP_SECONDS and (available is None or size.bytes <= available / 2):
        return None
    have = f" (the machine has {available / 2**30:.0f} GiB)" if available else ""
    return (
        f"{steps} is too large to simulate here: {size.describe()}{have}, beyond half "
        f"the memory or {_duration(MAX_STEP_SECONDS)}"
    )


def check_size(scenario: Scenario) -> None:
    """Refuse a step too large to simulate on this machine (``--force`` skips this)."""
    _refuse(scenario_size(scenario))


def check_request_size(
    path: str | Path, overrides: list[str] | None = None, forceable: bool = True
) -> None:
    """:func:`check_size` of the scenario file at ``path`` with ``overrides``, before it
    is loaded (loading lays out every rank: seconds and gigabytes for a million GPUs);
    ``forceable``: the command has ``--force``, and the error line says so."""
    raw = apply_overrides(read_scenario_file(path), overrides or [])
    size = request_size(raw, Path(path).parent)
    if size is not None:
        _refuse(size, forceable)


def advice(size: StepSize) -> str:
    """What makes a step of ``size`` smaller, for an error line."""
    if size.gpus * size.seconds_per_gpu >= size.seconds / 2:
        return "use fewer GPUs (the modelled cluster holds every one)"
    fold = "" if size.folded else "fold the ranks (analytic fidelity, simulation.fold: true) or "
    return f"{fold}use fewer micro-batches, layers or GPUs"


def _refuse(size: StepSize, forceable: bool = True) -> None:
    problem = size_problem(size)
    if problem is not None:
        force = ", or pass --force to run it anyway" if forceable else ""
        raise ParasimError(f"{problem}; {advice(size)}{force}")


def moe_summary(schedule: Schedule) -> dict[str, Any] | None:
    """Routing statistics of the step's MoE layers (None for a dense model)."""
    return schedule.meta.get("moe")


def representative_ranks(scenario: Scenario, critical_rank: int) -> list[int]:
    """One rank per pipeline stage (TP and DP coordinate 0), and the critical rank."""
    layout = scenario.layout
    ranks = {layout.rank_of(tp=0, dp=0, pp=stage) for stage in range(layout.pp)}
    ranks.add(critical_rank)
    if layout.tp > 1:
        ranks.add(layout.rank_of(tp=layout.tp - 1, dp=0, pp=0))
    return sorted(ranks)


#: The op types whose records name their own kind (gemm, all_reduce...); a send or a
#: recv is its own kind.
_KINDED = frozenset({"compute", "collective", "block"})


def _trace_size(run: RunResult, ranks: list[int]) -> tuple[int, bool]:
    """How many records :func:`make_trace` makes of ``ranks``, and whether it shows
    blocks op by op (when that keeps the trace within ``FULL_TRACE_OP_LIMIT`` ops)."""
    programs = run.schedule.programs
    plain = sum(len(programs[rank].ops) for rank in ranks)
    if run.times.blocks is None:
        return plain, False
    expanded = sum(
        len(op.body) if type(op) is Block else 1 for rank in ranks for op in programs[rank].ops
    )
    if expanded <= FULL_TRACE_OP_LIMIT:
        return expanded, True
    return plain, False


@fewer_collections()
def make_trace(run: RunResult, ranks: list[int] | None = None) -> Trace:
    """The Trace of the simulated step, for ``ranks`` (all when None). Blocks are shown
    op by op when that keeps the trace within ``FULL_TRACE_OP_LIMIT`` ops, and as one
    bar per pipeline action otherwise."""
    schedule, times = run.schedule, run.times
    chosen = sorted(schedule.programs) if ranks is None else ranks
    # op by op only with the blocks' body times (which _trace_size asks for)
    timer = times.blocks if _trace_size(run, chosen)[1] else None
    expand = timer is not None
    records: list[OpRecord] = []
    retagged: dict[tuple[int, Any], dict[str, Any]] = {}
    for rank in chosen:
        ready, start, end = times.ready[rank], times.start[rank], times.end[rank]
        first = len(records)  # expanded bodies renumber the rank's ops in program order
        for op in schedule.programs[rank].ops:
            kind_of_op = type(op)
            if timer is not None and kind_of_op is Block:
                block = cast(Block, op)  # kind_of_op is type(op)
                body = _body_records(
                    rank, block, start[op.id], timer(block, rank), len(records) - first, retagged
                )
                records += body
                continue
            i = op.id
            records.append(  # positional, in OpRecord's field order: the hot loop of a trace
                OpRecord(
                    rank,
                    len(records) - first if expand else i,
                    op.stream,
                    "compute" if kind_of_op is Block else op.type,
                    # ignores: op has a kind and flops where op.type and kind_of_op say, which
                    # mypy cannot narrow by (a type() narrowing would cost in this hot loop)
                    op.kind if op.type in _KINDED else op.type,  # type: ignore[union-attr]
                    op.label,
                    op.tags,
                    ready[i],
                    start[i],
                    end[i],
                    op.bytes,
                    op.flops if kind_of_op is Compute or kind_of_op is Block else 0.0,  # type: ignore[union-attr]
                    getattr(op, "group", None),
                    getattr(op, "peer", None),
                )
            )
    layout = run.scenario.layout
    meta = {
        "scenario": run.scenario.name,
        "fidelity": run.result.fidelity,
        "gpus_per_node": run.scenario.cluster_spec.gpus_per_node,
        "world": layout.world,
        "ranks_shown": chosen,
        "representative_ranks": [
            r
            for r in representative_ranks(run.scenario, run.result.breakdown.critical_rank)
            if r in chosen
        ]
        or chosen,
        "stage_of_rank": {str(rank): layout.coords(rank)["pp"] for rank in chosen},
        "idle": idle_intervals(run, chosen),
    }
    return Trace(records=records, step_time=times.step_time, meta=meta)


def idle_intervals(run: RunResult, ranks: list[int]) -> dict[str, list[list]]:
    """Per rank (as a string, for JSON), the stretches of its compute stream that are
    not compute, as ``[category, start, end]``: the bubbles, stalls, exposed
    communication and unexplained gaps of the time accounting (the run's own, when it
    kept them)."""
    schedule, times = run.schedule, run.times
    pipelined = run.scenario.layout.pp > 1
    idle: dict[str, list[list]] = {}
    bodies: dict[int, tuple] = {}  # a block body's accounting, shared by the ranks
    for rank in ranks:
        intervals = (run.idle or {}).get(rank)
        if intervals is None:
            intervals = []
            account_rank(
                schedule.programs[rank].ops,
                times.ready[rank],
                times.start[rank],
                times.end[rank],
                times.step_time,
                pipelined,
                blocks=None if times.blocks is None else times.blocks.on(rank),
                _bodies=bodies,
                intervals=intervals,
            )
        idle[str(rank)] = [
            [category, lo, hi] for category, lo, hi in sorted(intervals, key=lambda i: i[1])
        ]
    return idle


def _body_records(
    rank: int,
    block: Block,
    at: float,
    times,
    first_id: int,
    retagged: dict[tuple[int, Any], dict[str, Any]],
) -> list[OpRecord]:
    """A block's body ops as records of ``rank``, starting at ``at``, their labels and
    micro-batch tags naming the block's micro-batch. ``retagged`` holds the tags already
    renamed for a micro-batch, by the body's tags and that micro-batch: the records of
    one op in every micro-batch share them, as the schedule's ops share theirs (the
    trace's writer encodes each tags dict once)."""
    microbatch = block.tags.get("microbatch")
    old, new = f".mb{block.body_microbatch}", f".mb{microbatch}"
    records = []
    for op in block.body:
        label = op.label[: -len(old)] + new if op.label.endswith(old) else op.label
        tags = op.tags
        if tags.get("microbatch") is not None and tags["microbatch"] != microbatch:
            key = (id(op.tags), microbatch)  # the body's ops keep their tags alive
            renamed = retagged.get(key)
            if renamed is None:
                renamed = retagged[key] = dict(op.tags, microbatch=microbatch)
            tags = renamed
        records.append(
            OpRecord(
                rank=rank,
                op_id=first_id + op.id,
                stream=op.stream,
                op=op.type,
                kind=op.kind,
                label=label,
                tags=tags,
                ready=at + times.ready[op.id],
                start=at + times.start[op.id],
                end=at + times.end[op.id],
                bytes=op.bytes,
                flops=op.flops if type(op) is Compute else 0.0,
                group=getattr(op, "group", None),
            )
        )
    return records


def trace_ranks(run: RunResult, full: bool = False) -> tuple[list[int] | None, str | None]:
    """Which ranks the trace outputs keep (None: every simulated rank), and a note when
    they leave some out. A step of more than ``FULL_TRACE_OP_LIMIT`` ops keeps its
    representative ranks; a trace that would still hold more than ``STAGE_CAP_OPS``
    ops over more than ``MAX_TRACE_STAGES`` pipeline stages keeps the ranks of that many
    stages, evenly spaced, the first, the last and the critical rank's among them.
    ``full`` keeps every simulated rank."""
    if full:
        return None, None
    scenario, critical = run.scenario, run.result.breakdown.critical_rank
    layout = scenario.layout
    representative = run.schedule.num_ops > FULL_TRACE_OP_LIMIT
    ranks = (
        representative_ranks(scenario, critical)
        if representative
        else sorted(run.schedule.programs)
    )
    stage_of = {rank: layout.coords(rank)["pp"] for rank in ranks}
    stages = sorted(set(stage_of.values()))
    if len(stages) > MAX_TRACE_STAGES and _trace_size(run, ranks)[0] > STAGE_CAP_OPS:
        last = len(stages) - 1
        kept = {stages[round(i * last / (MAX_TRACE_STAGES - 1))] for i in range(MAX_TRACE_STAGES)}
        kept.add(layout.coords(critical)["pp"])
        ranks = [rank for rank in ranks if stage_of[rank] in kept]
        return ranks, (
            f"trace.json and timeline.html show {len(ranks)} ranks of {layout.world}, those "
            f"of {len(kept)} of the {len(stages)} pipeline stages (evenly spaced, with the "
            f"first, the last and the critical rank's); the step has {_expanded_ops(run)} "
            "ops (--full-trace shows every simulated rank)"
        )
    if not representative:
        return None, None
    return ranks, (
        f"trace.json and timeline.html show {len(ranks)} representative ranks of "
        f"{layout.world} (one per pipeline stage and the critical rank); "
        f"the step has {_expanded_ops(run)} ops"
    )


def _expanded_ops(run: RunResult) -> int:
    """The step's ops, a block's body op by op: as the engine counted them where it did
    (every engine and a measured replay count them so), else by walking the schedule."""
    counted = run.times.stats.get("ops")
    return int(counted) if counted is not None else run.schedule.expanded_ops


def executed_flops_per_step(schedule: Schedule) -> float:
    """The FLOPs the simulated ranks' kernels run in a step: recompute included, the
    half of causal attention FlashAttention skips not (blocks share a few bodies)."""
    by_body: dict[int, float] = {}
    total = 0.0
    for program in schedule.programs.values():
        for op in program.ops:
            if type(op) is Block:
                if id(op.body) not in by_body:
                    by_body[id(op.body)] = executed_flops(op)
                total += by_body[id(op.body)]
            elif type(op) is Compute:
                total += executed_flops(op)
    return total


def pin_warnings(simulation: Any, choices: dict[str, int]) -> list[str]:
    """One warning per collective kind that could not run a pinned
    ``simulation.algorithm`` or ``protocol`` and kept parasim's own choice."""
    warnings = []
    for field, index in (("algorithm", 1), ("protocol", 2)):
        pinned = getattr(simulation, field)
        if pinned is None:
            continue
        kept: dict[str, dict[str, int]] = {}
        for key, count in choices.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[index] not in (pinned, "none"):
                by_choice = kept.setdefault(parts[0], {})
                by_choice[parts[index]] = by_choice.get(parts[index], 0) + count
        for kind, by_choice in sorted(kept.items()):
            chosen = ", ".join(f"{name} ({calls} calls)" for name, calls in by_choice.items())
            warnings.append(
                f"simulation.{field}: {pinned} cannot run {kind} on these groups; kept "
                f"parasim's choice, {chosen}"
            )
    return warnings


@dataclass
class SimulatedStep:
    """A step's schedule and op times before any accounting (:func:`simulate_step`):
    enough to know its step time, which is all a search needs of a layout that cannot
    rank. ``factors`` are the stragglers' compute factors, ``sharing`` and
    ``comm_sharing`` the slowdowns of CPU ranks that share cores."""

    schedule: Schedule
    times: SimulationTimes
    options: EngineOptions
    factors: dict[int, float]
    sharing: dict[int, float]
    comm_sharing: dict[int, float]


def simulate_step(
    scenario: Scenario, force: bool = False, numbers_only: bool = False, labelled: bool = True
) -> SimulatedStep:
    """Build and replay one step of ``scenario`` (the first half of
    :func:`run_scenario`; :func:`finish_step` is the second)."""
    if not force:
        check_size(scenario)
    schedule = build_schedule(scenario, numbers_only, labelled)
    simulation = scenario.spec.simulation
    options = EngineOptions(simulation.fidelity, simulation.algorithm, simulation.protocol)
    gpu = scenario.cluster_spec.gpu
    factors = rank_factors(schedule, scenario.layout.world, gpu.jitter, simulation.seed)
    sharing: dict[int, float] = {}
    comm_sharing: dict[int, float] = {}
    if gpu.devices_per_core > 1 and len(schedule.programs) == scenario.layout.world:
        # CPU ranks beyond the node's cores: as many as want one at once share them
        sharing, comm_sharing, times = share_cores(
            schedule, scenario.cluster, options, factors, simulate
        )
    else:
        if gpu.devices_per_core > 1:  # folded: the ranks of a stage compute together
            sharing = {rank: gpu.devices_per_core for rank in schedule.programs}
            comm_sharing = dict(sharing)
        combined = {r: factors.get(r, 1.0) * sharing.get(r, 1.0) for r in schedule.programs}
        times = simulate(
            schedule,
            scenario.cluster,
            replace(
                options,
                rank_factors=tuple((r, f) for r, f in combined.items() if f != 1),
                comm_factors=tuple(comm_sharing.items()),
            ),
        )
    return SimulatedStep(schedule, times, options, factors, sharing, comm_sharing)


def finish_step(scenario: Scenario, step: SimulatedStep, timeline: bool = True) -> RunResult:
    """Account a replayed step (:func:`simulate_step`) into ``result.json``'s numbers,
    with the stragglers' cost (the same step with every rank at the mean); with
    ``timeline``, each rank's idle stretches kept for a timeline to draw."""
    schedule, times = step.schedule, step.times
    idle: dict[int, list[tuple[str, float, float]]] | None = {} if timeline else None
    fidelity = scenario.spec.simulation.fidelity
    result = assemble_result(scenario, schedule, times, fidelity, idle)
    if step.factors:
        even_options = replace(
            step.options,
            rank_factors=tuple(step.sharing.items()),
            comm_factors=tuple(step.comm_sharing.items()),
        )
        even = simulate(schedule, scenario.cluster, even_options).step_time
        result.straggler_s = max(0.0, times.step_time - even)
    return RunResult(scenario=scenario, schedule=schedule, times=times, result=result, idle=idle)


@fewer_collections()
def run_scenario(
    scenario: Scenario, force: bool = False, numbers_only: bool = False, labelled: bool = True
) -> RunResult:
    """Simulate one step of ``scenario``; the result dict is ``result.json``'s content.
    A step too large for this machine is refused (:func:`check_size`) unless ``force``.
    Without ``labelled`` the result is the same byte for byte, and the run is for it
    alone: its schedule's labels are not fit for a trace, and it keeps no idle stretches
    for a timeline; ``numbers_only`` (a search's run) is that, the same to float
    rounding (:func:`build_schedule`)."""
    step = simulate_step(scenario, force, numbers_only, labelled)
    return finish_step(scenario, step, timeline=labelled and not numbers_only)


def assemble_result(
    scenario: Scenario,
    schedule: Schedule,
    times: SimulationTimes,
    fidelity: str,
    idle: dict[int, list[tuple[str, float, float]]] | None = None,
) -> StepResult:
    """The result of a step whose op times are known: simulated or measured. With
    ``idle`` (a dict), each rank's idle stretches are put in it (:func:`account_step`)."""
    layout = scenario.layout
    gpu = scenario.cluster_spec.gpu
    training = scenario.training
    breakdown, per_rank = account_step(
        schedule, times, layout, scenario.cluster_spec.gpus_per_node, idle
    )
    step = times.step_time
    moe = moe_summary(schedule)
    # dropped expert assignments are work the step does not do (capacity factor)
    kept = 1.0 - moe["dropped_fraction"] if moe is not None else 1.0
    model_flops = model_flops_per_step(scenario.model, training.global_batch, scenario.moe, kept)
    world = layout.world
    # each simulated rank stands for world / simulated ranks (folded runs: its TP and DP peers)
    replicas = world / len(schedule.programs)
    hardware_flops = replicas * sum(
        op.flops
        for program in schedule.programs.values()
        for op in program.ops
        if type(op) is Compute or type(op) is Block
    )
    memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, gpu.hbm_capacity)
    warnings = list(scenario.warnings)
    if memory.oom:
        warnings.append(
            f"out of memory: stage {memory.peak_stage} needs "
            f"{memory.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU but the GPU has "
            f"{gpu.hbm_capacity / 2**30:.1f} GiB ({memory.dominant_term} dominate)"
        )
    warnings += pin_warnings(scenario.spec.simulation, times.collective_choices)
    if len(schedule.programs) < world and not _alike(scenario):
        warnings.append(
            "simulation.fold: the ranks of an EP group receive unequal expert loads, so "
            "each folded rank runs its group's busiest member's experts: the step time is "
            "the unfolded one, but every rank's figures are its group's busiest member's "
            "(simulation.fold: false simulates each rank)"
        )
    warnings += oversubscription_warnings(scenario.cluster, schedule, layout, fidelity)
    if fidelity == "analytic":
        simulation = scenario.spec.simulation
        warnings += contention_warnings(
            scenario.cluster, schedule, times, layout, simulation.algorithm, simulation.protocol
        )
    # each FLOP rate per GPU once, and each utilisation that rate over the peak
    model_rate, hardware_rate = model_flops / step / world, hardware_flops / step / world
    hfu = hardware_rate / gpu.peak_flops
    if hfu > 1:
        executed = replicas * executed_flops_per_step(schedule)
        warnings.append(
            f"MFU {model_rate / gpu.peak_flops:.0%} and HFU {hfu:.0%} count causal "
            "attention's full s² (Megatron-LM's and PaLM's convention, docs/modelling.md), "
            "but FlashAttention computes about half of it; the FLOPs the GPUs run reach "
            f"{executed / step / world / gpu.peak_flops:.0%} of peak"
        )
    links = link_summary(scenario.cluster, times.link_utilisation, step)
    result = StepResult(
        parasim_version=__version__,
        scenario=scenario.name,
        fidelity=fidelity,
        cluster=ClusterSummary(
            name=scenario.cluster_spec.name,
            nodes=scenario.cluster_spec.nodes,
            gpus=world,
            gpu=gpu.name,
            peak_flops_per_gpu=gpu.peak_flops,
            power_limit_w=gpu.power_limit_w,
        ),
        model=ModelSummary(
            name=scenario.model.name,
            parameters=parameter_count(scenario.model, scenario.moe),
            active_parameters=active_parameter_count(scenario.model, scenario.moe),
        ),
        layout=LayoutSummary(
            tp=layout.tp,
            pp=layout.pp,
            dp=layout.dp,
            placement=list(layout.placement),
            schedule=scenario.parallel.schedule,
            micro_batch=training.micro_batch,
            microbatches=scenario.microbatches,
            global_batch=training.global_batch,
            recompute=training.recompute,
            attention=training.attention,
            recipe=str(scenario.recipe),
        ),
        step_time_s=step,
        tokens_per_s=training.global_batch * scenario.model.seq_len / step,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        tflops_per_gpu=model_rate / 1e12,
        mfu=model_rate / gpu.peak_flops,
        hardware_tflops_per_gpu=hardware_rate / 1e12,
        hfu=hfu,
        breakdown=breakdown,
        per_rank=per_rank,
        memory=memory,
        moe=MoESummary(**moe) if moe is not None else None,
        warnings=warnings,
        simulation={
            **times.stats,
            "simulated_ranks": len(schedule.programs),
            "folded": len(schedule.programs) < world,
            "collective_choices": times.collective_choices,
        },
        busiest_links=[LinkUse(**row) for row in links],
    )
    if fidelity == "measured":  # a measurement needs no interval of the model's
        return result
    trust = trust_interval(result, scenario.recipe.framework, scenario.model.seq_len)
    result.interval = trust.to_json()
    if trust.outside:
        result.warnings.append(
            f"outside what was validated ({trust.outside}): the interval is widened"
        )
    return result
