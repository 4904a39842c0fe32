"""The GEMM shape model: tile and wave quantisation, short k, and a measured table."""

from __future__ import annotations

import pytest

from simulator.engine.gemm import (
    FP8_K_OVERHEAD_FACTOR,
    K_OVERHEAD,
    GemmEfficiency,
    gemm_efficiency,
    tile_shapes,
)

A100 = dict(base=0.9, sm_count=108, largest_tile=(256, 128))


def test_tiles_are_the_largest_and_its_halvings():
    assert tile_shapes((256, 128))[:3] == [(256, 128), (128, 256), (128, 128)]
    assert (64, 64) in tile_shapes((256, 128))


def test_one_tile_past_a_full_wave_is_slower():
    # 108 SMs x one 256x128 tile: 12 x 9 tiles fill one wave exactly
    full = gemm_efficiency(12 * 256, 9 * 128, 4096, **A100)
    past = gemm_efficiency(12 * 256 + 256, 9 * 128, 4096, **A100)
    assert past < 0.9 * full


def test_small_k_is_slower():
    shape = (8192, 8192)
    assert gemm_efficiency(*shape, 64, **A100) < gemm_efficiency(*shape, 512, **A100)
    assert gemm_efficiency(*shape, 512, **A100) < gemm_efficiency(*shape, 8192, **A100)


def test_ragged_dimension_pays_for_whole_tiles():
    assert gemm_efficiency(8192, 8192 + 1, 8192, **A100) < gemm_efficiency(8192, 8192, 8192, **A100)


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (7, 9, 13), (2048, 2048, 64), (6912, 16384, 2048), (8192, 8192, 8192),
     (4096, 3 * 12288 // 8, 12288), (50000, 3, 70000)],
)  # fmt: skip
def test_never_above_the_base_efficiency(shape):
    for batch in (1, 96):
        assert 0 < gemm_efficiency(*shape, batch=batch, **A100) <= A100["base"]


def test_a_measured_table_replaces_the_model_and_anchors_nearby_shapes():
    model = GemmEfficiency(0.9, 108, (256, 128))
    table = GemmEfficiency(0.9, 108, (256, 128), [(4096, 4096, 4096, 0.5)])
    assert table(4096, 4096, 4096) == 0.5
    near = (4096, 4096, 2048)
    ratio = model(*near) / model(4096, 4096, 4096)
    assert table(*near) == pytest.approx(0.5 * ratio)


@pytest.mark.parametrize("k_overhead", [K_OVERHEAD, K_OVERHEAD * FP8_K_OVERHEAD_FACTOR])
@pytest.mark.parametrize("sm_count", [108, 132, 148])
def test_the_model_peaks_over_a_matmul_sweep_at_whole_waves_of_the_deepest_k(sm_count, k_overhead):
    # The presets divide a sweep's best measured rate by this peak: every dimension
    # 256-20480 in steps of 256 (k deepest, which the short-k term favours), for BF16
    # (0.988) and for FP8 with its longer prologue (0.976).
    sweep = range(256, 20481, 256)
    shape = {
        "base": 1.0,
        "sm_count": sm_count,
        "largest_tile": (256, 128),
        "k_overhead": k_overhead,
    }
    peak = max(gemm_efficiency(m, n, 20480, **shape) for m in sweep for n in sweep)
    assert peak == pytest.approx(20480 / (20480 + k_overhead))
    assert gemm_efficiency(4096, 9728, 2048, **shape) < 0.9 * peak
