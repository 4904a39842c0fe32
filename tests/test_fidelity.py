"""Analytic fidelity (closed form, folded ranks) against flow fidelity (every flow)."""

from __future__ import annotations

import json

import pytest

from simulator.analysis.contention import missed_contention
from simulator.arithmetic.moe import loads_equal
from simulator.cli.main import main
from simulator.engine.collectives import collective_transfers
from simulator.engine.core import EngineOptions, simulate
from simulator.request.scenario import load_scenario
from simulator.run.simulate import folds, run_scenario
from simulator.schedule.ir import Collective, Program, Recv, Schedule, Send

from .conftest import SCENARIOS
from .helpers import cluster

SIZES = [8.0, 65536.0, 8 * 2**20, 8 * 2**30]


def alone(machine, kind, world, size, fidelity) -> float:
    programs = {r: Program(r, [Collective(0, "c", kind, "g", size)]) for r in range(world)}
    return simulate(
        Schedule(programs, {"g": tuple(range(world))}), machine, EngineOptions(fidelity)
    ).step_time


@pytest.mark.parametrize(
    "preset,nodes,gpus_per_node",
    [
        ("dgx-a100", 1, 2),
        ("dgx-h100", 1, 8),
        ("dgx-a100", 2, 8),
        ("dgx-h100", 8, 8),
        ("dgx-a100", 128, 8),
    ],
)
@pytest.mark.parametrize(
    "kind", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
)
def test_isolated_collectives_agree_within_3_percent(preset, nodes, gpus_per_node, kind):
    machine = cluster(
        preset, nodes, gpus_per_node=gpus_per_node, nic={"per_node": min(8, gpus_per_node)}
    )
    world = machine.num_gpus
    if kind == "all_to_all" and world > 64:
        pytest.skip(
            "a direct all-to-all on 1024 ranks is a million flows; the 64-rank case covers it"
        )
    for size in SIZES:
        flow = alone(machine, kind, world, size, "flow")
        analytic = alone(machine, kind, world, size, "analytic")
        assert analytic == pytest.approx(flow, rel=0.03), (size, flow, analytic)


STEP_SCENARIOS = [
    ("small.yaml", []),
    ("pipeline-demo.yaml", []),
    ("pipeline-demo.yaml", ["parallel.schedule=gpipe", "training.recompute=full"]),
    ("pipeline-demo.yaml", ["parallel.tp=4", "parallel.dp=2", "training.global_batch=16"]),
    (
        "small.yaml",
        [
            "cluster.nodes=4",
            "parallel.tp=4",
            "parallel.dp=8",
            "training.global_batch=32",
            "training.micro_batch=1",
        ],
    ),
]


MOE_SMALL = ["model.layers=2", "model.seq_len=1024", "training.global_batch=16"]
STEP_SCENARIOS += [
    ("mixtral-ep.yaml", MOE_SMALL),
    ("mixtral-ep-skewed.yaml", MOE_SMALL),
]


@pytest.mark.parametrize("name,overrides", STEP_SCENARIOS)
def test_whole_steps_agree_within_5_percent(name, overrides):
    flow = run_scenario(load_scenario(SCENARIOS / name, overrides))
    analytic = run_scenario(
        load_scenario(SCENARIOS / name, [*overrides, "simulation.fidelity=analytic"])
    )
    layout = analytic.scenario.layout
    # one rank per stage (and EP group), where an EP group's ranks receive alike
    if analytic.scenario.moe is None:
        simulated = layout.pp
    elif folds(analytic.scenario):  # one per EP group too, where they route apart
        scenario = analytic.scenario
        tokens = scenario.training.micro_batch * scenario.model.seq_len
        alike = loads_equal(scenario.moe, tokens)
        simulated = layout.pp * (1 if alike else layout.dp // layout.ep)
    else:
        simulated = layout.world
    assert analytic.result.simulation["simulated_ranks"] == simulated
    assert analytic.result.simulation["folded"] == (simulated < layout.world)
    assert analytic.result.step_time_s == pytest.approx(flow.result.step_time_s, rel=0.05)
    for category, value in flow.result.breakdown.mean.items():
        assert analytic.result.breakdown.mean[category] == pytest.approx(
            value, rel=0.05, abs=0.01 * flow.result.step_time_s
        )


def test_analytic_ignores_contention_that_flow_sees():
    """Concurrent sends through one NIC: flow halves their bandwidth, analytic does not."""
    from simulator.schedule.ir import Recv, Send

    machine = cluster(nodes=2)
    size = 1e9
    programs = {
        0: Program(0, [Send(0, "a", 8, size, 0), Send(1, "b", 9, size, 1)]),
        8: Program(8, [Recv(0, "a", 0, size, 0)]),
        9: Program(9, [Recv(0, "b", 0, size, 1)]),
    }
    flow = simulate(Schedule(programs, {}), machine, EngineOptions("flow")).step_time
    analytic = simulate(Schedule(programs, {}), machine, EngineOptions("analytic")).step_time
    assert flow == pytest.approx(2 * analytic, rel=0.01)


def test_collbench_table_and_json(capsys):
    assert (
        main(
            [
                "collbench",
                "--preset",
                "dgx-a100",
                "--nodes",
                "2",
                "--op",
                "all_reduce",
                "--sizes",
                "8B-1GiB",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "algbw" in table and "busbw" in table and "Avg bus bandwidth" in table
    assert "tree/LL" in table and "ring/Simple" in table
    assert (
        main(
            [
                "collbench",
                "--preset",
                "dgx-h100",
                "--op",
                "all_gather",
                "--sizes",
                "1MiB,1GiB",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [row["bytes"] for row in rows] == [2**20, 2**30]
    for row in rows:
        assert set(row) == {"bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol"}
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 7 / 8)
    # at 1 GiB an 8-GPU all-gather runs at NVLink's data rate (450 GB/s x 0.824)
    assert rows[1]["busbw_GBps"] == pytest.approx(450 * 0.824, rel=0.02)


def test_collbench_bad_input(capsys):
    assert main(["collbench", "--preset", "dgx-a100", "--sizes", "8GiB-8B"]) == 2
    assert "--sizes" in capsys.readouterr().err
    assert main(["collbench", "--preset", "dgx-a100", "--algo", "nvls"]) == 2
    assert "available algorithms" in capsys.readouterr().err
    assert main(["collbench", "--preset", "dgx-z100"]) == 2
    assert "dgx-z100" in capsys.readouterr().err


# FSDP2's copy-in stream under a pipeline: a side stream's op issued before the rank's
# first action has started (both engines stopped on it with a KeyError)
FSDP2_PIPELINE = [
    "training.framework=torchtitan",
    "cluster.nodes=4",
    "training.global_batch=128",
    "parallel.tp=4",
    "parallel.pp=2",
    "parallel.dp=4",
    "training.micro_batch=2",
    "training.recompute=selective",
    "training.sharding=full",
    "training.optimizer_sharding=false",
]


def test_a_search_step_of_fsdp2_reducing_every_micro_batch_is_the_runs_step():
    # FSDP2 without a pipeline reduce-scatters in every micro-batch's backward, inside
    # the blocks of the earlier ones: the optimizer waited for body-numbered ops (a
    # search's shorter program raised IndexError)
    overrides = [*FSDP2_PIPELINE, "parallel.pp=1", "parallel.dp=8", "parallel.tp=4"]
    scenario = load_scenario(SCENARIOS / "llama3-8b.yaml", overrides)
    run = run_scenario(scenario).result.step_time_s
    search = run_scenario(scenario, numbers_only=True).result.step_time_s
    assert search == pytest.approx(run, rel=1e-12)


@pytest.mark.parametrize("name,overrides", [*STEP_SCENARIOS, ("llama3-8b.yaml", FSDP2_PIPELINE)])
def test_closed_form_analytic_equals_the_simpy_replay(name, overrides):
    """The event-free evaluator and the SimPy engine give the same analytic times."""
    from simulator.run.simulate import build_schedule

    scenario = load_scenario(SCENARIOS / name, [*overrides, "simulation.fidelity=analytic"])
    schedule = build_schedule(scenario)
    direct = simulate(schedule, scenario.cluster, EngineOptions("analytic"))
    replay = simulate(schedule, scenario.cluster, EngineOptions("analytic", closed_form=False))
    assert direct.step_time == pytest.approx(replay.step_time, rel=1e-12)
    for rank in schedule.programs:
        assert direct.end[rank] == pytest.approx(replay.end[rank], rel=1e-12, abs=1e-15)
        assert direct.start[rank] == pytest.approx(replay.start[rank], rel=1e-12, abs=1e-15)
    assert direct.collective_choices == replay.collective_choices


DENSE_STEPS = [(name, overrides) for name, overrides in STEP_SCENARIOS if "mixtral" not in name]
DENSE_STEPS += [
    ("gpt3-175b-zb.yaml", ["training.global_batch=16"]),
    ("gpt3-175b-interleaved.yaml", ["training.global_batch=16"]),
    ("dense-70b-sp.yaml", ["training.global_batch=8", "training.recompute=selective"]),
]
# fabrics where images of an op share links: oversubscribed leaves, pods behind a core
FOUR_NODES = ["cluster.nodes=4", "parallel.tp=4", "parallel.dp=4", "training.global_batch=16"]
DENSE_STEPS += [
    ("pipeline-demo.yaml", [*FOUR_NODES, "cluster.network.oversubscription=4"]),
    (
        "pipeline-demo.yaml",
        [*FOUR_NODES, "cluster.network.pod_size=2", "cluster.network.core_oversubscription=4"],
    ),
]


@pytest.mark.parametrize("name,overrides", DENSE_STEPS)
def test_blocks_time_a_step_exactly_as_its_ops(name, overrides):
    _blocks_against_ops(name, overrides)


def _blocks_against_ops(name: str, overrides: list[str]) -> None:
    """A pipeline action written as one block gives the same times and accounting as
    the action written op by op."""
    from simulator.run.simulate import assemble_result
    from simulator.schedule.step import LoweringPlan, build_step

    scenario = load_scenario(SCENARIOS / name, [*overrides, "simulation.fidelity=analytic"])
    results = []
    for blocks in (False, True):
        plan = LoweringPlan(fold=True, blocks=blocks)
        schedule = build_step(scenario.recipe, scenario.model, moe=scenario.moe, plan=plan)
        times = simulate(schedule, scenario.cluster, EngineOptions("analytic"))
        results.append(assemble_result(scenario, schedule, times, "analytic"))
    ops, blocked = results
    assert blocked.simulation["blocks"] > 0
    assert blocked.step_time_s == pytest.approx(ops.step_time_s, rel=1e-12)
    for category, value in ops.breakdown.critical.items():
        assert blocked.breakdown.critical[category] == pytest.approx(value, abs=1e-9)
    assert blocked.hardware_flops_per_step == pytest.approx(ops.hardware_flops_per_step)
    assert blocked.simulation["collective_choices"] == ops.simulation["collective_choices"]
    assert blocked.simulation["ops"] == ops.simulation["ops"]
    assert blocked.moe == ops.moe  # a blocked MoE step's routing counts every layer


# MoE steps whose EP ranks receive alike (uniform routing): one rank per stage and EP
# group stands for the group. DeepSeek-V3-like's 256 ranks over 8 stages (11 layers, one
# micro-batch) take seconds unfolded in analytic fidelity and minutes in flow: analytic
MOE_ALIKE = [
    ("mixtral-ep.yaml", MOE_SMALL, "analytic"),
    ("mixtral-ep.yaml", MOE_SMALL, "flow"),
    ("mixtral-ep.yaml", [*MOE_SMALL, "cluster.nodes=4", "parallel.dp=16"], "analytic"),
    ("mixtral-ep.yaml", [*MOE_SMALL, "cluster.nodes=4", "parallel.dp=16"], "flow"),
    (
        "deepseek-v3-like-ep.yaml",
        ["model.layers=11", "parallel.stage_layers=[2,1,1,1,1,1,2,2]", "training.global_batch=32"],
        "analytic",
    ),
]


@pytest.mark.parametrize(
    "name,overrides",
    [(name, overrides) for name, overrides, fidelity in MOE_ALIKE if fidelity == "analytic"],
)
def test_an_alike_moe_steps_blocks_time_it_exactly_as_its_ops(name, overrides):
    """Where an EP group's ranks receive alike, every MoE layer and micro-batch routes
    the same, and the folded step's actions written as blocks time it as its ops do."""
    _blocks_against_ops(name, overrides)


# every rank of a 64- to 256-GPU step of a big model takes seconds to simulate: slow
_SLOW = ("gpt3-175b", "dense-70b", "deepseek")
FOLDED_STEPS = [
    pytest.param(name, overrides, fidelity, marks=[pytest.mark.slow] * name.startswith(_SLOW))
    for name, overrides, fidelity in [
        *((n, o, f) for n, o in DENSE_STEPS for f in ("analytic", "flow")),
        *MOE_ALIKE,
    ]
]


@pytest.mark.parametrize("name,overrides,fidelity", FOLDED_STEPS)
def test_folded_and_unfolded_steps_agree_within_1_percent(name, overrides, fidelity):
    """Folding simulates one rank per pipeline stage (and EP group) for its symmetric
    peers; where the step is small enough to simulate every rank too, the two agree,
    every rank's figures read from its class's row are its own, and the result says
    which was done."""
    results = {}
    for fold in (True, False):
        scenario = load_scenario(
            SCENARIOS / name,
            [*overrides, f"simulation.fidelity={fidelity}", f"simulation.fold={fold}"],
        )
        results[fold] = run_scenario(scenario).result
    folded, every = results[True], results[False]
    world = folded.cluster.gpus
    assert folded.simulation["folded"] == (folded.simulation["simulated_ranks"] < world)
    assert not every.simulation["folded"] and every.simulation["simulated_ranks"] == world
    assert folded.step_time_s == pytest.approx(every.step_time_s, rel=0.01)
    for category, value in every.breakdown.critical.items():
        assert folded.breakdown.critical[category] == pytest.approx(
            value, abs=0.01 * every.step_time_s
        )
    assert folded.memory.peak_bytes_per_gpu == every.memory.peak_bytes_per_gpu
    # every rank's figures read from its class's row are its own, within 1% of the step
    assert sum(row.ranks for row in folded.per_rank) == world
    for rank in range(world):
        mine, its_class = every.rank_figures(rank), folded.rank_figures(rank)
        assert (its_class.rank, its_class.node, its_class.pp) == (rank, mine.node, mine.pp)
        for category, value in mine.breakdown.items():
            assert its_class.breakdown[category] == pytest.approx(
                value, abs=0.01 * every.step_time_s
            )


def test_a_folded_moe_step_with_unequal_loads_keeps_its_step_time_and_says_so():
    """Skewed routing: each folded rank runs its EP group's busiest member's experts, so
    the step time is the unfolded one; the result warns that every rank's figures are
    the busiest member's, and such a step folds only when asked."""
    overrides = [*MOE_SMALL, "simulation.fidelity=analytic"]
    default = load_scenario(SCENARIOS / "mixtral-ep-skewed.yaml", overrides)
    assert not folds(default)
    every = run_scenario(default).result
    folded = run_scenario(
        load_scenario(SCENARIOS / "mixtral-ep-skewed.yaml", [*overrides, "simulation.fold=true"])
    ).result
    assert folded.simulation["folded"] and not every.simulation["folded"]
    assert folded.step_time_s == pytest.approx(every.step_time_s, rel=0.01)
    assert any("busiest member" in w for w in folded.warnings)
    assert not any("busiest member" in w for w in every.warnings)


OVERSUBSCRIBED = [
    "pipeline-demo.yaml",
    "teaching/layering-fix.yaml",
    "teaching/layering-mistake.yaml",
    "teaching/fsdp-across-nodes-mistake.yaml",
    "teaching/fsdp-across-nodes-fix.yaml",
    "teaching/pipeline-bubble-fix.yaml",
    "teaching/cp-across-nodes-fix.yaml",
    "teaching/cp-across-nodes-mistake.yaml",
]


@pytest.mark.slow
# no oversubscription and a strong one: the two ends of what the core does to a step
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("name", OVERSUBSCRIBED)
def test_analytic_prices_an_oversubscribed_core_as_flow_does(name, ratio):
    """Every node its own pod, the core oversubscribed: analytic and flow agree within 5%,
    unless analytic says in a warning why it cannot (a per-layer axis crossing the core
    beside other traffic), and then it is the faster of the two."""
    times, warned = {}, {}
    for fidelity in ("analytic", "flow"):
        overrides = [
            "cluster.network.pod_size=1",
            f"cluster.network.core_oversubscription={ratio}",
            f"simulation.fidelity={fidelity}",
        ]
        result = run_scenario(load_scenario(SCENARIOS / name, overrides)).result
        times[fidelity] = result.step_time_s
        warned[fidelity] = any(w.startswith("analytic fidelity prices") for w in result.warnings)
    assert not warned["flow"]
    if warned["analytic"]:
        assert ratio > 1 and times["analytic"] <= times["flow"] * 1.001
    else:
        assert times["analytic"] == pytest.approx(times["flow"], rel=0.05)


def test_an_oversubscription_that_no_traffic_crosses_says_so():
    result = run_scenario(
        load_scenario(SCENARIOS / "small.yaml", ["cluster.network.oversubscription=2"])
    ).result
    assert any("network.oversubscription 2:1 changes nothing here" in w for w in result.warnings)
    one_pod = run_scenario(
        load_scenario(SCENARIOS / "pipeline-demo.yaml", ["cluster.network.core_oversubscription=2"])
    ).result
    assert any("there is no core to cross" in w for w in one_pod.warnings)


@pytest.mark.parametrize("fidelity", ["analytic", "flow"])
def test_a_send_and_its_reverse_move_on_opposite_links(fidelity):
    """Two ranks that send to each other at once (a context-parallel ring of two, a
    pipeline's forward and backward) use each direction of their links once: the
    exchange takes as long as one send alone."""
    machine = cluster("dgx-h100", 1)
    size = 64 * 2**20
    one_way = {
        0: Program(0, [Send(0, "s", 1, size, 0)]),
        1: Program(1, [Recv(0, "r", 0, size, 0)]),
    }
    both_ways = {
        r: Program(r, [Send(0, "s", 1 - r, size, 0), Recv(1, "r", 1 - r, size, 0)]) for r in (0, 1)
    }
    options = EngineOptions(fidelity)
    alone = simulate(Schedule(one_way, {}), machine, options).step_time
    exchange = simulate(Schedule(both_ways, {}), machine, options).step_time
    assert exchange == pytest.approx(alone, rel=1e-9)


def test_an_uneven_all_to_all_sends_each_pair_its_own_way():
    """An uneven all-to-all moves each pair's bytes from its source to its destination:
    two ranks exchanging equal splits load each direction of their links once."""
    machine = cluster("dgx-h100", 1)
    size = 64 * 2**20
    even = collective_transfers(machine, "all_to_all", [0, 1], size)[1]
    uneven = collective_transfers(
        machine, "all_to_all", [0, 1], size, splits={0: (0.0, size / 2), 1: (size / 2, 0.0)}
    )[1]
    crossings = [link for spec in uneven for link in spec.usage]
    assert len(crossings) == len(set(crossings)) == 4  # each GPU's link up and its link down
    assert set(crossings) == {link for spec in even for link in spec.usage}


def _two_axes_on_one_link(size: float) -> Schedule:
    """Ranks 0 and 1 each run a TP and a DP all-reduce of ``size`` bytes at once, on two
    groups of the same two GPUs (two streams, the same NVLink ports)."""
    programs = {
        r: Program(
            r,
            [
                Collective(0, "tp", "all_reduce", "tp0", size, tags={"axis": "tp"}),
                Collective(1, "dp", "all_reduce", "dp0", size, tags={"axis": "dp"}),
            ],
        )
        for r in (0, 1)
    }
    return Schedule(programs, {"tp0": (0, 1), "dp0": (0, 1)})


def test_the_contention_analytic_leaves_out_is_what_flow_adds():
    """Two calls of two axes on the same links at once: analytic runs each at full speed,
    flow shares the links; the contention the analytic timeline shows left out is the
    time flow adds, and it names the axes and a rank that lost it."""
    machine = cluster("dgx-h100", 1)
    schedule = _two_axes_on_one_link(256 * 2**20)
    layout = load_scenario(SCENARIOS / "small.yaml", []).layout
    analytic = simulate(schedule, machine, EngineOptions("analytic"))
    flow = simulate(schedule, machine, EngineOptions("flow"))
    missed = missed_contention(machine, schedule, analytic, layout)
    assert flow.step_time > 1.9 * analytic.step_time
    assert missed.seconds == pytest.approx(flow.step_time - analytic.step_time, rel=0.01)
    assert missed.axes == ("dp", "tp") and missed.rank in (0, 1)


def test_calls_of_one_axis_one_after_another_leave_nothing_out():
    machine = cluster("dgx-h100", 1)
    schedule = _two_axes_on_one_link(256 * 2**20)
    for program in schedule.programs.values():  # both on one stream: one after the other
        program.ops[1].stream = "tp"
    layout = load_scenario(SCENARIOS / "small.yaml", []).layout
    analytic = simulate(schedule, machine, EngineOptions("analytic"))
    assert missed_contention(machine, schedule, analytic, layout).seconds == 0.0


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("gpt3-175b.yaml", []),
        ("llama3-70b-3d.yaml", []),
        ("pipeline-demo.yaml", []),
        ("small.yaml", []),
    ],
)
def test_a_layout_whose_axes_keep_to_their_links_carries_no_contention_warning(name, overrides):
    result = run_scenario(
        load_scenario(SCENARIOS / name, ["simulation.fidelity=analytic", *overrides]),
        numbers_only=True,
    ).result
    assert not any("flow fidelity" in warning for warning in result.warnings), result.warnings


@pytest.mark.slow
def test_an_analytic_step_whose_calls_contend_says_how_much_and_flow_agrees():
    """TP across two nodes beside pipeline sends and FSDP's gathers on the same NICs:
    the analytic result warns, and flow finds the step longer by about what it says."""
    overrides = [
        "parallel.placement=[tp,pp,dp]",
        "parallel.tp=16",
        "parallel.pp=2",
        "parallel.dp=2",
        "training.sharding=full",
        "training.global_batch=8",
        "cluster.nodes=8",
        "model.layers=8",
    ]
    analytic = run_scenario(
        load_scenario(
            SCENARIOS / "pipeline-demo.yaml", [*overrides, "simulation.fidelity=analytic"]
        )
    ).result
    warnings = [w for w in analytic.warnings if "calls run at once on the links" in w]
    assert len(warnings) == 1 and "--set simulation.fidelity=flow" in warnings[0]
    flow = run_scenario(
        load_scenario(SCENARIOS / "pipeline-demo.yaml", [*overrides, "simulation.fidelity=flow"])
    ).result
    assert not any("calls run at once on the links" in w for w in flow.warnings)
    assert flow.step_time_s > 1.02 * analytic.step_time_s


@pytest.mark.parametrize("fidelity", ["analytic", "flow"])
def test_an_ep_groups_alike_ranks_run_one_lowered_program(fidelity, monkeypatch):
    """Every rank simulated, the ranks of an EP group that receive alike run one
    program lowered once per stage and group (their all-to-alls carrying the group's
    matrix): the same step, to the bit, as each rank lowered on its own."""
    from simulator.schedule import step as step_module

    overrides = [*MOE_SMALL, f"simulation.fidelity={fidelity}", "simulation.fold=false"]
    scenario = load_scenario(SCENARIOS / "mixtral-ep.yaml", overrides)
    shared = run_scenario(scenario).result
    monkeypatch.setattr(step_module, "loads_equal", lambda spec, tokens: False)
    scenario = load_scenario(SCENARIOS / "mixtral-ep.yaml", overrides)
    alone = run_scenario(scenario).result
    assert shared.step_time_s == alone.step_time_s
    assert [row.breakdown for row in shared.per_rank] == [row.breakdown for row in alone.per_rank]
