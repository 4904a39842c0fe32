"""Full sharding as each framework runs it (``training.framework`` with
``training.sharding: full``): FSDP2's per-block gathers with their copies, FSDP1's flat
units under the all-gather rate limiter, DeepSpeed ZeRO-3's per-module gathers with its
prefetch bucket, and FSDP with expert parallelism."""

from __future__ import annotations

import json
import math

import pytest

from simulator.arithmetic.counts import unit_parameters
from simulator.request.scenario import load_scenario
from simulator.run.simulate import per_rank_schedule, run_scenario
from simulator.schedule.ir import Collective, Compute
from simulator.schedule.sharded_dp import FSDP2_COPY_IN_BYTES, FSDP2_COPY_OUT_BYTES
from simulator.schedule.sharding_units import (
    DEEPSPEED_PREFETCH_BUCKET,
    DEEPSPEED_REDUCE_BUCKET,
    block_units,
    submodule_units,
)

from .conftest import SCENARIOS
from .helpers import TINY

SMALL = SCENARIOS / "small.yaml"
# one micro-batch, bf16 gradients, full sharding over dp 4
ONE = [
    "training.grad_reduce_dtype=bf16",
    "training.global_batch=16",
    "training.micro_batch=4",
    "training.sharding=full",
]
MOE = [
    "parallel.tp=1",
    "parallel.dp=8",
    "parallel.ep=2",
    "training.global_batch=8",
    "training.micro_batch=1",
    "training.sharding=full",
    "model.moe={experts: 4, top_k: 2}",
]


def _program(overrides: list[str], rank: int = 0):
    scenario = load_scenario(SMALL, overrides)
    return scenario, per_rank_schedule(scenario).programs[rank].ops


def _collectives(ops, kind: str) -> list[Collective]:
    return [op for op in ops if type(op) is Collective and op.kind == kind]


def test_every_framework_s_units_hold_each_parameter_once():
    for name in ("llama3-8b.yaml", "small.yaml", "mixtral-ep.yaml"):
        scenario = load_scenario(SCENARIOS / name)
        recipe, model, moe = scenario.recipe, scenario.model, scenario.moe
        for layer in recipe.rank_layers(0):
            whole = unit_parameters(recipe, model, moe, layer)
            assert sum(u.params for u in block_units(recipe, model, moe, layer)) == whole
            assert sum(u.params for u in submodule_units(recipe, model, moe, layer)) == whole


def test_fsdp2_copies_in_gathers_and_copies_out_each_block():
    scenario, ops = _program([*ONE, "training.framework=torchtitan"])
    recipe, model = scenario.recipe, scenario.model
    dp = scenario.layout.dp
    layers = model.layers
    gathers = _collectives(ops, "all_gather")
    # one gather per block and pass, forward then backward order
    assert [g.tags["layer"] for g in gathers] == [*range(layers), *reversed(range(layers))]
    by_id = {op.id: op for op in ops}
    for gather in gathers:
        params = unit_parameters(recipe, model, None, gather.tags["layer"])
        assert gather.bytes == 2 * params
        (copy_in,) = (by_id[d] for d in gather.deps)
        assert copy_in.stream == "dp_copy_in" and copy_in.bytes == FSDP2_COPY_IN_BYTES * params / dp
        # the copy-out on the compute stream waits for the gather; the layer follows it
        copy_out = next(
            op
            for op in ops
            if type(op) is Compute and gather.id in op.deps and op.stream == "compute"
        )
        assert copy_out.label.split(".")[1] == "fsdp_copy_out"
        assert copy_out.bytes == FSDP2_COPY_OUT_BYTES * params
    scatters = _collectives(ops, "reduce_scatter")
    assert [s.tags["layer"] for s in scatters] == list(reversed(range(layers)))
    for scatter in scatters:
        params = unit_parameters(recipe, model, None, scatter.tags["layer"])
        assert scatter.bytes == params * recipe.grad_bytes
        (copy_in,) = (by_id[d] for d in scatter.deps)
        assert copy_in.stream == "dp_rs_copy_in"
        assert copy_in.bytes == params * (2 + recipe.grad_bytes)


def test_fsdp2_reduces_in_fp32_by_default_as_torchtitan_does():
    scenario, ops = _program(["training.sharding=full", "training.framework=torchtitan"])
    params = unit_parameters(scenario.recipe, scenario.model, None, 0)
    (first,) = [s for s in _collectives(ops, "reduce_scatter") if s.tags["layer"] == 0]
    assert first.bytes == 4 * params


@pytest.mark.parametrize(
    "framework,every",
    [("torchtitan", True), ("fsdp1", True), ("deepspeed", True), ("megatron", False)],
)
def test_the_pytorch_stacks_reduce_scatter_in_every_micro_batch_s_backward(framework, every):
    # four micro-batches: FSDP2 (OLMo-core's and torchtitan's gradient accumulation),
    # FSDP1 and ZeRO-3 reduce in each backward; Megatron-Core accumulates and reduces once
    four = [*ONE, "training.micro_batch=1", f"training.framework={framework}"]
    scenario, ops = _program(four)
    assert scenario.recipe.microbatches == 4
    reduces = _collectives(ops, "reduce_scatter")
    per_microbatch = {op.tags.get("microbatch") for op in reduces}
    assert per_microbatch == ({0, 1, 2, 3} if every else {3})
    if framework in ("torchtitan", "fsdp1"):  # one per unit, each micro-batch alike
        assert len(reduces) == 4 * len({op.label.split(".")[0] for op in reduces})


def test_fsdp2_under_pipeline_parallelism_reduces_in_the_last_backward_only():
    # torch.distributed.pipelining's stages turn gradient sync off until the last backward
    staged = [*ONE, "training.micro_batch=1", "training.framework=torchtitan"]
    scenario, ops = _program([*staged, "parallel.pp=2", "parallel.dp=2"])
    assert scenario.recipe.microbatches == 8
    reduces = _collectives(ops, "reduce_scatter")
    assert reduces and {op.tags.get("microbatch") for op in reduces} == {7}


def test_fsdp1_gathers_flat_units_at_most_two_in_flight():
    scenario, ops = _program([*ONE, "training.framework=fsdp1"])
    layers = scenario.model.layers
    by_id = {op.id: op for op in ops}
    gathers = _collectives(ops, "all_gather")
    assert [g.tags["layer"] for g in gathers] == [*range(layers), *reversed(range(layers))]
    assert not [op for op in ops if type(op) is Compute and "copy" in op.label]
    for gather in gathers:
        layer, forward = gather.tags["layer"], gather.tags["phase"] == "fwd"
        freed = [by_id[d] for d in gather.deps]
        # the rate limiter: a unit's gather waits for the free of the unit two back
        back = layer - 2 if forward else layer + 2
        if 0 <= back < layers:
            assert [op.tags["layer"] for op in freed] == [back]
            # the freed unit's last op: nothing of that layer and pass runs after it
            later = [
                op
                for op in ops
                if type(op) is Compute
                and op.id > freed[0].id
                and op.tags.get("layer") == back
                and (op.tags.get("phase") == "fwd") == forward
            ]
            assert not later
    # SHARD_GRAD_OP: nothing is freed in the forward, so nothing holds its gathers back
    _, kept = _program([*ONE, "training.framework=fsdp1", "training.reshard_after_forward=false"])
    forward = [g for g in _collectives(kept, "all_gather") if g.tags["phase"] == "fwd"]
    assert len(forward) == layers and all(not g.deps for g in forward)
    assert all(g.tags["phase"] == "fwd" for g in _collectives(kept, "all_gather"))


def test_zero3_gathers_module_by_module_with_its_prefetch_bucket():
    scenario, ops = _program([*ONE, "training.framework=deepspeed"])
    recipe, model = scenario.recipe, scenario.model
    layers = model.layers
    gathered = [m for layer in range(layers) for m in submodule_units(recipe, model, None, layer)]
    sharded = [m for m in gathered if not m.persistent]
    assert any(m.persistent for m in gathered)  # the norms stay whole (1e5 threshold)
    assert len(sharded) == 6 * layers + 1  # q, k, v, o, fc1, fc2 and the embedding
    gathers = _collectives(ops, "all_gather")
    for phase in ("fwd", "bwd"):
        calls = [g for g in gathers if (g.tags["phase"] == "fwd") == (phase == "fwd")]
        # every sharded module once per pass, in coalesced calls that each prefetch up
        # to the bucket past the module being fetched
        assert sum(g.bytes for g in calls) == 2 * sum(m.params for m in sharded)
        assert len(calls) < len(sharded)
        largest = max(m.params for m in sharded)
        assert all(g.bytes <= 2 * (DEEPSPEED_PREFETCH_BUCKET + largest) for g in calls)
    # one bucket of gradients: a GPT-2 small holds fewer than 5e8 elements
    (bucket,) = _collectives(ops, "reduce_scatter")
    assert bucket.bytes == recipe.grad_bytes * sum(m.params for m in gathered)
    assert sum(m.params for m in gathered) < DEEPSPEED_REDUCE_BUCKET


def test_zero3_per_module_gathers_stop_hiding_as_data_parallelism_grows():
    """GPT-3 13B on DGX A100 nodes at a fixed global batch of 1024 sequences: as dp goes
    64 -> 256 -> 1024, each GPU runs 16 -> 4 -> 1 sequences while its gathers stay the
    same and their calls grow latency-bound (the ring's steps grow with dp). ZeRO-3's
    throughput per GPU falls; FSDP2's per-block gathers still hide."""

    def per_gpu(framework: str, nodes: int) -> float:
        scenario = load_scenario(
            SMALL,
            [
                "model.preset=gpt3-13b",
                f"cluster.nodes={nodes}",
                "parallel.tp=1",
                "parallel.dp=null",
                "training.global_batch=1024",
                "training.micro_batch=1",
                "training.sharding=full",
                f"training.framework={framework}",
                "simulation.fidelity=analytic",
            ],
        )
        result = run_scenario(scenario).result
        return 1024 / result.step_time_s / (8 * nodes)  # sequences per second per GPU

    zero3 = [per_gpu("deepspeed", nodes) for nodes in (8, 32, 128)]
    assert zero3[0] > zero3[1] > zero3[2]
    assert zero3[2] < 0.75 * zero3[0]
    fsdp2 = per_gpu("torchtitan", 128)
    assert fsdp2 > 1.2 * zero3[2]


def test_deepspeed_zero2_buckets_by_reduce_bucket_size():
    scenario, ops = _program(
        ["training.sharding=gradients", "training.framework=deepspeed", "training.micro_batch=4"]
    )
    scatters = _collectives(ops, "reduce_scatter")
    # a rank's 62M gradients (GPT-2 small over tp 2) fit one 5e8-element bucket, where
    # DDP's 25 MiB buckets make several
    assert len(scatters) == 1
    _, ddp = _program(["training.sharding=gradients", "training.micro_batch=4"])
    assert len(_collectives(ddp, "reduce_scatter")) > 5


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "fsdp1", "deepspeed"])
def test_fsdp_with_expert_parallelism_shards_experts_over_edp(framework):
    scenario, ops = _program([*MOE, f"training.framework={framework}"])
    layout = scenario.layout
    groups = per_rank_schedule(scenario).groups
    edp = layout.group_name("edp", 0)
    dp = layout.group_name("dp", 0)
    gathers = _collectives(ops, "all_gather")
    scatters = _collectives(ops, "reduce_scatter")
    assert {g.group for g in gathers if g.tags.get("axis") == "dp"} == {dp, edp}
    assert len(groups[edp]) == layout.dp // layout.ep
    if framework != "deepspeed":
        experts = [g for g in gathers if g.group == edp]
        assert len(experts) == 2 * scenario.model.layers  # forward and backward
        assert {s.group for s in scatters} == {dp, edp}
    run = run_scenario(scenario).result
    assert math.isfinite(run.step_time_s) and run.step_time_s > 0


def test_experts_memory_shards_over_edp():
    """The dense weights shard over dp, the routed experts over edp = dp/ep; two units
    are gathered at once (reshard after forward)."""
    from simulator.arithmetic.counts import pipeline_rank_parameters
    from simulator.schedule.sharding_units import rank_expert_parameters

    full = load_scenario(SMALL, MOE)
    recipe, model, moe, layout = full.recipe, full.model, full.moe, full.layout
    memory = run_scenario(full).result.memory.per_stage[0].terms_bytes
    params = pipeline_rank_parameters(recipe, model, moe, 0)
    experts = rank_expert_parameters(recipe, model, moe, 0)
    units = sorted(unit_parameters(recipe, model, moe, layer) for layer in recipe.rank_layers(0))
    edp = layout.dp // layout.ep
    expected = 2 * (params - experts) / layout.dp + 2 * experts / edp + 2 * sum(units[-2:])
    assert 0 < experts < params
    assert memory["weights"] == pytest.approx(expected)


@pytest.mark.hardware
def test_fsdp_with_expert_parallelism_replays_on_gloo(tmp_path):
    pytest.importorskip("torch")
    from hardware.launch import launch_local

    scenario_file = str(SCENARIOS / "cpu-tiny.yaml")
    overrides = [
        *TINY,
        "cluster.gpus_per_node=4",
        "parallel.tp=1",
        "parallel.dp=4",
        "parallel.ep=2",
        "model.moe={experts: 4, top_k: 2}",
        "training.sharding=full",
        "training.framework=torchtitan",
    ]
    scenario = load_scenario(scenario_file, overrides)
    assert scenario.layout.world == 4
    launch_local(
        "hardware.replay",
        [scenario_file, "--out", str(tmp_path), "--warmup", "1", "--steps", "1"]
        + [f"--set={o}" for o in overrides],
        4,
        "gloo",
        60,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["fidelity"] == "measured"
    assert result["measured"]["verified_collectives"] is True
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = [e["name"] for e in events if e["ph"] == "X"]
    assert any("experts.fsdp_all_gather" in n for n in names)
    assert any("fsdp_copy_in" in n for n in names)
