"""The fused attention kernel's rate from its published benchmarks: by backend, GPU,
head dimension and sequence length, and the backend each software stack picks."""

from __future__ import annotations

import math

import pytest

from simulator.common.errors import ParasimError
from simulator.common.vocabulary import ATTENTION_BACKENDS
from simulator.engine.attention_kernels import (
    TABLES,
    combined,
    grid_fill,
    resolve_backend,
    table_for,
)
from simulator.engine.compute import ComputeModel
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario

from .conftest import SCENARIOS


def test_every_table_is_a_named_backend_with_ascending_published_points():
    for table in TABLES:
        assert table.backend in ATTENTION_BACKENDS and table.backend != "auto"
        for points in table.rates.values():
            lengths = [s for s, _ in points]
            assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
            # a share of the peak, as a microbenchmark reaches it
            assert all(0 < rate * 1e12 / table.peak_flops < 1 for _, rate in points)


def test_published_points_are_returned_and_between_them_log_linear():
    fa2 = table_for("fa2", "A100-SXM4-80GB")
    assert fa2.efficiency(128, 4096) == pytest.approx(173e12 / 312e12)
    assert fa2.efficiency(64, 2048) == pytest.approx(140e12 / 312e12)
    # halfway in log2 between 2k and 4k, halfway between head dimensions 64 and 128
    midway = round(2048 * math.sqrt(2))  # 2896, a rounding away from halfway in log2
    assert fa2.efficiency(128, midway) == pytest.approx(164e12 / 312e12, rel=1e-4)
    assert fa2.efficiency(96, 4096) == pytest.approx((156 + 173) / 2 * 1e12 / 312e12)
    # beyond the published points: the nearest one's
    assert fa2.efficiency(128, 128 * 1024) == fa2.efficiency(128, 16384)
    assert fa2.efficiency(256, 4096) == fa2.efficiency(128, 4096)
    # a longer sequence keeps the SMs busier
    assert fa2.efficiency(128, 512) < fa2.efficiency(128, 16384)


def test_forward_and_backward_combine_as_the_benchmarks_count_flops():
    # the backward does 2.5 times the forward's FLOPs: equal rates combine to that rate
    assert combined(400.0, 400.0) == pytest.approx(400.0)
    # a slow backward dominates: 3.5 / (1/600 + 2.5/300)
    assert combined(600.0, 300.0) == pytest.approx(3.5 / (1 / 600 + 2.5 / 300))
    cudnn = table_for("cudnn", "H200-SXM5-141GB")
    assert cudnn.efficiency(128, 8192) == pytest.approx(combined(644, 541) * 1e12 / 989.4e12)


def test_hoppers_cudnn_rate_falls_below_the_published_2k_as_measured_on_an_h200():
    cudnn = table_for("cudnn", "H200-SXM5-141GB")
    at_2k = cudnn.efficiency(128, 2048)
    assert at_2k == pytest.approx(combined(484, 370) * 1e12 / 989.4e12)
    # measured on an H200 (benchmarks/measurements/h200-kernels.json): 172.7 and 267.7
    # TFLOP/s at 512 and 1024 where 2048 ran 377.9, each at 2,048 CTAs: at one grid the
    # table's rates keep those ratios
    full = cudnn.full_grid_efficiency
    assert full(128, 512) / full(128, 2048) == pytest.approx(172.7 / 377.9)
    assert full(128, 1024) / full(128, 2048) == pytest.approx(267.7 / 377.9)
    assert cudnn.efficiency(128, 256) == cudnn.efficiency(128, 512)  # the end point's beyond


@pytest.mark.parametrize(
    ("framework", "gpu", "backend"),
    [
        ("megatron", "H100-SXM5-80GB", "cudnn"),  # TE prefers cuDNN on Hopper and later
        ("megatron", "GB200-Blackwell-186GB", "cudnn"),
        ("megatron", "A100-SXM4-80GB", "fa2"),
        ("torchtitan", "H100-SXM5-80GB", "sdpa"),  # SDPA's flash backend, measured
        ("fsdp1", "B200-SXM-180GB", "sdpa"),
        ("deepspeed", "A100-SXM4-80GB", "fa2"),  # no SDPA table: FlashAttention-2's figures
    ],
)
def test_auto_takes_the_stacks_own_kernel(framework, gpu, backend):
    assert resolve_backend("auto", framework, gpu) == backend
    assert resolve_backend("cudnn", framework, gpu) == "cudnn"


def test_sdpas_flash_backend_on_hopper_is_the_h200_measurement_below_standalone_fa2():
    sdpa, fa2 = table_for("sdpa", "H100-SXM5-80GB"), table_for("fa2", "H100-SXM5-80GB")
    # benchmarks/measurements/h200-kernels.json: 256.1 TFLOP/s at 4k, 108.0 at 512
    assert sdpa.efficiency(128, 4096) == pytest.approx(256.1e12 / 989.4e12)
    assert sdpa.efficiency(128, 512) == pytest.approx(108.0e12 / 989.4e12)
    for seq in (512, 2048, 8192, 16384):
        assert sdpa.efficiency(128, seq) < fa2.efficiency(128, seq)
    # on Blackwell the fa2 tables are themselves SDPA's flash backend
    assert table_for("sdpa", "B200").rates == table_for("fa2", "B200").rates


def test_a_small_grid_of_ctas_runs_below_the_benchmarks_full_one_as_measured():
    # benchmarks/measurements/h200-kernels.json: at 4k tokens, 16 heads at batch 1 (512
    # CTAs) ran 0.79 of the sweep's rate at 2,048 CTAs, FlashAttention-2 and cuDNN alike
    assert grid_fill(512, 132) / grid_fill(2048, 132) == pytest.approx(0.79, abs=0.01)
    assert grid_fill(192, 132) / grid_fill(2048, 132) == pytest.approx(0.54, abs=0.01)
    sdpa = table_for("sdpa", "H100-SXM5-80GB")
    # the sweep's own grid gives back its measured rate
    at_sweep = sdpa.full_grid_efficiency(128, 4096) * grid_fill(2048, 132)
    assert at_sweep == pytest.approx(sdpa.efficiency(128, 4096))


def _attention_seconds(overrides: list[str]) -> float:
    """Rank 0's attention ops, timed by the engine's compute model."""
    scenario = load_scenario(SCENARIOS / "small.yaml", overrides)
    schedule = per_rank_schedule(scenario)
    model = ComputeModel(scenario.cluster_spec, schedule.meta)
    ops = schedule.programs[0].ops
    return sum(
        model.compute_seconds(op) for op in ops if op.type == "compute" and op.kind == "attention"
    )


def test_the_kernel_sets_the_attention_time():
    h100 = ["cluster.preset=dgx-h100", "model.seq_len=8192", "training.micro_batch=1"]
    cudnn = _attention_seconds([*h100, "training.attention_backend=cudnn"])
    fa2 = _attention_seconds([*h100, "training.attention_backend=fa2"])
    # cuDNN's published causal rate at 8k on Hopper over FlashAttention-2's
    # (at one grid: each table's full-grid rate)
    cudnn_rate = table_for("cudnn", "H100").full_grid_efficiency(64, 8192)
    ratio = cudnn_rate / table_for("fa2", "H100").full_grid_efficiency(64, 8192)
    assert fa2 / cudnn == pytest.approx(ratio, rel=0.02)
    assert _attention_seconds(h100) == pytest.approx(cudnn)  # megatron's auto


def test_a_kernel_with_no_published_table_on_the_gpu_is_one_line_naming_the_field():
    with pytest.raises(
        ParasimError, match=r"^cluster.gpu.attention_efficiency: no tabulated cudnn"
    ):
        run_scenario(load_scenario(SCENARIOS / "small.yaml", ["training.attention_backend=cudnn"]))
    # a measured efficiency stands for any kernel
    given = ["training.attention_backend=cudnn", "cluster.gpu.attention_efficiency=0.5"]
    assert run_scenario(load_scenario(SCENARIOS / "small.yaml", given)).result.step_time_s > 0
