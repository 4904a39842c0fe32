"""Fitting parasim's few global parameters, and proving them on sources left out.

A *global parameter* is one physical number that no datasheet gives exactly and that
the open suite is used to choose: today the share of the microbenchmarks' tensor-core
rate that a training step sustains (``gpu.sustained_fraction``).
:data:`PARAMETERS` declares each: which cases it acts on, how it enters a scenario, and
the grid of values it is tried at. How the parameter is shared is the *scheme*:

* ``per-gpu``: one value per GPU type (how the presets' ``matmul_efficiency`` was
  chosen before: a GPU type seen in only one source cannot be predicted without it);
* ``global``: one value for every GPU: each preset's efficiencies come from its own
  microbenchmarks, and the share of them training sustains is the same everywhere.

Each case is predicted once per grid value (:func:`grid_predictions`); a prediction
between grid values is interpolated linearly in the logarithms. :func:`fit` chooses
the value that minimises the mean |log error| over the cases it is given (the log
keeps a too-fast and a too-slow case of the same size equal).
:func:`cross_validate` fits on every source but one and predicts that one, for each
source: the figure a user on a run of a source the model never saw can expect. The
in-sample figure (fit on everything, predict everything) is reported beside it.

:func:`interval_coverage` checks the trust interval
(:mod:`simulator.analysis.trust`) the same way: each left-out source's cases get an
interval made only from the other sources' cross-validated residuals, and the share of
published values inside it is the interval's coverage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Parameter",
    "PARAMETERS",
    "SCHEMES",
    "interpolate",
    "fit",
    "cross_validate",
    "interval_coverage",
    "time_residual",
]

SCHEMES = ("per-gpu", "global")


@dataclass(frozen=True)
class Parameter:
    """One global parameter: a multiplier on a GPU field of the cluster preset (a field
    that never passes 1, an efficiency or a fraction), tried at the ``grid`` values."""

    name: str
    field: str  # the cluster.gpu field it multiplies
    grid: tuple[float, ...]

    def key(self, case: dict[str, Any], scheme: str) -> str:
        """The value a case shares: its GPU type's (``per-gpu``) or everyone's."""
        return str(case.get("gpu", "?")) if scheme == "per-gpu" else "all"


# The share of the microbenchmarks' tensor-core rate a training step sustains
# (gpu.sustained_fraction), as a multiplier on the presets' value, tried from 0.7 to
# 1.3 of it (the field never passes 1).
PARAMETERS = (Parameter("sustained", "sustained_fraction", (0.7, 0.85, 1.0, 1.15, 1.3)),)


def interpolate(grid: Sequence[float], values: Sequence[float], x: float) -> float:
    """``values`` (positive, one per ``grid`` point) at ``x``, linearly in the logs of
    both, extrapolated from the end segments."""
    logs = [math.log(g) for g in grid]
    ys = [math.log(v) for v in values]
    lx = math.log(x)
    i = 0
    while i < len(grid) - 2 and lx > logs[i + 1]:
        i += 1
    slope = (ys[i + 1] - ys[i]) / (logs[i + 1] - logs[i])
    return math.exp(ys[i] + slope * (lx - logs[i]))


def _log_error(predicted: float, published: float) -> float:
    return abs(math.log(predicted / published))


def fit(
    cases: Iterable[tuple[Sequence[float], float]],
    grid: Sequence[float],
    steps: int = 241,
) -> float | None:
    """The multiplier in ``[grid[0], grid[-1]]`` minimising the mean |log error| of
    ``cases`` (each: its predictions on ``grid``, its published value); None with no
    case. A fine scan: the objective is cheap and need not be convex."""
    rows = list(cases)
    if not rows:
        return None
    lo, hi = math.log(grid[0]), math.log(grid[-1])
    best, best_x = math.inf, 1.0
    for i in range(steps):
        x = math.exp(lo + (hi - lo) * i / (steps - 1))
        loss = sum(_log_error(interpolate(grid, p, x), pub) for p, pub in rows) / len(rows)
        if loss < best - 1e-15:
            best, best_x = loss, x
    return best_x


@dataclass
class Fold:
    """One left-out source: the values fitted without it, and its cases' predictions."""

    source: str
    values: dict[str, float | None]
    errors: dict[str, float]  # case id -> relative error, (predicted - published) / published


def _fitted_prediction(
    row: dict[str, Any], values: dict[str, float | None], parameter: Parameter, scheme: str
) -> float:
    value = values.get(parameter.key(row["case"], scheme))
    return interpolate(parameter.grid, row["grid"], 1.0 if value is None else value)


def fit_values(
    rows: Sequence[dict[str, Any]], parameter: Parameter, scheme: str
) -> dict[str, float | None]:
    """The fitted value for each key among ``rows`` (each: ``case``, ``grid``
    predictions, ``published``)."""
    keys = sorted({parameter.key(r["case"], scheme) for r in rows})
    return {
        key: fit(
            [(r["grid"], r["published"]) for r in rows if parameter.key(r["case"], scheme) == key],
            parameter.grid,
        )
        for key in keys
    }


def cross_validate(
    rows: Sequence[dict[str, Any]], parameter: Parameter, scheme: str
) -> tuple[dict[str, float | None], dict[str, float], list[Fold]]:
    """In-sample fitted values and errors, and one :class:`Fold` per source.

    ``rows`` are the scored cases: ``case`` (its file's mapping), ``grid`` (its
    predictions at ``parameter.grid``) and ``published``. A case whose key has no
    training case left keeps the preset's value (multiplier 1)."""
    in_values = fit_values(rows, parameter, scheme)
    in_errors = {
        r["case"]["id"]: _fitted_prediction(r, in_values, parameter, scheme) / r["published"] - 1
        for r in rows
    }
    folds = []
    for source in sorted({r["case"]["source"] for r in rows}):
        train = [r for r in rows if r["case"]["source"] != source]
        values = fit_values(train, parameter, scheme)
        errors = {
            r["case"]["id"]: _fitted_prediction(r, values, parameter, scheme) / r["published"] - 1
            for r in rows
            if r["case"]["source"] == source
        }
        folds.append(Fold(source, values, errors))
    return in_values, in_errors, folds


def interval_coverage(
    folds: Sequence[Fold],
    descriptors: dict[str, dict[str, Any]],
    interval: Callable[[dict[str, Any], list[tuple[dict[str, Any], float]]], tuple[float, float]],
) -> dict[str, Any]:
    """The share of left-out cases whose published value lies inside their interval.

    ``descriptors`` gives each case's comparability descriptor (framework, GPU
    generation, dominant mechanism, and ``time_like``: whether its metric grows with
    the step time). ``interval(descriptor, residuals)`` returns the interval as
    multipliers ``(low, high)`` on the predicted step time, from ``residuals``: other
    cases' descriptors with their cross-validated step-time log residuals
    (:func:`time_residual`) and their ``source``. For each fold only the other sources'
    residuals are used."""
    residual_of = {
        case: (fold.source, time_residual(error, descriptors[case]["time_like"]))
        for fold in folds
        for case, error in fold.errors.items()
    }
    inside = total = 0
    per_source: dict[str, dict[str, int]] = {}
    for fold in folds:
        others = [
            (dict(descriptors[case], source=source), residual)
            for case, (source, residual) in residual_of.items()
            if source != fold.source
        ]
        hits = 0
        for case, (_, residual) in residual_of.items():
            if case not in fold.errors:
                continue
            low, high = interval(descriptors[case], others)
            hits += math.log(low) <= residual <= math.log(high)
        per_source[fold.source] = {"inside": hits, "cases": len(fold.errors)}
        inside += hits
        total += len(fold.errors)
    return {"coverage": inside / total if total else None, "cases": total, "per_source": per_source}


def time_residual(error: float, time_like: bool) -> float:
    """``log(true step time / predicted step time)`` of a case whose metric was
    predicted with relative ``error``: for a time (``time_like``) it is
    ``-log(1 + error)``, for a rate (throughput, FLOP/s, MFU) ``+log(1 + error)``."""
    residual = math.log1p(error)
    return -residual if time_like else residual
