"""A run's wall-clock time under failures: checkpoints, lost work and restarts.

The run must do ``work`` seconds of training. Every ``interval`` seconds of training it
saves a checkpoint, which stops training for ``cost`` seconds (the write, or an
asynchronous save's copy to host memory). Failures come as a Poisson process at
``rate`` per second of wall time (the GPUs' rate per GPU-hour times the GPUs): each
loses the work since the last checkpoint saved (and any checkpoint being written),
then ``restart`` seconds pass before training resumes from it. An infinite interval (no
failures, and ``auto``) saves no checkpoint.

:func:`simulate_goodput` draws this ``trials`` times from a seed, by failure (the cycles
of work and checkpoint between two failures are counted, not stepped through), and
gives the wall time's mean and spread and where the time went. :func:`optimal_interval`
is the interval that loses least: Daly's higher-order optimum (J. T. Daly, "A higher
order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3),
2006), ``sqrt(2·C·M)·(1 + sqrt(C/2M)/3 + (C/2M)/9) − C`` for a checkpoint cost ``C``
below twice the mean time between failures ``M`` (else ``M``), whose first term is
Young's (J. W. Young, "A first order approximation to the optimum checkpoint interval",
CACM 17(9), 1974).

Simplified: failures during a restart or a checkpoint's write are not drawn separately
(a failure's time counts from the restart's end); an asynchronous checkpoint counts as
saved once its copy to host memory is done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.common.errors import ParasimError

__all__ = ["Goodput", "optimal_interval", "simulate_goodput", "young_interval"]


#: Failures drawn over all trials: trials stop short of it (a run of many failures a
#: trial varies little from one trial to the next), and a run whose one trial passes it
#: is called one that does not finish (its failures outnumber what a plan draws in
#: seconds).
MAX_DRAWS = 2_000_000


def _endless(work: float, rate: float, interval: float, cost: float) -> str:
    """The one line that refuses a run whose failures never let it finish."""
    return (
        f"run: more than {MAX_DRAWS:,} failures drawn in one trial of {work / 86400:.3g} "
        f"days of training: a failure every {1 / rate:.3g} s of wall time against a "
        f"checkpoint every {interval:.3g} s taking {cost:.3g} s, so the run hardly moves "
        "forward; lower the failure rate or checkpoint more often (interval: auto)"
    )


def young_interval(cost: float, mtbf: float) -> float:
    """Young's first-order optimum: ``sqrt(2·C·M)``."""
    return math.sqrt(2.0 * cost * mtbf)


def optimal_interval(cost: float, mtbf: float) -> float:
    """Daly's higher-order optimum checkpoint interval (seconds of training between two
    checkpoints) for a checkpoint of ``cost`` seconds and failures ``mtbf`` seconds
    apart on average; ``inf`` without failures, ``mtbf`` where a checkpoint costs twice
    the time between failures or more."""
    if not math.isfinite(mtbf):
        return math.inf
    if cost <= 0:
        return 0.0
    if cost >= 2.0 * mtbf:
        return mtbf
    ratio = cost / (2.0 * mtbf)
    return young_interval(cost, mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost


@dataclass(frozen=True)
class Goodput:
    """The wall time of ``work`` seconds of training over the trials: its mean and 10th
    and 90th percentiles, the means of what it went to (checkpoints, work lost to
    failures, restarts) and of the failures, and the interval and cost it ran with."""

    work: float
    wall_mean: float
    wall_p10: float
    wall_p90: float
    checkpointing: float
    lost: float
    restarting: float
    failures: float
    interval: float
    cost: float
    trials: int

    @property
    def goodput(self) -> float:
        """Useful training time over wall time (the mean's)."""
        return self.work / self.wall_mean if self.wall_mean > 0 else 1.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "work_s": self.work,
            "wall_s": self.wall_mean,
            "wall_p10_s": self.wall_p10,
            "wall_p90_s": self.wall_p90,
            "goodput": self.goodput,
            "checkpointing_s": self.checkpointing,
            "lost_work_s": self.lost,
            "restarting_s": self.restarting,
            "failures": self.failures,
            "checkpoint_interval_s": self.interval,
            "checkpoint_cost_s": self.cost,
            "trials": self.trials,
        }


def simulate_goodput(
    work: float,
    rate: float,
    interval: float,
    cost: float,
    restart: float,
    trials: int,
    seed: int,
    timeline: list | None = None,
) -> Goodput:
    """The run's wall time under failures, drawn ``trials`` times from ``seed``
    (:class:`Goodput`); ``timeline``, if given, gets the first trial's
    ``(wall, progress, event)`` points (``event``: ``start``, ``failure``, ``resume``,
    ``end``) for the report's chart."""
    rng = np.random.default_rng(seed)
    draws = 0
    if work <= 0:
        return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, interval, cost, trials)
    if not math.isfinite(interval):  # no checkpoint (no failure to guard against)
        interval, cost = work, 0.0
    interval = min(interval, work) if interval > 0 else work
    cycle = interval + cost
    walls, checkpointing, lost, restarting, failures = [], [], [], [], []
    for trial in range(trials):
        if trial and draws * (trial + 1) > MAX_DRAWS * trial:
            # as many draws again would pass the bound: a run of this many failures a
            # trial varies little from one to the next, so fewer trials stand for it
            trials = trial
            break
        remaining, wall, spent, wasted, waited, count = work, 0.0, 0.0, 0.0, 0.0, 0
        points = [(0.0, 0.0, "start")] if trial == 0 and timeline is not None else None
        while remaining > 0:
            cycles = math.ceil(remaining / interval - 1e-12)
            finish = remaining + cycles * cost  # each cycle ends with its checkpoint
            gap = rng.exponential(1.0 / rate) if rate > 0 else math.inf
            if gap >= finish:
                wall += finish
                spent += cycles * cost
                remaining = 0.0
                break
            draws += 1
            if count >= MAX_DRAWS:  # this one trial alone passes the bound
                raise ParasimError(_endless(work, rate, interval, cost))
            done = min(math.floor(gap / cycle), cycles)
            saved = min(done * interval, remaining)
            remaining -= saved
            spent += done * cost
            wasted += gap - done * cycle
            wall += gap
            count += 1
            if points is not None:
                points.append((wall, work - remaining, "failure"))
            wall += restart
            waited += restart
            if points is not None:
                points.append((wall, work - remaining, "resume"))
        if points is not None:
            points.append((wall, work, "end"))
            assert timeline is not None
            timeline.extend(points)
        walls.append(wall)
        checkpointing.append(spent)
        lost.append(wasted)
        restarting.append(waited)
        failures.append(count)
    values = np.asarray(walls)
    return Goodput(
        work=work,
        wall_mean=float(values.mean()),
        wall_p10=float(np.percentile(values, 10)),
        wall_p90=float(np.percentile(values, 90)),
        checkpointing=float(np.mean(checkpointing)),
        lost=float(np.mean(lost)),
        restarting=float(np.mean(restarting)),
        failures=float(np.mean(failures)),
        interval=interval,
        cost=cost,
        trials=trials,
    )
