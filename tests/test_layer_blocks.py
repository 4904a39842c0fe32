"""A search's schedule (``run_scenario(..., numbers_only=True)``) writes a stage's last
backward, whose gradients go to data parallelism, in blocks of layers that share one
body; the gradient buckets and FSDP's gathers and reduce-scatters wait for points
inside them. The times must be the op-by-op schedule's, in both engines."""

from __future__ import annotations

import pytest

from simulator.engine.core import EngineOptions, simulate
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule.ir import Block, Collective, Compute, Schedule

from .helpers import same_numbers
from .test_shared_bodies import BASE  # 4 stages of 6 layers, tp 4, dp 2, on 4 nodes


def _layer_blocks(program) -> list[Block]:
    return [op for op in program.ops if type(op) is Block and op.label.startswith("L")]


@pytest.mark.parametrize(
    "overrides",
    [[], ["training.sharding=full", "training.recompute=full"], ["parallel.sp=true"]],
)
def test_the_last_backward_is_a_block_per_layer_over_one_body(overrides):
    scenario = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, *overrides])
    search = build_schedule(scenario, numbers_only=True)
    plain = build_schedule(scenario)
    for rank, program in search.programs.items():
        blocks = _layer_blocks(program)
        assert len(blocks) == 6  # the stage's six layers
        assert len({id(block.body) for block in blocks}) == 1
        # the stage's gradients leave from inside the blocks
        dp = [op for op in program.ops if type(op) is Collective and op.stream == "dp"]
        assert any(op.points for op in dp)
        for op in program.ops:
            for dep, point in zip(op.deps, op.points or [-1] * len(op.deps), strict=True):
                if point >= 0:
                    assert type(program.ops[dep]) is Block and point < len(program.ops[dep].body)
        computes = sum(type(op) is Compute for op in program.ops)
        assert computes < sum(type(op) is Compute for op in plain.programs[rank].ops) / 10
    # the bodies of the stages' layers were lowered once and retargeted to the others
    assert len(search.body_templates) >= len(plain.body_templates) + len(search.programs) - 1


@pytest.mark.parametrize(
    "overrides",
    [[], ["training.sharding=full"], ["parallel.sp=true", "training.tp_comm_overlap=pipelined"]],
)
def test_points_give_the_same_times_in_both_engines(overrides):
    scenario = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, *overrides])
    schedule = build_schedule(scenario, numbers_only=True)
    direct = simulate(schedule, scenario.cluster, EngineOptions("analytic"))
    replay = simulate(schedule, scenario.cluster, EngineOptions("analytic", closed_form=False))
    assert direct.step_time == pytest.approx(replay.step_time, rel=1e-12)
    for rank in schedule.programs:
        assert direct.end[rank] == pytest.approx(replay.end[rank], rel=1e-12, abs=1e-15)
    # each gradient bucket, gather and reduce-scatter starts when it did op by op
    plain = build_schedule(scenario)
    times = simulate(plain, scenario.cluster, EngineOptions("analytic"))
    for rank, program in schedule.programs.items():
        ops = plain.programs[rank].ops
        before = [times.start[rank][op.id] for op in ops if op.stream == "dp"]
        after = [direct.start[rank][op.id] for op in program.ops if op.stream == "dp"]
        assert after == pytest.approx(before, rel=1e-12)


def test_points_survive_json():
    scenario = load_scenario("scenarios/pipeline-demo.yaml", BASE)
    schedule = build_schedule(scenario, numbers_only=True)
    again = Schedule.from_json(schedule.to_json())
    assert again.programs == schedule.programs
    plain = build_schedule(scenario).to_json()
    assert '"points"' not in plain  # most ops wait for their deps' own ends: said by omission


@pytest.mark.parametrize("gpu", ["host_overhead=4e-6", "jitter=0.05"])
def test_per_action_and_per_rank_times_keep_the_last_backward_op_by_op(gpu):
    """A body holds neither the host's issue times of its action nor a straggler's
    factor: a search of such a GPU writes no layer blocks, and its numbers are the
    plain run's all the same."""
    scenario = load_scenario("scenarios/pipeline-demo.yaml", [*BASE, f"cluster.gpu.{gpu}"])
    search = run_scenario(scenario, numbers_only=True)
    assert not any(_layer_blocks(p) for p in search.schedule.programs.values())
    plain = run_scenario(scenario)
    assert same_numbers(search.result.to_json(), plain.result.to_json()) == []
