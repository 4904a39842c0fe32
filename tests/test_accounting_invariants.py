"""Every second of a step is accounted: for each mechanism that adds time, in both
fidelities (folded and not), every rank's categories sum to the step time, and the
time the mechanism adds lands in the category it belongs to."""

from __future__ import annotations

import math

import pytest

from simulator.request.scenario import load_scenario
from simulator.run.simulate import RunResult, build_schedule, run_scenario

from .conftest import SCENARIOS

FIDELITIES = ["analytic", "flow"]


def _run(name: str, *overrides: str) -> RunResult:
    return run_scenario(load_scenario(SCENARIOS / name, list(overrides)))


def _critical(run: RunResult):
    result = run.result
    return next(row for row in result.per_rank if row.rank == result.breakdown.critical_rank)


def assert_every_second_accounted(run: RunResult) -> None:
    """Every rank's categories, and the critical and mean breakdowns, add up to the
    step; no category is negative."""
    result = run.result
    step = result.step_time_s
    for row in result.per_rank:
        assert math.isclose(sum(row.breakdown.values()), step, rel_tol=1e-9), (row.rank, row)
        assert min(row.breakdown.values()) >= -1e-12 * step, (row.rank, row.breakdown)
    assert math.isclose(sum(result.breakdown.critical.values()), step, rel_tol=1e-9)
    assert math.isclose(sum(result.breakdown.mean.values()), step, rel_tol=1e-9)


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("fold", [True, False])
def test_a_straggler_s_extra_time_is_compute(fidelity, fold):
    """A straggler's compute ops (and a block's, in analytic fidelity) run slower; its
    calls do not: the slowest rank's compute is its own factor times the even step's,
    and its exposed communication is the even step's."""
    overrides = [f"simulation.fidelity={fidelity}", f"simulation.fold={str(fold).lower()}"]
    even = _run("small.yaml", *overrides)
    jittered = _run("small.yaml", *overrides, "cluster.gpu.jitter=0.5")
    assert_every_second_accounted(jittered)
    assert jittered.result.step_time_s > even.result.step_time_s
    from simulator.engine.stragglers import rank_factors

    schedule = build_schedule(jittered.scenario)
    factors = rank_factors(schedule, jittered.scenario.layout.world, 0.5, 0)
    slow = _critical(jittered)
    base = next(row for row in even.result.per_rank if row.rank == slow.rank)
    assert slow.breakdown["compute"] == pytest.approx(
        factors[slow.rank] * base.breakdown["compute"], rel=1e-9
    )
    assert slow.breakdown["exposed_comm"] == pytest.approx(base.breakdown["exposed_comm"])


def test_a_straggler_costs_the_same_whether_its_actions_are_blocks_or_ops():
    """Analytic fidelity runs a folded rank's actions as blocks; flow fidelity op by op
    on every rank: with a straggler (a folded rank takes its slowest image's factor,
    here the same rank) the two steps are one."""
    flow = _run("small.yaml", "simulation.fidelity=flow", "cluster.gpu.jitter=0.5")
    analytic = _run("small.yaml", "simulation.fidelity=analytic", "cluster.gpu.jitter=0.5")
    assert analytic.result.simulation["folded"] and analytic.times.blocks is not None
    assert analytic.result.step_time_s == pytest.approx(flow.result.step_time_s, rel=1e-9)
    assert analytic.result.straggler_s == pytest.approx(flow.result.straggler_s, rel=1e-9)


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_shared_cores_slow_compute_and_calls_and_every_second_stays_accounted(fidelity):
    """CPU ranks sharing a node's cores (``devices_per_core``): compute and the calls
    beside it take longer, in compute and exposed communication."""
    overrides = [f"simulation.fidelity={fidelity}", "simulation.fold=false"]
    alone = _run("cpu-tiny.yaml", *overrides, "cluster.gpu.devices_per_core=1")
    shared = _run("cpu-tiny.yaml", *overrides, "cluster.gpu.devices_per_core=2")
    assert_every_second_accounted(shared)
    assert _critical(shared).breakdown["compute"] > _critical(alone).breakdown["compute"]
    assert shared.result.step_time_s > alone.result.step_time_s


def test_shared_cores_in_a_folded_step_stretch_a_block_s_compute_and_its_calls():
    """Folded (analytic's blocks), every rank computes at once: its compute and its
    calls take ``devices_per_core`` times as long, the block's body's too."""
    analytic = "simulation.fidelity=analytic"
    alone = _run("cpu-tiny.yaml", analytic, "cluster.gpu.devices_per_core=1")
    shared = _run("cpu-tiny.yaml", analytic, "cluster.gpu.devices_per_core=2")
    assert shared.result.simulation["folded"] and shared.times.blocks is not None
    assert_every_second_accounted(shared)
    before, after = _critical(alone).breakdown, _critical(shared).breakdown
    assert after["compute"] == pytest.approx(2 * before["compute"], rel=1e-9)
    assert after["exposed_comm"] == pytest.approx(2 * before["exposed_comm"], rel=1e-9)


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_host_issue_gaps_are_other(fidelity):
    """A host that issues an action's kernels one per ``host_overhead`` leaves the GPU
    idle between them: no op explains that wait, so it is ``other``, the same in both
    fidelities."""
    overrides = [f"simulation.fidelity={fidelity}"]
    quick = _run("pipeline-demo.yaml", *overrides)
    slow = _run("pipeline-demo.yaml", *overrides, "cluster.gpu.host_overhead=50 us")
    assert_every_second_accounted(slow)
    assert _critical(quick).breakdown["other"] == pytest.approx(0.0, abs=1e-12)
    assert _critical(slow).breakdown["other"] > 0.1 * slow.result.step_time_s
    assert _critical(slow).breakdown["compute"] == pytest.approx(
        _critical(quick).breakdown["compute"], rel=1e-9
    )


def test_host_issue_gaps_are_the_same_other_in_both_fidelities():
    analytic = _run(
        "pipeline-demo.yaml", "simulation.fidelity=analytic", "cluster.gpu.host_overhead=50 us"
    )
    flow = _run("pipeline-demo.yaml", "simulation.fidelity=flow", "cluster.gpu.host_overhead=50 us")
    for category in ("compute", "other", "bubble"):
        assert _critical(analytic).breakdown[category] == pytest.approx(
            _critical(flow).breakdown[category], rel=1e-6
        )


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_a_pipeline_s_idle_stages_are_bubble(fidelity):
    run = _run("pipeline-demo.yaml", f"simulation.fidelity={fidelity}")
    assert_every_second_accounted(run)
    assert all(row.breakdown["bubble"] > 0 for row in run.result.per_rank)
    assert all(row.breakdown["imbalance_stall"] == 0 for row in run.result.per_rank)


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("overlap", ["none", "async"])
def test_waiting_on_tensor_parallel_calls_is_exposed_comm(fidelity, overlap):
    run = _run(
        "small.yaml", f"simulation.fidelity={fidelity}", f"training.tp_comm_overlap={overlap}"
    )
    assert_every_second_accounted(run)
    critical = _critical(run)
    assert critical.exposed_comm_by_axis["tp"] > 0
    assert critical.breakdown["exposed_comm"] == pytest.approx(
        sum(critical.exposed_comm_by_axis.values()), rel=1e-9
    )


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_waiting_for_the_busiest_expert_is_imbalance_stall(fidelity):
    run = _run("teaching/moe-imbalance-mistake.yaml", f"simulation.fidelity={fidelity}")
    assert_every_second_accounted(run)
    assert max(row.breakdown["imbalance_stall"] for row in run.result.per_rank) > 0
    assert _critical(run).exposed_comm_by_axis["ep"] > 0


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("fold", [True, False])
def test_fp8_steps_are_accounted(fidelity, fold):
    run = _run(
        "pipeline-demo.yaml",
        f"simulation.fidelity={fidelity}",
        f"simulation.fold={str(fold).lower()}",
        "training.dtype=fp8",
    )
    assert_every_second_accounted(run)
    bf16 = _run(
        "pipeline-demo.yaml",
        f"simulation.fidelity={fidelity}",
        f"simulation.fold={str(fold).lower()}",
    )
    assert _critical(run).breakdown["compute"] < _critical(bf16).breakdown["compute"]


@pytest.mark.slow
@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("kind", ["ring", "ulysses"])
def test_context_parallel_steps_are_accounted(fidelity, kind):
    run = _run(
        "teaching/cp-across-nodes-fix.yaml",
        f"simulation.fidelity={fidelity}",
        f"parallel.cp_kind={kind}",
        "model.seq_len=8192",
    )
    assert_every_second_accounted(run)
    assert _critical(run).exposed_comm_by_axis.get("cp", 0.0) > 0


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("sharding", ["optimizer", "gradients", "full"])
def test_sharded_steps_are_accounted(fidelity, sharding):
    run = _run("small.yaml", f"simulation.fidelity={fidelity}", f"training.sharding={sharding}")
    assert_every_second_accounted(run)
    assert _critical(run).exposed_comm_by_axis.get("dp", 0.0) > 0


@pytest.mark.parametrize("fidelity", FIDELITIES)
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_is_compute_of_its_own_phase(fidelity, recompute):
    run = _run(
        "pipeline-demo.yaml", f"simulation.fidelity={fidelity}", f"training.recompute={recompute}"
    )
    assert_every_second_accounted(run)
    critical = _critical(run)
    assert critical.compute_by_phase["recompute"] > 0
    assert sum(critical.compute_by_phase.values()) == pytest.approx(
        critical.breakdown["compute"], rel=1e-9
    )


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_every_mechanism_at_once_is_accounted(fidelity):
    """Stragglers, a slow host and a pipeline together, in the folded and plain forms."""
    for fold in ("true", "false"):
        run = _run(
            "pipeline-demo.yaml",
            f"simulation.fidelity={fidelity}",
            f"simulation.fold={fold}",
            "cluster.gpu.jitter=0.2",
            "cluster.gpu.host_overhead=5 us",
            "training.recompute=selective",
        )
        assert_every_second_accounted(run)


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("small.yaml", []),
        ("pipeline-demo.yaml", ["training.dtype=fp8", "training.recompute=full"]),
        ("teaching/moe-imbalance-mistake.yaml", ["model.moe.capacity_factor=1.0"]),
        ("cpu-tiny.yaml", ["cluster.gpu.devices_per_core=2", "cluster.gpu.jitter=0.2"]),
    ],
)
def test_mfu_and_hfu_are_their_tflops_per_gpu_over_the_peak(name, overrides):
    """MFU is the model TFLOP/s per GPU over the peak the result states, HFU the
    hardware TFLOP/s; the hardware FLOPs hold the model's (recompute on top, dropped
    expert assignments in neither)."""
    result = _run(name, *overrides).result
    peak = result.cluster.peak_flops_per_gpu
    assert result.mfu * peak == pytest.approx(result.tflops_per_gpu * 1e12, rel=1e-12)
    assert result.hfu * peak == pytest.approx(result.hardware_tflops_per_gpu * 1e12, rel=1e-12)
    assert 0 < result.mfu <= result.hfu <= 1


@pytest.mark.slow
def test_a_long_sequence_may_pass_100_percent_by_convention_but_never_runs_above_peak():
    """Llama 3 8B at 128K tokens without context parallelism: MFU and HFU count causal
    attention's full s² and pass 100%, which the result says in a warning; the FLOPs the
    kernels run stay below the peak."""
    from benchmarks.fuzz import violations
    from simulator.run.simulate import executed_flops_per_step

    run = _run(
        "llama3-8b-128k-cp.yaml",
        "parallel.cp=1",
        "parallel.dp=8",
        "training.global_batch=8",
        "cluster.gpu.attention_efficiency=0.95",
    )
    result = run.result
    world = run.scenario.layout.world
    executed = executed_flops_per_step(run.schedule) * world / len(run.schedule.programs)
    share = executed / (result.step_time_s * world * run.scenario.cluster_spec.gpu.peak_flops)
    assert result.hfu > 1 and share <= 1
    assert any("full s²" in warning for warning in result.warnings)
    assert violations(run) == []
