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

from collections import defaultdict
from dataclasses import replace
from typing import Any

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.trace import Trace, category_of
from simulator.common.errors import ParasimError

__all__ = ["compare_runs", "overlay_trace", "relative_error"]


def relative_error(predicted: float, measured: float) -> float | None:
    return None if measured == 0 else (predicted - measured) / measured


def _class_seconds(trace: Trace, ranks: set[int]) -> dict[str, float]:
    """Seconds per op class, averaged over ``ranks``."""
    totals: dict[str, float] = defaultdict(float)
    for record in trace.records:
        if record.rank in ranks:
            totals[f"{category_of(record)} · {record.kind}"] += record.end - record.start
    return {key: value / max(1, len(ranks)) for key, value in sorted(totals.items())}


def compare_runs(
    predicted: tuple[dict[str, Any], Trace], measured: tuple[dict[str, Any], Trace]
) -> dict[str, Any]:
    """The comparison as a JSON-ready dict."""
    (p_result, p_trace), (m_result, m_trace) = predicted, measured
    ranks = set(p_trace.ranks()) & set(m_trace.ranks())
    if not ranks:
        raise ParasimError("the two runs have no rank in common")
    p_classes, m_classes = _class_seconds(p_trace, ranks), _class_seconds(m_trace, ranks)
    classes = []
    for key in sorted(set(p_classes) | set(m_classes)):
        p, m = p_classes.get(key, 0.0), m_classes.get(key, 0.0)
        classes.append(
            {"class": key, "predicted_s": p, "measured_s": m, "error": relative_error(p, m)}
        )
    breakdown = [
        {
            "category": c,
            "predicted_s": p_result["breakdown"]["mean"][c],
            "measured_s": m_result["breakdown"]["mean"][c],
        }
        for c in CATEGORIES
    ]
    p_step, m_step = p_result["step_time_s"], m_result["step_time_s"]
    return {
        "scenario": {"predicted": p_result.get("scenario"), "measured": m_result.get("scenario")},
        "step_time": {
            "predicted_s": p_step,
            "measured_s": m_step,
            "error": relative_error(p_step, m_step),
        },
        "breakdown_mean": breakdown,
        "op_classes": classes,
        "ranks_compared": sorted(ranks),
    }


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
