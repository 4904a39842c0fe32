"""The layering mistakes ``parasim explain`` looks for, one registry entry each.

Every mistake is one :class:`Mistake` in :data:`MISTAKES`: its id, its title, a
``check`` that reads the simulated scenario and says what is wrong (a :class:`Symptom`,
or None when the mistake is absent), a ``fix`` that proposes the corrected layouts as
scenario overrides (a :class:`Remedy`), and the key of its teaching pair, the two files
``scenarios/teaching/<key>-mistake.yaml`` and ``<key>-fix.yaml``. Adding a mistake is
one entry here (and, where it has one, its two teaching scenarios and their story in
:mod:`simulator.report.teaching_page`); :data:`FINDING_IDS` and
:data:`MEMORY_FINDINGS` follow from the registry.

Each entry's ``when`` says in one line when it is found; ``docs/teaching.md`` ("What
explain looks for") lists them, generated from the registry.

The registry's order is the order of checking and of the findings. A mistake is not
checked once one of the ids in its ``unless`` has been found, so one problem is reported
once (a TP degree beyond the node is not also reported as TP across nodes), except a
memory mistake after a finding that has no fix that fits (SP alone does not bring the
layout into memory: the general out-of-memory check then looks for what does); ``also``
names the more general mistakes a finding is an instance of.

A fix is how the run is laid out, never what it trains: a candidate that changes the
recipe's meaning (:data:`RECIPE_FIELDS`: the model, its sequence length, the global
batch, the number format) is never proposed, and neither is one that does not fit in
memory; explain simulates such candidates and shows them apart with their numbers
(:func:`changes_recipe`).

Checks and fixes read the scenario through :class:`Case`, which
:mod:`simulator.tools.explain` implements: the scenario, its simulated result, and
:meth:`Case.options`, which turns candidate overrides into valid scenarios checked for
memory (:class:`Option`). The explain tool simulates the options, chooses the fix
(``choose``: the first option, or the fastest per the same global batch) and prices it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from simulator.analysis.power import rank_seconds
from simulator.analysis.result import MemoryEstimate, StepResult
from simulator.common.vocabulary import RECOMPUTE_MODES
from simulator.request.layout import Layout
from simulator.request.scenario import Scenario
from simulator.tools.plan import PhasePlan, phase_plan
from topologies.units import format_bytes, format_time

__all__ = [
    "RECIPE_FIELDS",
    "ROUTER_FIELDS",
    "changes_recipe",
    "BUBBLE_TARGET",
    "STALL_SHARE",
    "CAPACITY_FIX",
    "SP_PRESSURE",
    "CHECKPOINT_LOSS",
    "NO_FIX",
    "NO_FASTER_FIX",
    "NODE_LIMIT",
    "Option",
    "Case",
    "Symptom",
    "Remedy",
    "Mistake",
    "MISTAKES",
    "MISTAKE_BY_ID",
    "FINDING_IDS",
    "MEMORY_FINDINGS",
]

#: A pipeline's bubble above this share of the step is a finding, and the fix aims at it.
BUBBLE_TARGET = 0.10
#: Waiting for the busiest expert above this share of the step is a finding.
STALL_SHARE = 0.10
#: The capacity factor proposed for a skewed router (GShard/Switch's usual 1.25).
CAPACITY_FIX = 1.25
#: Activations dominating more than this share of a GPU's memory make SP worth turning on.
SP_PRESSURE = 0.5
#: A replicated checkpoint is a finding where a sharded save trains the run this much
#: sooner (its share of the wall time).
CHECKPOINT_LOSS = 0.01
#: What a finding says in place of a fix when no option was found.
NO_FIX = "no layout change that fits was found"
#: What a time finding says when every option it simulated was slower than the step.
NO_FASTER_FIX = "no layout change tried is faster"

_STATE_TERMS = ("weights", "gradients", "optimizer_state")

#: The scenario fields that say what a run trains, as opposed to how it is laid out:
#: the model (its shape, vocabulary and sequence length), the global batch (the
#: optimizer's batch: its learning-rate schedule is tuned for it) and the number
#: formats. A candidate fix that sets one of them changes the recipe and is shown apart,
#: never proposed (a field is matched with everything under it: ``model`` is every
#: ``model.*``).
RECIPE_FIELDS: tuple[str, ...] = (
    "model",
    "training.global_batch",
    "training.dtype",
    "training.grad_reduce_dtype",
)
#: The router settings under ``model`` that are how tokens reach their experts rather
#: than what the model is, and that trainers set for speed: the capacity factor
#: (GShard, Switch: assignments over it skip the expert through the residual) and
#: node-limited routing (DeepSeek-V3 trains with it at no measured loss of quality),
#: and the dispatcher (DeepEP sends the same tokens, fewer copies).
ROUTER_FIELDS: tuple[str, ...] = (
    "model.moe.capacity_factor",
    "model.moe.max_nodes_per_token",
    "model.moe.dispatcher",
)


def changes_recipe(fix: dict[str, Any]) -> list[str]:
    """The keys of ``fix`` that change what the run trains (:data:`RECIPE_FIELDS`, less
    :data:`ROUTER_FIELDS`), in order; empty for a change of layout."""

    def defines(key: str) -> bool:
        return key not in ROUTER_FIELDS and any(
            key == field or key.startswith(field + ".") for field in RECIPE_FIELDS
        )

    return [key for key in fix if defines(key)]


# ------------------------------------------------------------------- the registry


@dataclass
class Option:
    """A candidate fix: its overrides, one line saying what it does, the scenario with
    the overrides applied and its memory per rank; ``snap`` is filled in once simulated."""

    fix: dict[str, Any]
    summary: str
    scenario: Scenario
    memory: MemoryEstimate
    snap: dict[str, Any] | None = None


class Case(Protocol):
    """What a check or a fix may ask of the scenario under examination."""

    scenario: Scenario
    #: the simulated step of ``scenario`` (``result.json``'s dict)
    result: StepResult
    #: the :func:`~simulator.tools.explain.snapshot` of that step
    before: dict[str, Any]
    #: GPUs per node: the NVLink domain
    per_node: int

    @property
    def layout(self) -> Layout: ...

    @property
    def step(self) -> float: ...

    @property
    def memory(self) -> MemoryEstimate: ...

    def variant(self, fix: dict[str, Any]) -> Scenario | None:
        """The scenario with ``fix`` applied, or None when that is not a valid scenario."""
        ...

    def options(
        self,
        candidates: list[tuple[dict[str, Any], str]],
        notes: list[str] | None = None,
        accept: Callable[[Scenario], bool] | None = None,
        rescue: bool = True,
    ) -> list[Option]:
        """The valid ``(overrides, summary)`` candidates, preferring those that fit."""
        ...


@dataclass(frozen=True)
class Symptom:
    """What a check found: the problem with its numbers, and a title more precise than
    the mistake's own when the check can give one."""

    problem: str
    title: str | None = None


@dataclass
class Remedy:
    """What a fix proposes: the options to simulate (in order of preference), notes for
    the finding, and what the finding says when there is no option."""

    options: list[Option]
    notes: list[str] = field(default_factory=list)
    no_fix: str = NO_FIX


@dataclass(frozen=True)
class Mistake:
    """One registry entry.

    ``check(case)`` returns a :class:`Symptom` when the mistake is present; ``fix(case)``
    the :class:`Remedy`. ``teaching`` is the key of the teaching pair (None: none yet).
    ``choose`` picks the fix among the simulated options, ``memory`` says the finding is
    about memory (its ``moved`` always lists memory, its chart shows memory), ``also``
    the more general mistakes a finding is an instance of, and ``unless`` the mistakes
    whose finding makes this one moot (for a memory mistake, only a finding with a fix
    that fits does)."""

    id: str
    title: str
    check: Callable[[Case], Symptom | None]
    fix: Callable[[Case], Remedy]
    # when it is found, one line for the docs' table of findings (every registered
    # mistake has one)
    when: str = ""
    teaching: str | None = None
    choose: Literal["first", "fastest"] = "fastest"
    memory: bool = False
    also: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()

    @property
    def teaching_files(self) -> tuple[str, str] | None:
        """The names of the teaching pair's files in ``scenarios/teaching/``."""
        if self.teaching is None:
            return None
        return f"{self.teaching}-mistake.yaml", f"{self.teaching}-fix.yaml"


# ----------------------------------------------------------------------------- helpers


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _spanning(layout: Layout, axis: str, per_node: int) -> tuple[list[tuple[int, ...]], int]:
    """The groups of ``axis`` whose members sit on more than one node, and how many
    groups the axis has."""
    groups = [m for name, m in layout.groups.items() if layout.axis_of_group(name) == axis]
    spanning = [m for m in groups if len({rank // per_node for rank in m}) > 1]
    return spanning, len(groups)


def _nodes_of(members: tuple[int, ...], per_node: int) -> int:
    return len({rank // per_node for rank in members})


def _innermost(layout: Layout) -> str:
    """The innermost axis of the placement that has more than one rank."""
    return next((axis for axis in layout.placement if layout.size(axis) > 1), "tp")


def _tp_first(placement: tuple[str, ...] | list[str], then: str | None = None) -> list[str]:
    """The placement with TP innermost (and ``then`` next), the other axes in order."""
    rest = [axis for axis in placement if axis != "tp"]
    if then is not None:
        rest = [then] + [axis for axis in rest if axis != then]
    return ["tp", *rest]


def _peak_terms(memory: MemoryEstimate) -> dict[str, float]:
    return next(s for s in memory.per_stage if s.stage == memory.peak_stage).terms_bytes


# ------------------------------------------------------ TP across nodes, three ways


def _fabric(case: Case) -> str:
    return "NVLink" if case.scenario.cluster_spec.nvswitch is not None else "PCIe"


def _tp_span(case: Case) -> tuple[str, int, str] | None:
    """Which TP groups span nodes (``every TP group`` or ``k of n TP groups``), the most
    nodes one spans, and what it costs in words; None when every TP group fits a node."""
    layout, per_node = case.layout, case.per_node
    if layout.tp == 1:
        return None
    spanning, total = _spanning(layout, "tp", per_node)
    if not spanning:
        return None
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    axes = case.before["exposed_comm_by_axis"]["critical"]
    exposed = axes.get("tp", 0.0) + axes.get("sp", 0.0)
    cost = (
        f"every layer's TP collectives cross the network instead of {_fabric(case)}: "
        f"{format_time(exposed)} ({_pct(exposed, case.step)}) of the step is exposed "
        "TP communication"
    )
    groups = f"{len(spanning)} of {total} TP groups" if len(spanning) < total else "every TP group"
    return groups, nodes, cost


def _tp_inside_node(case: Case) -> Callable[[Scenario], bool]:
    """Accepts a variant whose TP groups all sit inside one node."""
    per_node = case.per_node
    return lambda s: not _spanning(s.layout, "tp", per_node)[0]


def _reduce_tp(case: Case, limit: int) -> list[tuple[dict[str, Any], str]]:
    """Candidates with the largest tp ≤ ``limit`` that divides both the node and tp: the
    pipeline absorbs the factor freed, or data parallelism does."""
    layout = case.layout
    placement = list(layout.placement)
    if _innermost(layout) != "tp":
        placement = _tp_first(placement)
    for t in sorted(_divisors(case.per_node), reverse=True):
        if t > limit or t >= layout.tp or layout.tp % t:
            continue
        factor = layout.tp // t
        extra = {} if placement == list(layout.placement) else {"parallel.placement": placement}
        candidates = [
            (
                {"parallel.tp": t, "parallel.pp": layout.pp * factor, "parallel.dp": layout.dp}
                | extra,
                f"tp {t} × pp {layout.pp * factor}: TP inside the node, "
                f"the pipeline absorbs the factor {factor}",
            ),
            (
                {"parallel.tp": t, "parallel.pp": layout.pp, "parallel.dp": layout.dp * factor}
                | extra,
                f"tp {t} × dp {layout.dp * factor}: TP inside the node, "
                f"data parallelism absorbs the factor {factor}",
            ),
        ]
        if any(case.variant(fix) is not None for fix, _ in candidates):
            return candidates
    return []


def _placements(case: Case) -> list[tuple[dict[str, Any], str]]:
    out = []
    for order in (["tp", "pp", "dp"], ["tp", "dp", "pp"]):
        if order != list(case.layout.placement):
            out.append(
                ({"parallel.placement": order}, f"placement [{', '.join(order)}]: TP innermost")
            )
    return out


def _check_tp_beyond_nvlink(case: Case) -> Symptom | None:
    layout, per_node = case.layout, case.per_node
    span = _tp_span(case)
    if span is None or layout.tp <= per_node:
        return None
    groups, nodes, cost = span
    return Symptom(
        f"tp({layout.tp}) > {per_node} GPUs per node, so {groups} spans {nodes} nodes and {cost}.",
        title=f"TP degree {layout.tp} is larger than the {_fabric(case)} domain ({per_node} GPUs)",
    )


def _fix_tp_beyond_nvlink(case: Case) -> Remedy:
    notes: list[str] = []
    options = case.options(_reduce_tp(case, case.per_node), notes, accept=_tp_inside_node(case))
    return Remedy(options, notes)


def _check_layering_backwards(case: Case) -> Symptom | None:
    layout = case.layout
    span = _tp_span(case)
    inner = _innermost(layout)
    if span is None or inner == "tp":
        return None
    groups, nodes, cost = span
    return Symptom(
        f"placement [{', '.join(layout.placement)}] puts {inner} ({layout.size(inner)}) "
        f"innermost, so {groups} of {layout.tp} spans {nodes} nodes and {cost}.",
        title=f"layering backwards: {inner.upper()} inside the node, TP across nodes",
    )


def _fix_layering_backwards(case: Case) -> Remedy:
    notes: list[str] = []
    options = case.options(_placements(case), notes, accept=_tp_inside_node(case))
    return Remedy(options, notes)


def _check_tp_across_nodes(case: Case) -> Symptom | None:
    span = _tp_span(case)
    if span is None:
        return None
    groups, nodes, cost = span
    return Symptom(
        f"tp({case.layout.tp}) does not tile the {case.per_node}-GPU nodes, so {groups} "
        f"spans {nodes} nodes and {cost}."
    )


def _fix_tp_across_nodes(case: Case) -> Remedy:
    notes: list[str] = []
    candidates = _placements(case) + _reduce_tp(case, case.layout.tp)
    options = case.options(candidates, notes, accept=_tp_inside_node(case))
    return Remedy(options, notes)


# --------------------------------------------------------------------------- memory


def _check_dp_only_oom(case: Case) -> Symptom | None:
    layout, memory = case.layout, case.memory
    if layout.tp != 1 or layout.pp != 1 or not memory.oom:
        return None
    terms = _peak_terms(memory)
    states = sum(terms[t] for t in _STATE_TERMS)
    capacity = memory.capacity_bytes
    if memory.dominant_term not in _STATE_TERMS and states <= capacity:
        return None
    params = memory.per_stage[0].parameters
    return Symptom(
        f"data parallelism alone keeps the whole model on every GPU: {params / 1e9:.2f} B "
        f"parameters × 16 bytes of weights, gradients and Adam state take "
        f"{format_bytes(states)} per GPU, plus {format_bytes(terms['activations'])} of "
        f"activations, {format_bytes(memory.peak_bytes_per_gpu)} in all against "
        f"{format_bytes(capacity)}; the {layout.dp} replicas add throughput, not headroom."
    )


def _fix_dp_only_oom(case: Case) -> Remedy:
    layout = case.layout
    world, per_node = layout.world, case.per_node
    placement: dict[str, Any] = {}
    if layout.placement[0] != "tp":  # TP will be innermost once tp > 1
        placement = {"parallel.placement": _tp_first(layout.placement)}
    notes: list[str] = []
    chosen: list[Option] = []
    largest_tp = 1
    for t in _divisors(per_node)[1:]:
        if world % t:
            continue
        fix = {"parallel.tp": t, "parallel.dp": world // t} | placement
        found = case.options(
            [(fix, f"tp {t} × dp {world // t}: each GPU holds 1/{t} of the model")], rescue=False
        )
        if not found:
            continue
        largest_tp = t
        if not found[0].memory.oom:
            chosen = found
            break
        notes.append(
            f"tp {t} × dp {world // t} would still need "
            f"{format_bytes(found[0].memory.peak_bytes_per_gpu)} per GPU"
        )
    if not chosen and largest_tp > 1:
        t = largest_tp
        for p in _divisors(case.scenario.model.layers)[1:]:
            if world % (t * p):
                continue
            fix = {"parallel.tp": t, "parallel.pp": p, "parallel.dp": world // (t * p)} | placement
            summary = f"tp {t} × pp {p} × dp {world // (t * p)}: each GPU holds 1/{t * p}"
            found = case.options([(fix, summary)], rescue=False)
            if found and not found[0].memory.oom:
                chosen = found
                break
    zero1: list[Option] = []
    if not case.scenario.recipe.shards_optimizer and layout.dp > 1:
        zero1 = case.options(
            [
                (
                    {"training.sharding": "optimizer"},
                    f"ZeRO-1 alone (Adam state split {layout.dp} ways)",
                )
            ],
            rescue=False,
        )
        if zero1 and zero1[0].memory.oom:
            notes.append(
                f"ZeRO-1 alone would still need "
                f"{format_bytes(zero1[0].memory.peak_bytes_per_gpu)} per GPU"
            )
            zero1 = []
    return Remedy(chosen + zero1, notes)


def _check_sp(case: Case) -> Symptom | None:
    layout, memory = case.layout, case.memory
    if layout.tp == 1 or case.scenario.parallel.sp:
        return None
    terms = _peak_terms(memory)
    activations, peak, capacity = (
        terms["activations"],
        memory.peak_bytes_per_gpu,
        memory.capacity_bytes,
    )
    dominant = memory.dominant_term == "activations"
    pressured = dominant and (memory.oom or peak > SP_PRESSURE * capacity)
    out_because = memory.oom and peak - activations <= capacity
    if not (pressured or out_because):
        return None
    verdict = "out of memory" if memory.oom else f"{_pct(peak, capacity)} of the GPU"
    return Symptom(
        f"with tp({layout.tp}) and sequence parallelism off, every TP rank keeps the "
        f"norms', dropouts' and residuals' activations for the whole sequence: activations "
        f"take {format_bytes(activations)} of the {format_bytes(peak)} per GPU "
        f"({format_bytes(capacity)} available, {verdict})."
    )


def _fix_sp(case: Case) -> Remedy:
    tp = case.layout.tp
    return Remedy(
        case.options(
            [({"parallel.sp": True}, f"sequence parallelism: those activations split {tp} ways")]
        )
    )


def _check_oom(case: Case) -> Symptom | None:
    memory = case.memory
    if not memory.oom:
        return None
    terms = _peak_terms(memory)
    return Symptom(
        f"stage {memory.peak_stage} needs {format_bytes(memory.peak_bytes_per_gpu)} per "
        f"GPU against {format_bytes(memory.capacity_bytes)} ("
        + ", ".join(f"{name} {format_bytes(v)}" for name, v in terms.items() if v > 0)
        + ")."
    )


def _fix_oom(case: Case) -> Remedy:
    scenario, layout = case.scenario, case.layout
    training = scenario.training
    candidates: list[tuple[dict[str, Any], str]] = []
    if not case.scenario.recipe.shards_optimizer and layout.dp > 1:
        candidates.append(({"training.sharding": "optimizer"}, "ZeRO-1: Adam state split"))
    levels = RECOMPUTE_MODES
    for level in levels[levels.index(training.recompute) + 1 :]:
        candidates.append(({"training.recompute": level}, f"recompute {level}"))
    t = layout.tp * 2
    while t <= case.per_node and layout.dp % (t // layout.tp) == 0:
        candidates.append(
            (
                {"parallel.tp": t, "parallel.dp": layout.dp // (t // layout.tp)},
                f"tp {t}: each GPU holds 1/{t} of each layer",
            )
        )
        t *= 2
    p = layout.pp * 2
    while layout.dp % (p // layout.pp) == 0 and p <= scenario.model.layers:
        candidates.append(
            (
                {"parallel.pp": p, "parallel.dp": layout.dp // (p // layout.pp)},
                f"pp {p}: each GPU holds 1/{p} of the layers",
            )
        )
        p *= 2
    return Remedy([o for o in case.options(candidates, rescue=False) if not o.memory.oom][:1])


# ------------------------------------------------------------------------- pipeline


def _pipeline(case: Case) -> tuple[int, int, int, float]:
    """Stages p, chunks per rank v, micro-batches m and the reference bubble
    ``(p−1)/(v·m+p−1)``."""
    scenario = case.scenario
    p = case.layout.pp
    schedule = scenario.parallel.schedule
    v = scenario.parallel.virtual_stages if schedule == "interleaved-1f1b" else 1
    m = scenario.microbatches
    return p, v, m, (p - 1) / (v * m + p - 1)


def _needed(p: int, v: int) -> int:
    """The fewest micro-batches that bring the reference bubble to ``BUBBLE_TARGET``."""
    # (p−1)/(v·m + p−1) ≤ 1/10  ⟺  v·m ≥ 9(p−1)
    return math.ceil(9 * (p - 1) / v)


def _check_microbatches(case: Case) -> Symptom | None:
    if case.layout.pp == 1:
        return None
    p, v, m, reference = _pipeline(case)
    bubble = case.result.breakdown.critical["bubble"]
    if reference <= BUBBLE_TARGET or bubble <= BUBBLE_TARGET * case.step:
        return None
    return Symptom(
        f"the {p}-stage pipeline runs only {m} micro-batch{'es' if m != 1 else ''} per step: "
        f"the reference bubble (p−1)/({'v·' if v > 1 else ''}m+p−1) is {_pct(reference, 1)}, "
        f"and the critical rank idles {format_time(bubble)} ({_pct(bubble, case.step)}) of "
        f"the step in the bubble; {_needed(p, v)} micro-batches or more bring the reference "
        f"to {_pct(BUBBLE_TARGET, 1)} or less."
    )


def _fix_microbatches(case: Case) -> Remedy:
    scenario, layout = case.scenario, case.layout
    p, v, m, _ = _pipeline(case)
    schedule = scenario.parallel.schedule
    needed = _needed(p, v)
    training = scenario.training
    gb, mb, dp = training.global_batch, training.micro_batch, layout.dp
    candidates: list[tuple[dict[str, Any], str]] = []
    for smaller in sorted(_divisors(mb), reverse=True):
        if smaller < mb and gb % (dp * smaller) == 0 and gb // (dp * smaller) >= needed:
            m2 = gb // (dp * smaller)
            candidates.append(
                (
                    {"training.micro_batch": smaller},
                    f"micro-batch {smaller}: {m2} micro-batches, reference bubble "
                    f"{_pct(p - 1, v * m2 + p - 1)}",
                )
            )
            break
    if not candidates and schedule in ("1f1b", "gpipe") and m % p == 0:
        for v2 in range(2, 9):
            if scenario.model.layers % (p * v2) == 0 and (p - 1) / (v2 * m + p - 1) <= 0.1:
                candidates.append(
                    (
                        {"parallel.schedule": "interleaved-1f1b", "parallel.virtual_stages": v2},
                        f"interleaved 1F1B with {v2} chunks per rank: reference bubble "
                        f"{_pct(p - 1, v2 * m + p - 1)}",
                    )
                )
                break
    if not candidates:  # more micro-batches only from a larger batch: a recipe change
        m2 = p * math.ceil(needed / p)  # a whole number of rounds (interleaved needs it)
        candidates.append(
            (
                {"training.global_batch": m2 * dp * mb},
                f"global batch {m2 * dp * mb}: {m2} micro-batches",
            )
        )
    return Remedy(
        case.options(candidates),
        no_fix="no change of layout brings the bubble down here: more micro-batches need a "
        "smaller micro-batch or a larger global batch, which changes the recipe",
    )


# ---------------------------------------------------------------- mixture of experts


def _check_ep(case: Case) -> Symptom | None:
    layout, per_node = case.layout, case.per_node
    if case.scenario.moe is None or layout.ep == 1:
        return None
    spanning, total = _spanning(layout, "ep", per_node)
    if not spanning:
        return None
    inside = case.options(
        _ep_inside_node(case),
        accept=lambda s: not _spanning(s.layout, "ep", per_node)[0],
        rescue=False,
    )
    if not [option for option in inside if not option.memory.oom]:
        return None  # the experts need EP groups wider than a node
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("ep", 0.0)
    groups = f"{len(spanning)} of {total} EP groups" if len(spanning) < total else "every EP group"
    return Symptom(
        f"ep({layout.ep}) with tp({layout.tp}) and placement [{', '.join(layout.placement)}]: "
        f"{groups} spans {nodes} nodes, so every MoE layer's dispatch and combine all-to-alls "
        f"cross the network: {format_time(exposed)} ({_pct(exposed, case.step)}) of the step "
        "is exposed EP communication."
    )


def _fix_ep(case: Case) -> Remedy:
    notes: list[str] = []
    options = case.options(
        _ep_inside_node(case),
        notes,
        accept=lambda s: not _spanning(s.layout, "ep", case.per_node)[0],
    )
    return Remedy(options, notes)


def _ep_inside_node(case: Case) -> list[tuple[dict[str, Any], str]]:
    """Layouts whose EP groups stay inside a node: the EP ranks side by side in the
    placement, or the largest smaller ``ep`` that one node holds."""
    layout, per_node, moe = case.layout, case.per_node, case.scenario.moe
    assert moe is not None
    placement = _tp_first(layout.placement, then="dp")
    extra = {} if placement == list(layout.placement) else {"parallel.placement": placement}
    candidates: list[tuple[dict[str, Any], str]] = []
    if extra:
        candidates.append((extra, f"placement [{', '.join(placement)}]: EP ranks side by side"))
    for e in sorted(_divisors(layout.ep), reverse=True):
        if e < layout.ep and moe.experts % e == 0 and layout.tp * e <= per_node:
            candidates.append(
                (
                    {"parallel.ep": e} | extra,
                    f"ep {e}: each EP group of {e} ranks inside one node, "
                    f"{moe.experts // e} experts per rank",
                )
            )
            break
    return candidates


#: Node-limited routing as DeepSeek-V3 trains it: each token reaches at most 4 of the 8
#: nodes its experts span (DeepSeek-AI 2024, arXiv 2412.19437, section 2.1.2); the fix
#: proposes this limit, and half of it.
NODE_LIMIT = 4


def _routing_reach(case: Case) -> tuple[int, int] | None:
    """``(nodes an EP group spans, nodes a token's assignments may reach)`` when every
    assignment crosses the network on its own, else None: with
    ``moe.max_nodes_per_token`` set (the limit is the recipe's own choice, even where it
    does not bind) or DeepEP's dispatcher a token crosses to each of its nodes once."""
    layout, per_node, moe = case.layout, case.per_node, case.scenario.moe
    if moe is None or layout.ep == 1:
        return None
    spanning, _ = _spanning(layout, "ep", per_node)
    if not spanning:
        return None
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    if moe.max_nodes_per_token is not None or moe.dispatcher == "deepep":
        return None  # node-limited routing or DeepEP's dispatch: one copy per node already
    return nodes, min(moe.top_k, nodes)


def _check_ep_routing(case: Case) -> Symptom | None:
    spread = _routing_reach(case)
    if spread is None:
        return None
    nodes, reach = spread
    if not [m for m in (NODE_LIMIT, NODE_LIMIT // 2) if m < reach]:
        return None
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("ep", 0.0)
    if exposed <= FSDP_EXPOSED * case.step:
        return None
    moe = case.scenario.moe
    assert moe is not None
    return Symptom(
        f"ep({case.layout.ep}) spans {nodes} nodes and routing is not node-limited: each "
        f"token's {moe.top_k} expert assignments cross the network one by one, to as many as "
        f"{reach} nodes, and {format_time(exposed)} ({_pct(exposed, case.step)}) of the step "
        "is exposed EP communication."
    )


def _fix_ep_routing(case: Case) -> Remedy:
    spread = _routing_reach(case)
    assert spread is not None
    _, reach = spread
    candidates: list[tuple[dict[str, Any], str]] = [
        (
            {"model.moe.max_nodes_per_token": m},
            f"node-limited routing: each token to at most {m} nodes, crossing to each once",
        )
        for m in (NODE_LIMIT, NODE_LIMIT // 2)
        if m < reach
    ]
    candidates.append(
        (
            {"model.moe.dispatcher": "deepep"},
            "DeepEP's dispatch: each token crosses to each of its nodes once, the same routing",
        )
    )
    notes = [
        "node-limited routing picks a token's experts among its best-scoring nodes first; "
        "DeepSeek-V3 trains with 4 of 8 nodes at no measured loss of quality, and parasim "
        "keeps the unlimited router's expert loads"
    ]
    return Remedy(case.options([*candidates, *_ep_inside_node(case)], notes), notes)


def _dualpipev_layouts(case: Case) -> list[tuple[dict[str, Any], str]]:
    """DualPipeV at the scenario's pipeline depth (or two stages, from half the DP
    replicas, without a pipeline) where its layers split over the ``2p`` stages and
    each stage gets a micro-batch."""
    scenario, layout = case.scenario, case.layout
    training = scenario.training
    candidates = []
    for pp in (layout.pp,) if layout.pp > 1 else (2,):
        dp = layout.dp * layout.pp // pp
        if layout.dp * layout.pp % pp or dp < 1:
            continue
        microbatches = training.global_batch // (dp * training.micro_batch)
        if microbatches < 2 * pp:
            continue
        fix: dict[str, Any] = {"parallel.schedule": "dualpipev", "parallel.virtual_stages": 2}
        if scenario.parallel.stage_layers is not None:
            fix["parallel.stage_layers"] = None  # a split for the old stages
        if pp != layout.pp:
            fix |= {"parallel.pp": pp, "parallel.dp": dp}
        candidates.append(
            (
                fix,
                f"DualPipeV over {pp} pipeline ranks: each rank's forward of one "
                "micro-batch overlapped with the backward of another, one's all-to-alls "
                "behind the other's compute",
            )
        )
    return candidates


def _check_ep_overlap(case: Case) -> Symptom | None:
    layout, scenario = case.layout, case.scenario
    if scenario.moe is None or layout.ep == 1 or scenario.parallel.schedule == "dualpipev":
        return None
    spanning, _ = _spanning(layout, "ep", case.per_node)
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("ep", 0.0)
    if not spanning or exposed <= FSDP_EXPOSED * case.step or not _dualpipev_layouts(case):
        return None
    return Symptom(
        f"ep({layout.ep}) all-to-alls cross nodes and {format_time(exposed)} "
        f"({_pct(exposed, case.step)}) of the step waits for them: the "
        f"{scenario.parallel.schedule} pipeline runs one micro-batch at a time, so nothing "
        "computes while a layer's dispatch and combine are in flight."
    )


def _fix_ep_overlap(case: Case) -> Remedy:
    notes = [
        "DualPipeV overlaps the pair only where the framework interleaves their kernels "
        "(DeepSeek's DualPipe, a registered OVERLAP_F_B function in "
        "torch.distributed.pipelining); it holds 2p+1 chunks' activations per rank"
    ]
    return Remedy(case.options(_dualpipev_layouts(case), notes), notes)


def _check_routing(case: Case) -> Symptom | None:
    moe, moe_result = case.scenario.moe, case.result.moe
    if moe is None or not moe_result or case.layout.ep == 1:
        return None
    stall = case.result.breakdown.critical["imbalance_stall"]
    if stall <= STALL_SHARE * case.step:
        return None
    return Symptom(
        f"the {moe_result.routing} router sends the busiest expert "
        f"{moe_result.imbalance_mean:.2f}× the mean load, and the critical rank waits "
        f"{format_time(stall)} ({_pct(stall, case.step)}) of the step at the all-to-alls for "
        f"the ranks holding the hot experts."
    )


def _fix_routing(case: Case) -> Remedy:
    moe = case.scenario.moe
    assert moe is not None
    notes = [
        "dropped token assignments skip the expert through the residual connection; a "
        "router trained with a load-balancing loss is the lasting cure"
    ]
    candidates = []
    if moe.capacity_factor is None or moe.capacity_factor > CAPACITY_FIX:
        candidates.append(
            (
                {"model.moe.capacity_factor": CAPACITY_FIX},
                f"capacity factor {CAPACITY_FIX}: each expert takes at most "
                f"{CAPACITY_FIX}·k·T/E assignments, the overflow is dropped",
            )
        )
    return Remedy(
        case.options(candidates),
        notes,
        no_fix=f"the capacity factor is already {moe.capacity_factor}: the router itself "
        "needs balancing (an auxiliary load-balancing loss)",
    )


# ------------------------------------------------------------------- the whole run


def _checkpoint_runs(case: Case) -> tuple[PhasePlan, PhasePlan] | None:
    """The scenario's run (``run:``) trained at its layout with its replicated
    checkpoint, and with a sharded save; None where it has no run or saves sharded."""
    run = case.scenario.spec.run
    if run is None:
        return None
    said = run.checkpoint.sharded
    if said is True or (said == "auto" and case.scenario.recipe.shards_optimizer):
        return None
    parts = rank_seconds(case.result)
    replicated = phase_plan(case.scenario, case.step, parts, run.tokens, run)
    saving = run.checkpoint.model_copy(update={"sharded": True})
    sharded = phase_plan(
        case.scenario, case.step, parts, run.tokens, run.model_copy(update={"checkpoint": saving})
    )
    return replicated, sharded


def _check_checkpoint(case: Case) -> Symptom | None:
    runs = _checkpoint_runs(case)
    if runs is None:
        return None
    replicated, sharded = runs
    before, after = replicated.goodput, sharded.goodput
    if after.wall_mean >= before.wall_mean * (1 - CHECKPOINT_LOSS):
        return None
    write = replicated.checkpoint
    lost = before.wall_mean - after.wall_mean
    return Symptom(
        f"one data-parallel replica writes the whole {format_bytes(write.bytes)} checkpoint "
        f"({format_bytes(write.node_bytes)} from the busiest node, {format_time(write.stall_s)}"
        f" a save, every {format_time(before.interval)}); at "
        f"{before.failures / max(before.wall_mean / 86400, 1e-12):.1f} failures a day on "
        f"{replicated.gpus:,} GPUs the run's goodput is {before.goodput:.1%}, and training "
        f"its {replicated.tokens:.3g} tokens takes {lost / 86400:,.2f} days "
        f"({_pct(lost, before.wall_mean)}) longer than with a sharded save "
        f"({format_time(sharded.checkpoint.stall_s)} a save, goodput {after.goodput:.1%})."
    )


def _fix_checkpoint(case: Case) -> Remedy:
    notes = [
        "the step hardly changes: what the fix saves is the run's time, checkpoints and "
        "the work lost to failures between them (parasim plan shows it)"
    ]
    candidates: list[tuple[dict[str, Any], str]] = [
        (
            {"run.checkpoint.sharded": True},
            "save sharded: every rank writes its share of the state "
            "(torch.distributed.checkpoint, Megatron-Core's fully parallel save)",
        ),
        (
            {"training.sharding": "optimizer"},
            "shard the optimizer (ZeRO-1): its checkpoint is sharded with it",
        ),
    ]
    return Remedy(case.options(candidates), notes)


# ------------------------------------------------------------------- sharding


#: Exposed data-parallel communication above this share of the step makes full sharding
#: across nodes worth narrowing to HSDP.
FSDP_EXPOSED = 0.05


def _check_fsdp_across_nodes(case: Case) -> Symptom | None:
    layout, per_node = case.layout, case.per_node
    recipe = case.scenario.recipe
    if not recipe.shards_weights or layout.dp_shard or layout.cp > 1:
        return None
    spanning, _ = _spanning(layout, "dp", per_node)
    if not spanning:
        return None
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("dp", 0.0)
    if exposed <= FSDP_EXPOSED * case.step:
        return None
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    return Symptom(
        f"full sharding over all {layout.dp} data-parallel ranks, across {nodes} nodes: every "
        f"layer's weights are gathered twice and its gradients reduce-scattered over the "
        f"network, and {format_time(exposed)} ({_pct(exposed, case.step)}) of the step is "
        "exposed data-parallel communication."
    )


def _fix_fsdp_across_nodes(case: Case) -> Remedy:
    layout, per_node = case.layout, case.per_node
    dp_group = layout.members(layout.group_name("dp", 0))
    inside = sum(1 for rank in dp_group if rank // per_node == dp_group[0] // per_node)
    candidates = []
    # the shard group over one node, then two, four... nodes: a shard over fewer ranks
    # holds more of the model, so the narrowest one that fits is found among them
    shard = inside
    while shard < layout.dp:
        if shard > 1 and layout.dp % shard == 0:
            span = "one node" if shard == inside else f"{shard // inside} nodes"
            candidates.append(
                (
                    {"parallel.dp_shard": shard},
                    f"HSDP: shard over {shard} ranks ({span}), replicate across "
                    f"{layout.dp // shard} groups",
                )
            )
        shard *= 2
    notes: list[str] = []
    return Remedy(case.options(candidates, notes, rescue=False), notes)


def _check_cp_across_nodes(case: Case) -> Symptom | None:
    layout, per_node = case.layout, case.per_node
    if layout.cp == 1:
        return None
    spanning, total = _spanning(layout, "cp", per_node)
    if not spanning:
        return None
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("cp", 0.0)
    if exposed <= FSDP_EXPOSED * case.step:
        return None
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    kind = case.scenario.recipe.cp_kind
    what = "passes its K/V blocks" if kind == "ring" else "runs its all-to-alls"
    return Symptom(
        f"cp({layout.cp}) with tp({layout.tp}): each context-parallel group spans {nodes} "
        f"nodes, so attention {what} over the network and {format_time(exposed)} "
        f"({_pct(exposed, case.step)}) of the step is exposed CP communication."
    )


def _fix_cp_across_nodes(case: Case) -> Remedy:
    layout, per_node, model = case.layout, case.per_node, case.scenario.model
    candidates: list[tuple[dict[str, Any], str]] = []
    inside = per_node // layout.tp
    if 1 < inside < layout.cp and layout.cp % inside == 0:
        rest = layout.cp // inside
        if model.layers % (layout.pp * rest) == 0:
            candidates.append(
                (
                    {"parallel.cp": inside, "parallel.pp": layout.pp * rest},
                    f"cp {inside} inside each node, pp {layout.pp * rest} across nodes",
                )
            )
        candidates.append(
            (
                {"parallel.cp": inside, "parallel.dp": layout.dp * rest},
                f"cp {inside} inside each node, dp {layout.dp * rest} across nodes",
            )
        )
    if case.scenario.recipe.cp_kind == "ring":
        candidates.append(
            ({"parallel.cp_kind": "ulysses"}, "Ulysses: two all-to-alls per attention instead")
        )
    notes: list[str] = []
    return Remedy(case.options(candidates, notes), notes)


# ------------------------------------------------------------------------ the registry

#: Every mistake, in the order explain checks them and reports their findings.
MISTAKES: tuple[Mistake, ...] = (
    Mistake(
        id="tp-beyond-nvlink",
        title="TP degree larger than the NVLink domain",
        when="tp is larger than a node, so TP crosses nodes (also reported as `tp-across-nodes`)",
        check=_check_tp_beyond_nvlink,
        fix=_fix_tp_beyond_nvlink,
        also=("tp-across-nodes",),
    ),
    Mistake(
        id="layering-backwards",
        title="layering backwards: DP or PP inside the node, TP across nodes",
        when=(
            "DP or PP is innermost in the placement while TP groups cross nodes (also `tp-across-"
            "nodes`)"
        ),
        check=_check_layering_backwards,
        fix=_fix_layering_backwards,
        teaching="layering",
        also=("tp-across-nodes",),
        unless=("tp-beyond-nvlink",),
    ),
    Mistake(
        id="tp-across-nodes",
        title="tensor parallelism across nodes",
        when="TP groups cross nodes for any other reason (tp does not tile the node)",
        check=_check_tp_across_nodes,
        fix=_fix_tp_across_nodes,
        teaching="tp-across-nodes",
        unless=("tp-beyond-nvlink", "layering-backwards"),
    ),
    Mistake(
        id="dp-only-oom",
        title="data parallelism alone does not fit the model",
        when="tp = pp = 1 and the weights, gradients and optimizer state do not fit",
        check=_check_dp_only_oom,
        fix=_fix_dp_only_oom,
        teaching="dp-oom",
        choose="first",
        memory=True,
    ),
    Mistake(
        id="sp-off-activation-bound",
        title="sequence parallelism off while activations fill the GPU",
        when=(
            "tp > 1, SP off, and activations dominate a GPU more than half full, or push it out "
            "of memory"
        ),
        check=_check_sp,
        fix=_fix_sp,
        teaching="sp-memory",
        choose="first",
        memory=True,
    ),
    Mistake(
        id="too-few-microbatches",
        title="too few micro-batches for the pipeline",
        when="a pipeline whose reference bubble and simulated bubble both exceed 10% of the step",
        check=_check_microbatches,
        fix=_fix_microbatches,
        teaching="pipeline-bubble",
        choose="first",
    ),
    Mistake(
        id="ep-routing-spread",
        title="expert all-to-all spread over more nodes than routing needs",
        when=(
            "an expert-parallel group spans nodes, routing is not node-limited and more than 5% "
            "of the step is exposed EP communication (fix: `moe.max_nodes_per_token`; also `ep-"
            "across-nodes`)"
        ),
        check=_check_ep_routing,
        fix=_fix_ep_routing,
        teaching="ep-routing",
        also=("ep-across-nodes",),
    ),
    Mistake(
        id="ep-across-nodes",
        title="expert-parallel all-to-all across nodes",
        when=(
            "an expert-parallel group spans nodes where a placement or a smaller ep would keep it"
            " inside one and fit"
        ),
        check=_check_ep,
        fix=_fix_ep,
        unless=("ep-routing-spread",),
    ),
    Mistake(
        id="ep-comm-not-overlapped",
        title="expert all-to-alls across nodes left exposed by the pipeline schedule",
        when=(
            "an expert-parallel group spans nodes, more than 5% of the step is exposed EP "
            "communication and the pipeline schedule runs one micro-batch at a time (fix: "
            "DualPipeV, which overlaps one micro-batch's all-to-alls with another's compute)"
        ),
        check=_check_ep_overlap,
        fix=_fix_ep_overlap,
    ),
    Mistake(
        id="fsdp-across-nodes",
        title="full sharding across nodes where HSDP fits",
        when=(
            "full sharding over a data-parallel group that spans nodes, with more than 5% of the "
            "step exposed data-parallel communication (fix: HSDP)"
        ),
        check=_check_fsdp_across_nodes,
        fix=_fix_fsdp_across_nodes,
        teaching="fsdp-across-nodes",
        choose="fastest",
    ),
    Mistake(
        id="cp-across-nodes",
        title="context parallelism across nodes that cannot hide its traffic",
        when=(
            "a context-parallel group spans nodes and more than 5% of the step is exposed CP "
            "communication"
        ),
        check=_check_cp_across_nodes,
        fix=_fix_cp_across_nodes,
        teaching="cp-across-nodes",
    ),
    Mistake(
        id="routing-skew",
        title="routing imbalance stalls the step behind the busiest expert",
        when="the critical rank waits more than 10% of the step for the busiest expert",
        check=_check_routing,
        fix=_fix_routing,
        teaching="moe-imbalance",
        choose="first",
    ),
    Mistake(
        id="checkpoint-loses-at-scale",
        title="a replicated checkpoint that loses the run at scale",
        when=(
            "the scenario has a run: whose checkpoint one data-parallel replica writes, and a "
            "sharded save would train it more than 1% sooner under its failures"
        ),
        check=_check_checkpoint,
        fix=_fix_checkpoint,
        choose="first",
    ),
    Mistake(
        id="out-of-memory",
        title="the layout does not fit GPU memory",
        when="any other layout that does not fit",
        check=_check_oom,
        fix=_fix_oom,
        choose="first",
        memory=True,
        unless=("dp-only-oom", "sp-off-activation-bound"),
    ),
)

#: The registry by id.
MISTAKE_BY_ID: dict[str, Mistake] = {mistake.id: mistake for mistake in MISTAKES}
#: The id of every mistake, in registry order.
FINDING_IDS: tuple[str, ...] = tuple(MISTAKE_BY_ID)
#: The mistakes about memory: their charts show memory per GPU against capacity.
MEMORY_FINDINGS: tuple[str, ...] = tuple(m.id for m in MISTAKES if m.memory)
