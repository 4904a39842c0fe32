"""The framework's overlap settings and the host's issue rate, as the schedule runs them."""

from __future__ import annotations

import pytest

from simulator.common.errors import ScenarioError
from simulator.engine.core import EngineOptions, simulate
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule.ir import Collective, Compute

from .conftest import SCENARIOS

SMALL = SCENARIOS / "small.yaml"
TP_SP = ["parallel.tp=4", "parallel.dp=2", "training.global_batch=8", "training.micro_batch=2"]
TP_SP += ["parallel.sp=true"]


def ops_of(overrides):
    return build_schedule(load_scenario(SMALL, overrides)).programs[0].ops


def test_pipelined_tp_overlap_runs_forward_gathers_beside_their_gemm():
    ops = ops_of([*TP_SP, "training.tp_comm_overlap=pipelined"])
    by_label = {op.label: op for op in ops}
    gather = by_label["L0.ln1.all_gather.fwd.mb0"]
    qkv = by_label["L0.qkv.fwd.mb0"]
    assert qkv.beside_comm and gather.id not in qkv.deps  # works on the chunks as they come
    after = ops[qkv.id + 1]
    assert gather.id in after.deps  # the op after the GEMM waits for the whole gather
    scatter = by_label["L0.proj.reduce_scatter.fwd.mb0"]
    proj = by_label["L0.proj.fwd.mb0"]
    assert scatter.id < proj.id and proj.beside_comm  # the scatter runs beside its GEMM
    # async (Megatron's backward overlap only): the forward waits for each gather
    ops = ops_of([*TP_SP, "training.tp_comm_overlap=async"])
    by_label = {op.label: op for op in ops}
    assert by_label["L0.ln1.all_gather.fwd.mb0"].id in by_label["L0.qkv.fwd.mb0"].deps
    assert not by_label["L0.qkv.fwd.mb0"].beside_comm


def test_pipelined_overlap_exposes_less_tp_communication():
    def exposed(mode):
        result = run_scenario(load_scenario(SMALL, [*TP_SP, f"training.tp_comm_overlap={mode}"]))
        return result.result.breakdown.critical["exposed_comm"]

    assert exposed("pipelined") < exposed("async") < exposed("none")


def test_pipelined_overlap_needs_sequence_parallelism():
    with pytest.raises(ScenarioError, match=r"training.tp_comm_overlap: pipelined.*parallel.sp"):
        load_scenario(SMALL, [*TP_SP[:-1], "training.tp_comm_overlap=pipelined"])


def test_sp_backward_regathers_each_column_parallel_input():
    ops = ops_of([*TP_SP, "training.tp_comm_overlap=async"])
    by_label = {op.label: op for op in ops}
    regather = by_label["L0.qkv.input_ag.bwd.mb0"]
    dgrad, wgrad = by_label["L0.qkv.dgrad.mb0"], by_label["L0.qkv.wgrad.mb0"]
    assert regather.kind == "all_gather" and regather.id < dgrad.id
    assert regather.id not in dgrad.deps and dgrad.beside_comm  # beside the input gradient
    assert regather.id in wgrad.deps  # the weight gradient needs the gathered input
    # none: waited for before the input gradient
    ops = ops_of([*TP_SP, "training.tp_comm_overlap=none"])
    by_label = {op.label: op for op in ops}
    assert by_label["L0.qkv.input_ag.bwd.mb0"].id in by_label["L0.qkv.dgrad.mb0"].deps


def test_grad_reduce_overlap_false_reduces_once_after_the_backward():
    base = ["parallel.tp=1", "parallel.dp=8", "training.global_batch=8", "training.micro_batch=1"]
    late = [op for op in ops_of([*base, "training.grad_reduce_overlap=false"]) if op.stream == "dp"]
    early = [op for op in ops_of(base) if op.stream == "dp"]
    assert len(late) == 1 and len(early) > 1
    assert late[0].bytes == pytest.approx(sum(op.bytes for op in early))
    assert late[0].bytes == pytest.approx(4 * 124.4e6, rel=0.01)  # GPT-2 small, fp32
    halves = [*base, "training.grad_reduce_overlap=false", "training.grad_reduce_dtype=bf16"]
    bf16 = [op for op in ops_of(halves) if op.stream == "dp"]
    assert bf16[0].bytes == pytest.approx(late[0].bytes / 2)


def test_param_gather_overlap_gathers_beside_the_forward():
    base = ["parallel.tp=1", "parallel.dp=8", "training.global_batch=16", "training.micro_batch=1"]
    base += ["training.optimizer_sharding=true"]
    ops = ops_of([*base, "training.param_gather_overlap=true"])
    gathers = [op for op in ops if type(op) is Collective and op.kind == "all_gather"]
    (gather,) = gathers
    assert gather.id == 0 and gather.deps == ()
    step = next(op for op in ops if op.label == "optimizer.grad_norm")
    assert gather.id in step.deps
    after = ops_of(base)
    (late,) = [op for op in after if type(op) is Collective and op.kind == "all_gather"]
    assert late.id == len(after) - 1  # after the optimizer
    overlapped = run_scenario(load_scenario(SMALL, [*base, "training.param_gather_overlap=true"]))
    plain = run_scenario(load_scenario(SMALL, base))
    assert overlapped.result.step_time_s < plain.result.step_time_s


@pytest.mark.parametrize("host", [0.0, 50e-6])
def test_host_issue_rate_bounds_an_action_and_both_engines_agree(host):
    overrides = [*TP_SP, f"cluster.gpu.host_overhead={host}", "simulation.fidelity=analytic"]
    scenario = load_scenario(SMALL, overrides)
    schedule = build_schedule(scenario)
    direct = simulate(schedule, scenario.cluster, EngineOptions("analytic"))
    replay = simulate(schedule, scenario.cluster, EngineOptions("analytic", closed_form=False))
    assert direct.step_time == pytest.approx(replay.step_time, rel=1e-12)
    ops = schedule.programs[0].ops
    computes = [op for op in ops if type(op) is Compute]
    assert computes[0].host_index == 0 and max(op.host_index for op in computes) > 10
    if host:
        slowest = max(op.host_index for op in computes)
        assert direct.step_time >= slowest * host
        free = load_scenario(SMALL, [*overrides[:-2], "simulation.fidelity=analytic"])
        assert direct.step_time > simulate(build_schedule(free), free.cluster).step_time
