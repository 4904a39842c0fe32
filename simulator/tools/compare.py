"""Compare a predicted step with a measured one: step time, breakdown, op classes.

``parasim compare PREDICTED_DIR MEASURED_DIR`` reads ``result.json`` and ``trace.json``
from both folders (written by ``parasim run`` and ``parasim replay``), and reports

* the step-time error ``(predicted − measured) / measured``;
* the mean breakdown (compute, exposed communication, bubble, ...) side by side;
* per op class — the display category and kind, e.g. ``forward · gemm`` or
  ``comm:tp · all_reduce`` — the time per rank spent in those ops, predicted against
  measured, over the ranks present in both traces;

and :func:`overlay_trace` lays the two timelines over each other, each rank's
predicted lanes above its measured lanes.

This module only compares: reading the run folders, the console table and the files
(``compare.json`` and ``compare.html``) are :mod:`simulator.report.compare_report`'s.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import StepResult
from simulator.analysis.trace import Trace, category_of
from simulator.common.errors import ParasimError

__all__ = [
    "Comparison",
    "StepTimeComparison",
    "CategoryComparison",
    "OpClassComparison",
    "compare_runs",
    "overlay_trace",
    "relative_error",
]


def relative_error(predicted: float, measured: float) -> float | None:
    return None if measured == 0 else (predicted - measured) / measured


def _class_seconds(trace: Trace, ranks: set[int]) -> dict[str, float]:
    """Seconds per op class, averaged over ``ranks``."""
    totals: dict[str, float] = defaultdict(float)
    for record in trace.records:
        if record.rank in ranks:
            totals[f"{category_of(record)} · {record.kind}"] += record.end - record.start
    return {key: value / max(1, len(ranks)) for key, value in sorted(totals.items())}


@dataclass
class StepTimeComparison:
    predicted_s: float
    measured_s: float
    error: float | None


@dataclass
class CategoryComparison:
    category: str
    predicted_s: float
    measured_s: float


@dataclass
class OpClassComparison:
    op_class: str
    predicted_s: float
    measured_s: float
    error: float | None


@dataclass
class Comparison:
    """A predicted step set against a measured one (``compare.json``)."""

    scenario: dict[str, str]
    step_time: StepTimeComparison
    breakdown_mean: list[CategoryComparison]
    op_classes: list[OpClassComparison]
    ranks_compared: list[int]
    # "measured": a prediction against a replay (error = predicted/measured - 1);
    # "what-if": two runs of the same kind, A against B (the error field holds A/B - 1)
    mode: str = "measured"
    labels: tuple[str, str] = ("predicted", "measured")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for row in data["op_classes"]:
            row["class"] = row.pop("op_class")
        return data


def compare_runs(
    predicted: tuple[StepResult, Trace], measured: tuple[StepResult, Trace]
) -> Comparison:
    """The comparison: step time, the mean time per category, and per op class the
    time per rank over the ranks both runs show."""
    (p_result, p_trace), (m_result, m_trace) = predicted, measured
    ranks = set(p_trace.ranks()) & set(m_trace.ranks())
    if not ranks:
        raise ParasimError("the two runs have no rank in common")
    p_classes, m_classes = _class_seconds(p_trace, ranks), _class_seconds(m_trace, ranks)
    classes = []
    for key in sorted(set(p_classes) | set(m_classes)):
        p, m = p_classes.get(key, 0.0), m_classes.get(key, 0.0)
        classes.append(OpClassComparison(key, p, m, relative_error(p, m)))
    breakdown = [
        CategoryComparison(c, p_result.breakdown.mean[c], m_result.breakdown.mean[c])
        for c in CATEGORIES
    ]
    p_step, m_step = p_result.step_time_s, m_result.step_time_s
    what_if = (p_result.measured is None) == (m_result.measured is None)
    return Comparison(
        scenario={"predicted": p_result.scenario, "measured": m_result.scenario},
        step_time=StepTimeComparison(p_step, m_step, relative_error(p_step, m_step)),
        breakdown_mean=breakdown,
        op_classes=classes,
        ranks_compared=sorted(ranks),
        mode="what-if" if what_if else "measured",
        labels=("A", "B") if what_if else ("predicted", "measured"),
    )


def overlay_trace(p_trace: Trace, m_trace: Trace) -> Trace:
    """One Trace whose lanes are ``predicted <stream>`` and ``measured <stream>``."""
    ranks = set(p_trace.ranks()) & set(m_trace.ranks())
    records = [
        replace(r, stream=f"{side} {r.stream}")
        for side, trace in (("predicted", p_trace), ("measured", m_trace))
        for r in trace.records
        if r.rank in ranks
    ]
    meta = dict(
        m_trace.meta, scenario=m_trace.meta.get("scenario"), fidelity="predicted over measured"
    )
    return Trace(records=records, step_time=max(p_trace.step_time, m_trace.step_time), meta=meta)
