"""CPU ranks that share a node's cores: processor sharing among the ranks computing.

When a node runs more CPU ranks than it has cores (``gpu.devices_per_core > 1``, set
by a profile measured on fewer cores than the scenario has ranks), the operating
system shares the cores among the ranks that want one. A rank waiting for a transfer
or for its pipeline peer wants none, so a rank computes ``max(1, k / cores)`` times
slower while ``k`` of its node's ranks compute, and at full speed when it computes
alone: a pipeline's bubbles leave the cores to the stages that are busy. A call under
way wants part of a core too (gloo's threads copy and reduce on the CPU), and that
part is slowed the same way: a tensor-parallel all-reduce beside another stage's
compute takes longer.

The engine takes a fixed factor per rank for the whole step, for its compute
(``EngineOptions.rank_factors``, as stragglers do) and for its calls
(``EngineOptions.comm_factors``; a call takes its slowest member's), so the sharing is
found as a fixed point: simulate, find from the simulated timeline how many of the
node's threads wanted a core beside each op, take as a rank's new factors the mean
slowdown over its compute time and over its calls' time, ``∫ max(1, k(t) / cores) dt /
∫ dt``, move half-way there, and repeat until no factor moves by more than 1%. It
starts from every rank at the full ``devices_per_core``, the slowdown when all compute
at once.

Simplified: a rank's factors are one number each for the step (the mean over its ops);
a call under way wants a fixed share of a core (:data:`COMM_CPU_SHARE`, measured on
one machine); the operating system's time slices and cache interference are not
modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from simulator.engine.core import EngineOptions, SimulationTimes
from simulator.schedule.ir import Block, Compute, Schedule
from topologies import Cluster

__all__ = ["share_cores", "sharing_slowdowns"]

#: Fixed-point rounds at most, and the largest relative change of a factor that ends them.
ROUNDS, TOLERANCE = 12, 0.01
#: The share of a gloo call's time its threads work on a core (copies, reductions); the
#: rest they wait on the network. ``python -m benchmarks.gloo_interference`` measured
#: 0.45-0.58 for 64 KiB-4 MiB all-reduces of 2 ranks (benchmarks/RESULTS.md).
COMM_CPU_SHARE = 0.5


def sharing_slowdowns(
    schedule: Schedule, cluster: Cluster, times: SimulationTimes, devices_per_core: float
) -> tuple[dict[int, float], dict[int, float]]:
    """Each rank's mean slowdown over its compute ops and over its communication calls
    (from when they start moving data), with ``k(t)`` cores' worth of work wanted on
    its node at ``t`` in ``times`` (a rank computing counts one, a rank's call under
    way :data:`COMM_CPU_SHARE`) and ``gpus_per_node / devices_per_core`` cores per node.
    A call's slowdown applies to its work on a core only."""
    cores = cluster.spec.gpus_per_node / devices_per_core
    nodes: dict[int, dict[int, tuple[list, list]]] = {}  # node -> rank -> (compute, comm)
    for rank, program in schedule.programs.items():
        start, end = times.start[rank], times.end[rank]
        compute, comm = [], []
        for op in program.ops:
            begin, stop = start[op.id], end[op.id]
            if not stop > begin:
                continue
            if type(op) is Compute or type(op) is Block:
                compute.append((begin, stop))
            else:
                comm.append((begin, stop))
        nodes.setdefault(cluster.node_of(rank), {})[rank] = (compute, comm)
    on_compute: dict[int, float] = {}
    on_comm: dict[int, float] = {}
    for by_rank in nodes.values():
        weighted = [
            (iv, weight)
            for compute, comm in by_rank.values()
            for ivs, weight in ((compute, 1.0), (comm, COMM_CPU_SHARE))
            for iv in ivs
        ]
        if not weighted:
            for rank in by_rank:
                on_compute[rank] = on_comm[rank] = 1.0
            continue
        # k(t) is constant between the sorted instants; G(t) = ∫ max(1, k/cores) dt
        instants = np.array(sorted({t for iv, _ in weighted for t in iv}))
        change = np.zeros(len(instants))
        position = {t: i for i, t in enumerate(instants)}
        for (begin, stop), weight in weighted:
            change[position[begin]] += weight
            change[position[stop]] -= weight
        wanting = np.cumsum(change)[:-1]  # on each segment between two instants
        rate = np.maximum(1.0, wanting / cores)
        integral = np.concatenate([[0.0], np.cumsum(rate * np.diff(instants))])
        for rank, (compute, comm) in by_rank.items():
            on_compute[rank] = _mean_slowdown(compute, instants, integral)
            # only the call's work on a core slows; its waits on the network do not
            slowed = _mean_slowdown(comm, instants, integral)
            on_comm[rank] = 1.0 + COMM_CPU_SHARE * (slowed - 1.0)
    return on_compute, on_comm


def _mean_slowdown(
    own: list[tuple[float, float]], instants: np.ndarray, integral: np.ndarray
) -> float:
    """``∫ rate dt / ∫ dt`` over the intervals ``own``, ``integral`` the running integral
    of the rate at ``instants``."""
    busy = sum(stop - begin for begin, stop in own)
    if busy <= 0:
        return 1.0
    begins = np.interp([b for b, _ in own], instants, integral)
    stops = np.interp([e for _, e in own], instants, integral)
    return float(np.sum(stops - begins) / busy)


def share_cores(
    schedule: Schedule,
    cluster: Cluster,
    options: EngineOptions,
    base: dict[int, float],
    simulate: Callable[..., SimulationTimes],
) -> tuple[dict[int, float], dict[int, float], SimulationTimes]:
    """Each rank's sharing slowdown of its compute and of its calls at the fixed point,
    and the step simulated with them (its compute also taking its ``base`` factor, the
    stragglers')."""
    share = cluster.spec.gpu.devices_per_core
    compute = {rank: share for rank in schedule.programs}
    comm = dict(compute)

    def run() -> SimulationTimes:
        factors = {rank: base.get(rank, 1.0) * f for rank, f in compute.items()}
        return simulate(
            schedule,
            cluster,
            replace(
                options,
                rank_factors=tuple(factors.items()),
                comm_factors=tuple(comm.items()),
            ),
        )

    times = run()
    for _ in range(ROUNDS):
        on_compute, on_comm = sharing_slowdowns(schedule, cluster, times, share)
        # each rank's ops were stretched by its factors; the slowdowns its ops saw are
        # the sharing's answer to that timeline: move half-way towards them (a rank
        # slowed less is busy for less time beside the others)
        moved = max(
            max(abs(on_compute[r] / compute[r] - 1.0), abs(on_comm[r] / comm[r] - 1.0))
            for r in compute
        )
        compute = {r: 0.5 * (compute[r] + on_compute[r]) for r in compute}
        comm = {r: 0.5 * (comm[r] + on_comm[r]) for r in comm}
        times = run()
        if moved < TOLERANCE:
            break
    return compute, comm, times
