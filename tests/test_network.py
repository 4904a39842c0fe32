"""The flow network and NCCL's algorithms against their closed forms."""

from __future__ import annotations

import pytest
import simpy

from simulator.engine.collectives import bus_factor, plan_collective, plan_p2p
from simulator.engine.core import EngineOptions, simulate
from simulator.engine.nccl import latency_seconds
from simulator.engine.network import FlowNetwork
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.schedule.ir import Collective, Program, Recv, Schedule, Send

from .helpers import cluster

RING_SIMPLE = EngineOptions(algorithm="ring", protocol="Simple")


def collective_alone(machine, kind, members, size, options=RING_SIMPLE, fidelity="flow") -> float:
    programs = {
        rank: Program(rank, [Collective(0, "comm", kind, "g", size, tags={"axis": "dp"})])
        for rank in members
    }
    options = EngineOptions(fidelity, options.algorithm, options.protocol)
    return simulate(Schedule(programs, {"g": tuple(members)}), machine, options).step_time


def nvlink(machine) -> float:
    return machine.spec.nvswitch.bandwidth * machine.spec.nvswitch.link_efficiency


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1.0, 1e6, 3e9])
def test_ring_all_reduce_inside_a_node_is_alpha_beta(n, size):
    """NCCL ring/Simple: base latency + 2(n−1)·α + 2(n−1)/n · S/B, with α NCCL's
    per-step NVLink latency (3.4 µs) and B the NVLink data rate."""
    machine = cluster(nodes=1)
    alpha, base = 3.4e-6, 8.4e-6
    expected = base + 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / nvlink(machine)
    assert collective_alone(machine, "all_reduce", list(range(n)), size) == pytest.approx(
        expected, rel=1e-6
    )


def test_ring_all_reduce_across_nodes_uses_one_ring_per_rail():
    machine = cluster(nodes=2)
    members, size = list(range(16)), 1e9
    rails = 8
    # every NIC carries one ring's crossing; the NIC (25 GB/s) is the slowest link of each ring
    bandwidth = rails * machine.spec.nic.bandwidth
    latency = latency_seconds("all_reduce", "ring", "Simple", 16, 2)
    expected = latency + 2 * 15 / 16 * size / bandwidth
    assert collective_alone(machine, "all_reduce", members, size) == pytest.approx(
        expected, rel=1e-6
    )


def test_one_gpu_per_node_rings_run_at_one_nic():
    machine = cluster(nodes=4)
    members, size = [0, 8, 16, 24], 4e8
    latency = latency_seconds("all_reduce", "ring", "Simple", 4, 4)
    expected = latency + 2 * 3 / 4 * size / machine.spec.nic.bandwidth
    assert collective_alone(machine, "all_reduce", members, size) == pytest.approx(
        expected, rel=1e-6
    )


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_ring_all_gather_and_reduce_scatter(kind):
    machine = cluster(nodes=1)
    n, size = 8, 2e8
    expected = 8.4e-6 + (n - 1) * 3.4e-6 + (n - 1) / n * size / nvlink(machine)
    assert collective_alone(machine, kind, list(range(n)), size) == pytest.approx(
        expected, rel=1e-6
    )


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize(
    "kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
)
def test_bus_bandwidth_factors_hold_for_large_messages(preset, nodes, kind):
    """algbw × nccl-tests factor = the bus bandwidth the plan reports."""
    machine = cluster(preset, nodes)
    gpus = list(range(machine.num_gpus))
    size = 2**33
    plan = plan_collective(machine, kind, gpus, size, "direct" if kind == "all_to_all" else "ring")
    algbw = size / plan.choice.time(size)
    # the bus bandwidth is the bottleneck links' rate, whatever the rank count
    assert algbw * bus_factor(kind, len(gpus)) == pytest.approx(plan.choice.busbw, rel=0.01)
    slowest = min(link.bandwidth for link in machine.links)
    assert plan.choice.busbw >= slowest


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100"])
def test_tree_wins_small_multi_node_all_reduce_and_ring_wins_large(preset):
    machine = cluster(preset, nodes=16)
    gpus = list(range(machine.num_gpus))
    small = plan_collective(machine, "all_reduce", gpus, 4096).choice
    large = plan_collective(machine, "all_reduce", gpus, 2**33).choice
    assert small.algorithm == "tree" and small.protocol == "LL"
    assert large.algorithm == "ring" and large.protocol == "Simple"
    ring_small = plan_collective(machine, "all_reduce", gpus, 4096, "ring").choice
    tree_large = plan_collective(machine, "all_reduce", gpus, 2**33, "tree").choice
    assert small.time(4096) < ring_small.time(4096)
    assert large.time(2**33) < tree_large.time(2**33)


def test_latency_bound_small_and_bandwidth_bound_large_messages():
    machine = cluster(nodes=1)
    gpus = list(range(8))
    tiny = plan_collective(machine, "all_reduce", gpus, 8).choice
    assert tiny.protocol == "LL"
    assert tiny.time(8) == pytest.approx(tiny.latency, rel=1e-3)  # all latency
    huge = plan_collective(machine, "all_reduce", gpus, 2**33).choice
    assert huge.latency / huge.time(2**33) < 1e-3  # all bandwidth


def test_nvls_only_where_the_switch_reduces():
    h100 = cluster("dgx-h100", nodes=1)
    a100 = cluster("dgx-a100", nodes=1)
    assert plan_collective(h100, "all_reduce", list(range(8)), 2**30).choice.algorithm == "nvls"
    assert plan_collective(a100, "all_reduce", list(range(8)), 2**30).choice.algorithm == "ring"
    # a pin the switch cannot run keeps the model's own choice (the run warns)
    assert plan_collective(a100, "all_reduce", list(range(8)), 2**30, "nvls").choice.algorithm == (
        "ring"
    )


def test_a_pinned_algorithm_a_group_cannot_run_is_a_warning_not_a_crash(scenarios_dir):
    scenario = load_scenario(scenarios_dir / "small.yaml", ["simulation.algorithm=tree"])
    result = run_scenario(scenario).result
    (warning,) = [w for w in result.warnings if w.startswith("simulation.algorithm")]
    assert "tree cannot run all_reduce" in warning and "kept parasim's choice, ring" in warning
    across = load_scenario(
        scenarios_dir / "pipeline-demo.yaml",
        ["simulation.algorithm=tree", "parallel.placement=[pp,tp,dp]"],
    )
    choices = run_scenario(across).result.simulation["collective_choices"]
    assert any(key.startswith("all_reduce/tree/") for key in choices)


def _run_flows(bandwidths: list[float], flows: list[tuple[dict[int, int], float]]) -> list[float]:
    env = simpy.Environment()
    network = FlowNetwork(env, bandwidths)
    finished: list[float] = [0.0] * len(flows)
    for index, (usage, volume) in enumerate(flows):
        network.transfer(usage, volume, 0.0, lambda i=index: finished.__setitem__(i, env.now))
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
    choice = plan_p2p(machine, 0, 8, size).choice
    nic = machine.spec.nic.bandwidth
    assert alone == pytest.approx(choice.latency + size / nic, rel=1e-9)
    assert rails_apart == pytest.approx(alone, rel=1e-9)
    # the NIC link is busy from the flows' start until both have crossed it
    assert same_nic == pytest.approx(choice.latency + 2 * size / nic, rel=1e-9)


def test_dp_all_reduce_and_pipeline_sends_on_one_nic_slow_each_other():
    machine = cluster(nodes=2)
    size = 5e8
    ring = [0, 8]  # one GPU per node: the ring crosses rail 0's NICs
    programs = {
        0: Program(
            0,
            [
                Collective(0, "dp", "all_reduce", "dp", size, tags={"axis": "dp"}),
                Send(1, "pp", 8, size, 0, tags={"axis": "pp"}),
            ],
        ),
        8: Program(
            8,
            [
                Collective(0, "dp", "all_reduce", "dp", size, tags={"axis": "dp"}),
                Recv(1, "pp", 0, size, 0, tags={"axis": "pp"}),
            ],
        ),
    }
    together = simulate(Schedule(programs, {"dp": tuple(ring)}), machine)
    dp_alone = collective_alone(machine, "all_reduce", ring, size, EngineOptions())
    send_alone = simulate(p2p_schedule([(0, 8)], size), machine).step_time
    dp_end = together.end[0][0]
    assert dp_end > 1.3 * dp_alone
    assert together.step_time > 1.3 * max(dp_alone, send_alone)


def test_link_utilisation_is_recorded_per_link():
    from simulator.analysis.links import link_summary, utilisation_bins

    machine = cluster(nodes=2)
    size = 1e9
    times = simulate(p2p_schedule([(0, 8), (0, 9)], size), machine)
    rows = {
        row["link"]: row for row in link_summary(machine, times.link_utilisation, times.step_time)
    }
    nic = rows["n0.nic0->leaf0"]
    assert nic["bytes"] == pytest.approx(2 * size, rel=1e-6)  # both sends crossed it
    assert nic["peak_utilisation"] == pytest.approx(1.0)
    assert rows["n1.nic0->n1.gpu0"]["bytes"] == pytest.approx(size, rel=1e-6)
    link_id = next(
        link.id for link in machine.links if (link.src, link.dst) == ("n0.nic0", "leaf0")
    )
    bins = utilisation_bins(
        times.link_utilisation[link_id], machine.links[link_id].bandwidth, times.step_time, 10
    )
    assert all(0 <= b <= 1 + 1e-9 for b in bins) and bins[5] == pytest.approx(1.0)
    assert sum(bins) / 10 == pytest.approx(nic["mean_utilisation"], rel=1e-6)


def test_a_call_s_busiest_link_summed_with_arrays_is_the_loop_s_to_the_bit():
    """A call with many link crossings (a folded call's images) has its links' loads
    summed with arrays; the busiest link's time is exactly the plain loop's, including
    links that several of its transfers cross."""
    import random

    from simulator.engine import alone
    from simulator.engine.collectives import collective_transfers

    machine = cluster(nodes=4)
    gpus = list(range(machine.num_gpus))
    pick = random.Random(7)
    for _ in range(40):
        specs = []
        for _ in range(pick.randint(1, 6)):
            members = sorted(pick.sample(gpus, pick.choice([2, 4, 8, 16])))
            kind = pick.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
            specs += collective_transfers(machine, kind, members, pick.uniform(1e3, 1e9))[1]
        crossings = sum(len(spec.usage) for spec in specs if spec.volume > 0)
        arrays = alone.time_alone(machine, specs, 0.0)
        saved = alone._ARRAY_CROSSINGS
        try:
            alone._ARRAY_CROSSINGS = 10**9  # the plain loop
            loop = alone.time_alone(machine, specs, 0.0)
        finally:
            alone._ARRAY_CROSSINGS = saved
        assert arrays == loop
        assert crossings <= saved or arrays > 0


def _series_one_entry_at_a_time(log, bandwidths) -> dict[int, list[tuple[float, float]]]:
    """Each link's load after each log entry, summed entry by entry (a load within
    1e-9 of the link's bandwidth of zero taken as zero), one point per instant."""
    loads: dict[int, float] = {}
    series: dict[int, list[tuple[float, float]]] = {}
    for now, usage, change, _ in log:
        for link, mult in usage:
            load = loads.get(link, 0.0) + mult * change
            if abs(load) <= 1e-9 * bandwidths[link]:
                load = 0.0
            loads[link] = load
            points = series.setdefault(link, [])
            if points and points[-1][0] == now:
                points[-1] = (now, load)
            elif not points or points[-1][1] != load:
                points.append((now, load))
    return series


def test_link_series_in_arrays_are_the_loads_summed_entry_by_entry():
    """Random transfers starting over time on shared links: the arrays' series are the
    step functions summing the log entry by entry gives (loads to rounding, a point only
    where the load changes), exactly zero on an idle link, and carry what the series
    integrate to."""
    import random
    from itertools import pairwise

    rng = random.Random(7)
    bandwidths = [rng.choice([10.0, 25.0, 40.0]) for _ in range(12)]
    env = simpy.Environment()
    network = FlowNetwork(env, bandwidths)

    def start(usage, volume, delay):
        yield env.timeout(delay)
        network.transfer(usage, volume, rng.choice([0.0, 0.5]), lambda: None)

    for _ in range(60):
        links = rng.sample(range(12), rng.randint(1, 4))
        usage = {link: rng.randint(1, 3) for link in links}
        env.process(start(usage, rng.uniform(5, 500), rng.uniform(0, 40)))
    env.run()
    series = network.utilisation
    expected = _series_one_entry_at_a_time(network._rate_log, bandwidths)
    assert sorted(series) == sorted(expected)
    end = env.now
    carried = series.carried(end)
    for link, points in expected.items():
        got = series[link]

        def at(steps, t):
            return [load for when, load in steps if when <= t][-1]

        instants = sorted({t for t, _ in got} | {t for t, _ in points})
        assert [at(got, t) for t in instants] == pytest.approx(
            [at(points, t) for t in instants], abs=1e-9
        )
        assert all(a[1] != b[1] for a, b in pairwise(got))
        assert got[-1][1] == 0.0  # every transfer ended: the link is idle, exactly
        integral = sum(
            load * (t1 - t0)
            for (t0, load), (t1, _) in zip(points, [*points[1:], (end, 0)], strict=True)
        )
        assert carried[link] == pytest.approx(integral, rel=1e-9, abs=1e-6)
        assert series.peak(link) == pytest.approx(max(load for _, load in points))
