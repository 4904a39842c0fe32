"""Fine-grained mixtures of experts as stacks run them: the grouped-GEMM efficiency at
small per-expert row counts, the op list of one MoE layer (router, top-k, aux loss,
permute and unpermute, per-expert GEMMs) per ``training.framework``, padding, and the
step time of a 128-expert top-8 model against a dense one of the same active FLOPs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from simulator.arithmetic.moe import (
    FP8_ROW_ALIGN,
    STACKS,
    expert_backward_of,
    moe_layer_ops,
    moe_layer_traffic,
    padded_capacity_rows,
)
from simulator.common.errors import ScenarioError
from simulator.engine.grouped_gemm import grouped_gemm_efficiency, grouped_gemm_seconds
from simulator.request.moe import MoESpec
from simulator.request.scenario import scenario_from_dict
from simulator.run.simulate import run_scenario

from .conftest import SCENARIOS

H100 = dict(base=0.66, sm_count=132, largest_tile=(256, 128))  # the dgx-h100 preset
FINE = MoESpec(experts=128, top_k=8, expert_ffn_hidden=768)  # Qwen3-MoE-like experts


class _Op:
    def __init__(self, kind, flops, shape, batch, fp8=True):
        self.kind, self.flops, self.shape, self.batch, self.fp8 = kind, flops, shape, batch, fp8


def test_grouped_gemm_efficiency_falls_as_rows_per_expert_shrink():
    n, k, total = 1536, 2048, 32768  # one rank's fc1 for 16 local experts
    effs = [grouped_gemm_efficiency(total // g, n, k, g, **H100) for g in (1, 16, 64, 256, 1024)]
    assert all(a >= b for a, b in zip(effs, effs[1:], strict=False))
    assert effs[-1] < 0.5 * effs[0]  # 32 rows per expert waste most of a 64-row tile
    # a ragged row count pays for whole tiles: 65 rows cost what 128 do
    assert grouped_gemm_efficiency(65, n, k, 16, **H100) < grouped_gemm_efficiency(
        128, n, k, 16, **H100
    )


def test_transformer_engines_loop_fills_the_gpu_with_four_experts_at_a_time():
    # Megatron-Core's experts: one GEMM per expert over 4 streams. Many rows per
    # expert fill the SMs either way; a few hundred leave SMs idle that one grouped
    # kernel over all 16 experts would fill
    many = dict(m=2048, n=1536, k=2048, groups=16)
    few = dict(m=512, n=1536, k=2048, groups=16)
    for shape in (many, few):
        loop = grouped_gemm_efficiency(**shape, **H100, streams=4)
        assert loop <= grouped_gemm_efficiency(**shape, **H100)
    assert grouped_gemm_efficiency(**many, **H100, streams=4) == pytest.approx(
        grouped_gemm_efficiency(**many, **H100)
    )
    assert grouped_gemm_efficiency(**few, **H100, streams=4) < 0.8 * grouped_gemm_efficiency(
        **few, **H100
    )
    assert STACKS["megatron"].expert_streams == 4 and STACKS["torchtitan"].expert_streams == 0


@pytest.mark.parametrize(
    ("groups", "m", "n", "k", "published"),
    [  # DeepGEMM README (commit 55ab91f), grouped FP8 GEMMs on H800, TFLOP/s
        (1, 1024, 4096, 7168, 1233),
        (2, 512, 4096, 7168, 1040),
        (4, 256, 4096, 7168, 932),
        (1, 1024, 7168, 2048, 925),
        (2, 512, 7168, 2048, 916),
        (4, 256, 7168, 2048, 815),
        (4, 8192, 4096, 7168, 1346),
        (8, 4096, 7168, 2048, 1214),
    ],
)
def test_grouped_gemm_time_matches_published_grouped_gemms(groups, m, n, k, published):
    flops = 2.0 * groups * m * n * k
    op = _Op("grouped_gemm", flops, (m, n, k), groups)
    seconds = grouped_gemm_seconds(op, 1978.9e12, 3.35e12 * 0.88, **H100)
    assert flops / seconds / 1e12 == pytest.approx(published, rel=0.14)


def _layer(framework, fp8=False, rows=None, **kw):
    rows = np.full(16, 2048) if rows is None else rows
    return moe_layer_ops(
        FINE,
        2048,
        rows,
        tokens=4096,
        sent=4096 * 8,
        framework=framework,
        fp8=fp8,
        mlp="swiglu",
        bias=False,
        **kw,
    )


def test_megatron_layer_runs_grouped_gemms_and_fused_permutes():
    ops = _layer("megatron")
    names = [op.name for op in ops.all]
    assert names == [
        "moe_router",
        "moe_router_topk",
        "moe_aux_loss",
        "moe_permute",
        "moe_sort_chunks",
        "expert_fc1",
        "expert_swiglu",
        "expert_fc2",
        "moe_unsort_chunks",
        "moe_unpermute",
    ]
    by = {op.name: op for op in ops.all}
    t, e, h, k = 4096, 128, 2048, 8
    assert by["moe_router"].shape == (t, e, h)
    assert by["moe_router_topk"].bytes == 9 * t * e and by["moe_aux_loss"].bytes == 5 * t * e
    assert by["moe_permute"].bytes == 4 * k * t * h  # every assignment read and written
    assert by["moe_unpermute"].bytes == pytest.approx((2 + 2 / k) * k * t * h)
    fc1 = by["expert_fc1"]
    assert fc1.kind == "grouped_gemm" and fc1.batch == 16 and fc1.shape == (2048, 2 * 768, h)
    assert fc1.flops == fc1.model_flops == 2.0 * k * t * 2 * 768 * h
    assert fc1.weight_params == 16 * 2 * 768 * h
    dgrad, wgrad = expert_backward_of(fc1, 16)
    assert (dgrad.kind, dgrad.shape) == ("grouped_gemm", (2048, h, 2 * 768))
    assert (wgrad.kind, wgrad.shape, wgrad.weight_params) == (
        "grouped_gemm_wgrad",
        (h, 2 * 768, 2048),
        fc1.weight_params,
    )


def test_megatrons_flex_dispatcher_permutes_once_after_the_dispatch():
    # DeepEP / HybridEP send the tokens unpermuted; the received ones are permuted once
    # into the local experts' rows, and unpermuted once before the combine, where the
    # all-to-all dispatcher permutes before it and sorts the chunks after it
    flex = moe_layer_ops(
        FINE.model_copy(update={"dispatcher": "deepep"}),
        2048,
        np.full(16, 2048),
        tokens=4096,
        sent=4096 * 8,
        framework="megatron",
        mlp="swiglu",
        bias=False,
    )
    assert flex.dispatch == () and flex.combine == ()
    assert [op.name for op in flex.received] == ["moe_permute"]
    assert [op.name for op in flex.returned] == ["moe_unpermute"]
    plain = _layer("megatron")
    assert flex.received[0].bytes == plain.received[0].bytes  # the received rows, read and written
    reorder = sum(
        op.bytes for op in (*plain.dispatch, *plain.received, *plain.returned, *plain.combine)
    )
    assert sum(op.bytes for op in (*flex.received, *flex.returned)) < 0.6 * reorder


def test_torchtitan_layer_runs_eager_index_ops_and_separate_w1_w3():
    ops = _layer("torchtitan")
    names = [op.name for op in ops.all]
    assert "moe_aux_loss" not in names  # auxiliary-loss-free balancing
    assert names[names.index("moe_router_topk") + 1 :] == [
        "moe_sort",
        "moe_permute",
        "moe_sort_chunks",
        "expert_fc1",
        "expert_fc1_up",
        "expert_swiglu",
        "expert_fc2",
        "moe_unsort_chunks",
        "moe_scores",
        "moe_unpermute",
    ]
    megatron = {op.name: op for op in _layer("megatron").all}
    titan = {op.name: op for op in ops.all}
    # an eager index backward accumulates with atomics: more bytes than TE's fused one
    assert titan["moe_permute"].backward_bytes > megatron["moe_permute"].backward_bytes
    compiled = {op.name: op for op in _layer("torchtitan", compiled=True).all}
    assert compiled["moe_scores"].bytes < titan["moe_scores"].bytes


def test_looped_experts_launch_one_gemm_each_at_their_own_rows():
    rows = np.array([3000, 0, 17, 900] + [2048] * 12)
    ops = _layer("fsdp1", rows=rows)
    gemms = [op for op in ops.all if op.kind == "gemm" and op.name != "moe_router"]
    assert len(gemms) == 3 * 15  # w1, w3, w2 of each expert hit; the empty one skipped
    assert sorted({op.shape[0] for op in gemms}) == [17, 900, 2048, 3000]
    names = [op.name for op in ops.all]
    assert names.count("expert_fc1") == 1 and names.count("expert_fc2") == 1
    assert "moe_permute" not in names and sum(n.startswith("expert_gather") for n in names) == 15
    assert sum(op.model_flops for op in gemms) == pytest.approx(2.0 * rows.sum() * 2048 * 768 * 3)


def test_fp8_pads_each_expert_to_sixteen_rows_and_the_padding_is_computed():
    rows = np.array([1, 17, 40, 0] * 4)
    plain = {op.name: op for op in _layer("megatron", rows=rows).all}
    fp8 = {op.name: op for op in _layer("megatron", fp8=True, rows=rows).all}
    padded = int((-(-rows // FP8_ROW_ALIGN) * FP8_ROW_ALIGN).sum())
    assert fp8["expert_fc1"].flops == pytest.approx(2.0 * padded * 1536 * 2048)
    assert fp8["expert_fc1"].model_flops == plain["expert_fc1"].model_flops
    assert fp8["expert_fc1"].fp8 and "expert_fc1.cast" in fp8 and "moe_fp8_pad" in fp8


def test_padding_to_capacity_computes_and_sends_the_padded_rows():
    spec = MoESpec(
        experts=16, top_k=2, capacity_factor=1.5, pad_to_capacity=True, routing={"kind": "uniform"}
    )
    traffic = moe_layer_traffic(spec, 4, 1024, 512, 2, 0, 0, 0)
    rows, splits = padded_capacity_rows(spec, traffic, 4)
    cap = 192  # ceil(2 · 1.5 · 1024 / 16)
    assert rows == [4 * cap] * 4  # every source rank's capacity, for each local expert
    assert splits[0, 1] == cap * 4 * 512 * 2 > traffic.splits[0, 1]
    plain = MoESpec(experts=16, top_k=2, capacity_factor=1.5)
    assert padded_capacity_rows(plain, traffic, 4) == (None, None)
    assert padded_capacity_rows(plain, traffic, 4, "deepspeed")[0] == rows  # always pads
    with pytest.raises(ValueError, match="pad_to_capacity needs a capacity_factor"):
        MoESpec(experts=4, pad_to_capacity=True)


def test_every_framework_has_a_row_and_unknown_ones_say_so():
    assert set(STACKS) == {"megatron", "torchtitan", "fsdp1", "deepspeed"}
    with pytest.raises(ScenarioError, match="training.framework"):
        _layer("jax")


def _fine_and_dense(framework: str) -> tuple[dict, dict]:
    raw = yaml.safe_load((SCENARIOS / "mixtral-ep.yaml").read_text())
    raw["model"].update(
        layers=2, hidden=2048, heads=32, kv_heads=4, mlp="swiglu", bias=False, ffn_hidden=6144
    )
    raw["model"]["moe"] = {"experts": 128, "top_k": 8, "expert_ffn_hidden": 768}
    raw["parallel"].update(tp=1, dp=8, ep=8)
    raw["cluster"]["nodes"] = 1
    raw["training"].update(global_batch=8, recompute="none", dtype="fp8", framework=framework)
    raw["simulation"]["fidelity"] = "analytic"
    dense = copy.deepcopy(raw)
    del dense["model"]["moe"]  # 8 experts of 768 per token: the dense 6144-wide MLP
    dense["parallel"]["ep"] = 1
    return raw, dense


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_fine_grained_moe_runs_slower_than_dense_of_the_same_active_flops(framework):
    fine, dense = (
        run_scenario(scenario_from_dict(d, source="test")).result
        for d in _fine_and_dense(framework)
    )
    assert fine.model_flops_per_step == pytest.approx(dense.model_flops_per_step, rel=0.02)
    assert fine.step_time_s > 1.4 * dense.step_time_s


def test_each_stack_tells_the_compute_model_how_it_issues_its_experts():
    from simulator.run.simulate import per_rank_schedule

    for framework, streams in (("megatron", 4), ("torchtitan", 0)):
        raw, _ = _fine_and_dense(framework)
        schedule = per_rank_schedule(scenario_from_dict(raw, source="test"))
        assert schedule.meta["expert_streams"] == streams
