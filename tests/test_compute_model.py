"""The compute model: GEMM shapes, FlashAttention's causal work, streaming bytes, and
compute slowed by the NCCL kernels that share its SMs."""

from __future__ import annotations

import pytest

from simulator.engine.compute import NCCL_CHANNELS, ComputeModel
from simulator.run import build_schedule, run_scenario
from simulator.scenario import load_scenario
from simulator.schedule.ir import Compute
from topologies import load_cluster_spec

from .conftest import SCENARIOS

A100 = load_cluster_spec({"preset": "dgx-a100", "nodes": 1})


def gemm(m, n, k, beside=False, batch=1):
    flops = 2.0 * batch * m * n * k
    return Compute(0, "compute", flops, 2.0 * batch * (m * k + k * n + m * n), "gemm",
                   shape=(m, n, k), batch=batch, beside_comm=beside)  # fmt: skip


def test_overlapped_communication_slows_a_gemm_and_nothing_else_does():
    model = ComputeModel(A100)
    alone = model.duration(gemm(8192, 8192, 8192))
    beside = model.duration(gemm(8192, 8192, 8192, beside=True))
    launch = A100.gpu.kernel_launch_overhead
    sms = A100.gpu.sm_count
    assert beside - launch == pytest.approx((alone - launch) * sms / (sms - NCCL_CHANNELS))
    assert model.duration(gemm(8192, 8192, 8192)) == alone  # unchanged without comm


def test_step_builder_marks_the_weight_gradient_beside_the_async_tp_all_reduce():
    base = ["parallel.tp=4", "parallel.dp=2", "training.global_batch=8", "training.micro_batch=2"]
    for overlap, expected in (("async", True), ("none", False)):
        scenario = load_scenario(
            SCENARIOS / "small.yaml", [*base, f"training.tp_comm_overlap={overlap}"]
        )
        ops = build_schedule(scenario).programs[0].ops
        wgrads = [op for op in ops if type(op) is Compute and op.label.startswith("L0.qkv.wgrad")]
        assert wgrads and all(op.beside_comm is expected for op in wgrads)
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
    crit = {m: r["breakdown"]["critical"] for m, r in results.items()}
    assert crit["async"]["compute"] > crit["none"]["compute"]
    assert crit["async"]["exposed_comm"] < crit["none"]["exposed_comm"]


def test_flash_attention_runs_half_the_causal_scores():
    model = ComputeModel(A100)
    s, d, heads = 8192, 128, 108  # 64 query blocks x 108 heads: whole waves on 108 SMs
    flops = 4.0 * heads * s * s * d
    op = Compute(0, "compute", flops, 0.0, "attention", shape=(s, s, d), batch=heads)
    blocks = s // 128
    expected = (
        flops * (blocks + 1) / (2 * blocks) / (A100.gpu.peak_flops * A100.gpu.attention_efficiency)
    )
    assert model.duration(op) - A100.gpu.kernel_launch_overhead == pytest.approx(expected)


def test_unfused_attention_is_slower_than_flash_and_both_keep_model_flops():
    base = ["parallel.tp=2", "parallel.dp=4", "model.seq_len=2048"]
    flash = run_scenario(load_scenario(SCENARIOS / "small.yaml", base)).result
    unfused = run_scenario(
        load_scenario(SCENARIOS / "small.yaml", [*base, "training.attention=unfused"])
    ).result
    assert unfused["model_flops_per_step"] == flash["model_flops_per_step"]
    assert unfused["step_time_s"] > flash["step_time_s"]
    assert unfused["memory"]["peak_bytes_per_gpu"] > flash["memory"]["peak_bytes_per_gpu"]


def test_elementwise_ops_stream_at_the_reachable_bandwidth():
    model = ComputeModel(A100)
    op = Compute(0, "compute", 1e3, 1e9, "elementwise")
    seconds = model.duration(op) - A100.gpu.kernel_launch_overhead
    assert seconds == pytest.approx(1e9 / (A100.gpu.hbm_bandwidth * A100.gpu.hbm_efficiency))
