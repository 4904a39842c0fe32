"""Stragglers: ranks whose compute runs slower than their peers' within a step.

Identical ranks do not take identical time: on shared CPUs the ranks differ by several
per cent from step to step, and on GPUs clocks, thermals and noisy neighbours do the
same on a smaller scale. The step waits for the slowest rank of every group it
synchronises. ``gpu.jitter`` is that spread as a relative standard deviation (0 in the
datasheet presets; ``parasim calibrate`` fits it from the spread it measures). Each
rank of the job draws ``z`` from a normal distribution seeded by the scenario's
``simulation.seed`` and its rank number, and its compute takes ``1 + jitter·z`` times
as long (at least half as long), for the whole step. A simulated rank that stands for
several ranks (folded runs) takes the slowest of their factors, since every group it
joins waits for the slowest member.
"""

from __future__ import annotations

import numpy as np

from simulator.schedule.ir import Schedule

__all__ = ["rank_factors", "STRAGGLER_STREAM"]

#: Mixed into the seed so that straggler draws are independent of routing draws.
STRAGGLER_STREAM = 0x5354


def rank_factors(schedule: Schedule, world: int, jitter: float, seed: int) -> dict[int, float]:
    """Compute-time factor of each simulated rank of ``schedule`` (empty: no jitter)."""
    if jitter <= 0:
        return {}
    rng = np.random.default_rng(np.random.SeedSequence([seed, STRAGGLER_STREAM]))
    factors = np.maximum(0.5, 1.0 + jitter * rng.standard_normal(world))
    out = {}
    for rank in schedule.programs:
        stands_for = schedule.rank_images.get(rank, (rank,))
        out[rank] = float(max(factors[r] for r in stands_for))
    return out
