"""Find layering mistakes in a scenario and quantify each one against its fix.

``parasim explain SCENARIO`` simulates one step of the scenario, looks for the failure
modes of each parallel axis, and for every mistake it finds builds the corrected
scenario, simulates that too and reports what the mistake costs. The mistakes, what each
one checks and how each is fixed, are the registry of :mod:`simulator.tools.mistakes`;
this module is the machinery around it: the scenario under examination (:class:`_Case`,
which implements :class:`~simulator.tools.mistakes.Case`), the simulated fix chosen
among the registry's options, and the result as data, an :class:`Explanation` holding
one :class:`Finding` per mistake found.

Every fix is a set of scenario overrides (``--set key.path=value``) that changes how the
run is laid out, never what it trains. Candidate fixes are checked for memory with
:func:`~simulator.analysis.memory.memory_per_rank` before any is simulated, and the fix
is chosen among those that keep the recipe and fit; a candidate that changes the recipe
(:func:`~simulator.tools.mistakes.changes_recipe`: the global batch, the model...) is
simulated and one that does not fit is priced by its memory, and both are shown apart
(``Finding.set_apart``), never proposed. Both the scenario and the fix run through
:func:`~simulator.run.simulate.run_scenario`, in analytic fidelity unless asked otherwise, so the
step times, the breakdown (``compute``, ``exposed_comm``, ``bubble``, ``imbalance_stall``,
``other``) and memory before and after are the simulator's own numbers. A TP finding caused
by tp > node or a backwards placement names ``tp-across-nodes`` in ``also``, so one problem
is reported once. The command exits 0 when nothing is wrong and 1 when something is.

Nothing here prints or writes: :mod:`simulator.report.explain_report` prints the report
and writes ``explain.json`` (what ``--json`` prints) and ``explain.html``, and
:mod:`simulator.cli.explain` is the command.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import MemoryEstimate, StepResult
from simulator.common.errors import ParasimError
from simulator.request.layout import Layout
from simulator.request.scenario import Scenario, load_scenario, scenario_from_dict
from simulator.run.simulate import check_request_size, run_scenario
from simulator.tools.mistakes import (
    BUBBLE_TARGET,
    CAPACITY_FIX,
    FINDING_IDS,
    MISTAKES,
    NO_FASTER_FIX,
    SP_PRESSURE,
    STALL_SHARE,
    Mistake,
    Option,
    Remedy,
    Symptom,
    changes_recipe,
)
from topologies.units import format_bytes, format_time

__all__ = [
    "BUBBLE_TARGET",
    "STALL_SHARE",
    "CAPACITY_FIX",
    "SP_PRESSURE",
    "MOVED_SHARE",
    "FINDING_IDS",
    "MISTAKES",
    "Finding",
    "Explanation",
    "snapshot",
    "set_args",
    "diagnose",
    "explain",
]

#: A category moves in a finding when it changes by more than this share of the step.
MOVED_SHARE = 0.01


@dataclass
class Finding:
    """One mistake: what is wrong, the fix as overrides, and the simulated before/after.

    ``before`` and ``after`` are :func:`snapshot` dicts; ``after`` is None when no fix
    that keeps the recipe and fits in memory was found. ``cost_s`` is the step time the
    mistake costs (before − after), None when the scenario does not fit memory, where its
    step time cannot be had at all. ``moved`` lists the categories that changed;
    ``set_apart`` the candidates that change the recipe or do not fit.
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
    #: candidates not proposed: each with its ``reason`` ("changes the recipe", "does
    #: not fit"), the recipe fields it ``changes``, its memory and, where simulated, its
    #: step time
    set_apart: list[dict[str, Any]] = field(default_factory=list)

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
            "set_apart": list(self.set_apart),
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


def _assign(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    *parents, last = key.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = copy.deepcopy(value)


def snapshot(scenario: Scenario, result: StepResult) -> dict[str, Any]:
    """The numbers of a run that explain compares: step time, layout, the breakdown of the
    critical rank and the mean (with exposed communication per axis), memory and MoE."""
    rows = result.per_rank
    critical_rank = result.breakdown.critical_rank
    critical_row = next(row for row in rows if row.rank == critical_rank)
    mean_axes: dict[str, float] = {}
    for row in rows:
        for axis, seconds in row.exposed_comm_by_axis.items():
            mean_axes[axis] = mean_axes.get(axis, 0.0) + seconds / len(rows)
    memory = result.memory
    peak = next(s for s in memory.per_stage if s.stage == memory.peak_stage)
    recipe, training = scenario.recipe, scenario.training
    moe = result.moe
    return {
        "step_time_s": result.step_time_s,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "layout": {
            **recipe.knobs(),
            "global_batch": training.global_batch,
            "microbatches": recipe.microbatches,
            "optimizer_sharding": recipe.shards_optimizer,
            "sharding": recipe.sharding,
        },
        "breakdown": {
            "critical": dict(result.breakdown.critical),
            "mean": dict(result.breakdown.mean),
        },
        "exposed_comm_by_axis": {
            "critical": dict(critical_row.exposed_comm_by_axis),
            "mean": dict(sorted(mean_axes.items())),
        },
        "memory": {
            "peak_bytes_per_gpu": memory.peak_bytes_per_gpu,
            "capacity_bytes": memory.capacity_bytes,
            "oom": memory.oom,
            "dominant_term": memory.dominant_term,
            "peak_stage": memory.peak_stage,
            "terms_bytes": dict(peak.terms_bytes),
        },
        "moe": None
        if not moe
        else {
            "capacity_factor": scenario.moe.capacity_factor if scenario.moe else None,
            "dropped_fraction": moe.dropped_fraction,
            "imbalance_mean": moe.imbalance_mean,
            "imbalance_max": moe.imbalance_max,
        },
    }


# ------------------------------------------------------------------------ the case


class _Case:
    """The scenario under examination, its simulated step, and its variants: the
    :class:`~simulator.tools.mistakes.Case` the registry's checks and fixes read."""

    def __init__(
        self, raw: dict[str, Any], source: str, base_dir: Path | None, fidelity: str | None
    ):
        self.raw = copy.deepcopy(raw)
        if fidelity is not None:
            _assign(self.raw, "simulation.fidelity", fidelity)
        self.source, self.base_dir = source, base_dir
        self.scenario = scenario_from_dict(self.raw, source=source, base_dir=base_dir)
        self.fidelity = self.scenario.spec.simulation.fidelity
        self.result = run_scenario(self.scenario, labelled=False).result
        self.before = snapshot(self.scenario, self.result)
        self.per_node = self.scenario.cluster_spec.gpus_per_node
        self._runs: dict[str, dict[str, Any]] = {}

    @property
    def layout(self) -> Layout:
        return self.scenario.layout

    @property
    def step(self) -> float:
        return self.result.step_time_s

    @property
    def memory(self) -> MemoryEstimate:
        return self.result.memory

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
        accept: Callable[[Scenario], bool] | None = None,
        rescue: bool = True,
    ) -> list[Option]:
        """Valid candidates that fit memory, in order, with a note for each one rejected
        for memory; ``accept(scenario)`` filters further. When none fits, each is tried
        again with ZeRO-1 (``rescue``), and failing that all valid ones are returned."""
        valid: list[Option] = []
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
                capacity = scenario.cluster_spec.gpu.hbm_capacity
                memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, capacity)
            except ParasimError:
                continue
            valid.append(Option(fix, summary, scenario, memory))
        fitting = [o for o in valid if not o.memory.oom]
        if not fitting and valid and rescue and not self.scenario.recipe.shards_optimizer:
            zero1 = {"training.sharding": "optimizer"}
            rescued = self.options(
                [(o.fix | zero1, f"{o.summary}, with ZeRO-1") for o in valid],
                accept=accept,
                rescue=False,
            )
            if rescued and not rescued[0].memory.oom:
                fitting = rescued
        if notes is not None and fitting:
            for option in valid:
                if option.memory.oom:
                    notes.append(
                        f"not proposed, out of memory: {' '.join(set_args(option.fix))} "
                        f"({option.summary}) needs "
                        f"{format_bytes(option.memory.peak_bytes_per_gpu)} per GPU of "
                        f"{format_bytes(option.memory.capacity_bytes)}"
                    )
        return fitting or valid

    def simulate(self, option: Option) -> dict[str, Any]:
        key = repr(sorted(option.fix.items()))
        if key not in self._runs:
            self._runs[key] = snapshot(
                option.scenario, run_scenario(option.scenario, labelled=False).result
            )
        option.snap = self._runs[key]
        return option.snap


# --------------------------------------------------------------------- the finding


def _same_work_step(before: dict[str, Any], after: dict[str, Any]) -> float:
    """``after``'s step time scaled to ``before``'s global batch (a candidate that
    changes the batch is set apart with its time per the scenario's sequences)."""
    return after["step_time_s"] * before["layout"]["global_batch"] / after["layout"]["global_batch"]


def _moved(
    before: dict[str, Any], after: dict[str, Any], focus: str, memory: bool
) -> list[dict[str, Any]]:
    """Categories (exposed communication per axis) that changed by more than
    ``MOVED_SHARE`` of the step, largest change first; memory and MoE drops after."""
    threshold = MOVED_SHARE * before["step_time_s"]
    items: list[dict[str, Any]] = []
    for category in CATEGORIES:
        b, a = before["breakdown"][focus][category], after["breakdown"][focus][category]
        if abs(a - b) <= threshold:
            continue
        if category == "exposed_comm":
            axes_b = before["exposed_comm_by_axis"][focus]
            axes_a = after["exposed_comm_by_axis"][focus]
            added = False
            for axis in sorted(set(axes_b) | set(axes_a)):
                ab, aa = axes_b.get(axis, 0.0), axes_a.get(axis, 0.0)
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
        item["text"] = f"{label} {format_time(item['before'])} → {format_time(item['after'])}"
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


def _set_apart(option: Option, reason: str, before: dict[str, Any]) -> dict[str, Any]:
    """A candidate fix that is not proposed, with why and its numbers: the recipe
    fields it changes, its memory per GPU against capacity (simulated, or else
    estimated) and, where it was simulated, its step time and that time per the
    scenario's global batch."""
    snap = option.snap
    memory = snap["memory"] if snap is not None else dataclasses.asdict(option.memory)
    return {
        "fix": dict(option.fix),
        "fix_set": set_args(option.fix),
        "summary": option.summary,
        "reason": reason,
        "changes": changes_recipe(option.fix),
        "peak_bytes_per_gpu": memory["peak_bytes_per_gpu"],
        "capacity_bytes": memory["capacity_bytes"],
        "oom": memory["oom"],
        "step_time_s": None if snap is None else snap["step_time_s"],
        "same_work_step_s": None if snap is None else _same_work_step(before, snap),
    }


def _snap(option: Option) -> dict[str, Any]:
    """The snapshot of an option :func:`_finding` proposes (simulated: not None)."""
    return cast("dict[str, Any]", option.snap)


def _finding(case: _Case, mistake: Mistake, symptom: Symptom, remedy: Remedy) -> Finding:
    """Simulate the remedy's options, pick the fix (the first, or the fastest, as the
    mistake says) among those that keep the recipe and fit in memory, and assemble the
    finding; the options that change the recipe (simulated) or do not fit are set apart
    with their numbers."""
    id, problem = mistake.id, symptom.problem
    title = mistake.title if symptom.title is None else symptom.title
    notes = list(remedy.notes)
    before = case.before
    recipe = [o for o in remedy.options if changes_recipe(o.fix)]
    layouts = [o for o in remedy.options if not changes_recipe(o.fix)]
    for option in recipe + [o for o in layouts if not o.memory.oom]:
        case.simulate(option)
    options = [o for o in layouts if o.snap is not None and not o.snap["memory"]["oom"]]
    set_apart = [_set_apart(o, "changes the recipe", before) for o in recipe] + [
        _set_apart(o, "does not fit", before) for o in layouts if o not in options
    ]

    def without_fix(summary: str) -> Finding:
        return Finding(
            id,
            title,
            problem,
            {},
            summary,
            before,
            None,
            None,
            None,
            [],
            notes,
            [],
            [],
            set_apart,
        )

    if not options:
        return without_fix(remedy.no_fix)
    if mistake.choose == "fastest":
        chosen = min(options, key=lambda o: _snap(o)["step_time_s"])
    else:
        chosen = options[0]
    after = chosen.snap
    assert after is not None
    if (
        mistake.choose == "fastest"
        and not mistake.memory
        and not before["memory"]["oom"]
        and after["step_time_s"] >= before["step_time_s"]
    ):
        # a speed mistake whose every remedy is slower is not worth fixing this way
        tried = "; ".join(
            f"{' '.join(set_args(o.fix))} ({o.summary}) "
            f"takes {format_time(_snap(o)['step_time_s'])}"
            for o in options
        )
        notes.append(
            f"every fix tried is slower than the {format_time(before['step_time_s'])} step: {tried}"
        )
        return without_fix(NO_FASTER_FIX)
    cost_s = cost_pct = None
    if not before["memory"]["oom"]:
        cost_s = before["step_time_s"] - after["step_time_s"]
        cost_pct = 100 * cost_s / before["step_time_s"]
    alternatives = [
        {
            "fix": dict(o.fix),
            "fix_set": set_args(o.fix),
            "summary": o.summary,
            "step_time_s": _snap(o)["step_time_s"],
            "peak_bytes_per_gpu": _snap(o)["memory"]["peak_bytes_per_gpu"],
            "oom": _snap(o)["memory"]["oom"],
        }
        for o in options
        if o is not chosen
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
        moved=_moved(before, after, "critical", mistake.memory),
        notes=notes,
        alternatives=alternatives,
        also=list(mistake.also),
        set_apart=set_apart,
    )


# ------------------------------------------------------------------------- the API


def diagnose(
    scenario: Scenario | str | Path,
    overrides: list[str] | None = None,
    *,
    fidelity: str | None = "analytic",
    base_dir: Path | None = None,
) -> Explanation:
    """Simulate ``scenario`` (a resolved :class:`Scenario` or a YAML path), check it for
    every mistake of the registry in order, and return every finding with its simulated
    fix. ``fidelity`` None keeps the scenario's own."""
    if isinstance(scenario, str | Path):
        path = Path(scenario)
        simulated = [*(overrides or []), *([f"simulation.fidelity={fidelity}"] if fidelity else [])]
        check_request_size(path, simulated, forceable=False)  # before loading lays out ranks
        scenario = load_scenario(path, overrides)
        base_dir = path.parent if base_dir is None else base_dir
    elif overrides:
        raise ParasimError("explain: overrides apply to a scenario file, not a loaded scenario")
    if fidelity not in (None, "analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow, got {fidelity!r}")
    raw = scenario.spec.model_dump(mode="json", exclude_unset=True)
    case = _Case(raw, scenario.name, base_dir, fidelity)
    findings: list[Finding] = []
    for mistake in MISTAKES:
        # a memory mistake is moot only where the finding before it has a fix that fits
        if any(f.id in mistake.unless and (f.after or not mistake.memory) for f in findings):
            continue
        symptom = mistake.check(case)
        if symptom is not None:
            findings.append(_finding(case, mistake, symptom, mistake.fix(case)))
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
