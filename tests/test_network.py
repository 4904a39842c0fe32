"""The flow network and the ring collectives against their closed forms."""

from __future__ import annotations

import pytest
import simpy

from simulator.engine.core import simulate
from simulator.engine.network import FlowNetwork
from simulator.schedule.ir import Collective, Program, Recv, Schedule, Send

from .helpers import cluster


def collective_alone(machine, kind: str, members: list[int], size: float) -> float:
    programs = {
        rank: Program(rank, [Collective(0, "comm", kind, "g", size, tags={"axis": "dp"})])
        for rank in members
    }
    return simulate(Schedule(programs, {"g": tuple(members)}), machine).step_time


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1.0, 1e6, 3e9])
def test_ring_all_reduce_inside_a_node(n, size):
    machine = cluster(nodes=1)
    alpha = machine.spec.nvswitch.latency
    bandwidth = machine.spec.nvswitch.bandwidth
    expected = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth
    assert collective_alone(machine, "all_reduce", list(range(n)), size) == pytest.approx(
        expected, rel=1e-6
    )


def test_ring_all_reduce_across_nodes_runs_at_the_slowest_link():
    machine = cluster(nodes=2)
    members = list(range(16))
    size = 1e9
    edges = [(members[i], members[(i + 1) % 16]) for i in range(16)]
    alpha = max(machine.route(a, b).latency for a, b in edges)
    bandwidth = min(
        machine.links[link].bandwidth for a, b in edges for link in machine.route(a, b).links
    )
    assert bandwidth == machine.spec.nic.bandwidth
    expected = 2 * 15 * alpha + 2 * 15 / 16 * size / bandwidth
    assert collective_alone(machine, "all_reduce", members, size) == pytest.approx(
        expected, rel=1e-6
    )


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_ring_all_gather_and_reduce_scatter(kind):
    machine = cluster(nodes=1)
    n, size = 8, 2e8
    alpha, bandwidth = machine.spec.nvswitch.latency, machine.spec.nvswitch.bandwidth
    expected = (n - 1) * alpha + (n - 1) / n * size / bandwidth
    assert collective_alone(machine, kind, list(range(n)), size) == pytest.approx(
        expected, rel=1e-6
    )


def _run_flows(bandwidths: list[float], flows: list[tuple[dict[int, int], float]]) -> list[float]:
    env = simpy.Environment()
    network = FlowNetwork(env, bandwidths)
    finished: list[float] = [0.0] * len(flows)
    for index, (usage, volume) in enumerate(flows):
        done = network.transfer(usage, volume, 0.0)
        done.callbacks.append(lambda _ev, i=index: finished.__setitem__(i, env.now))
    env.run()
    return finished


def test_two_flows_sharing_a_link_get_half_each():
    # flow 0 crosses links 0 and 1, flow 1 crosses links 1 and 2: link 1 is shared.
    times = _run_flows([10.0, 10.0, 10.0], [({0: 1, 1: 1}, 100.0), ({1: 1, 2: 1}, 100.0)])
    assert times == pytest.approx([20.0, 20.0], rel=1e-12)


def test_flows_on_disjoint_links_do_not_slow_each_other():
    times = _run_flows([10.0, 10.0, 10.0], [({0: 1}, 100.0), ({2: 1}, 100.0)])
    assert times == pytest.approx([10.0, 10.0], rel=1e-12)


def test_max_min_gives_leftover_to_the_unconstrained_flow():
    # link 0 (10 B/s) carries flows A and B; link 1 (4 B/s) carries B only.
    # B is held to 4 by link 1, so A gets the remaining 6 of link 0.
    times = _run_flows([10.0, 4.0], [({0: 1}, 60.0), ({0: 1, 1: 1}, 40.0)])
    assert times == pytest.approx([10.0, 10.0], rel=1e-12)


def test_rates_rise_when_a_sharing_flow_finishes():
    # Both share link 0 (10 B/s): 5 B/s each until the short one ends at t=10
    # (50 bytes), then the long one runs alone: 150 more bytes at 10 B/s.
    times = _run_flows([10.0], [({0: 1}, 50.0), ({0: 1}, 200.0)])
    assert times == pytest.approx([10.0, 25.0], rel=1e-12)


def p2p_schedule(pairs: list[tuple[int, int]], size: float) -> Schedule:
    programs: dict[int, Program] = {}
    for tag, (src, dst) in enumerate(pairs):
        for rank, op_type, peer in ((src, Send, dst), (dst, Recv, src)):
            program = programs.setdefault(rank, Program(rank))
            stream = f"{op_type.__name__.lower()}{tag}"
            program.ops.append(
                op_type(len(program.ops), stream, peer, size, tag, tags={"axis": "pp"})
            )
    return Schedule(programs, {})


def test_sends_through_one_nic_share_it_and_sends_on_other_rails_do_not():
    machine = cluster(nodes=2)
    size = 1e9
    alone = simulate(p2p_schedule([(0, 8)], size), machine).step_time
    rails_apart = simulate(p2p_schedule([(0, 8), (1, 9)], size), machine).step_time
    same_nic = simulate(p2p_schedule([(0, 8), (0, 9)], size), machine).step_time
    nic = machine.spec.nic.bandwidth
    assert alone == pytest.approx(machine.route(0, 8).latency + size / nic, rel=1e-9)
    assert rails_apart == pytest.approx(alone, rel=1e-9)
    # The NIC link is busy from the first flow's arrival until both have crossed it.
    assert same_nic == pytest.approx(machine.route(0, 8).latency + 2 * size / nic, rel=1e-9)
