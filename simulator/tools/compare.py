"""Compare two steps: a prediction with a measurement, or two runs of one kind.

``parasim compare A B`` reads ``result.json`` and the Chrome trace from two run folders
(written by ``parasim run`` and ``parasim replay``) and sets them side by side:

* the step time, and the relative difference;
* the mean breakdown (compute, exposed communication, bubble, ...);
* per op class — the display category and kind, e.g. ``forward · gemm`` or
  ``comm:tp · all_reduce`` — the time per rank spent in those ops, over the ranks
  present in both traces;
* the peak memory per GPU, as the model estimates it (a replay does not measure
  memory: a measured run has none to show);
* each run's folder, scenario, fidelity and the ``--set`` overrides it was run with.

Which is which follows from the runs themselves, not from the order given:

``measured``
    one run is a prediction (``parasim run``) and the other a measurement (``parasim
    replay``): the sides are ``predicted`` and ``measured``, in that order whatever the
    order of the folders, and the difference is the prediction's error,
    ``(predicted − measured) / measured``;
``what-if``
    two predictions, or two measurements: the sides are ``A`` and ``B``, in the order
    given, and the difference is ``(A − B) / B``, "A against B".

A difference is None where the reference is zero (or the quotient not finite).
:func:`overlay_trace` lays the two timelines over each other, each rank's lanes of the
first side above those of the second.

This module only compares: reading the run folders, the console table and the files
(``compare.json`` and ``compare.html``) are :mod:`simulator.report.compare_report`'s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import StepResult
from simulator.analysis.trace import Trace, category_of
from simulator.analysis.trust import difference_within
from simulator.common.errors import ParasimError

__all__ = [
    "Comparison",
    "Side",
    "Row",
    "MODES",
    "compare_runs",
    "overlay_trace",
    "relative_error",
]

#: The two kinds of comparison, by ``Comparison.mode``: their sides' labels and the name
#: of the relative difference (the key ``compare.json`` gives it).
MODES: dict[str, tuple[tuple[str, str], str]] = {
    "measured": (("predicted", "measured"), "error"),
    "what-if": (("A", "B"), "a_against_b"),
}


def relative_error(value: float, reference: float) -> float | None:
    """``(value − reference) / reference``; None where the reference is zero or the
    quotient is not finite."""
    if reference == 0:
        return None
    error = (value - reference) / reference
    return error if math.isfinite(error) else None


@dataclass
class Side:
    """One of the two runs: its label in the comparison and what made it."""

    label: str
    folder: str
    scenario: str
    fidelity: str
    #: the ``--set`` overrides the scenario file was run with
    overrides: list[str]
    #: a measurement (``parasim replay``), not a prediction
    measured: bool
    #: the model's estimate of the peak memory per GPU; None for a measurement
    peak_bytes_per_gpu: float | None
    capacity_bytes: float
    oom: bool | None

    @property
    def key(self) -> str:
        """The side's name in ``compare.json``'s keys: ``predicted``, ``measured``,
        ``a`` or ``b``."""
        return self.label.lower()

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "scenario": self.scenario,
            "fidelity": self.fidelity,
            "kind": "measurement" if self.measured else "prediction",
            "overrides": list(self.overrides),
            "peak_bytes_per_gpu": self.peak_bytes_per_gpu,
            "capacity_bytes": self.capacity_bytes,
            "oom": self.oom,
        }


@dataclass
class Row:
    """One quantity on both sides (seconds, or bytes for memory); a side without it
    holds None."""

    name: str
    first: float | None
    second: float | None

    @property
    def difference(self) -> float | None:
        """The relative difference, first against second (:func:`relative_error`)."""
        if self.first is None or self.second is None:
            return None
        return relative_error(self.first, self.second)


@dataclass
class Comparison:
    """Two steps set side by side (``compare.json``)."""

    mode: str
    sides: tuple[Side, Side]
    step_time: Row
    breakdown_mean: list[Row]
    op_classes: list[Row]
    #: peak memory per GPU, bytes
    memory: Row
    ranks_compared: list[int]
    #: the sides are in the opposite order to the folders given (the measurement first)
    swapped: bool = False
    #: a what-if of two predictions: whether their step times differ by less than their
    #: trust intervals (simulator.analysis.trust); None otherwise
    within_interval: bool | None = None

    @property
    def labels(self) -> tuple[str, str]:
        return MODES[self.mode][0]

    @property
    def difference_name(self) -> str:
        """The key of the relative difference in ``compare.json``."""
        return MODES[self.mode][1]

    def _values(self, row: Row, unit: str, difference: bool = True) -> dict[str, Any]:
        first, second = self.sides
        values = {f"{first.key}_{unit}": row.first, f"{second.key}_{unit}": row.second}
        if difference:
            values[self.difference_name] = row.difference
        return values

    def to_json(self) -> dict[str, Any]:
        """``compare.json``: every value keyed by the side it belongs to
        (``predicted_s``/``measured_s`` and ``error``, or ``a_s``/``b_s`` and
        ``a_against_b``). Refuses a value that is not finite: JSON has no NaN."""
        first, second = self.sides
        data = {
            "mode": self.mode,
            "labels": list(self.labels),
            "runs": {side.key: side.to_json() for side in self.sides},
            "scenario": {first.key: first.scenario, second.key: second.scenario},
            "step_time": {
                **self._values(self.step_time, "s"),
                **({"within_interval": self.within_interval} if self.mode == "what-if" else {}),
            },
            "peak_memory_per_gpu": self._values(self.memory, "bytes"),
            "breakdown_mean": [
                {"category": row.name, **self._values(row, "s", difference=False)}
                for row in self.breakdown_mean
            ],
            "op_classes": [
                {"class": row.name, **self._values(row, "s")} for row in self.op_classes
            ],
            "ranks_compared": list(self.ranks_compared),
        }
        _check_finite(data, "compare.json")
        return data


def _check_finite(value: Any, where: str) -> None:
    """Refuse a float that is not finite anywhere in ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ParasimError(f"{where}: {value} is not a number JSON can hold")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(item, f"{where}[{index}]")


def _class_seconds(trace: Trace, ranks: set[int]) -> dict[str, float]:
    """Seconds per op class, averaged over ``ranks``."""
    totals: dict[str, float] = defaultdict(float)
    for record in trace.records:
        if record.rank in ranks:
            totals[f"{category_of(record)} · {record.kind}"] += record.end - record.start
    return {key: value / max(1, len(ranks)) for key, value in sorted(totals.items())}


def _side(label: str, folder: str, result: StepResult) -> Side:
    measured = result.measured is not None
    memory = result.memory
    return Side(
        label=label,
        folder=folder,
        scenario=result.scenario,
        fidelity=result.fidelity,
        overrides=list(result.overrides),
        measured=measured,
        peak_bytes_per_gpu=None if measured else memory.peak_bytes_per_gpu,
        capacity_bytes=memory.capacity_bytes,
        oom=None if measured else memory.oom,
    )


def compare_runs(
    first: tuple[StepResult, Trace],
    second: tuple[StepResult, Trace],
    folders: tuple[str, str] = ("", ""),
) -> Comparison:
    """The comparison of two runs given in that order (``folders`` names where each
    came from): step time, peak memory, the mean time per category, and per op class
    the time per rank over the ranks both runs show. A prediction and a measurement
    are compared as ``measured`` (the prediction first, whichever order they came in),
    two runs of one kind as a ``what-if``."""
    runs = [(first, folders[0]), (second, folders[1])]
    kinds = [result.measured is not None for (result, _), _ in runs]
    mode = "what-if" if kinds[0] == kinds[1] else "measured"
    swapped = mode == "measured" and kinds[0]
    if swapped:
        runs.reverse()  # the prediction first
    ((a_result, a_trace), a_folder), ((b_result, b_trace), b_folder) = runs
    ranks = set(a_trace.ranks()) & set(b_trace.ranks())
    if not ranks:
        raise ParasimError(
            f"the two runs have no rank in common ({a_folder or 'the first'}: ranks "
            f"{_ranks_text(a_trace)}; {b_folder or 'the second'}: ranks {_ranks_text(b_trace)})"
        )
    a_classes, b_classes = _class_seconds(a_trace, ranks), _class_seconds(b_trace, ranks)
    classes = [
        Row(key, a_classes.get(key, 0.0), b_classes.get(key, 0.0))
        for key in sorted(set(a_classes) | set(b_classes))
    ]
    breakdown = [
        Row(c, a_result.breakdown.mean.get(c, 0.0), b_result.breakdown.mean.get(c, 0.0))
        for c in CATEGORIES
    ]
    labels = MODES[mode][0]
    sides = (
        _side(labels[0], a_folder, a_result),
        _side(labels[1], b_folder, b_result),
    )
    return Comparison(
        mode=mode,
        sides=sides,
        step_time=Row("step time", a_result.step_time_s, b_result.step_time_s),
        breakdown_mean=breakdown,
        op_classes=classes,
        memory=Row("peak memory per GPU", sides[0].peak_bytes_per_gpu, sides[1].peak_bytes_per_gpu),
        ranks_compared=sorted(ranks),
        swapped=swapped,
        within_interval=difference_within(
            a_result.step_time_s, a_result.interval, b_result.step_time_s, b_result.interval
        )
        if mode == "what-if"
        else None,
    )


def _ranks_text(trace: Trace) -> str:
    ranks = trace.ranks()
    return ", ".join(map(str, ranks[:8])) + (
        f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    )


def overlay_trace(
    first: Trace, second: Trace, labels: tuple[str, str] = ("predicted", "measured")
) -> Trace:
    """One Trace whose lanes are ``<label> <stream>``: each rank both traces show, the
    lanes of ``first`` above those of ``second``."""
    ranks = set(first.ranks()) & set(second.ranks())
    records = [
        replace(r, stream=f"{label} {r.stream}")
        for label, trace in zip(labels, (first, second), strict=True)
        for r in trace.records
        if r.rank in ranks
    ]
    meta = dict(
        second.meta,
        scenario=second.meta.get("scenario"),
        fidelity=f"{labels[0]} over {labels[1]}",
    )
    meta.pop("idle", None)  # the idle stretches of the compute lanes: not these lanes
    return Trace(records=records, step_time=max(first.step_time, second.step_time), meta=meta)
