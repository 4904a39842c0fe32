"""Stragglers: ranks whose compute runs slower than their peers' within a step.

Identical ranks do not take identical time: on shared CPUs the ranks differ by several
per cent from step to step, and on GPUs clocks, thermals and noisy neighbours do the
same on a smaller scale. The step waits for the slowest rank of every group it
synchronises. ``gpu.jitter`` is that spread as a relative standard deviation (0 in the
datasheet presets; ``parasim calibrate`` fits it from the spread it measures). Each
rank of the job draws ``z`` from a normal distribution, and its compute takes
``1 + jitter·z`` times as long (at least half as long), for the whole step. The draws
are stratified (Latin hypercube sampling in one dimension): the ``N`` ranks take the
``N`` normal scores ``Φ⁻¹((i − 3/8)/(N + 1/4))`` (Blom's approximation of the expected
order statistics) in an order shuffled by the scenario's ``simulation.seed``. So the
slowest of ``N`` ranks sits where the slowest of ``N`` draws does on average
(``+0.59σ`` for two ranks, ``+3.2σ`` for 1,000), and the step's straggler cost is its
expectation rather than one draw's luck, while which rank is slow still follows the
seed. A simulated rank that stands for several ranks (folded runs) takes the slowest
of their factors, since every group it joins waits for the slowest member.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from simulator.schedule.ir import Schedule

__all__ = ["rank_factors", "normal_scores", "STRAGGLER_STREAM"]

#: Mixed into the seed so that straggler draws are independent of routing draws.
STRAGGLER_STREAM = 0x5354


def normal_scores(n: int) -> np.ndarray:
    """Blom's normal scores of ``n`` draws, ascending: about the expected order
    statistics of ``n`` standard normal draws."""
    inverse = NormalDist().inv_cdf
    return np.array([inverse((i - 0.375) / (n + 0.25)) for i in range(1, n + 1)])


def rank_factors(schedule: Schedule, world: int, jitter: float, seed: int) -> dict[int, float]:
    """Compute-time factor of each simulated rank of ``schedule`` (empty: no jitter)."""
    if jitter <= 0:
        return {}
    rng = np.random.default_rng(np.random.SeedSequence([seed, STRAGGLER_STREAM]))
    factors = np.maximum(0.5, 1.0 + jitter * rng.permutation(normal_scores(world)))
    out = {}
    for rank in schedule.programs:
        stands_for = schedule.rank_images.get(rank, (rank,))
        out[rank] = float(max(factors[r] for r in stands_for))
    return out
