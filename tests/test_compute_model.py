"""The compute model: GEMM shapes, FlashAttention's causal work, streaming bytes, and
compute slowed by the NCCL kernels that share its SMs."""

from __future__ import annotations

import pytest

from simulator.engine.attention_kernels import grid_fill
from simulator.engine.compute import NCCL_CHANNELS, ComputeModel
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule.ir import Compute
from topologies import load_cluster_spec

from .conftest import SCENARIOS
from .helpers import sustained_peak

A100 = load_cluster_spec({"preset": "dgx-a100", "nodes": 1})


def gemm(m, n, k, batch=1):
    flops = 2.0 * batch * m * n * k
    return Compute(0, "compute", flops, 2.0 * batch * (m * k + k * n + m * n), "gemm",
                   shape=(m, n, k), batch=batch)  # fmt: skip


def test_overlapped_communication_slows_a_gemm_for_the_overlapped_span_only():
    model = ComputeModel(A100)
    op = gemm(8192, 8192, 8192)
    math = model.duration(op) - A100.gpu.kernel_launch_overhead
    sms = A100.gpu.sm_count
    slower = sms / (sms - NCCL_CHANNELS)
    # a large all-reduce lasting longer than the GEMM: the whole GEMM runs slower
    assert model.interference(op, 10 * math) == pytest.approx(math * (slower - 1))
    # a short one: only its span
    assert model.interference(op, math / 4) == pytest.approx(math / 4 * (slower - 1))
    assert model.interference(op, 0.0) == 0.0  # no communication, no change


def test_a_large_all_reduce_beside_a_gemm_slows_it_in_both_engines():
    """A program with a GEMM and, beside it by construction, an all-reduce on another
    stream: the GEMM lasts longer than alone, the same in the closed form and SimPy."""
    from simulator.engine.core import EngineOptions, simulate
    from simulator.schedule.ir import Collective, Program, Schedule

    from .helpers import cluster

    machine = cluster(nodes=1)
    op = gemm(8192, 8192, 8192)
    for beside, expected_longer in (((0,), True), ((), False)):
        programs = {
            rank: Program(rank, [
                Collective(0, "comm", "all_reduce", "world", 2**30),
                Compute(1, "compute", op.flops, op.bytes, "gemm", shape=op.shape,
                        beside_comm=beside),
            ]) for rank in range(8)
        }  # fmt: skip
        schedule = Schedule(programs, {"world": tuple(range(8))})
        times = [
            simulate(schedule, machine, EngineOptions("analytic", closed_form=closed))
            for closed in (True, False)
        ]
        gemm_times = [t.end[0][1] - t.start[0][1] for t in times]
        assert gemm_times[0] == pytest.approx(gemm_times[1], rel=1e-12)
        alone = ComputeModel(machine.spec).duration(op)
        assert (gemm_times[0] > alone * 1.01) is expected_longer


def test_step_builder_marks_the_weight_gradient_beside_the_async_tp_all_reduce():
    base = ["parallel.tp=4", "parallel.dp=2", "training.global_batch=8", "training.micro_batch=2"]
    for overlap, expected in (("async", True), ("none", False)):
        scenario = load_scenario(
            SCENARIOS / "small.yaml", [*base, f"training.tp_comm_overlap={overlap}"]
        )
        ops = build_schedule(scenario).programs[0].ops
        wgrads = [op for op in ops if type(op) is Compute and op.label.startswith("L0.qkv.wgrad")]
        assert wgrads and all(bool(op.beside_comm) is expected for op in wgrads)
        for op in wgrads:  # it names the all-reduce it runs beside
            assert all(ops[i].kind == "all_reduce" for i in op.beside_comm)
    # no tensor parallelism: nothing runs beside communication by construction
    scenario = load_scenario(
        SCENARIOS / "small.yaml",
        ["parallel.tp=1", "parallel.dp=8", "training.global_batch=8", "training.micro_batch=1"],
    )
    ops = build_schedule(scenario).programs[0].ops
    assert not any(type(op) is Compute and op.beside_comm for op in ops)


def test_async_tp_overlap_hides_communication_but_slows_compute():
    base = ["parallel.tp=4", "parallel.dp=2", "training.global_batch=8", "training.micro_batch=2"]
    results = {
        mode: run_scenario(
            load_scenario(SCENARIOS / "small.yaml", [*base, f"training.tp_comm_overlap={mode}"])
        ).result
        for mode in ("async", "none")
    }
    crit = {m: r.breakdown.critical for m, r in results.items()}
    assert crit["async"]["compute"] > crit["none"]["compute"]
    assert crit["async"]["exposed_comm"] < crit["none"]["exposed_comm"]


def _attention(s: int, d: int, heads: int) -> Compute:
    flops = 4.0 * heads * s * s * d
    return Compute(0, "compute", flops, 0.0, "attention", shape=(s, s, d), batch=heads)


def test_a_measured_attention_efficiency_runs_the_causal_blocks_at_that_rate():
    measured = load_cluster_spec(
        {"preset": "dgx-a100", "nodes": 1, "gpu": {"attention_efficiency": 0.6}}
    )
    model = ComputeModel(measured)
    s, d, heads = 8192, 128, 108  # 64 query blocks x 108 heads: whole waves on 108 SMs
    op = _attention(s, d, heads)
    blocks = s // 128
    expected = op.flops * (blocks + 1) / (2 * blocks) / (sustained_peak(measured) * 0.6)
    assert model.duration(op) - measured.gpu.kernel_launch_overhead == pytest.approx(expected)


def test_the_presets_attention_runs_at_its_kernels_published_causal_rate():
    """FlashAttention-2 on the A100 at head dimension 128 and 8k tokens: 182 TFLOP/s
    forward plus backward with the causal mask (its published figure) at the grid the
    benchmark launched (16k tokens of 16 heads: 32 heads x 64 query blocks), the FLOPs
    counted halved as the benchmark counts them; a larger grid fills the SMs better."""
    model = ComputeModel(A100)
    op = _attention(8192, 128, 32)
    expected = op.flops * 0.5 / (sustained_peak(A100) * 182e12 / 312e12)
    assert model.duration(op) - A100.gpu.kernel_launch_overhead == pytest.approx(expected)
    wide = _attention(8192, 128, 108)
    per_flop = (model.duration(wide) - A100.gpu.kernel_launch_overhead) / wide.flops
    fill = grid_fill(108 * 64, 108) / grid_fill(32 * 64, 108)
    assert per_flop == pytest.approx(expected / op.flops / fill)


def test_unfused_attention_is_slower_than_flash_and_both_keep_model_flops():
    base = ["parallel.tp=2", "parallel.dp=4", "model.seq_len=2048"]
    flash = run_scenario(load_scenario(SCENARIOS / "small.yaml", base)).result
    unfused = run_scenario(
        load_scenario(SCENARIOS / "small.yaml", [*base, "training.attention=unfused"])
    ).result
    assert unfused.model_flops_per_step == flash.model_flops_per_step
    assert unfused.step_time_s > flash.step_time_s
    assert unfused.memory.peak_bytes_per_gpu > flash.memory.peak_bytes_per_gpu


def test_elementwise_ops_stream_at_the_reachable_bandwidth():
    model = ComputeModel(A100)
    op = Compute(0, "compute", 1e3, 1e9, "elementwise")
    seconds = model.duration(op) - A100.gpu.kernel_launch_overhead
    assert seconds == pytest.approx(1e9 / (A100.gpu.hbm_bandwidth * A100.gpu.hbm_efficiency))
