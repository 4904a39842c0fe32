"""Find layering mistakes in a scenario and quantify each one against its fix.

``parasim explain SCENARIO`` simulates one step of the scenario, looks for the failure
modes of each parallel axis, and for every mistake it finds builds the corrected
scenario, simulates that too and reports what the mistake costs:

========================  ==================================================================
finding                   when
========================  ==================================================================
tp-beyond-nvlink          ``tp`` is larger than a node (the NVLink domain), so TP crosses
                          nodes; fix: ``tp`` = GPUs per node, the pipeline (or DP, if it
                          fits) absorbs the rest
layering-backwards        DP or PP placed innermost (inside the node) while TP groups
                          cross nodes; fix: a placement with TP innermost
tp-across-nodes           TP groups cross nodes for any other reason; fix: placement, or a
                          smaller ``tp`` that divides the node
dp-only-oom               data parallel only and the replica does not fit; fix: the smallest
                          ``tp`` (≤ GPUs per node), then ``pp``, that fits
sp-off-activation-bound   ``tp > 1`` without sequence parallelism while activations dominate
                          a GPU under memory pressure, or push it out of memory; fix: SP
too-few-microbatches      a pipeline whose reference bubble ``(p−1)/(v·m+p−1)`` and
                          simulated bubble both exceed 10%; fix: more micro-batches
ep-across-nodes           an expert-parallel group spans nodes, so every MoE layer's
                          all-to-alls cross the network; fix: placement or a smaller ``ep``
routing-skew              waiting for the busiest expert (``imbalance_stall``) exceeds 10%
                          of the step; fix: ``capacity_factor`` 1.25
out-of-memory             any other layout that does not fit; fix: the first of ZeRO-1,
                          more recompute, larger ``tp``, larger ``pp`` that fits
========================  ==================================================================

Every fix is a set of scenario overrides (``--set key.path=value``). Candidate fixes are
checked for memory with :func:`~simulator.analysis.memory.memory_per_rank` before any is simulated,
and the fix is chosen among those that fit. Both the scenario and the fix run through
:func:`~simulator.run.simulate.run_scenario`, in analytic fidelity unless asked otherwise, so the
step times, the breakdown (``compute``, ``exposed_comm``, ``bubble``, ``imbalance_stall``,
``other``) and memory before and after are the simulator's own numbers. A TP finding caused
by tp > node or a backwards placement names ``tp-across-nodes`` in ``also``, so one problem
is reported once. The command exits 0 when nothing is wrong and 1 when something is.

Like ``parasim sweep`` and ``scale``, the command also writes its files to ``--out``
(default ``out/<scenario>-explain``): ``explain.json``, what ``--json`` prints, and
``explain.html``, each finding's mistake and fix side by side in one offline page
(:mod:`simulator.report.explain_report`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import CATEGORIES
from simulator.common.errors import ParasimError
from simulator.request.layout import Layout
from simulator.request.scenario import Scenario, load_scenario, scenario_from_dict
from simulator.run.simulate import run_scenario, step_config
from topologies.units import format_bytes, format_time

__all__ = [
    "BUBBLE_TARGET",
    "STALL_SHARE",
    "CAPACITY_FIX",
    "SP_PRESSURE",
    "FINDING_IDS",
    "Finding",
    "Explanation",
    "snapshot",
    "set_args",
    "describe_layout",
    "describe_memory",
    "cost_text",
    "diagnose",
    "explain",
    "print_explanation",
    "write_outputs",
]

#: A pipeline's bubble above this share of the step is a finding, and the fix aims at it.
BUBBLE_TARGET = 0.10
#: Waiting for the busiest expert above this share of the step is a finding.
STALL_SHARE = 0.10
#: The capacity factor proposed for a skewed router (GShard/Switch's usual 1.25).
CAPACITY_FIX = 1.25
#: Activations dominating more than this share of a GPU's memory make SP worth turning on.
SP_PRESSURE = 0.5
#: A category moves in a finding when it changes by more than this share of the step.
MOVED_SHARE = 0.01

FINDING_IDS = (
    "tp-beyond-nvlink",
    "layering-backwards",
    "tp-across-nodes",
    "dp-only-oom",
    "sp-off-activation-bound",
    "too-few-microbatches",
    "ep-across-nodes",
    "routing-skew",
    "out-of-memory",
)
_STATE_TERMS = ("weights", "gradients", "optimizer_state")


@dataclass
class Finding:
    """One mistake: what is wrong, the fix as overrides, and the simulated before/after.

    ``before`` and ``after`` are :func:`snapshot` dicts; ``after`` is None when no fix can
    be expressed as overrides. ``cost_s`` is the step time the mistake costs (before −
    after, per the same global batch), None when the scenario does not fit memory, where
    its step time cannot be had at all. ``moved`` lists the categories that changed.
    """

    id: str
    title: str
    problem: str
    fix: dict[str, Any]
    fix_summary: str
    before: dict[str, Any]
    after: dict[str, Any] | None
    cost_s: float | None
    cost_pct: float | None
    moved: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    also: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        """This finding's id and the more general diagnoses it is an instance of."""
        return [self.id, *self.also]

    @property
    def set_args(self) -> list[str]:
        """The fix as ``--set`` arguments."""
        return set_args(self.fix)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "also": list(self.also),
            "title": self.title,
            "problem": self.problem,
            "fix": dict(self.fix),
            "fix_set": self.set_args,
            "fix_summary": self.fix_summary,
            "before": self.before,
            "after": self.after,
            "cost_s": self.cost_s,
            "cost_pct": self.cost_pct,
            "moved": list(self.moved),
            "notes": list(self.notes),
            "alternatives": list(self.alternatives),
        }


@dataclass
class Explanation:
    """What ``parasim explain`` found in one scenario; ``result`` is the :func:`snapshot`
    of the scenario as given, ``findings`` is empty when nothing is wrong."""

    scenario: str
    fidelity: str
    result: dict[str, Any]
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "fidelity": self.fidelity,
            "ok": self.ok,
            "result": self.result,
            "findings": [f.to_dict() for f in self.findings],
        }


# ----------------------------------------------------------------------------- helpers


def set_args(fix: dict[str, Any]) -> list[str]:
    """``{"parallel.tp": 8}`` → ``["parallel.tp=8"]`` (values written as YAML)."""
    return [f"{key}={_yaml(value)}" for key, value in fix.items()]


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_yaml(v) for v in value) + "]"
    return str(value)


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


def _assign(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = copy.deepcopy(value)


def snapshot(scenario: Scenario, result: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a run that explain compares: step time, layout, the breakdown of the
    critical rank and the mean (with exposed communication per axis), memory and MoE."""
    rows = result["per_rank"]
    critical_rank = result["breakdown"]["critical_rank"]
    critical_row = next(row for row in rows if row["rank"] == critical_rank)
    mean_axes: dict[str, float] = {}
    for row in rows:
        for axis, seconds in row["exposed_comm_by_axis"].items():
            mean_axes[axis] = mean_axes.get(axis, 0.0) + seconds / len(rows)
    memory = result["memory"]
    peak = next(s for s in memory["per_stage"] if s["stage"] == memory["peak_stage"])
    layout, parallel, training = scenario.layout, scenario.parallel, scenario.training
    moe = result.get("moe")
    return {
        "step_time_s": result["step_time_s"],
        "tokens_per_s": result["tokens_per_s"],
        "mfu": result["mfu"],
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "ep": layout.ep,
            "sp": bool(parallel.sp),
            "placement": list(layout.placement),
            "schedule": parallel.schedule,
            "virtual_stages": parallel.virtual_stages,
            "global_batch": training.global_batch,
            "micro_batch": training.micro_batch,
            "microbatches": scenario.microbatches,
            "recompute": training.recompute,
            "optimizer_sharding": training.optimizer_sharding,
        },
        "breakdown": {
            "critical": dict(result["breakdown"]["critical"]),
            "mean": dict(result["breakdown"]["mean"]),
        },
        "exposed_comm_by_axis": {
            "critical": dict(critical_row["exposed_comm_by_axis"]),
            "mean": dict(sorted(mean_axes.items())),
        },
        "memory": {
            "peak_bytes_per_gpu": memory["peak_bytes_per_gpu"],
            "capacity_bytes": memory["capacity_bytes"],
            "oom": memory["oom"],
            "dominant_term": memory["dominant_term"],
            "peak_stage": memory["peak_stage"],
            "terms_bytes": dict(peak["terms_bytes"]),
        },
        "moe": None
        if not moe
        else {
            "capacity_factor": scenario.moe.capacity_factor if scenario.moe else None,
            "dropped_fraction": moe["dropped_fraction"],
            "imbalance_mean": moe["imbalance_mean"],
            "imbalance_max": moe["imbalance_max"],
        },
    }


def describe_layout(layout: dict[str, Any]) -> str:
    """One line for a snapshot's layout: ``tp=8 pp=2 dp=1 · placement tp,dp,pp · …``."""
    parts = [f"tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}"]
    if layout["ep"] > 1:
        parts[0] += f" ep={layout['ep']}"
    if layout["sp"]:
        parts[0] += " +sp"
    parts.append("placement " + ",".join(layout["placement"]))
    if layout["pp"] > 1:
        schedule = layout["schedule"]
        if layout["virtual_stages"] > 1:
            schedule += f" v={layout['virtual_stages']}"
        parts.append(schedule)
    parts.append(f"{layout['microbatches']} × micro-batch {layout['micro_batch']}")
    return " · ".join(parts)


def describe_memory(memory: dict[str, Any]) -> str:
    """One line for a snapshot's memory: peak of capacity, dominant term, verdict."""
    verdict = "OUT OF MEMORY" if memory["oom"] else "fits"
    return (
        f"{format_bytes(memory['peak_bytes_per_gpu'])} of {format_bytes(memory['capacity_bytes'])}"
        f" ({memory['dominant_term']}) · {verdict}"
    )


# ------------------------------------------------------------------------ the case


@dataclass
class _Option:
    fix: dict[str, Any]
    summary: str
    scenario: Scenario
    memory: dict[str, Any]
    snap: dict[str, Any] | None = None


class _Case:
    """The scenario under examination, its simulated step, and its variants."""

    def __init__(
        self, raw: dict[str, Any], source: str, base_dir: Path | None, fidelity: str | None
    ):
        self.raw = copy.deepcopy(raw)
        if fidelity is not None:
            _assign(self.raw, "simulation.fidelity", fidelity)
        self.source, self.base_dir = source, base_dir
        self.scenario = scenario_from_dict(self.raw, source=source, base_dir=base_dir)
        self.fidelity = self.scenario.spec.simulation.fidelity
        self.result = run_scenario(self.scenario).result
        self.before = snapshot(self.scenario, self.result)
        self.per_node = self.scenario.cluster_spec.gpus_per_node
        self._runs: dict[str, dict[str, Any]] = {}

    @property
    def layout(self) -> Layout:
        return self.scenario.layout

    @property
    def step(self) -> float:
        return self.result["step_time_s"]

    @property
    def memory(self) -> dict[str, Any]:
        return self.result["memory"]

    def variant(self, fix: dict[str, Any]) -> Scenario | None:
        """The scenario with ``fix`` applied, or None when that is not a valid scenario."""
        raw = copy.deepcopy(self.raw)
        for key, value in fix.items():
            _assign(raw, key, value)
        try:
            return scenario_from_dict(raw, source=self.source, base_dir=self.base_dir)
        except ParasimError:
            return None

    def options(
        self,
        candidates: list[tuple[dict[str, Any], str]],
        notes: list[str] | None = None,
        accept: Any = None,
        rescue: bool = True,
    ) -> list[_Option]:
        """Valid candidates that fit memory, in order, with a note for each one rejected
        for memory; ``accept(scenario)`` filters further. When none fits, each is tried
        again with ZeRO-1 (``rescue``), and failing that all valid ones are returned."""
        valid: list[_Option] = []
        seen: set[str] = set()
        for fix, summary in candidates:
            key = repr(sorted(fix.items()))
            if key in seen or not fix:
                continue
            seen.add(key)
            scenario = self.variant(fix)
            if scenario is None or (accept is not None and not accept(scenario)):
                continue
            try:
                memory = memory_per_rank(
                    step_config(scenario), scenario.cluster_spec.gpu.hbm_capacity
                )
            except ParasimError:
                continue
            valid.append(_Option(fix, summary, scenario, memory))
        fitting = [o for o in valid if not o.memory["oom"]]
        if not fitting and valid and rescue and not self.scenario.training.optimizer_sharding:
            zero1 = {"training.optimizer_sharding": True}
            rescued = self.options(
                [(o.fix | zero1, f"{o.summary}, with ZeRO-1") for o in valid],
                accept=accept,
                rescue=False,
            )
            if rescued and not rescued[0].memory["oom"]:
                fitting = rescued
        if notes is not None and fitting:
            for option in valid:
                if option.memory["oom"]:
                    notes.append(
                        f"not proposed, out of memory: {' '.join(set_args(option.fix))} "
                        f"({option.summary}) needs "
                        f"{format_bytes(option.memory['peak_bytes_per_gpu'])} per GPU of "
                        f"{format_bytes(option.memory['capacity_bytes'])}"
                    )
        return fitting or valid

    def simulate(self, option: _Option) -> dict[str, Any]:
        key = repr(sorted(option.fix.items()))
        if key not in self._runs:
            self._runs[key] = snapshot(option.scenario, run_scenario(option.scenario).result)
        option.snap = self._runs[key]
        return option.snap


# --------------------------------------------------------------------- the finding


def _same_work_step(before: dict[str, Any], after: dict[str, Any]) -> float:
    """``after``'s step time scaled to ``before``'s global batch."""
    return after["step_time_s"] * before["layout"]["global_batch"] / after["layout"]["global_batch"]


def _moved(
    before: dict[str, Any], after: dict[str, Any], focus: str, memory: bool
) -> list[dict[str, Any]]:
    """Categories (exposed communication per axis) that changed by more than
    ``MOVED_SHARE`` of the step, largest change first; memory and MoE drops after."""
    threshold = MOVED_SHARE * before["step_time_s"]
    # a fix that changes the global batch is compared per the same number of sequences
    scale = before["layout"]["global_batch"] / after["layout"]["global_batch"]
    per = "" if scale == 1 else f" (per {before['layout']['global_batch']} sequences)"
    items: list[dict[str, Any]] = []
    for category in CATEGORIES:
        b, a = before["breakdown"][focus][category], scale * after["breakdown"][focus][category]
        if abs(a - b) <= threshold:
            continue
        if category == "exposed_comm":
            axes_b = before["exposed_comm_by_axis"][focus]
            axes_a = after["exposed_comm_by_axis"][focus]
            added = False
            for axis in sorted(set(axes_b) | set(axes_a)):
                ab, aa = axes_b.get(axis, 0.0), scale * axes_a.get(axis, 0.0)
                if abs(aa - ab) > threshold:
                    items.append({"category": category, "axis": axis, "before": ab, "after": aa})
                    added = True
            if added:
                continue
        items.append({"category": category, "axis": None, "before": b, "after": a})
    items.sort(key=lambda item: -abs(item["after"] - item["before"]))
    for item in items:
        label = item["category"] + (f" ({item['axis']})" if item["axis"] else "")
        item["unit"] = "s"
        item["text"] = f"{label} {format_time(item['before'])} → {format_time(item['after'])}{per}"
    mb, ma = before["memory"], after["memory"]
    if (
        memory
        or abs(ma["peak_bytes_per_gpu"] - mb["peak_bytes_per_gpu"]) > 0.01 * (mb["capacity_bytes"])
    ):
        items.append(
            {
                "category": "memory",
                "axis": None,
                "before": mb["peak_bytes_per_gpu"],
                "after": ma["peak_bytes_per_gpu"],
                "unit": "bytes",
                "text": f"memory {format_bytes(mb['peak_bytes_per_gpu'])} → "
                f"{format_bytes(ma['peak_bytes_per_gpu'])} per GPU "
                f"(capacity {format_bytes(ma['capacity_bytes'])})",
            }
        )
    if before["moe"] and after["moe"]:
        db, da = before["moe"]["dropped_fraction"], after["moe"]["dropped_fraction"]
        if abs(da - db) > 1e-9:
            items.append(
                {
                    "category": "moe_dropped",
                    "axis": None,
                    "before": db,
                    "after": da,
                    "unit": "fraction",
                    "text": f"dropped token assignments {100 * db:.1f}% → {100 * da:.1f}%",
                }
            )
    return items


def _finding(
    case: _Case,
    id: str,
    title: str,
    problem: str,
    options: list[_Option],
    *,
    choose: str = "fastest",
    memory: bool = False,
    notes: list[str] | None = None,
    also: tuple[str, ...] = (),
    no_fix: str = "no layout change that fits was found",
) -> Finding:
    """Simulate the options, pick the fix (the first, or the fastest) and assemble."""
    notes = list(notes or [])
    before = case.before
    if not options:
        return Finding(id, title, problem, {}, no_fix, before, None, None, None, [], notes, [], [])
    for option in options:
        case.simulate(option)
    if choose == "fastest":
        chosen = min(options, key=lambda o: _same_work_step(before, o.snap))
    else:
        chosen = options[0]
    after = chosen.snap
    assert after is not None
    cost_s = cost_pct = None
    if not before["memory"]["oom"]:
        cost_s = before["step_time_s"] - _same_work_step(before, after)
        cost_pct = 100 * cost_s / before["step_time_s"]
    if after["layout"]["global_batch"] != before["layout"]["global_batch"]:
        notes.append(
            f"the fix changes global_batch from {before['layout']['global_batch']} to "
            f"{after['layout']['global_batch']}: the cost compares the time per sequence"
        )
    if after["memory"]["oom"]:
        notes.append("even the fix does not fit memory: see the other findings")
    alternatives = [
        {
            "fix": dict(o.fix),
            "fix_set": set_args(o.fix),
            "summary": o.summary,
            "step_time_s": o.snap["step_time_s"],
            "peak_bytes_per_gpu": o.snap["memory"]["peak_bytes_per_gpu"],
            "oom": o.snap["memory"]["oom"],
        }
        for o in options
        if o is not chosen and o.snap is not None
    ]
    return Finding(
        id=id,
        title=title,
        problem=problem,
        fix=dict(chosen.fix),
        fix_summary=chosen.summary,
        before=before,
        after=after,
        cost_s=cost_s,
        cost_pct=cost_pct,
        moved=_moved(before, after, "critical", memory),
        notes=notes,
        alternatives=alternatives,
        also=list(also),
    )


# ------------------------------------------------------------------------- the rules


def _reduce_tp(case: _Case, limit: int) -> list[tuple[dict[str, Any], str]]:
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


def _placements(case: _Case) -> list[tuple[dict[str, Any], str]]:
    out = []
    for order in (["tp", "pp", "dp"], ["tp", "dp", "pp"]):
        if order != list(case.layout.placement):
            out.append(
                ({"parallel.placement": order}, f"placement [{', '.join(order)}]: TP innermost")
            )
    return out


def _check_tp(case: _Case) -> list[Finding]:
    layout, per_node = case.layout, case.per_node
    if layout.tp == 1:
        return []
    spanning, total = _spanning(layout, "tp", per_node)
    if not spanning:
        return []
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    axes = case.before["exposed_comm_by_axis"]["critical"]
    exposed = axes.get("tp", 0.0) + axes.get("sp", 0.0)
    fabric = "NVLink" if case.scenario.cluster_spec.nvswitch is not None else "PCIe"
    cost = (
        f"every layer's TP collectives cross the network instead of {fabric}: "
        f"{format_time(exposed)} ({_pct(exposed, case.step)}) of the step is exposed "
        "TP communication"
    )
    groups = f"{len(spanning)} of {total} TP groups" if len(spanning) < total else "every TP group"
    fits_node = lambda s: not _spanning(s.layout, "tp", per_node)[0]  # noqa: E731
    notes: list[str] = []
    if layout.tp > per_node:
        options = case.options(_reduce_tp(case, per_node), notes, accept=fits_node)
        return [
            _finding(
                case,
                "tp-beyond-nvlink",
                f"TP degree {layout.tp} is larger than the {fabric} domain ({per_node} GPUs)",
                f"tp({layout.tp}) > {per_node} GPUs per node, so {groups} spans {nodes} nodes "
                f"and {cost}.",
                options,
                notes=notes,
                also=("tp-across-nodes",),
            )
        ]
    inner = _innermost(layout)
    if inner != "tp":
        options = case.options(_placements(case), notes, accept=fits_node)
        return [
            _finding(
                case,
                "layering-backwards",
                f"layering backwards: {inner.upper()} inside the node, TP across nodes",
                f"placement [{', '.join(layout.placement)}] puts {inner} ({layout.size(inner)}) "
                f"innermost, so {groups} of {layout.tp} spans {nodes} nodes and {cost}.",
                options,
                notes=notes,
                also=("tp-across-nodes",),
            )
        ]
    candidates = _placements(case) + _reduce_tp(case, layout.tp)
    options = case.options(candidates, notes, accept=fits_node)
    return [
        _finding(
            case,
            "tp-across-nodes",
            "tensor parallelism across nodes",
            f"tp({layout.tp}) does not tile the {per_node}-GPU nodes, so {groups} spans "
            f"{nodes} nodes and {cost}.",
            options,
            notes=notes,
        )
    ]


def _peak_terms(memory: dict[str, Any]) -> dict[str, float]:
    return next(s for s in memory["per_stage"] if s["stage"] == memory["peak_stage"])["terms_bytes"]


def _check_dp_only_oom(case: _Case) -> list[Finding]:
    layout, memory = case.layout, case.memory
    if layout.tp != 1 or layout.pp != 1 or not memory["oom"]:
        return []
    terms = _peak_terms(memory)
    states = sum(terms[t] for t in _STATE_TERMS)
    capacity = memory["capacity_bytes"]
    if memory["dominant_term"] not in _STATE_TERMS and states <= capacity:
        return []
    world, per_node = layout.world, case.per_node
    placement: dict[str, Any] = {}
    if layout.placement[0] != "tp":  # TP will be innermost once tp > 1
        placement = {"parallel.placement": _tp_first(layout.placement)}
    notes: list[str] = []
    chosen: list[_Option] = []
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
        if not found[0].memory["oom"]:
            chosen = found
            break
        notes.append(
            f"tp {t} × dp {world // t} would still need "
            f"{format_bytes(found[0].memory['peak_bytes_per_gpu'])} per GPU"
        )
    if not chosen and largest_tp > 1:
        t = largest_tp
        for p in _divisors(case.scenario.model.layers)[1:]:
            if world % (t * p):
                continue
            fix = {"parallel.tp": t, "parallel.pp": p, "parallel.dp": world // (t * p)} | placement
            summary = f"tp {t} × pp {p} × dp {world // (t * p)}: each GPU holds 1/{t * p}"
            found = case.options([(fix, summary)], rescue=False)
            if found and not found[0].memory["oom"]:
                chosen = found
                break
    zero1: list[_Option] = []
    if not case.scenario.training.optimizer_sharding and layout.dp > 1:
        zero1 = case.options(
            [
                (
                    {"training.optimizer_sharding": True},
                    f"ZeRO-1 alone (Adam state split {layout.dp} ways)",
                )
            ],
            rescue=False,
        )
        if zero1 and zero1[0].memory["oom"]:
            notes.append(
                f"ZeRO-1 alone would still need "
                f"{format_bytes(zero1[0].memory['peak_bytes_per_gpu'])} per GPU"
            )
            zero1 = []
    params = memory["per_stage"][0]["parameters"]
    problem = (
        f"data parallelism alone keeps the whole model on every GPU: {params / 1e9:.2f} B "
        f"parameters × 16 bytes of weights, gradients and Adam state take "
        f"{format_bytes(states)} per GPU, plus {format_bytes(terms['activations'])} of "
        f"activations, {format_bytes(memory['peak_bytes_per_gpu'])} in all against "
        f"{format_bytes(capacity)}; the {layout.dp} replicas add throughput, not headroom."
    )
    return [
        _finding(
            case,
            "dp-only-oom",
            "data parallelism alone does not fit the model",
            problem,
            chosen + zero1,
            choose="first",
            memory=True,
            notes=notes,
        )
    ]


def _check_sp(case: _Case) -> list[Finding]:
    layout, memory = case.layout, case.memory
    if layout.tp == 1 or case.scenario.parallel.sp:
        return []
    terms = _peak_terms(memory)
    activations, peak, capacity = (
        terms["activations"],
        memory["peak_bytes_per_gpu"],
        memory["capacity_bytes"],
    )
    dominant = memory["dominant_term"] == "activations"
    pressured = dominant and (memory["oom"] or peak > SP_PRESSURE * capacity)
    out_because = memory["oom"] and peak - activations <= capacity
    if not (pressured or out_because):
        return []
    verdict = "out of memory" if memory["oom"] else f"{_pct(peak, capacity)} of the GPU"
    problem = (
        f"with tp({layout.tp}) and sequence parallelism off, every TP rank keeps the "
        f"norms', dropouts' and residuals' activations for the whole sequence: activations "
        f"take {format_bytes(activations)} of the {format_bytes(peak)} per GPU "
        f"({format_bytes(capacity)} available, {verdict})."
    )
    options = case.options(
        [({"parallel.sp": True}, f"sequence parallelism: those activations split {layout.tp} ways")]
    )
    return [
        _finding(
            case,
            "sp-off-activation-bound",
            "sequence parallelism off while activations fill the GPU",
            problem,
            options,
            choose="first",
            memory=True,
        )
    ]


def _check_microbatches(case: _Case) -> list[Finding]:
    scenario, layout = case.scenario, case.layout
    p = layout.pp
    if p == 1:
        return []
    schedule = scenario.parallel.schedule
    v = scenario.parallel.virtual_stages if schedule == "interleaved-1f1b" else 1
    m = scenario.microbatches
    reference = (p - 1) / (v * m + p - 1)
    bubble = case.result["breakdown"]["critical"]["bubble"]
    if reference <= BUBBLE_TARGET or bubble <= BUBBLE_TARGET * case.step:
        return []
    # (p−1)/(v·m + p−1) ≤ 1/10  ⟺  v·m ≥ 9(p−1)
    needed = math.ceil(9 * (p - 1) / v)
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
    if not candidates:
        m2 = p * math.ceil(needed / p)  # a whole number of rounds (interleaved needs it)
        candidates.append(
            (
                {"training.global_batch": m2 * dp * mb},
                f"global batch {m2 * dp * mb}: {m2} micro-batches",
            )
        )
    problem = (
        f"the {p}-stage pipeline runs only {m} micro-batch{'es' if m != 1 else ''} per step: "
        f"the reference bubble (p−1)/({'v·' if v > 1 else ''}m+p−1) is {_pct(reference, 1)}, "
        f"and the critical rank idles {format_time(bubble)} ({_pct(bubble, case.step)}) of "
        f"the step in the bubble; {needed} micro-batches or more bring the reference "
        f"to {_pct(BUBBLE_TARGET, 1)} or less."
    )
    return [
        _finding(
            case,
            "too-few-microbatches",
            "too few micro-batches for the pipeline",
            problem,
            case.options(candidates),
            choose="first",
        )
    ]


def _check_ep(case: _Case) -> list[Finding]:
    layout, per_node, moe = case.layout, case.per_node, case.scenario.moe
    if moe is None or layout.ep == 1:
        return []
    spanning, total = _spanning(layout, "ep", per_node)
    if not spanning:
        return []
    nodes = max(_nodes_of(m, per_node) for m in spanning)
    exposed = case.before["exposed_comm_by_axis"]["critical"].get("ep", 0.0)
    placement = _tp_first(layout.placement, then="dp")
    extra = {} if placement == list(layout.placement) else {"parallel.placement": placement}
    candidates = []
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
    notes: list[str] = []
    options = case.options(
        candidates, notes, accept=lambda s: not _spanning(s.layout, "ep", per_node)[0]
    )
    groups = f"{len(spanning)} of {total} EP groups" if len(spanning) < total else "every EP group"
    problem = (
        f"ep({layout.ep}) with tp({layout.tp}) and placement [{', '.join(layout.placement)}]: "
        f"{groups} spans {nodes} nodes, so every MoE layer's dispatch and combine all-to-alls "
        f"cross the network: {format_time(exposed)} ({_pct(exposed, case.step)}) of the step "
        "is exposed EP communication."
    )
    return [
        _finding(
            case,
            "ep-across-nodes",
            "expert-parallel all-to-all across nodes",
            problem,
            options,
            notes=notes,
        )
    ]


def _check_routing(case: _Case) -> list[Finding]:
    moe, moe_result = case.scenario.moe, case.result.get("moe")
    if moe is None or not moe_result or case.layout.ep == 1:
        return []
    stall = case.result["breakdown"]["critical"]["imbalance_stall"]
    if stall <= STALL_SHARE * case.step:
        return []
    problem = (
        f"the {moe_result['routing']} router sends the busiest expert "
        f"{moe_result['imbalance_mean']:.2f}× the mean load, and the critical rank waits "
        f"{format_time(stall)} ({_pct(stall, case.step)}) of the step at the all-to-alls for "
        f"the ranks holding the hot experts."
    )
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
    return [
        _finding(
            case,
            "routing-skew",
            "routing imbalance stalls the step behind the busiest expert",
            problem,
            case.options(candidates),
            choose="first",
            notes=notes,
            no_fix=f"the capacity factor is already {moe.capacity_factor}: the router itself "
            "needs balancing (an auxiliary load-balancing loss)",
        )
    ]


def _check_oom(case: _Case, found: list[Finding]) -> list[Finding]:
    memory = case.memory
    if not memory["oom"] or any(f.id in ("dp-only-oom", "sp-off-activation-bound") for f in found):
        return []
    scenario, layout = case.scenario, case.layout
    training = scenario.training
    candidates: list[tuple[dict[str, Any], str]] = []
    if not training.optimizer_sharding and layout.dp > 1:
        candidates.append(({"training.optimizer_sharding": True}, "ZeRO-1: Adam state split"))
    levels = ("none", "selective", "full")
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
    options = [o for o in case.options(candidates, rescue=False) if not o.memory["oom"]][:1]
    terms = _peak_terms(memory)
    problem = (
        f"stage {memory['peak_stage']} needs {format_bytes(memory['peak_bytes_per_gpu'])} per "
        f"GPU against {format_bytes(memory['capacity_bytes'])} ("
        + ", ".join(f"{name} {format_bytes(v)}" for name, v in terms.items() if v > 0)
        + ")."
    )
    return [
        _finding(
            case,
            "out-of-memory",
            "the layout does not fit GPU memory",
            problem,
            options,
            choose="first",
            memory=True,
        )
    ]


_RULES = (_check_tp, _check_dp_only_oom, _check_sp, _check_microbatches, _check_ep, _check_routing)


# ------------------------------------------------------------------------- the API


def diagnose(
    scenario: Scenario | str | Path,
    overrides: list[str] | None = None,
    *,
    fidelity: str | None = "analytic",
    base_dir: Path | None = None,
) -> Explanation:
    """Simulate ``scenario`` (a resolved :class:`Scenario` or a YAML path) and return every
    finding with its simulated fix. ``fidelity`` None keeps the scenario's own."""
    if isinstance(scenario, str | Path):
        path = Path(scenario)
        scenario = load_scenario(path, overrides)
        base_dir = path.parent if base_dir is None else base_dir
    elif overrides:
        raise ParasimError("explain: overrides apply to a scenario file, not a loaded scenario")
    if fidelity not in (None, "analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow, got {fidelity!r}")
    raw = scenario.spec.model_dump(mode="json", exclude_unset=True)
    case = _Case(raw, scenario.name, base_dir, fidelity)
    findings: list[Finding] = []
    for rule in _RULES:
        findings.extend(rule(case))
    findings.extend(_check_oom(case, findings))
    return Explanation(case.scenario.name, case.fidelity, case.before, findings)


def explain(
    scenario: Scenario | str | Path,
    overrides: list[str] | None = None,
    *,
    fidelity: str | None = "analytic",
    base_dir: Path | None = None,
) -> list[Finding]:
    """The findings of :func:`diagnose`: an empty list when nothing is wrong."""
    return diagnose(scenario, overrides, fidelity=fidelity, base_dir=base_dir).findings


# ----------------------------------------------------------------------- printing


def _breakdown_cell(snap: dict[str, Any], category: str, focus: str = "critical") -> str:
    seconds = snap["breakdown"][focus][category]
    text = f"{format_time(seconds)}  {_pct(seconds, snap['step_time_s'])}"
    if category == "exposed_comm":
        axes = [
            f"{axis} {format_time(v)}"
            for axis, v in snap["exposed_comm_by_axis"][focus].items()
            if v > MOVED_SHARE * snap["step_time_s"]
        ]
        if axes:
            text += " (" + ", ".join(axes) + ")"
    return text


def _comparison(before: dict[str, Any], after: dict[str, Any] | None) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("")
    table.add_column("now")
    if after is not None:
        table.add_column("with the fix")
    snaps = [before] if after is None else [before, after]
    table.add_row("layout", *[describe_layout(s["layout"]) for s in snaps])
    table.add_row("step time", *[format_time(s["step_time_s"]) for s in snaps])
    table.add_row("critical rank:", *["" for _ in snaps])
    for category in CATEGORIES:
        table.add_row(f"  {category}", *[_breakdown_cell(s, category) for s in snaps])
    table.add_row("memory per GPU", *[describe_memory(s["memory"]) for s in snaps])
    if before["moe"]:
        table.add_row(
            "MoE",
            *[
                f"busiest expert {s['moe']['imbalance_mean']:.2f}× mean · dropped "
                f"{100 * s['moe']['dropped_fraction']:.1f}%"
                for s in snaps
            ],
        )
    return table


def cost_text(finding: Finding) -> str:
    """The cost of a finding in one line."""
    if finding.after is None:
        return "no fix expressible as scenario overrides"
    after = format_time(finding.after["step_time_s"])
    if finding.cost_s is None:
        verdict = "fits" if not finding.after["memory"]["oom"] else "still does not fit"
        return f"the scenario does not fit memory; the fix {verdict}, at {after} per step"
    if finding.cost_s >= 0:
        return (
            f"the mistake costs {format_time(finding.cost_s)} per step "
            f"({finding.cost_pct:.1f}% of the step)"
        )
    return (
        f"the fix is {format_time(-finding.cost_s)} per step slower "
        f"({-finding.cost_pct:.1f}%), the price of what it buys"
    )


def print_explanation(explanation: Explanation, console: Console) -> None:
    """The human report: a header, then one panel per finding with before/after."""
    snap = explanation.result
    console.print(f"[bold]parasim explain · {explanation.scenario}[/] ({explanation.fidelity})")
    console.print(f"  layout   {describe_layout(snap['layout'])}")
    console.print(f"  step     {format_time(snap['step_time_s'])}")
    console.print(f"  memory   {describe_memory(snap['memory'])}")
    if explanation.ok:
        console.print("[green]No layering mistakes found.[/]")
        return
    count = len(explanation.findings)
    console.print(f"[bold red]{count} problem{'s' if count != 1 else ''} found.[/]")
    for finding in explanation.findings:
        parts: list[Any] = [Text(finding.problem)]
        if finding.fix:
            fix = " ".join(f"--set {arg}" for arg in finding.set_args)
            parts.append(
                Text.assemble(("fix: ", "bold"), (fix, "cyan"), f"  ({finding.fix_summary})")
            )
        else:
            parts.append(Text.assemble(("fix: ", "bold"), finding.fix_summary))
        parts.append(_comparison(finding.before, finding.after))
        parts.append(Text.assemble(("cost: ", "bold"), cost_text(finding)))
        if finding.moved:
            parts.append(
                Text.assemble(("moved: ", "bold"), "; ".join(m["text"] for m in finding.moved))
            )
        for alternative in finding.alternatives:
            parts.append(
                Text(
                    f"also possible: {' '.join(alternative['fix_set'])} ({alternative['summary']})"
                    f": {format_time(alternative['step_time_s'])} per step, "
                    f"{format_bytes(alternative['peak_bytes_per_gpu'])} per GPU",
                    style="dim",
                )
            )
        for note in finding.notes:
            parts.append(Text(f"note: {note}", style="dim"))
        title = f"[bold]{finding.id}[/] · {finding.title}"
        console.print(Panel(Group(*parts), title=title, title_align="left", border_style="red"))


# ---------------------------------------------------------------------- the command


def write_outputs(explanation: Explanation, out: Path) -> list[Path]:
    """Write ``explain.json`` (what ``--json`` prints) and ``explain.html`` to ``out``.

    A folder that cannot be written is bad input (:class:`ParasimError`)."""
    from simulator.report.explain_report import write_explain_outputs

    try:
        return write_explain_outputs(explanation, out)
    except OSError as exc:
        raise ParasimError(f"--out: cannot write to {out}: {exc.strerror or exc}") from exc
