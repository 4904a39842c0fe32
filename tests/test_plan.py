"""The whole run (``parasim plan``): phases of steps, failures, checkpoints and restarts,
cost and energy."""

from __future__ import annotations

import json
import math

import pytest

from simulator.analysis.checkpoint import checkpoint_write
from simulator.analysis.power import gpu_powers, step_energy
from simulator.analysis.result import RankAccount
from simulator.cli.main import main
from simulator.request.scenario import load_scenario
from simulator.run.simulate import make_trace, run_scenario
from simulator.tools.goodput import optimal_interval, simulate_goodput, young_interval
from simulator.tools.plan import plan_run

from .conftest import ROOT
from .helpers import MARKUP, markup_args

SMALL = str(ROOT / "scenarios" / "small.yaml")
NO_FAILURES = (
    "run={tokens: 4e9, failures: {per_gpu_hour: none}, phases: ["
    "{name: short, tokens: 1e9, set: [training.global_batch=32]}, "
    "{name: long, tokens: 3e9, set: [model.seq_len=2048]}]}"
)


def test_without_failures_the_run_is_its_phases_steps():
    plan = plan_run(SMALL, [NO_FAILURES])
    assert [p.name for p in plan.phases] == ["short", "long"]
    total = 0.0
    for phase, sets, tokens in zip(
        plan.phases, (["training.global_batch=32"], ["model.seq_len=2048"]), (1e9, 3e9), strict=True
    ):
        scenario = load_scenario(SMALL, [NO_FAILURES, *sets])
        step = run_scenario(scenario, numbers_only=True).result.step_time_s
        per_step = scenario.spec.training.global_batch * scenario.model.seq_len
        assert phase.steps == math.ceil(tokens / per_step) and phase.step_s == step
        total += phase.steps * step
    assert plan.wall_s == pytest.approx(total, rel=1e-12) and plan.goodput == pytest.approx(1.0)
    assert all(p.goodput.failures == 0 and p.goodput.checkpointing == 0 for p in plan.phases)


def test_daly_s_interval_is_the_monte_carlo_s_optimum_within_its_spread():
    mtbf, cost, work = 10 * 3600.0, 300.0, 30 * 86400.0
    best = optimal_interval(cost, mtbf)
    assert young_interval(cost, mtbf) * 0.9 < best < young_interval(cost, mtbf)
    scan = {
        f: simulate_goodput(work, 1 / mtbf, best * f, cost, 600.0, 400, 1)
        for f in (0.25, 0.5, 0.7, 1.0, 1.4, 2.0, 4.0)
    }
    fastest = min(scan, key=lambda f: scan[f].wall_mean)
    at_daly = scan[1.0]
    # the scan's best is no better than Daly's interval by more than the draws' spread
    assert scan[fastest].wall_mean >= at_daly.wall_mean - (at_daly.wall_p90 - at_daly.wall_p10)
    assert 0.5 <= fastest <= 2.0
    # far from it, the run is measurably slower
    assert scan[0.25].wall_mean > at_daly.wall_p90 and scan[4.0].wall_mean > at_daly.wall_p90


def test_the_monte_carlo_is_seeded_and_its_parts_add_up():
    first = simulate_goodput(1e6, 1 / 20_000, 3000.0, 60.0, 300.0, 50, seed=7)
    assert first == simulate_goodput(1e6, 1 / 20_000, 3000.0, 60.0, 300.0, 50, seed=7)
    assert first != simulate_goodput(1e6, 1 / 20_000, 3000.0, 60.0, 300.0, 50, seed=8)
    parts = first.work + first.checkpointing + first.lost + first.restarting
    assert parts == pytest.approx(first.wall_mean, rel=1e-9)
    assert first.restarting == pytest.approx(300.0 * first.failures)


def test_goodput_falls_as_the_cluster_grows_at_a_fixed_rate_per_gpu():
    goodputs = []
    for nodes in (1, 8, 64, 512):
        sets = [
            f"cluster.nodes={nodes}",
            f"parallel.dp={4 * nodes}",
            f"training.global_batch={16 * nodes}",
            "run={tokens: 2e12, failures: {per_gpu_hour: {faulty_gpu: 2e-5}}}",
        ]
        goodputs.append(plan_run(SMALL, ["simulation.fidelity=analytic", *sets]).goodput)
    assert goodputs == sorted(goodputs, reverse=True) and goodputs[0] > goodputs[-1] + 0.01, (
        goodputs
    )


def test_a_sharded_checkpoint_writes_faster_per_rank_than_a_replicated_one():
    scenario = load_scenario(SMALL)
    args = (125e6, 12.0, scenario.layout, 8, 2e9)
    sharded = checkpoint_write(*args, sharded=True, asynchronous=False)
    replicated = checkpoint_write(*args, sharded=False, asynchronous=False)
    assert sharded.bytes == replicated.bytes == 125e6 * 14
    # dp 4: the replicated state goes out through a quarter of the ranks
    assert replicated.rank_bytes == pytest.approx(4 * sharded.rank_bytes)
    assert sharded.write_s < replicated.write_s or sharded.node_bytes == replicated.node_bytes
    assert sharded.rank_bytes / 2e9 < replicated.rank_bytes / 2e9
    # across nodes the sharded write spreads over every node, the replicated one not
    spread = load_scenario(
        SMALL, ["cluster.nodes=4", "parallel.dp=16", "training.global_batch=64"]
    ).layout
    on_nodes = checkpoint_write(125e6, 12.0, spread, 8, 2e9, sharded=True, asynchronous=False)
    one_replica = checkpoint_write(125e6, 12.0, spread, 8, 2e9, sharded=False, asynchronous=False)
    assert on_nodes.write_s == pytest.approx(one_replica.write_s / 4)
    # an asynchronous save stops the step only for the copy to host memory
    quick = checkpoint_write(125e6, 12.0, spread, 8, 2e9, sharded=True, asynchronous=True)
    assert quick.stall_s < quick.write_s


def test_energy_is_the_power_model_over_a_hand_computed_step():
    result = run_scenario(
        load_scenario(SMALL, ["cluster.preset=dgx-h100"]), numbers_only=True
    ).result
    # a step of 3 s by hand: rank 0 computes 2 s, communicates 0.5 s and waits 0.5 s;
    # rank 1 computes 1 s and waits 2 s
    rows = [
        RankAccount(
            0, 0, 0, 0, 0, 3.0, {"compute": 2.0, "exposed_comm": 0.5, "bubble": 0.5}, {}, {}
        ),
        RankAccount(
            1, 0, 1, 0, 0, 3.0, {"compute": 1.0, "imbalance_stall": 1.5, "other": 0.5}, {}, {}
        ),
    ]
    result.per_rank, result.step_time_s = rows, 3.0
    gpu = load_scenario(SMALL, ["cluster.preset=dgx-h100"]).cluster_spec.gpu
    energy = step_energy(result, gpu, nodes=1, pue=1.1, node_other_w=4_600.0)
    communicating = 145.0 + 16 / 132 * (700.0 - 145.0)  # static + NCCL's share of the SMs
    by_hand = 1.1 * (700.0 * 3.0 + communicating * 0.5 + 145.0 * 2.5 + 4_600.0 * 3.0)
    assert energy is not None and energy.total_j == pytest.approx(by_hand, rel=1e-12)


def test_energy_follows_the_simulated_timeline():
    """The breakdown's energy equals the power model integrated over the trace itself:
    compute where a compute op runs, communication where only calls do, idle else."""
    run = run_scenario(load_scenario(SMALL, ["cluster.preset=dgx-h100"]))
    trace = make_trace(run)
    gpu = run.scenario.cluster_spec.gpu
    computing, communicating, waiting = gpu_powers(gpu)
    integral = 0.0
    for rank in trace.ranks():
        records = [r for r in trace.records if r.rank == rank]
        cuts = sorted({0.0, trace.step_time, *(t for r in records for t in (r.start, r.end))})
        for a, b in zip(cuts, cuts[1:], strict=False):
            middle = (a + b) / 2
            active = [r for r in records if r.start <= middle < r.end]
            if any(r.op == "compute" for r in active):
                integral += computing * (b - a)
            elif active:
                integral += communicating * (b - a)
            else:
                integral += waiting * (b - a)
    energy = step_energy(run.result, gpu, nodes=1, pue=1.0, node_other_w=0.0)
    assert energy is not None and energy.total_j == pytest.approx(integral, rel=0.01)


def test_the_command_writes_the_plan_and_refuses_a_scenario_without_a_run(tmp_path, capsys):
    out = tmp_path / "plan"
    args = ["plan", SMALL, "--set", "run={tokens: 1e10, price_per_gpu_hour: 2.5}"]
    assert main([*args, "--set", "cluster.preset=dgx-h100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "time to train" in printed and "cost: $" in printed and "energy:" in printed
    data = json.loads((out / "plan.json").read_text())
    assert data["cost"] == pytest.approx(data["gpu_hours"] * 2.5)
    assert {"plan.csv", "plan.html", "plotly.min.js"} <= {p.name for p in out.iterdir()}
    assert main(["plan", SMALL, "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "run: is missing" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ("{tokens: 1e9, phases: [{name: a, tokens: 4e8}]}", "must add up to tokens"),
        ("{tokens: -5}", "run.tokens"),
        ("{tokens: 1e9, checkpoint: {interval: 'ten'}}", "run.checkpoint.interval"),
        ("{tokens: 1e9, failures: {per_gpu_hour: {gpu: 7}}}", "run.failures.per_gpu_hour"),
        ("{tokens: 1e9, restart: '1e30 s'}", "run.restart"),
    ],
)
def test_a_bad_run_is_one_line_naming_the_field(tmp_path, capsys, run, message):
    assert main(["plan", SMALL, "--set", f"run={run}", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


SLOW_STORAGE = (
    "run={tokens: 5e10, failures: {mtbf_node: '3 h'}, checkpoint: {bandwidth_per_node: '20 MB/s'}}"
)
FIXED = {"tp": 2, "pp": 1, "sp": False, "reshard_after_forward": True, "recompute": "none"}


def test_a_sweep_on_time_to_train_ranks_down_the_layout_whose_checkpoint_loses():
    from simulator.tools.sweep import run_sweep

    sets = [SLOW_STORAGE, "cluster.nodes=4"]
    by_step = run_sweep(SMALL, sets, fixed=FIXED, keep=10, workers=1)
    by_run = run_sweep(SMALL, sets, fixed=FIXED, keep=10, workers=1, objective="time-to-train")
    assert by_run.objective == "time-to-train"
    replicated = "tp2 pp1 dp16 mb1 1f1b rc=none [tp,dp,pp]"
    steps = [row["layout"] for row in by_step.rows]
    runs = [row["layout"] for row in by_run.rows]
    assert replicated in steps and replicated in runs
    # a replicated optimizer's checkpoint goes out through one replica of sixteen over
    # slow storage: faster steps do not make up for it
    assert runs.index(replicated) > steps.index(replicated)
    row = next(r for r in by_run.rows if r["layout"] == replicated)
    assert row["run"]["checkpoint_sharded"] is False
    sharded = [r for r in by_run.rows if r["run"]["checkpoint_sharded"]]
    assert sharded and row["run"]["goodput"] < min(r["run"]["goodput"] for r in sharded)
    # a sharded layout slower per step ranks above it on the run
    assert any(
        r["step_time_s"] > row["step_time_s"] and runs.index(r["layout"]) < runs.index(replicated)
        for r in sharded
    )
    values = [r["objective_value"] for r in by_run.rows]
    assert values == sorted(values)


@pytest.mark.parametrize("objective", ["time-to-train", "cost", "energy"])
def test_best_first_on_a_run_objective_ranks_what_every_layout_ranks(objective):
    from simulator.tools.sweep import run_sweep

    run = "run={tokens: 1e10, price_per_gpu_hour: 2, failures: {mtbf_node: '6 h'}}"
    sets = [run, "cluster.preset=dgx-h100"]
    fixed = {"tp": 2, "pp": 1}  # a space of a few hundred layouts
    best = run_sweep(SMALL, sets, fixed=fixed, keep=3, workers=1, objective=objective)
    every = run_sweep(SMALL, sets, fixed=fixed, exhaustive=True, workers=1, objective=objective)
    assert [r["layout"] for r in best.rows[:3]] == [r["layout"] for r in every.rows[:3]]
    assert best.counts["simulated"] < every.counts["simulated"]


def test_a_run_objective_needs_the_run(capsys, tmp_path):
    assert main(["sweep", SMALL, "--objective", "time-to-train", "--out", str(tmp_path / "s")]) == 2
    assert "no run: section" in capsys.readouterr().err
    args = ["sweep", SMALL, "--set", "run={tokens: 1e9}", "--objective", "cost"]
    assert main([*args, "--out", str(tmp_path / "c")]) == 2
    assert "price_per_gpu_hour is missing" in capsys.readouterr().err


GPT3 = str(ROOT / "scenarios" / "gpt3-175b.yaml")
FAILING_RUN = (
    "run={tokens: 3e11, failures: {mtbf_node: '1 day'}, "
    "checkpoint: {bandwidth_per_node: '100 MB/s'}}"
)


def test_explain_names_a_layout_whose_checkpoint_loses_the_run():
    from simulator.tools.explain import explain

    (finding,) = [f for f in explain(GPT3, [FAILING_RUN]) if f.id == "checkpoint-loses-at-scale"]
    assert "one data-parallel replica writes the whole" in finding.problem
    assert "longer than with a sharded save" in finding.problem
    assert finding.fix == {"run.checkpoint.sharded": True}
    # the fix is how the run saves: the step is the same
    assert (
        finding.after is not None and finding.after["step_time_s"] == finding.before["step_time_s"]
    )
    # a sharded save, a run without failures, or no run: nothing to find
    for sets in (
        [FAILING_RUN, "training.sharding=optimizer"],
        ["run={tokens: 3e11, failures: {per_gpu_hour: none}}"],
        [],
    ):
        assert "checkpoint-loses-at-scale" not in {f.id for f in explain(GPT3, sets)}


def test_the_published_whole_runs_are_planned_and_set_beside_their_figures():
    from benchmarks.validate_runs import load_cases, run_case

    cases = load_cases()
    assert {case["id"] for case in cases} >= {"llama3-405b-run", "deepseek-v3-run"}
    for case in cases:
        assert case["source"] and case["where"] and case["base_case"]
        rows = run_case(case)
        assert len(rows) == len(case["published"])
        for row in rows:
            assert row["predicted"] > 0 and ("error" in row or "holds" in row)


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_plans(path):
    sets = ["simulation.fidelity=analytic"]
    if "run:" not in path.read_text():
        sets.append("run={tokens: 1e10, price_per_gpu_hour: 2}")
    plan = plan_run(str(path), sets)
    assert plan.wall_s >= plan.train_s > 0 and 0 < plan.goodput <= 1
    assert plan.cost is not None and plan.cost > 0
    if plan.energy_j is None:  # a CPU process has no GPU power to draw
        assert plan.warnings


@pytest.mark.parametrize(
    "run",
    [
        "{tokens: 1e13, failures: {mtbf_node: '1 s'}}",
        "{tokens: 1e12, failures: {mtbf_node: '10 min'}, checkpoint: {interval: '30 days'}}",
    ],
)
def test_a_run_that_cannot_finish_is_refused_in_one_line(run, tmp_path, capsys):
    # refused once its failures outnumber what a plan draws, not drawn for ever
    assert main(["plan", SMALL, "--set", f"run={run}", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "failures drawn" in err and len(err.strip().splitlines()) == 1


def test_a_run_of_many_failures_draws_fewer_trials():
    many = simulate_goodput(3e7, 1 / 600.0, 300.0, 20.0, 60.0, 200, seed=0)
    assert many.trials < 200 and many.failures * many.trials <= 2_000_000 * 1.01
    assert many.wall_p10 <= many.wall_mean <= many.wall_p90


def test_a_name_and_a_folder_that_look_like_markup_print_as_written(tmp_path, capsys, monkeypatch):
    argv, out = markup_args(tmp_path, monkeypatch)
    assert main(["plan", SMALL, "--set", "run={tokens: 1e10}", *argv]) == 0
    printed = capsys.readouterr().out
    assert f"parasim plan · {MARKUP} · 1e+10 tokens" in printed
    assert f"wrote {out / 'plan.csv'}, {out / 'plan.json'}" in printed
