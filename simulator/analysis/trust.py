"""How far a prediction can be trusted: an interval from the residuals of comparable
validated runs.

``python -m benchmarks.validate --cross-validate --write-trust`` predicts every case of
the open validation suite with the global parameters fitted *without* the case's own
source, and writes each case's cross-validated residual, ``log(true step time /
predicted step time)``, with its *descriptor* (:func:`describe`) to
``trust_residuals.json`` beside this module. A new prediction's interval is made from
those residuals:

1. **Comparable runs.** The descriptor is the software stack (``framework``), the GPU
   generation (Ampere, Hopper, Blackwell), whether the model is a mixture of experts,
   and which part dominates the critical rank's step (compute, exposed communication,
   or the pipeline bubble). The residuals used are those of the most specific group
   with at least :data:`FEWEST_COMPARABLE` cases, trying in order: all four alike;
   framework, generation and MoE alike; framework and generation alike; framework
   alike; every case.
   A group must also hold residuals from at least :data:`FEWEST_SOURCES` sources.
2. **The interval.** A new run comes from a source (a framework's version, a cluster, a
   way of measuring) whose own systematic offset is unknown: its residual is one
   source's offset plus one run's scatter about its source. So the residuals are split
   into each source's mean and each run's deviation from it, and the interval is the
   ``(1 − level)/2`` and ``(1 + level)/2`` quantiles of every sum of a source mean and a
   deviation, each source weighing the same (a source of sixteen alike runs counts no
   more than one of two), widened by ``√(1 + 1/S)`` for ``S`` sources (the spread of
   the next source's offset is the sources' spread plus the uncertainty of where they
   sit). It is not forced to be centred: when comparable runs were predicted too
   fast, the interval leans slower.
3. **Outside what was validated.** When no validated case shares the run's framework
   and GPU generation, or the run has more than :data:`BEYOND_SCALE` times the GPUs (or
   sequence length) of the largest validated run of its framework, the interval says
   so and its log half-widths are doubled.

The interval is on the step time; throughput's is its inverse. ``benchmarks.validate``
measures how often an 80% interval, made without the left-out source, holds that
source's published values (its coverage).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "Descriptor",
    "TrustInterval",
    "RESIDUALS_FILE",
    "FEWEST_COMPARABLE",
    "FEWEST_SOURCES",
    "BEYOND_SCALE",
    "gpu_generation",
    "describe",
    "interval",
    "load_residuals",
    "trust_interval",
    "difference_within",
]

RESIDUALS_FILE = Path(__file__).with_name("trust_residuals.json")
# The fewest residuals a group must hold to stand for a run (fewer: the next wider
# group). With 8 cases the 10% and 90% quantiles fall between the first two and last
# two order statistics.
FEWEST_COMPARABLE = 8
# The fewest sources a group must draw on: with fewer, the spread between sources, which
# is what a new run's source adds, cannot be seen.
FEWEST_SOURCES = 3
# A run with this many times the GPUs (or the sequence length) of the largest validated
# run of its framework is outside what was validated.
BEYOND_SCALE = 4.0
LEVEL = 0.8

# GPU names (cluster.gpu.name, the case files' gpu) by generation, matched by prefix
_GENERATIONS = (
    ("ampere", ("A100", "A800", "A10", "A30", "A40")),
    ("hopper", ("H100", "H200", "H800", "H20", "GH200")),
    ("blackwell", ("B200", "B100", "GB200", "B300", "GB300")),
    ("ada", ("L40", "L4")),
)


def gpu_generation(name: str) -> str:
    """The architecture generation of a GPU name (``"other"`` when not known)."""
    upper = name.upper()
    for generation, prefixes in _GENERATIONS:
        if any(upper.startswith(prefix) for prefix in prefixes):
            return generation
    return "other"


@dataclass(frozen=True)
class Descriptor:
    """What makes two runs comparable for the trust interval."""

    framework: str
    generation: str
    moe: bool
    dominant: str  # compute | communication | bubble
    gpus: int
    seq_len: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe(result: Any, framework: str, seq_len: int) -> Descriptor:
    """The descriptor of a :class:`~simulator.analysis.result.StepResult`."""
    critical = result.breakdown.critical
    parts = {
        "compute": critical.get("compute", 0.0) + critical.get("other", 0.0),
        "communication": critical.get("exposed_comm", 0.0),
        "bubble": critical.get("bubble", 0.0) + critical.get("imbalance_stall", 0.0),
    }
    return Descriptor(
        framework=framework,
        generation=gpu_generation(result.cluster.gpu),
        moe=result.moe is not None,
        dominant=max(parts, key=lambda key: parts[key]),
        gpus=result.cluster.gpus,
        seq_len=seq_len,
    )


def _weighted_quantile(samples: list[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile of weighted ``(value, weight)`` samples (equal values pooled),
    linear between the midpoints of each value's share of the total weight."""
    pooled: dict[float, float] = {}
    for value, weight in samples:
        key = round(value, 12)  # a sum made two ways is one value
        pooled[key] = pooled.get(key, 0.0) + weight
    ordered = sorted(pooled.items())
    total = sum(weight for _, weight in ordered)
    points, cumulative = [], 0.0
    for value, weight in ordered:
        points.append(((cumulative + weight / 2) / total, value))
        cumulative += weight
    if q <= points[0][0]:
        return points[0][1]
    for (p0, v0), (p1, v1) in zip(points, points[1:], strict=False):
        if q <= p1:
            return v0 + (v1 - v0) * (q - p0) / (p1 - p0)
    return points[-1][1]


def _source_mixture(group: list[tuple[str, float]]) -> tuple[list[tuple[float, float]], int]:
    """Every sum of a source's mean residual and a run's deviation from its own source's
    mean, weighted so that each source's mean and each source's deviations weigh the
    same; and the number of sources."""
    by_source: dict[str, list[float]] = {}
    for source, residual in group:
        by_source.setdefault(source, []).append(residual)
    means = {source: sum(values) / len(values) for source, values in by_source.items()}
    deviations = [
        (residual - means[source], 1.0 / len(values))
        for source, values in by_source.items()
        for residual in values
    ]
    samples = [
        (mean + deviation, weight) for mean in means.values() for deviation, weight in deviations
    ]
    return samples, len(means)


_GROUPS = (
    ("framework", "generation", "moe", "dominant"),
    ("framework", "generation", "moe"),
    ("framework", "generation"),
    ("framework",),
    (),
)


@dataclass(frozen=True)
class TrustInterval:
    """Multipliers on the predicted step time that hold the true one at ``level``."""

    low: float
    high: float
    level: float
    basis: str  # which runs it comes from, in words
    comparable: int  # how many residuals
    outside: str | None  # why the run is outside what was validated, or None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def interval(
    descriptor: Descriptor | dict[str, Any],
    residuals: list[tuple[dict[str, Any], float]],
    level: float = LEVEL,
) -> TrustInterval:
    """The interval for a run described by ``descriptor``, from ``residuals`` (each:
    a validated case's descriptor as a mapping, its step-time log residual)."""
    wanted = descriptor.to_json() if isinstance(descriptor, Descriptor) else dict(descriptor)
    chosen: list[tuple[str, float]] = []
    basis = "no validated runs"
    for keys in _GROUPS:
        group = [
            (str(d.get("source", "")), r)
            for d, r in residuals
            if all(d.get(k) == wanted.get(k) for k in keys)
        ]
        sources = len({source for source, _ in group})
        if (len(group) >= FEWEST_COMPARABLE and sources >= FEWEST_SOURCES) or (not keys and group):
            chosen = group
            basis = (
                "runs alike in " + ", ".join(keys) if keys else "every validated run"
            ) + f" ({len(group)} from {sources} sources)"
            break
    outside = _outside(wanted, [d for d, _ in residuals])
    if not chosen:
        return TrustInterval(0.5, 2.0, level, basis, 0, outside or "no validated runs")
    samples, sources = _source_mixture(chosen)
    widen = math.sqrt(1.0 + 1.0 / sources) * (2.0 if outside else 1.0)
    centre = _weighted_quantile(samples, 0.5)
    low = centre + (_weighted_quantile(samples, (1.0 - level) / 2.0) - centre) * widen
    high = centre + (_weighted_quantile(samples, (1.0 + level) / 2.0) - centre) * widen
    return TrustInterval(math.exp(low), math.exp(high), level, basis, len(chosen), outside)


def _outside(wanted: dict[str, Any], validated: list[dict[str, Any]]) -> str | None:
    """Why a run is outside the validated cases, or None."""
    same = [
        d
        for d in validated
        if d.get("framework") == wanted.get("framework")
        and d.get("generation") == wanted.get("generation")
    ]
    if not same:
        return f"no validated run of {wanted.get('framework')} on {wanted.get('generation')} GPUs"
    family = [d for d in validated if d.get("framework") == wanted.get("framework")]
    for key, what in (("gpus", "GPUs"), ("seq_len", "tokens per sequence")):
        largest = max(int(d.get(key) or 0) for d in family)
        value = int(wanted.get(key) or 0)
        if largest and value > BEYOND_SCALE * largest:
            return (
                f"{value} {what}, beyond {BEYOND_SCALE:g}x the largest validated "
                f"{wanted.get('framework')} run ({largest})"
            )
    return None


@lru_cache(maxsize=1)
def load_residuals() -> tuple[tuple[dict[str, Any], float], ...]:
    """The shipped cross-validated residuals (empty when the file is absent)."""
    try:
        data = json.loads(RESIDUALS_FILE.read_text())
    except FileNotFoundError:
        return ()
    return tuple(
        (dict(row["descriptor"], source=row["source"]), float(row["residual"]))
        for row in data["cases"]
    )


def trust_interval(result: Any, framework: str, seq_len: int) -> TrustInterval:
    """The interval of a result, from the shipped residuals."""
    return interval(describe(result, framework, seq_len), list(load_residuals()))


def difference_within(
    first_s: float,
    first: dict[str, Any] | None,
    second_s: float,
    second: dict[str, Any] | None,
) -> bool | None:
    """Whether two predicted step times differ by less than their intervals: each lies
    inside the other's interval (None when either has no interval)."""
    if first is None or second is None:
        return None
    return (
        first_s * first["low"] <= second_s <= first_s * first["high"]
        and second_s * second["low"] <= first_s <= second_s * second["high"]
    )
