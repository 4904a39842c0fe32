"""Layout sweeps: every valid way to split a scenario's model over its cluster, ranked.

``parasim sweep SCENARIO`` keeps the scenario's model, cluster and training recipe and
tries every layout of the space below, each built by applying ``--set``-style overrides
to the scenario's own YAML, so every rule of the scenario validator applies to it.

The space (``--gpus N`` first resizes the cluster to ``N / gpus_per_node`` nodes, the
global batch following ``--batch``, :func:`scaled_batch`) holds every searched knob of
:data:`simulator.request.knobs.KNOBS`, each tried as its ``searched_how`` says
(``parasim sweep --help`` lists them; :mod:`simulator.tools.space` lays them out).
``--fix KEY=VALUE`` replaces one knob's choices by that single value, which may lie
outside them, and the validator then judges it. ``zbv`` and ``interleaved-1f1b`` need
``pp > 1``, even when pinned; with a long sequence (16K tokens or more) context
parallelism is tried inside a node; ``full`` sharding is not tried with the
split-backward schedules nor with expert parallelism (neither is modelled).

Each candidate then meets these filters, in order, and the count of each is reported:

1. *invalid*: the scenario validator rejects it (counted by the first line of its
   message, e.g. ``parallel.tp: heads(12) is not divisible by tp(8)``);
2. *pruned*: it is valid but does not fit in memory
   (:func:`simulator.analysis.memory.memory_per_rank`, no simulation needed); the
   dominant memory term of the pruned layouts is reported;
3. *dominated*: the same layout with a value its knob lists as never slower
   (``faster_first``), and no knob at a slower value, also fits: a lighter recompute
   (``none`` < ``selective`` < ``full``; recompute only adds work to a step), ZeRO-1
   where ZeRO-2 is asked (both reduce-scatter the gradients and gather the updated
   parameters, so their steps take the same time and ZeRO-2 only saves memory), full
   sharding that keeps the gathered weights from the forward to the backward
   (``reshard_after_forward: false``, one all-gather fewer). ``--exhaustive`` simulates them anyway;
4. *bounded* (``keep``: ``--top``): every candidate gets a lower bound on its step
   (:mod:`simulator.tools.bound`), and the candidates are examined (checked, then
   simulated) in the order of it, a lighter recompute or sharding first among equal
   bounds; the search stops where the next bound exceeds the slowest step the ranking
   must hold, the ``keep``-th fastest simulated. The candidates never examined, or
   found slower than that, are counted as *bounded*. Without ``keep`` (the Python
   default) or with ``--exhaustive`` every candidate is examined;
5. *simulated*: one step with :func:`simulator.run.simulate.run_scenario`, in ``analytic``
   fidelity by default (collectives in closed form, symmetric ranks folded), on every
   core, and ranked by step time (ties broken by the layout string). A simulation
   that ends in an error (a schedule that cannot finish) is counted as *failed*.

The size of the space: GPT-3 175B on 1024 A100s (``scenarios/gpt3-175b.yaml --gpus
1024``, global batch 512) enumerates 24,565 candidates; examined every one, 4,206 are
simulated (about two minutes on two cores); ranking the ten fastest, the bound leaves
22,706 out and 48 are simulated in full (``benchmarks/RESULTS.md``).
Mixture-of-experts steps fold one rank per stage and EP group where the group's ranks
receive alike (uniform routing); others simulate every rank, so their runs take
seconds each: pin some dimensions with ``--fix`` to keep such a sweep short. A
sweep estimated too large for this machine, every listed candidate simulated, is
refused before anything is laid out (:func:`check_search`); so is ``--workers`` above
four a core (:func:`resolve_workers`).

Every ranking says where the scenario's own layout stands (:func:`_scenario_layout`):
its rank, or why it has none, simulating it on its own where the space does not hold
it or a lighter recompute of it fits.

:func:`run_sweep` does the work and returns a :class:`SweepResult`: data only. The
ranking table, the counts, ``sweep.csv``, ``sweep.json`` and ``sweep.html`` are drawn
by :mod:`simulator.report.sweep_report`, and the command line lives in
:mod:`simulator.cli.sweep`.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.arithmetic.moe import loads_equal
from simulator.common.errors import ParasimError, ScenarioError
from simulator.common.vocabulary import BATCH_POLICIES
from simulator.request.knobs import SEARCHED, format_value
from simulator.request.moe import MoESpec
from simulator.request.scenario import (
    MAX_WORLD,
    Scenario,
    ScenarioSpec,
    SimulationSpec,
    apply_overrides,
    read_scenario_file,
    scenario_from_dict,
    scenario_model,
    spec_settings,
)
from simulator.run.simulate import StepSize, step_size, would_fold
from simulator.tools.bound import StepBound
from simulator.tools.cache import ResultCache
from simulator.tools.objective import RunObjective
from simulator.tools.plan import PhasePlan
from simulator.tools.pool import (
    check_chunk,
    check_search,
    load_overridden,
    open_executor,
    process_pool,
    resolve_workers,
    run_chunked,
    same_grid,
    simulate_chunk,
    simulate_overrides,
)
from simulator.tools.progress import Progress, Silent
from simulator.tools.space import (
    FIX_KEYS,
    MAX_MICRO_BATCH,
    PLACEMENTS,
    SCHEDULES,
    VIRTUAL_STAGES,
    Candidate,
    check_fixed,
    enumerate_layouts,
    faster_first,
    never_slower,
    parse_fixes,
    select_lightest,
)
from topologies import TopologyError, load_cluster_spec
from topologies.validation import validation_message

__all__ = [
    "FIX_KEYS",
    "SCHEDULES",
    "PLACEMENTS",
    "MAX_MICRO_BATCH",
    "VIRTUAL_STAGES",
    "Candidate",
    "SweepBase",
    "SweepResult",
    "prepare",
    "parse_fixes",
    "check_fixed",
    "enumerate_layouts",
    "run_sweep",
    "run_chunked",
    "process_pool",
    "resolve_workers",
    "no_layout_message",
    "check_chunk",
    "simulate_chunk",
    "simulate_overrides",
    "scaled_batch",
    "check_search",
    "plan_sweep",
    "sweep_sizes",
]


#: Checking or simulating candidates: their overrides and a progress callback in (and,
#: for a simulation, the step beyond which a layout cannot rank), one outcome each out.
Work = Callable[..., list[dict]]


# -- the scenario being swept -----------------------------------------------------------


@dataclass
class SweepBase:
    """A scenario's raw YAML (overrides and resize applied) and what the space needs."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    name: str
    world: int
    nodes: int
    gpus_per_node: int
    cluster_name: str
    gpu_name: str
    capacity_bytes: float
    model_name: str
    layers: int
    global_batch: int
    experts: int | None
    extra_overrides: list[str]
    # the scenario's context parallelism, sharding and model shape the space starts from
    context: dict[str, Any]
    # the scenario's simulation settings (its fold, before --fidelity)
    simulation: SimulationSpec
    # the model's experts (None: a dense model), for whether a candidate's EP ranks
    # receive alike and its step folds
    moe_spec: MoESpec | None
    # how the global batch was set: the ``policy`` (None: the scenario's own size) and
    # the scenario's own ``scenario_gpus`` and ``scenario_global_batch``
    batch: dict[str, Any]

    def candidate_overrides(self, candidate: Candidate, fidelity: str) -> list[str]:
        """Everything to pass to ``parasim run SCENARIO --set ...`` for this layout: the
        knobs a candidate always writes, then every other searched knob where it differs
        from the scenario's own value (with what that change also unsets)."""
        fixed = [f"simulation.fidelity={fidelity}"]
        training = self.raw.get("training") or {}
        parallel = self.raw.get("parallel") or {}
        for knob in SEARCHED:
            value = getattr(candidate, knob.name)
            if knob.always_set or value == self.context[knob.name]:
                continue
            written = "null" if value is None else format_value(value, brackets=True)
            if knob.name == "dp_shard":
                written = str(value or "null")  # 0: no HSDP
            fixed.append(f"{knob.path}={written}")
        if candidate.sharding != self.context["sharding"]:
            # the older optimizer_sharding spelling would contradict the new level
            fixed.append("training.optimizer_sharding=false")
        if training.get("param_gather_overlap") and candidate.sharding not in (
            "optimizer",
            "gradients",
        ):
            fixed.append("training.param_gather_overlap=false")  # a ZeRO-1/2 setting only
        if candidate.dp_shard != self.context["dp_shard"] or parallel.get("dp_replicate"):
            fixed.append("parallel.dp_replicate=null")
        if parallel.get("schedule_file") is not None:
            fixed.append("parallel.schedule_file=null")
        return [*self.extra_overrides, *candidate.overrides(), *fixed]


def _cluster_spec(raw: dict[str, Any], base_dir: str):
    try:
        return load_cluster_spec(raw.get("cluster"), prefix="cluster", base_dir=base_dir)
    except TopologyError as exc:
        raise ScenarioError(str(exc)) from None


def scaled_batch(policy: str, batch: int, gpus: int, scenario_gpus: int) -> int:
    """The global batch at ``gpus`` GPUs of a scenario whose global batch is ``batch``
    on its own ``scenario_gpus``, by ``policy`` (:data:`BATCH_POLICIES`):

    * ``per-gpu``: each GPU keeps the scenario's share of the batch, so the global
      batch grows with the GPUs: ``batch · gpus / scenario_gpus``, which must be a whole
      number of sequences (weak scaling);
    * ``fixed``: the global batch stays ``batch`` (strong scaling);
    * ``tokens``: each GPU keeps the scenario's tokens per step as closely as whole
      sequences allow: ``batch · gpus / scenario_gpus`` rounded to the nearest whole
      number, at least one.
    """
    if policy not in BATCH_POLICIES:
        raise ParasimError(f"--batch: expected one of {', '.join(BATCH_POLICIES)} (got {policy!r})")
    if policy == "fixed" or gpus == scenario_gpus:
        return batch
    share = Fraction(batch * gpus, scenario_gpus)
    if policy == "tokens":
        return max(1, round(share))
    if share.denominator != 1:
        raise ParasimError(
            f"--batch per-gpu: global_batch({batch}) * {gpus} / {scenario_gpus} GPUs = "
            f"{float(share):g} is not a whole number of sequences; choose a GPU count it "
            "divides, or --batch tokens (the nearest whole batch) or --batch fixed"
        )
    return int(share)


def prepare(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    batch: str | None = None,
) -> SweepBase:
    """Read a scenario, apply ``--set`` overrides and resize its cluster to ``gpus``,
    its global batch following ``batch`` (:func:`scaled_batch`; default ``per-gpu``).
    Nothing is laid out yet: a million GPUs are refused (:func:`check_search`) before
    any rank grid is built."""
    path = Path(scenario_path)
    base_dir = str(path.parent)
    overrides = list(overrides or [])
    raw = apply_overrides(read_scenario_file(path), overrides)
    spec = _spec(raw)
    cluster = _cluster_spec(raw, base_dir)
    per_node = cluster.gpus_per_node
    scenario_gpus = cluster.nodes * per_node
    global_batch = spec.training.global_batch
    if gpus is not None:
        if gpus > MAX_WORLD:
            raise ParasimError(f"--gpus: {gpus:,} GPUs; parasim lays out at most {MAX_WORLD:,}")
        if gpus < 1 or gpus % per_node:
            raise ParasimError(
                f"--gpus: {gpus} GPUs is not a whole number of {cluster.name} nodes "
                f"({per_node} GPUs per node; {gpus} / {per_node} = {gpus / per_node:g})"
            )
        resize = [f"cluster.nodes={gpus // per_node}"]
        global_batch = scaled_batch(batch or BATCH_POLICIES[0], global_batch, gpus, scenario_gpus)
        if global_batch != spec.training.global_batch:
            resize.append(f"training.global_batch={global_batch}")
        raw = apply_overrides(raw, resize)
        overrides = overrides + resize
        cluster = _cluster_spec(raw, base_dir)
        if cluster.nodes * cluster.gpus_per_node != gpus:
            raise ParasimError(
                f"--gpus: cannot resize {cluster.name} to {gpus} GPUs "
                f"(it has {cluster.nodes} nodes of {cluster.gpus_per_node} GPUs)"
            )
    model, moe = scenario_model(spec)
    return SweepBase(
        raw=raw,
        source=str(path),
        base_dir=base_dir,
        name=spec.name,
        world=cluster.nodes * cluster.gpus_per_node,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        cluster_name=cluster.name,
        gpu_name=cluster.gpu.name,
        capacity_bytes=cluster.gpu.hbm_capacity,
        model_name=model.name,
        layers=model.layers,
        global_batch=global_batch,
        experts=moe.experts if moe is not None else None,
        moe_spec=moe,
        extra_overrides=overrides,
        context={
            **_scenario_knobs(spec),
            "seq_len": model.seq_len,
            "heads": model.heads,
            "kv_heads": model.kv,
        },
        simulation=spec.simulation,
        batch={
            "policy": (batch or BATCH_POLICIES[0]) if gpus is not None else None,
            "scenario_gpus": scenario_gpus,
            "scenario_global_batch": spec.training.global_batch,
        },
    )


def _scenario_knobs(spec: ScenarioSpec) -> dict[str, Any]:
    """The scenario's own value of every searched knob a candidate writes only where it
    differs (its stage split as written, None when even or unset; no HSDP: 0)."""
    settings = spec_settings(spec)
    values = {}
    for knob in SEARCHED:
        if knob.always_set:
            continue
        section, _, name = knob.path.partition(".")
        value = settings.get(knob.name, getattr(getattr(spec, section), name))
        values[knob.name] = tuple(value) if isinstance(value, list) else value
    values["dp_shard"] = values["dp_shard"] or 0
    return values


def _spec(raw: dict[str, Any]) -> ScenarioSpec:
    try:
        return ScenarioSpec(**raw)
    except ValidationError as exc:
        raise ScenarioError(validation_message(exc, ScenarioSpec)) from None


def check_base(base: SweepBase) -> None:
    """Validate the scenario's model and cluster as the validator resolves them, on the
    simplest layout (every GPU a data-parallel replica: O(world) to lay out, so after
    the size guard), so that a mistake of theirs is one line rather than the reason
    every candidate is invalid."""
    probe = apply_overrides(
        base.raw, [f"training.global_batch={base.world}", "training.micro_batch=1"]
    )
    probe["parallel"] = {"tp": 1, "pp": 1, "cp": 1}
    scenario_from_dict(probe, source=base.source, base_dir=Path(base.base_dir))


# -- the sweep ---------------------------------------------------------------------------


@dataclass
class SweepResult:
    """A finished sweep: what was searched, what each filter removed, and the ranking.

    ``cluster`` holds the cluster's ``name``, ``nodes``, ``gpus_per_node``, ``gpu`` and
    per-GPU ``capacity_bytes``; ``batch`` how the global batch was set (``policy``,
    None at the scenario's own size; the scenario's own ``scenario_gpus`` and
    ``scenario_global_batch``); ``experts`` the model's experts (None: a dense model);
    ``counts`` how many layouts were ``enumerated``, ``invalid`` (with
    ``invalid_by_reason``), ``pruned_memory`` (with ``pruned_by_term`` and
    ``smallest_pruned_bytes``), ``dominated``, ``failed`` (with ``failed_by_reason``)
    and ``simulated``; ``rows`` one dict per simulated layout, fastest first, each with
    its ``rank``, its fields, its headline numbers and the ``overrides`` that reproduce
    it with ``parasim run``. ``scenario_layout`` is the scenario's own layout at this
    size (:func:`_scenario_layout`). ``wall_s`` and ``timing_s`` (seconds spent checking
    and simulating) vary from run to run.
    """

    scenario: str
    source: str
    gpus: int
    cluster: dict[str, Any]
    model: str
    experts: int | None
    global_batch: int
    batch: dict[str, Any]
    fidelity: str
    fixed: dict[str, Any]
    max_tp: int | None
    exhaustive: bool
    counts: dict[str, Any]
    rows: list[dict[str, Any]]
    scenario_layout: dict[str, Any] | None
    wall_s: float
    timing_s: dict[str, float]
    #: what the rows are ranked on (simulator.tools.objective)
    objective: str = "step"

    def to_json(self) -> dict[str, Any]:
        """What ``sweep.json`` holds: every field but the timings, so that the same
        inputs give the same bytes."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in ("wall_s", "timing_s")
        }


def plan_sweep(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    fixed: dict[str, Any] | None = None,
    max_tp: int | None = None,
    batch: str | None = None,
) -> tuple[SweepBase, list[Candidate]]:
    """The scenario prepared for a sweep (:func:`prepare`) and every candidate of its
    space (:func:`enumerate_layouts`): what :func:`run_sweep` and its size guard start
    from, before anything is laid out."""
    if max_tp is not None and max_tp < 1:
        raise ParasimError(f"--max-tp: expected a positive number (got {max_tp})")
    fixed = check_fixed(fixed or {})
    base = prepare(scenario_path, overrides, gpus, batch)
    candidates = enumerate_layouts(
        base.world,
        base.gpus_per_node,
        base.layers,
        base.global_batch,
        base.experts,
        fixed,
        max_tp,
        base.context,
    )
    if not candidates:
        pins = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "no pins"
        raise ParasimError(
            f"no layout to try for {base.name} on {base.world} GPUs ({pins}): tp * cp * pp "
            f"must divide the {base.world} GPUs and pp the {base.layers} layers"
        )
    return base, candidates


def sweep_sizes(base: SweepBase, candidates: list[Candidate], fidelity: str) -> list[StepSize]:
    """What simulating each candidate costs (:func:`simulator.run.simulate.step_size`),
    for :func:`check_search`; tens of thousands of candidates share a few sizes."""
    simulation = base.simulation.model_copy(update={"fidelity": fidelity})
    analytic, moe = fidelity == "analytic", base.experts is not None
    seq_len, spec = base.context["seq_len"], base.moe_spec
    alike = {
        micro: loads_equal(spec, micro * seq_len) for micro in {c.micro_batch for c in candidates}
    }
    folded = {
        (cp, micro): would_fold(simulation, moe, cp, base.world, alike[micro])
        for cp, micro in {(c.cp, c.micro_batch) for c in candidates}
    }
    known: dict[tuple[int, int, int, int, int], StepSize] = {}
    sizes = []
    for candidate in candidates:
        pp, dp, micro, cp = candidate.pp, candidate.dp, candidate.micro_batch, candidate.cp
        ep = candidate.ep
        size = known.get((pp, dp, micro, cp, ep))
        if size is None:
            microbatches = max(1, base.global_batch // (dp * micro))
            size = step_size(
                base.world,
                pp,
                base.layers,
                microbatches,
                folded[(cp, micro)],
                analytic,
                moe=moe,
                ep=ep,
                ep_groups=max(1, dp // ep),
                alike=alike[micro],
            )
            known[(pp, dp, micro, cp, ep)] = size
        sizes.append(size)
    return sizes


def run_sweep(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    fixed: dict[str, Any] | None = None,
    max_tp: int | None = None,
    fidelity: str = "analytic",
    workers: int | None = None,
    progress: Progress | None = None,
    exhaustive: bool = False,
    cache: ResultCache | None = None,
    scheduler: str | None = None,
    batch: str | None = None,
    force: bool = False,
    keep: int | None = None,
    objective: str = "step",
) -> SweepResult:
    """Enumerate, validate, prune and simulate every layout; rows ranked by step time
    (:class:`SweepResult`). ``gpus`` resizes the cluster, the global batch following
    ``batch`` (:func:`scaled_batch`, default ``per-gpu``). A sweep too large for this
    machine is refused before anything is laid out (:func:`check_search`) unless
    ``force``. With ``cache``, a candidate checked or simulated before (the same
    scenario, files and parasim) is read from it instead. With ``scheduler``
    (``local`` or a Dask scheduler's address), the candidates run on that Dask cluster
    instead of this machine's process pool (:mod:`simulator.tools.scheduler`). With an
    ``objective`` other than ``step`` (:mod:`simulator.tools.objective`) the rows are
    ranked on the scenario's run trained at each layout, and no layout makes another
    needless (a heavier sharding writes its checkpoint faster)."""
    started = time.perf_counter()
    if fidelity not in ("analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow (got {fidelity!r})")
    workers = resolve_workers(workers)
    base, candidates = plan_sweep(scenario_path, overrides, gpus, fixed, max_tp, batch)
    fixed = check_fixed(fixed or {})
    if not force:
        hint = "pin dimensions with --fix, or use fewer GPUs"
        own = base.batch["scenario_global_batch"]
        if base.global_batch != own:
            hint += (
                f" (--batch {base.batch['policy']} made the global batch {base.global_batch:,}"
                f" of the scenario's {own:,}; --batch fixed keeps it)"
            )
        check_search(
            "the sweep",
            sweep_sizes(base, candidates, fidelity),
            workers,
            shared=scheduler in (None, "local"),
            hint=hint,
        )
    check_base(base)
    all_overrides = _Overrides(base, candidates, fidelity)
    args = (base.raw, base.source, base.base_dir)
    first = _first_scenario(base, all_overrides) if objective != "step" else None
    goal = RunObjective.of(objective, first)
    scored: dict[int, tuple[float, PhasePlan | None]] = {}

    def score(index: int, run: dict[str, Any]) -> float:
        """The objective of candidate ``index``'s simulated ``run``."""
        if goal.run is None:
            return float(run["step_time_s"])
        known = scored.get(index)
        if known is None:
            scenario = load_overridden(*args, all_overrides[index])
            known = scored[index] = goal.value(scenario, run)
        return known[0]

    cache = cache or ResultCache(None)
    bound = None if exhaustive or keep is None else _bound_of(base, candidates, all_overrides)
    executor, workers = open_executor(scheduler, workers, len(candidates))
    # a Dask task costs the scheduler milliseconds: hand it chunks four times as large
    scale = 4 if scheduler is not None else 1

    def work(kind: str, chunk: Callable[..., list[dict]], largest: int, forced: bool) -> Work:
        """Check or simulate candidates by their overrides: in chunks of at most
        ``largest`` on the pool, through the cache (a step's time alone, where it is
        slower than a ranking needs, is not kept: it holds for this search only)."""

        def run(
            items: list[list[str]], advance: Callable[[int], None], slower_than: float = math.inf
        ) -> list[dict]:
            task = chunk
            if slower_than < math.inf:
                task = functools.partial(chunk, slower_than=slower_than)
            return cache.run(
                kind,
                base.raw,
                base.base_dir,
                items,
                lambda missing: run_chunked(
                    task,
                    args,
                    missing,
                    executor,
                    workers,
                    advance,
                    largest=largest * scale,
                    together=same_grid,
                ),
                advance,
                forced,
                store=lambda outcome: outcome["status"] != "slower",
            )

        return run

    check = work("check", check_chunk, 64, False)
    simulate = work("simulate", functools.partial(simulate_chunk, force=force), 4, force)

    try:
        with progress or Silent() as bar:
            if bound is None:
                search = _search_all(
                    candidates,
                    all_overrides,
                    check,
                    simulate,
                    bar,
                    exhaustive or goal.run is not None,
                    fidelity,
                )
            else:
                search = _search_best_first(
                    candidates,
                    all_overrides,
                    bound,
                    max(1, keep or 1),
                    workers * scale,
                    check,
                    simulate,
                    bar,
                    (score, goal.per_step_second),
                    dominance=goal.run is None,
                )
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
    checked = started + search.check_s

    checks, runs = search.checks, search.runs
    invalid = Counter(c["reason"] for c in checks.values() if c["status"] == "invalid")
    pruned = [c for c in checks.values() if c["status"] == "pruned"]
    failed = Counter(r["reason"] for r in runs.values() if r["status"] == "failed")
    rows = []
    for index, run in runs.items():
        if run["status"] != "simulated":
            continue
        candidate = candidates[index]
        rows.append(
            {
                "layout": candidate.label(),
                **candidate.fields(),
                **{k: v for k, v in run.items() if k != "status"},
                **_objective_fields(objective, score(index, run), scored.get(index)),
                "overrides": all_overrides[index],
            }
        )
    rows.sort(key=lambda row: (row["objective_value"], row["step_time_s"], row["layout"]))
    for position, row in enumerate(rows, 1):
        row["rank"] = position
    outcomes = {
        candidate: (checks.get(i), runs.get(i), i in search.bounded)
        for i, candidate in enumerate(candidates)
    }
    own = _scenario_layout(base, fidelity, rows, outcomes, cache, force, keep)
    counts = {
        "enumerated": len(candidates),
        "invalid": sum(invalid.values()),
        "invalid_by_reason": dict(sorted(invalid.items(), key=lambda kv: (-kv[1], kv[0]))),
        "pruned_memory": len(pruned),
        "pruned_by_term": dict(Counter(c["dominant_term"] for c in pruned).most_common()),
        "smallest_pruned_bytes": min((c["peak_bytes_per_gpu"] for c in pruned), default=None),
        "dominated": search.dominated,
        "bounded": len(search.bounded),
        "bound_s": search.threshold if bound is not None else None,
        "failed": sum(failed.values()),
        "failed_by_reason": dict(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))),
        "simulated": len(rows),
    }
    return SweepResult(
        scenario=base.name,
        source=base.source,
        gpus=base.world,
        cluster={
            "name": base.cluster_name,
            "nodes": base.nodes,
            "gpus_per_node": base.gpus_per_node,
            "gpu": base.gpu_name,
            "capacity_bytes": base.capacity_bytes,
        },
        model=base.model_name,
        experts=base.experts,
        global_batch=base.global_batch,
        batch=base.batch,
        fidelity=fidelity,
        fixed={k: list(v) if isinstance(v, tuple) else v for k, v in fixed.items()},
        max_tp=max_tp,
        exhaustive=exhaustive,
        counts=counts,
        rows=rows,
        scenario_layout=own,
        wall_s=time.perf_counter() - started,
        timing_s={
            "check": checked - started,
            "simulate": time.perf_counter() - checked,
            "cached": cache.hits,
        },
        objective=objective,
    )


class _Overrides(Sequence[list[str]]):
    """Each candidate's ``--set`` overrides (:meth:`SweepBase.candidate_overrides`),
    made when first asked for: a search that examines few of its candidates writes few."""

    def __init__(self, base: SweepBase, candidates: list[Candidate], fidelity: str):
        self.base, self.candidates, self.fidelity = base, candidates, fidelity
        self.made: dict[int, list[str]] = {}

    def __len__(self) -> int:
        return len(self.candidates)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        made = self.made.get(index)
        if made is None:
            candidate = self.candidates[index]
            made = self.made[index] = self.base.candidate_overrides(candidate, self.fidelity)
        return made


@dataclass
class _Search:
    """What a sweep's search found: each examined candidate's ``checks`` and ``runs``
    (by index), how many were ``dominated``, the indices the bound left unexamined or
    unsimulated (``bounded``), the ``threshold`` it stopped at (the slowest step the
    ranking must hold; infinite when it examined everything) and the seconds spent
    checking (``check_s``)."""

    checks: dict[int, dict[str, Any]]
    runs: dict[int, dict[str, Any]]
    dominated: int
    bounded: set[int]
    threshold: float
    check_s: float


def _search_all(
    candidates: list[Candidate],
    all_overrides: Sequence[list[str]],
    check: Work,
    simulate: Work,
    bar: Any,
    exhaustive: bool,
    fidelity: str,
) -> _Search:
    """Check every candidate, then simulate every one that fits and no lighter one
    makes needless (``exhaustive``: every one that fits)."""
    started = time.perf_counter()
    advance = bar.stage(f"checking {len(candidates)} layouts", len(candidates))
    results = check(list(all_overrides), advance)
    chosen, dominated = select_lightest(candidates, results, exhaustive)
    check_s = time.perf_counter() - started
    advance = bar.stage(f"simulating {len(chosen)} layouts ({fidelity})", len(chosen))
    runs = simulate([all_overrides[i] for i in chosen], advance)
    runs_by_index = dict(zip(chosen, runs, strict=True))
    return _Search(dict(enumerate(results)), runs_by_index, dominated, set(), math.inf, check_s)


def _search_best_first(
    candidates: list[Candidate],
    all_overrides: Sequence[list[str]],
    bound: tuple[list[float], Callable[[int], float]],
    keep: int,
    width: int,
    check: Work,
    simulate: Work,
    bar: Any,
    scoring: tuple[Callable[[int, dict[str, Any]], float], float] | None = None,
    dominance: bool = True,
) -> _Search:
    """Examine the candidates in the order of their lower bound (:mod:`.bound`; a lighter
    recompute or sharding first among equal bounds, so that it is known before the
    layouts it makes needless), check them in batches, simulate those that fit and no
    lighter one makes needless, and stop where the next bound exceeds the threshold:
    the ``keep``-th fastest step simulated. A candidate's cheap bound orders it until it
    comes first, then its refined bound (a walk of its pipeline's order) does. A
    candidate whose step exceeds the threshold at its simulation is not accounted
    (status ``slower``): it cannot rank, and counts with those its bound left out. A
    simulated step below its own bound would mean the bound is wrong: the search then
    goes on through every candidate, in full. With ``scoring`` (the objective of a
    simulated candidate, by its index and run, and the least it is per second of step),
    the threshold is the ``keep``-th best objective over that least, in seconds of
    step; without ``dominance`` no candidate makes another needless."""
    score, per_step = scoring or ((lambda i, run: float(run["step_time_s"])), 1.0)
    cheap, refine = bound
    bounds = list(cheap)
    count = len(candidates)
    weights = [faster_first(candidate) for candidate in candidates]
    # (bound, faster-first positions, index, refined?): the next candidate first
    heap = [(bounds[i], weights[i][1], i, False) for i in range(count)]
    heapq.heapify(heap)
    advance = bar.stage(f"searching {count} layouts, the lowest bound first", count)
    checks: dict[int, dict[str, Any]] = {}
    runs: dict[int, dict[str, Any]] = {}
    lightest: dict[Candidate, list[tuple[int, ...]]] = {}  # fitting positions by group
    needless: set[int] = set()
    threshold, trusted = math.inf, True
    check_s = 0.0
    while heap and heap[0][0] <= threshold:
        batch: list[int] = []
        while heap and heap[0][0] <= threshold and len(batch) < 64 * width:
            key, weight, i, refined = heapq.heappop(heap)
            if not refined and threshold < math.inf:  # worth a closer look now
                bounds[i] = max(key, refine(i))
                heapq.heappush(heap, (bounds[i], weight, i, True))
                continue
            batch.append(i)
        if not batch:
            break
        started = time.perf_counter()
        results = check([all_overrides[i] for i in batch], _no_progress)
        check_s += time.perf_counter() - started
        todo = []
        for i, result in zip(batch, results, strict=True):
            checks[i] = result
            if result["status"] != "fits":
                continue
            group, weight = weights[i]
            fitting = lightest.setdefault(group, [])
            if dominance and any(never_slower(other, weight) for other in fitting):
                needless.add(i)  # a lighter recompute or sharding of it fits
                continue
            fitting.append(weight)
            todo.append(i)
        size = max(keep, 16 * width)
        while todo:
            todo = [i for i in todo if bounds[i] <= threshold]
            now, todo = todo[:size], todo[size:]
            ran = simulate([all_overrides[i] for i in now], _no_progress, threshold)
            for i, run in zip(now, ran, strict=True):
                runs[i] = run
                step = run.get("step_time_s")
                if step is not None and step < bounds[i] * (1 - 1e-9):
                    trusted = False
            threshold = _threshold(runs, keep, score) / per_step if trusted else math.inf
        if not trusted:  # the steps cut short under a threshold no longer trusted, in full
            redo = [i for i, run in runs.items() if run["status"] == "slower"]
            again = simulate([all_overrides[i] for i in redo], _no_progress)
            runs.update(zip(redo, again, strict=True))
        advance(len(batch))
    advance(count - len(checks))
    settled = {i for i, result in checks.items() if result["status"] != "fits"}
    ranked = {i for i, run in runs.items() if run["status"] != "slower"}
    bounded = set(range(count)) - settled - needless - ranked
    return _Search(checks, runs, len(needless), bounded, threshold, check_s)


def _threshold(
    runs: dict[int, dict[str, Any]], keep: int, score: Callable[[int, dict[str, Any]], float]
) -> float:
    """The worst objective a ranking of ``keep`` layouts holds: the ``keep``-th best
    ``score`` of the simulated ``runs``; infinite while fewer than ``keep`` have run."""
    values = sorted(score(i, run) for i, run in runs.items() if run["status"] == "simulated")
    return values[keep - 1] if len(values) >= keep else math.inf


def _objective_fields(
    objective: str, value: float, scored: tuple[float, PhasePlan | None] | None
) -> dict[str, Any]:
    """A row's objective, and with a run's, its time to train, goodput, cost and energy."""
    fields: dict[str, Any] = {"objective": objective, "objective_value": value}
    if scored is not None and scored[1] is not None:
        phase = scored[1]
        fields["run"] = {
            "time_to_train_s": phase.goodput.wall_mean,
            "goodput": phase.goodput.goodput,
            "gpu_hours": phase.gpus * phase.goodput.wall_mean / 3600.0,
            "energy_j": phase.energy_j,
            "checkpoint_s": phase.checkpoint.stall_s,
            "checkpoint_sharded": phase.checkpoint.sharded,
        }
    return fields


def _bound_of(
    base: SweepBase, candidates: list[Candidate], all_overrides: Sequence[list[str]]
) -> tuple[list[float], Callable[[int], float]] | None:
    """Each candidate's cheap lower bound on its step (:meth:`StepBound.seconds`) and
    the refined one of a candidate by its index (:meth:`StepBound.refined`), from the
    scenario at its own layout, or the first candidate that validates (None where none
    of the first few does: the search then examines every candidate)."""
    try:
        scenario = _first_scenario(base, all_overrides)
    except ParasimError:
        return None
    bound = StepBound(scenario, _spec(base.raw).training.recompute_fraction)
    batch = base.global_batch
    cheap = [bound.seconds(candidate, batch) for candidate in candidates]
    return cheap, lambda i: bound.refined(candidates[i], batch)


#: Candidates tried in turn for the scenario a sweep's bounds start from.
_BOUND_TRIES = 16


def _first_scenario(base: SweepBase, all_overrides: Sequence[list[str]]) -> Scenario:
    """The scenario at the sweep's size: at its own layout, or the first of a few
    candidates that validates (its layout may not fit the new size); the last one's
    error where none does."""
    tries = [["parallel.dp=null"], *all_overrides[:_BOUND_TRIES]]
    error: ParasimError | None = None
    for overrides in tries:
        try:
            return load_overridden(base.raw, base.source, base.base_dir, overrides)
        except ParasimError as exc:
            error = exc
    assert error is not None
    raise error


def _scenario_layout(
    base: SweepBase,
    fidelity: str,
    rows: list[dict[str, Any]],
    outcomes: dict[Candidate, tuple[dict[str, Any] | None, dict[str, Any] | None, bool]],
    cache: ResultCache,
    force: bool,
    keep: int | None = None,
) -> dict[str, Any]:
    """The scenario's own layout at the sweep's size (its ``tp``, ``cp``, ``pp`` and
    recipe as written, ``dp`` the rest), so that a ranking always says where the
    user's layout stands: its ``layout``, ``status`` (``simulated``, ``pruned``,
    ``invalid`` or ``failed``), ``rank`` among the rows (None where it is not one of
    them, ``unranked`` saying why: a lighter recompute of it fits, its bound put it
    outside the ``keep`` fastest, or it lies outside the searched space; it is then
    checked and simulated on its own, through the cache), its fields and numbers or its
    ``reason``, and the ``overrides`` that give it with ``parasim run``.
    ``outcomes`` holds each candidate's check and run (None where the search did
    neither) and whether the bound left it out."""
    own = ["parallel.dp=null", f"simulation.fidelity={fidelity}"]
    entry: dict[str, Any] = {"rank": None, "overrides": [*base.extra_overrides, *own]}
    try:
        scenario = load_overridden(base.raw, base.source, base.base_dir, own)
    except ParasimError as exc:
        return {**entry, "layout": None, "status": "invalid", "reason": _first_line(exc)}
    candidate = Candidate.of_recipe(scenario.recipe)
    for row in rows:
        if Candidate.from_knobs(row) == candidate:
            return {**row, "status": "simulated"}
    check, run, bounded = outcomes.get(candidate, (None, None, False))
    if candidate not in outcomes:
        why = "outside the searched space"
    elif bounded:
        why = f"its lower bound puts it outside the {keep} fastest, which the search ranks"
    else:
        why = "a lighter recompute of it fits, or ZeRO-1 where it has ZeRO-2 (never slower)"
    entry = {"layout": candidate.label(), **candidate.fields(), **entry, "unranked": why}
    if check is None:
        check = _alone(cache, "check", base, own, check_chunk)
    if check["status"] != "fits":
        return {**entry, **check}
    if run is None or run["status"] == "slower":  # its step alone: account it
        chunk = functools.partial(simulate_chunk, force=force)
        run = _alone(cache, "simulate", base, own, chunk, force)
    return {**entry, **run}


def _alone(
    cache: ResultCache,
    kind: str,
    base: SweepBase,
    overrides: list[str],
    chunk: Callable[..., list[dict]],
    force: bool = False,
) -> dict[str, Any]:
    """``chunk`` (:func:`check_chunk`, :func:`simulate_chunk`) of one candidate here,
    through the cache (``force``: a forced search's)."""
    compute = functools.partial(chunk, base.raw, base.source, base.base_dir)
    return cache.run(kind, base.raw, base.base_dir, [overrides], compute, _no_progress, force)[0]


def _no_progress(n: int) -> None:
    """No progress to show for one layout."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def no_layout_message(result: SweepResult) -> str:
    """One line saying why a sweep has nothing to rank."""
    counts = result.counts
    head = f"no layout of {result.model} runs on {result.gpus} GPUs ({counts['enumerated']} tried"
    if counts["invalid"]:
        reason, n = next(iter(counts["invalid_by_reason"].items()))
        head += f"; {counts['invalid']} invalid, most often {n} x '{reason}'"
    if counts["pruned_memory"]:
        term = next(iter(counts["pruned_by_term"]))
        head += (
            f"; {counts['pruned_memory']} out of memory, the smallest needs "
            f"{counts['smallest_pruned_bytes'] / 2**30:.1f} GiB of "
            f"{result.cluster['capacity_bytes'] / 2**30:.1f} GiB per GPU (mostly {term})"
        )
    if counts["failed"]:
        reason = next(iter(counts["failed_by_reason"]))
        head += f"; {counts['failed']} failed to simulate: {reason}"
    return head + ")"
