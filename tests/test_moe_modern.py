"""Today's mixtures of experts: fine-grained experts (``moe.expert_ffn_hidden``) and
shared experts, run after the routed ones or overlapped with the all-to-alls."""

from __future__ import annotations

import pytest

from simulator.arithmetic.counts import active_parameter_count, parameter_count
from simulator.arithmetic.moe import moe_layer_parameters
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario
from simulator.schedule.ir import Collective

from .conftest import SCENARIOS

MIXTRAL = SCENARIOS / "mixtral-ep.yaml"
SMALL_MOE = ["model.layers=4", "simulation.fidelity=analytic"]


def test_shared_and_fine_grained_experts_count_their_parameters():
    model = ModelSpec(
        layers=2, hidden=1024, heads=8, seq_len=512, vocab=1000, mlp="swiglu", bias=False
    )
    fine = MoESpec(experts=64, top_k=6, expert_ffn_hidden=256, shared_experts=2)
    h, f = 1024, 256
    expected = h * 64 + 64 * 3 * h * f + 3 * h * (2 * f)  # router, routed, shared
    assert moe_layer_parameters(fine, h, mlp="swiglu", bias=False) == expected
    dense_mlp = 3 * h * model.ffn
    assert parameter_count(model, fine) == parameter_count(model) + 2 * (expected - dense_mlp)
    active = h * 64 + 6 * 3 * h * f + 3 * h * 2 * f - dense_mlp
    assert active_parameter_count(model, fine) == parameter_count(model) + 2 * active
    assert MoESpec(experts=4, ffn_hidden=256).model_dump()["ffn_hidden"] == 256
    with pytest.raises(ValueError, match="name the same width"):
        MoESpec(experts=4, ffn_hidden=256, expert_ffn_hidden=512)


def test_overlapped_shared_experts_run_beside_the_all_to_alls():
    shared = [*SMALL_MOE, "model.moe.shared_experts=1"]
    after = run_scenario(load_scenario(MIXTRAL, shared)).result.step_time_s
    overlapped_scenario = load_scenario(MIXTRAL, [*shared, "model.moe.overlap_shared_experts=true"])
    overlapped = run_scenario(overlapped_scenario).result.step_time_s
    routed_only = run_scenario(load_scenario(MIXTRAL, SMALL_MOE)).result.step_time_s
    assert routed_only < overlapped < after
    ops = per_rank_schedule(overlapped_scenario).programs[0].ops
    by_label = {op.label: op for op in ops}
    dispatch = by_label["L0.dispatch.fwd.mb0"]
    first_shared = by_label["L0.shared_fc1.fwd.mb0"]
    first_expert = by_label["L0.expert_fc1.fwd.mb0"]
    assert type(dispatch) is Collective and dispatch.id < first_shared.id < first_expert.id
    assert dispatch.id not in first_shared.deps and dispatch.id in first_expert.deps


def test_shared_experts_reduce_their_gradients_over_data_parallelism():
    scenario = load_scenario(
        MIXTRAL, [*SMALL_MOE, "model.moe.shared_experts=1", "parallel.ep=2", "parallel.dp=8"]
    )
    ops = per_rank_schedule(scenario).programs[0].ops
    dp_bytes = sum(
        op.bytes for op in ops if type(op) is Collective and op.group.startswith("dp") and
        ".bucket" in op.label
    )  # fmt: skip
    without = load_scenario(MIXTRAL, [*SMALL_MOE, "parallel.ep=2", "parallel.dp=8"])
    plain = sum(
        op.bytes
        for op in per_rank_schedule(without).programs[0].ops
        if type(op) is Collective and op.group.startswith("dp") and ".bucket" in op.label
    )
    model, moe = scenario.model, scenario.moe
    shared_per_rank = 2 * model.hidden * model.ffn // 2  # GELU: fc1 and fc2, split over tp 2
    layers = model.layers
    assert dp_bytes - plain == pytest.approx(
        layers * (shared_per_rank + model.ffn // 2 + model.hidden) * 4, rel=1e-9
    )
    assert moe.shared_experts == 1


def test_node_limited_routing_never_crosses_to_more_nodes_than_allowed():
    from simulator.arithmetic.moe import moe_layer_traffic

    spec = MoESpec(experts=64, top_k=8, max_nodes_per_token=2)
    ep, tokens, hidden = 16, 4096, 1024
    nodes = [rank // 4 for rank in range(ep)]  # 4 EP ranks per node, 4 nodes
    limited = moe_layer_traffic(spec, ep, tokens, hidden, 2, 0, 0, 0, nodes=nodes)
    free = moe_layer_traffic(spec, ep, tokens, hidden, 2, 0, 0, 0)
    for i in range(ep):
        remote = [j for j in range(ep) if nodes[j] != nodes[i]]
        crossing = limited.splits[i, remote].sum() / (hidden * 2)  # tokens sent off-node
        # each token crosses to at most 2 nodes (one copy each)
        assert crossing <= tokens * spec.max_nodes_per_token + 1e-6
        assert limited.splits[i, remote].sum() < free.splits[i, remote].sum()
        local = [j for j in range(ep) if nodes[j] == nodes[i]]
        assert (limited.splits[i, local] == free.splits[i, local]).all()
    assert (limited.counts == free.counts).all()  # the experts' loads are the same


@pytest.mark.parametrize("experts,ep", [(128, 8), (256, 32), (64, 16)])
def test_deepep_sends_a_token_once_to_each_gpu_of_its_node_that_holds_one_of_its_experts(
    experts, ep
):
    from math import comb

    from simulator.arithmetic.moe import moe_layer_traffic

    spec = MoESpec(experts=experts, top_k=8, dispatcher="deepep")
    each = MoESpec(experts=experts, top_k=8)
    tokens, hidden = 4096, 2048
    deduplicated = moe_layer_traffic(spec, ep, tokens, hidden, 2, 0, 0, 0)
    copies = moe_layer_traffic(each, ep, tokens, hidden, 2, 0, 0, 0)
    # a uniform router: a GPU holding e of E experts gets 1 - C(E-e, 8)/C(E, 8) of the
    # tokens, where each assignment would move a copy: k·e/E of them
    per = experts // ep
    reach = 1 - comb(experts - per, 8) / comb(experts, 8)
    assert deduplicated.splits.sum() / copies.splits.sum() == pytest.approx(
        reach / (8 * per / experts), rel=1e-3
    )
    # the experts' loads, and so their compute, do not change
    assert (deduplicated.counts == copies.counts).all()
    assert (deduplicated.splits.T == deduplicated.combine_splits).all()


def test_deepep_crosses_to_each_other_node_once():
    from simulator.arithmetic.moe import moe_layer_traffic

    spec = MoESpec(experts=128, top_k=8, dispatcher="deepep")
    ep, tokens, hidden = 32, 4096, 1024
    nodes = [rank // 8 for rank in range(ep)]  # 4 nodes of 8
    traffic = moe_layer_traffic(spec, ep, tokens, hidden, 2, 0, 0, 0, nodes=nodes)
    copies = moe_layer_traffic(MoESpec(experts=128, top_k=8), ep, tokens, hidden, 2, 0, 0, 0)
    for i in range(ep):
        for node in range(4):
            if node == nodes[i]:
                continue
            there = [j for j in range(ep) if nodes[j] == node]
            crossing = traffic.splits[i, there].sum() / (hidden * 2)
            assert crossing <= tokens  # at most one copy of each token per node
            assert crossing > 0.85 * tokens  # 32 of 128 experts: 91% of tokens reach it
            assert crossing < copies.splits[i, there].sum() / (hidden * 2) / 2


def test_a_deepep_run_spends_less_time_in_its_all_to_alls():
    overrides = [*SMALL_MOE, "model.moe.top_k=4"]
    plain = run_scenario(load_scenario(MIXTRAL, overrides)).result
    deepep = run_scenario(
        load_scenario(MIXTRAL, [*overrides, "model.moe.dispatcher=deepep"])
    ).result
    assert deepep.step_time_s < plain.step_time_s
    with pytest.raises(Exception, match="dispatcher"):
        load_scenario(MIXTRAL, [*SMALL_MOE, "model.moe.dispatcher=nccl"])


def test_the_first_layers_stay_dense_and_heads_can_be_wider_than_hidden():
    from simulator.request.moe import is_moe_layer

    spec = MoESpec(experts=8, first_dense=3)
    assert [is_moe_layer(spec, layer) for layer in range(5)] == [False] * 3 + [True] * 2
    wide = ModelSpec(layers=1, hidden=2048, heads=32, kv_heads=4, head_dim=128, seq_len=64,
                     vocab=10, mlp="swiglu", bias=False)  # fmt: skip
    from simulator.arithmetic.counts import attention_parameter_count

    assert attention_parameter_count(wide) == 2048 * (32 + 8) * 128 + 32 * 128 * 2048
    with pytest.raises(ValueError, match="or give head_dim"):
        ModelSpec(layers=1, hidden=100, heads=3, seq_len=8, vocab=10)
