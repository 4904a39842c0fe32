"""CPU ranks sharing a node's cores (:mod:`simulator.engine.core_sharing`): the
slowdown each rank's ops see, and calls stretched by their members' factors."""

from __future__ import annotations

import math

import pytest

from simulator.engine.core import EngineOptions, SimulationTimes, simulate
from simulator.engine.core_sharing import COMM_CPU_SHARE, sharing_slowdowns
from simulator.schedule.ir import Collective, Compute, Program, Schedule
from topologies import build_cluster, load_cluster_spec


def _cluster(gpus_per_node: int = 4):
    return build_cluster(
        load_cluster_spec({"preset": "cpu-localhost", "nodes": 1, "gpus_per_node": gpus_per_node})
    )


def test_the_slowdown_is_the_mean_of_k_over_cores_over_each_rank_s_ops():
    """4 ranks on 2 cores. Ranks 0 and 1 compute over [0, 2]; ranks 2 and 3 over [1, 2]:
    on [0, 1] two compute (full speed), on [1, 2] four (twice as slow). Rank 3 also
    has a call under way over [2, 4], beside nothing."""
    programs = {
        r: Program(r, [Compute(0, "c", 1.0, 0.0, "gemm"), Collective(1, "m", "all_reduce", "g", 1)])
        for r in range(4)
    }
    schedule = Schedule(programs, {"g": (0, 1, 2, 3)})
    nan = math.nan
    spans = {0: (0.0, 2.0), 1: (0.0, 2.0), 2: (1.0, 2.0), 3: (1.0, 2.0)}
    start = {r: [spans[r][0], nan] for r in range(4)}
    end = {r: [spans[r][1], nan] for r in range(4)}
    start[3][1], end[3][1] = 2.0, 4.0
    times = SimulationTimes(ready=start, start=start, end=end, step_time=4.0)
    compute, comm = sharing_slowdowns(schedule, _cluster(), times, devices_per_core=2.0)
    assert compute[0] == pytest.approx((1.0 + 2.0) / 2)
    assert compute[2] == pytest.approx(2.0)
    assert comm[3] == pytest.approx(1.0)  # alone: COMM_CPU_SHARE of a core, of 2
    assert comm[0] == 1.0  # no call under way
    assert 0 < COMM_CPU_SHARE < 1


@pytest.mark.parametrize(
    "options",
    [
        EngineOptions("flow"),
        EngineOptions("analytic"),
        EngineOptions("analytic", closed_form=False),
    ],
    ids=["flow", "analytic", "analytic-simpy"],
)
def test_a_call_takes_its_slowest_member_s_factor_times_as_long(options):
    cluster = _cluster(2)
    programs = {r: Program(r, [Collective(0, "c", "all_reduce", "g", 4e6)]) for r in (0, 1)}
    schedule = Schedule(programs, {"g": (0, 1)})
    alone = simulate(schedule, cluster, options).step_time
    stretched = simulate(
        schedule,
        cluster,
        EngineOptions(options.fidelity, closed_form=options.closed_form, comm_factors=((1, 1.5),)),
    ).step_time
    assert stretched == pytest.approx(1.5 * alone, rel=1e-6)
