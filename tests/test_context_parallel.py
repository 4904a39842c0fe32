"""Context parallelism: the sequence split over ``cp`` ranks, attention by a ring of K/V
blocks or by Ulysses' all-to-alls."""

from __future__ import annotations

import pytest

from simulator.analysis.memory import memory_per_rank
from simulator.common.errors import ScenarioError
from simulator.request.recipe import Recipe
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario
from simulator.schedule.ir import Collective, Recv, Send

from .conftest import SCENARIOS

LLAMA = SCENARIOS / "llama3-8b.yaml"
ONE_STEP = [
    "training.global_batch=1",
    "training.recompute=none",
    "training.optimizer_sharding=false",
    "parallel.dp=1",
]
# a model whose K/V are as large as its queries (no GQA), on one GPU per rank
MHA = ["model.kv_heads=32", "parallel.tp=1", "parallel.cp=2"]
TWO_GPUS = ["cluster.gpus_per_node=2", "cluster.nic.per_node=2"]
TWO_NODES = ["cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.nic.per_node=1"]


def _cp_share(overrides: list[str]) -> float:
    """Exposed context-parallel communication on the critical rank, as a share of the step."""
    result = run_scenario(load_scenario(LLAMA, [*ONE_STEP, *overrides])).result
    critical = result.per_rank[result.breakdown.critical_rank]
    return critical.exposed_comm_by_axis.get("cp", 0.0) / result.step_time_s


def test_the_ring_hides_its_transfers_behind_long_blocks_and_not_behind_short_ones():
    # 32K tokens over NVLink: a block's attention outlasts sending its K/V
    hidden = _cp_share([*MHA, "model.seq_len=32768", *TWO_GPUS])
    # 4K tokens, each rank on its own node: sending K/V outlasts the block
    exposed = _cp_share([*MHA, "model.seq_len=4096", *TWO_NODES])
    assert hidden < 0.03  # what is left: the K/V gradients' last hop of each backward
    # several times as much shows (how many times depends on how fast the attention
    # kernel runs its blocks: cuDNN's on Hopper)
    assert exposed > 0.05 and exposed > 5 * hidden


def test_a_ring_step_is_a_block_beside_a_transfer_to_the_next_rank():
    scenario = load_scenario(LLAMA, [*ONE_STEP, *MHA, "model.seq_len=4096", *TWO_GPUS])
    ops = per_rank_schedule(scenario).programs[0].ops
    sends = [op for op in ops if type(op) is Send and op.stream == "cp_send"]
    recvs = [op for op in ops if type(op) is Recv and op.stream == "cp_recv"]
    layers, cp = scenario.model.layers, 2
    # forward: cp-1 K/V hops per layer; backward: cp-1 K/V+dK/dV hops and the last dK/dV
    assert len(sends) == len(recvs) == layers * ((cp - 1) + cp)
    assert {op.peer for op in sends} == {1} and {op.peer for op in recvs} == {1}
    blocks = [op for op in ops if op.type == "compute" and ".attn_ring1.fwd." in op.label]
    # the forward's second block waits for the K/V the ring brought
    assert all(any(d in {r.id for r in recvs} for d in op.deps) for op in blocks)


def test_ulysses_moves_the_closed_form_bytes_per_layer():
    scenario = load_scenario(
        LLAMA, [*ONE_STEP, "parallel.tp=2", "parallel.cp=4", "parallel.cp_kind=ulysses"]
    )
    model, b, tp, cp = scenario.model, 1, 2, 4
    tokens = b * model.seq_len // cp
    d = model.head_dim
    qkv = 2 * tokens * (model.heads + 2 * model.kv) // tp * d
    out = 2 * tokens * model.heads // tp * d
    ops = per_rank_schedule(scenario).programs[0].ops
    moved = [op for op in ops if type(op) is Collective and op.tags.get("axis") == "cp"]
    per_layer = sum(op.bytes for op in moved) / model.layers
    # forward: Q, K, V in and O out; backward: dO in and dQ, dK, dV out
    assert per_layer == pytest.approx(2 * (qkv + out))
    assert {op.kind for op in moved} == {"all_to_all"}


def test_llama3_8b_at_128k_tokens_fits_8_h100s_only_with_context_parallelism():
    long = ["model.seq_len=131072", "training.global_batch=8", "training.recompute=full"]

    def oom(overrides: list[str]) -> bool:
        scenario = load_scenario(LLAMA, [*long, "parallel.tp=1", *overrides])
        capacity = scenario.cluster_spec.gpu.hbm_capacity
        return memory_per_rank(scenario.recipe, scenario.model, None, capacity).oom

    assert oom(["parallel.cp=1", "parallel.dp=8"])
    assert not oom(["parallel.cp=8", "parallel.dp=1"])


def test_context_parallel_ranks_reduce_gradients_and_shard_the_optimizer_together():
    scenario = load_scenario(LLAMA, ["parallel.cp=2", "parallel.dp=2"])
    layout = scenario.layout
    assert layout.world == 8 and layout.placement == ("tp", "cp", "dp", "pp")
    assert layout.shard_degree == 4  # ZeRO-1 over dp × cp
    ops = per_rank_schedule(scenario).programs[0].ops
    buckets = {op.group for op in ops if type(op) is Collective and ".bucket" in op.label}
    assert buckets == {layout.group_name("dp_cp", 0)}
    assert len(layout.groups[layout.group_name("dp_cp", 0)]) == 4
    assert Recipe.parse(str(scenario.recipe)) == scenario.recipe
    assert "cp2" in scenario.recipe.label()


def test_both_fidelities_run_a_context_parallel_step():
    for kind in ("ring", "ulysses"):
        times = [
            run_scenario(
                load_scenario(
                    LLAMA,
                    [
                        *ONE_STEP,
                        "parallel.cp=4",
                        f"parallel.cp_kind={kind}",
                        f"simulation.fidelity={f}",
                    ],
                )
            ).result.step_time_s
            for f in ("analytic", "flow")
        ]
        assert times[1] == pytest.approx(times[0], rel=0.05)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.cp=3"], "world"),
        (["parallel.cp=2", "parallel.dp=null", "training.attention=unfused"], "FlashAttention"),
        (["parallel.cp=4", "parallel.cp_kind=ulysses", "parallel.tp=2", "parallel.dp=null",
          "model.kv_heads=4"], "kv_heads"),
        (["parallel.cp=2", "parallel.dp=null", "model.seq_len=4098"], "2·cp"),
    ],
)  # fmt: skip
def test_bad_context_parallel_layouts_are_one_line_errors(overrides, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(LLAMA, overrides)
