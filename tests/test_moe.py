"""Mixture-of-experts math: routing, capacity dropping, placement, all-to-all traffic,
expert compute and parameters."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from simulator.arithmetic.layer_ops import backward_of
from simulator.arithmetic.moe import (
    apply_capacity,
    capacity,
    dispatch_splits,
    expert_backward_of,
    expert_loads,
    expert_ops,
    expert_ranks,
    local_experts,
    moe_layer_parameters,
    moe_layer_parameters_per_rank,
    moe_layer_traffic,
)
from simulator.common.errors import ScenarioError
from simulator.request.moe import MoESpec, check_expert_parallel, moe_layers
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario

from .conftest import SCENARIOS

ROUTINGS = [
    {"kind": "uniform"},
    {"kind": "zipf", "exponent": 0.0},
    {"kind": "zipf", "exponent": 1.2},
    {"kind": "zipf", "exponent": 3.0},
    {"kind": "dirichlet", "concentration": 0.05},
    {"kind": "dirichlet", "concentration": 5.0},
    {"kind": "histogram", "loads": [8, 1, 1, 0, 2, 2, 3, 7]},
    {"kind": "histogram", "loads": [8, 1, 1, 0, 2, 2, 3, 7], "sample": False},
]

SEEDS = range(20)


def spec(routing, experts=8, top_k=2, capacity_factor=None, **kw) -> MoESpec:
    return MoESpec(
        experts=experts, top_k=top_k, capacity_factor=capacity_factor, routing=routing, **kw
    )


def mean_imbalance(moe: MoESpec, ep: int, tokens: int = 4096) -> float:
    return float(
        np.mean([moe_layer_traffic(moe, ep, tokens, 1024, 2, s, 3, 1).imbalance for s in SEEDS])
    )


@pytest.mark.parametrize("routing", ROUTINGS, ids=lambda r: str(list(r.values())))
@pytest.mark.parametrize("capacity_factor", [None, 1.0, 1.25])
@pytest.mark.parametrize("top_k", [1, 2])
def test_tokens_are_conserved(routing, capacity_factor, top_k):
    moe = spec(routing, top_k=top_k, capacity_factor=capacity_factor)
    for seed in range(10):
        for layer in range(2):
            for mb in range(2):
                loads = expert_loads(moe, 1000, seed, layer, mb)
                assert loads.sum() == 1000 * top_k
                assert loads.max() <= 1000  # an expert sees each token at most once
                t = moe_layer_traffic(moe, 4, [1000, 999, 512, 0], 64, 2, seed, layer, mb)
                assert np.array_equal(t.tokens_routed, np.array([1000, 999, 512, 0]) * top_k)
                assert np.array_equal(t.tokens_routed, t.tokens_sent + t.tokens_dropped)
                assert t.tokens_sent.sum() == t.tokens_received.sum() == t.expert_tokens.sum()
                assert t.tokens_routed.sum() == t.tokens_received.sum() + t.tokens_dropped.sum()
                assert np.array_equal(t.tokens_received, t.expert_tokens.reshape(4, 2).sum(1))


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_uniform_routing_is_balanced_and_drops_nothing(ep, capacity_factor):
    moe = spec({"kind": "uniform"}, capacity_factor=capacity_factor)
    for seed in range(5):
        t = moe_layer_traffic(moe, ep, 4096, 1024, 2, seed, 0, 0)
        assert t.imbalance == 1.0
        assert t.tokens_dropped.sum() == 0 and t.dropped_fraction == 0.0
        assert np.all(t.expert_tokens == ep * 4096 * 2 // 8)


def test_uniform_remainders_stay_within_one_token_per_expert():
    loads = expert_loads(spec({"kind": "uniform"}, experts=8, top_k=1), 13, 0, 0, 0)
    assert loads.tolist() == [2, 2, 2, 2, 2, 1, 1, 1]
    t = moe_layer_traffic(spec({"kind": "uniform"}, top_k=1), 8, 13, 16, 2, 0, 0, 0)
    assert t.expert_tokens.max() - t.expert_tokens.min() <= 1


@pytest.mark.parametrize("ep", [4, 8])
def test_imbalance_grows_with_zipf_exponent(ep):
    means = [
        mean_imbalance(spec({"kind": "zipf", "exponent": a}, experts=16), ep)
        for a in (0.0, 0.5, 1.0, 1.5)
    ]
    assert all(a < b for a, b in zip(means, means[1:], strict=False)), means
    assert means[0] < 1.1  # uniform popularity: only sampling noise


@pytest.mark.parametrize("ep", [4, 8])
def test_imbalance_falls_with_dirichlet_concentration(ep):
    means = [
        mean_imbalance(spec({"kind": "dirichlet", "concentration": c}, experts=16), ep)
        for c in (0.1, 1.0, 10.0, 100.0)
    ]
    assert all(a > b for a, b in zip(means, means[1:], strict=False)), means


def test_hot_experts_persist_across_microbatches_and_ranks():
    moe = spec({"kind": "zipf", "exponent": 2.0}, experts=16)
    hottest = {
        int(np.argmax(expert_loads(moe, 4096, 7, 5, mb, rank=r)))
        for mb in range(4)
        for r in range(4)
    }
    assert len(hottest) == 1
    other_layers = {int(np.argmax(expert_loads(moe, 4096, 7, layer, 0))) for layer in range(8)}
    assert len(other_layers) > 1  # each layer has its own popular experts


@pytest.mark.parametrize("routing", ROUTINGS[1:-1], ids=lambda r: str(list(r.values())))
def test_seed_reproduces_and_varies_routing(routing):
    moe = spec(routing)
    a = moe_layer_traffic(moe, 4, 4096, 256, 2, 11, 2, 3)
    b = moe_layer_traffic(moe, 4, 4096, 256, 2, 11, 2, 3)
    assert np.array_equal(a.splits, b.splits)
    assert np.array_equal(expert_loads(moe, 4096, 11, 2, 3), expert_loads(moe, 4096, 11, 2, 3))
    for other in [(12, 2, 3), (11, 3, 3), (11, 2, 4)]:
        c = moe_layer_traffic(moe, 4, 4096, 256, 2, *other)
        assert not np.array_equal(a.counts, c.counts), other
    # every source rank draws its own routing, and so does every EP group
    rows = {tuple(expert_loads(moe, 4096, 11, 2, 3, rank=r)) for r in range(4)}
    assert len(rows) == 4
    g1 = moe_layer_traffic(moe, 4, 4096, 256, 2, 11, 2, 3, group=1)
    assert not np.array_equal(a.counts, g1.counts)


def test_histogram_without_sampling_is_exactly_proportional():
    moe = spec({"kind": "histogram", "loads": [4, 2, 1, 1], "sample": False}, experts=4, top_k=1)
    assert expert_loads(moe, 800, 0, 0, 0).tolist() == [400, 200, 100, 100]
    assert expert_loads(moe, 800, 5, 9, 9).tolist() == [400, 200, 100, 100]
    # top-2: no expert can take more than every token once, the excess moves on
    moe2 = spec({"kind": "histogram", "loads": [6, 1, 1], "sample": False}, experts=3)
    assert expert_loads(moe2, 100, 0, 0, 0).tolist() == [100, 50, 50]


def test_capacity_formula():
    assert capacity(spec({"kind": "uniform"}, capacity_factor=1.25), 4096) == 1280
    assert capacity(spec({"kind": "uniform"}, experts=2, capacity_factor=1.1), 100) == 110
    assert capacity(spec({"kind": "uniform"}, experts=8, top_k=1, capacity_factor=1.0), 13) == 2
    assert capacity(spec({"kind": "uniform"}), 4096) is None
    kept, dropped = apply_capacity(np.array([5, 1, 3]), 3)
    assert kept.tolist() == [3, 1, 3] and dropped.tolist() == [2, 0, 0]
    kept, dropped = apply_capacity(np.array([5, 1, 3]), None)
    assert kept.tolist() == [5, 1, 3] and dropped.tolist() == [0, 0, 0]


def test_skewed_routing_drops_tokens_over_capacity():
    moe = spec({"kind": "zipf", "exponent": 1.5}, capacity_factor=1.0)
    for seed in range(5):
        t = moe_layer_traffic(moe, 4, 4096, 1024, 2, seed, 0, 0)
        assert t.tokens_dropped.sum() > 0
        assert t.dropped_fraction == pytest.approx(t.tokens_dropped.sum() / t.tokens_routed.sum())
        assert t.expert_tokens.max() <= 4 * capacity(moe, 4096)
        assert all(c == 1024 for c in t.capacity)
    # the same routing without a limit drops nothing and is more imbalanced
    free = moe_layer_traffic(spec(moe.routing), 4, 4096, 1024, 2, 0, 0, 0)
    capped = moe_layer_traffic(moe, 4, 4096, 1024, 2, 0, 0, 0)
    assert free.dropped_fraction == 0.0 and free.imbalance > capped.imbalance


def test_splits_rows_are_bytes_sent_and_combine_is_transpose():
    moe = spec({"kind": "dirichlet", "concentration": 0.5}, capacity_factor=1.25)
    tokens = [2048, 4096, 1024, 3000]
    t = moe_layer_traffic(moe, 4, tokens, 1024, 2, 3, 1, 2)
    assert t.splits.shape == (4, 4)
    assert np.array_equal(t.splits.sum(axis=1), t.tokens_sent * 1024 * 2)
    assert np.array_equal(t.splits.sum(axis=0), t.tokens_received * 1024 * 2)
    assert np.array_equal(t.combine_splits, t.splits.T)
    assert np.array_equal(dispatch_splits(moe, 4, tokens, 1024, 2, 3, 1, 2), t.splits)
    assert t.imbalance == pytest.approx(t.tokens_received.max() / t.tokens_received.mean())


def test_validation_messages_name_the_numbers():
    with pytest.raises(pydantic.ValidationError, match=r"top_k\(3\) > experts\(2\)"):
        MoESpec(experts=2, top_k=3)
    with pytest.raises(pydantic.ValidationError, match=r"3 entries != experts\(4\)"):
        MoESpec(experts=4, routing={"kind": "histogram", "loads": [1, 2, 3]})
    with pytest.raises(pydantic.ValidationError, match=r"loads\[1\]\(-1.0\)"):
        MoESpec(experts=2, routing={"kind": "histogram", "loads": [1, -1]})
    with pytest.raises(pydantic.ValidationError):
        MoESpec(experts=2, routing={"kind": "zipf", "exponent": -1})
    with pytest.raises(pydantic.ValidationError):
        MoESpec(experts=2, routing={"kind": "dirichlet", "concentration": 0})
    with pytest.raises(pydantic.ValidationError):
        MoESpec(experts=2, routing={"kind": "pareto"})
    with pytest.raises(pydantic.ValidationError):
        MoESpec(experts=2, capacity_factor=0)
    with pytest.raises(pydantic.ValidationError):
        MoESpec(experts=2, top_k_=1)
    with pytest.raises(ScenarioError, match=r"experts\(6\) is not divisible by ep\(4\)"):
        moe_layer_traffic(MoESpec(experts=6), 4, 128, 64, 2, 0, 0, 0)
    with pytest.raises(ScenarioError, match=r"dp\(6\) is not divisible by ep\(4\)"):
        check_expert_parallel(MoESpec(experts=8), 4, dp=6)


def test_histogram_loads_are_normalised():
    moe = MoESpec(experts=4, routing={"kind": "histogram", "loads": [2, 2, 4, 0]})
    assert moe.routing.loads == [0.25, 0.25, 0.5, 0.0]


def test_placement_and_moe_layers():
    moe = MoESpec(experts=8, every=2)
    assert [list(local_experts(moe, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert expert_ranks(moe, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert moe_layers(moe, 6) == [1, 3, 5]
    assert moe_layers(MoESpec(experts=8), 3) == [0, 1, 2]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("ep", [1, 2, 8])
def test_expert_ops_flops_and_parameters(tp, ep):
    h, f, tokens = 1024, 3584, 8192
    moe = MoESpec(experts=8, top_k=2, ffn_hidden=f)
    ops = expert_ops(moe, h, tokens, tp, ep=ep, router_tokens=4096)
    names = [op.name for op in ops]
    assert names == ["moe_router", "expert_fc1", "expert_gelu", "expert_fc2"]
    by = {op.name: op for op in ops}
    assert by["moe_router"].shape == (4096, 8, h)
    assert by["expert_fc1"].shape == (tokens, f // tp, h)
    assert by["expert_fc2"].shape == (tokens, h, f // tp)
    assert by["expert_fc1"].flops + by["expert_fc2"].flops == pytest.approx(4 * tokens * h * f / tp)
    assert sum(op.weight_params for op in ops) == moe_layer_parameters_per_rank(moe, h, ep, tp)
    # backward: twice the forward's FLOPs, with every local expert's weights read/written
    local = 8 // ep
    for op in ops:
        grads = expert_backward_of(op, local)
        assert sum(g.model_flops for g in grads) == pytest.approx(2 * op.model_flops)
        assert sum(g.weight_params for g in grads) == op.weight_params
        if op.name == "expert_fc1" and local > 1:
            single = sum(g.bytes for g in backward_of(op))
            assert sum(g.bytes for g in grads) > single


def test_moe_parameters():
    h, f = 4096, 14336  # Mixtral 8x7B's expert shape, 8 experts
    moe = MoESpec(experts=8, top_k=2, ffn_hidden=f)
    total = moe_layer_parameters(moe, h)
    assert total == h * 8 + 8 * (2 * h * f + f + h)
    assert moe_layer_parameters_per_rank(moe, h, 1) == total
    assert moe_layer_parameters_per_rank(moe, h, 8) == h * 8 + (2 * h * f + f + h)
    assert moe_layer_parameters(MoESpec(experts=4), 64) == 64 * 4 + 4 * (2 * 64 * 256 + 256 + 64)
    with pytest.raises(ScenarioError, match=r"ffn\(14336\) is not divisible by tp\(3\)"):
        moe_layer_parameters_per_rank(moe, h, 1, tp=3)


def test_dropped_assignments_are_not_model_flops():
    """With a capacity factor the experts skip the dropped assignments: model FLOPs count
    the processed ones, so MFU stays below HFU."""
    path = SCENARIOS / "teaching" / "moe-imbalance-mistake.yaml"
    full = run_scenario(load_scenario(path)).result
    capped = run_scenario(load_scenario(path, ["model.moe.capacity_factor=0.5"])).result
    assert capped.moe.dropped_fraction > 0.3
    assert capped.model_flops_per_step < full.model_flops_per_step
    assert 0 < capped.mfu <= capped.hfu <= 1
