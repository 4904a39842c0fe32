"""Least-squares fits of measured times: the line ``t = a + b·x`` that a GEMM sweep
(``x`` its FLOPs), a copy sweep or a collective's sizes (``x`` bytes) make, read the
same way whether the points come from parasim's microbenchmarks or from a real run's
trace."""

from __future__ import annotations

import numpy as np

from simulator.common.errors import ParasimError

__all__ = ["FitError", "fit_line"]


class FitError(ParasimError):
    """Points that give no positive slope."""


def fit_line(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b·x`` with ``a >= 0``, in relative terms (each point
    weighted by ``1/y``, so the small sizes that pin the fixed cost count as much as
    the large ones that pin the rate); returns ``(a, b, rms residual in seconds)``."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    weights = 1.0 / ys
    design = np.vstack([np.ones_like(xs), xs]).T * weights[:, None]
    a, b = np.linalg.lstsq(design, ys * weights, rcond=None)[0]
    if a < 0:  # a negative fixed cost is noise: fit through the origin instead
        a, b = 0.0, float(np.sum(xs / ys) / np.sum((xs / ys) ** 2))
    if b <= 0:
        raise FitError(
            f"cannot fit a positive slope to {len(xs)} points (times do not grow with size: "
            f"{', '.join(f'{t:.3g} s' for t in ys)} at {', '.join(f'{v:.3g}' for v in xs)})"
        )
    rms = float(np.sqrt(np.mean((ys - (a + b * xs)) ** 2)))
    return float(a), float(b), rms
