"""Pipeline orders replayed with free communication and equal stages reproduce the
reference bubble fraction (p−1)/(m+p−1) of GPipe and 1F1B."""

from __future__ import annotations

import pytest

from simulator.analysis.metrics import account_rank
from simulator.engine.core import simulate
from simulator.request.orders import parse_action
from simulator.schedule.ir import Compute, Program, Recv, Schedule, Send
from simulator.schedule.pipeline import gpipe_order, one_f_one_b_order

from .helpers import FREE_NETWORK, cluster, seconds_to_flops


def pipeline_schedule(orders, forward_flops: float, backward_flops: float) -> Schedule:
    """Stage s on rank s: each F/B is one compute op, activations and gradients travel
    as zero-byte sends (communication is free)."""
    stages = len(orders)
    programs = {}
    for stage, actions in orders.items():
        ops = []
        for action in actions:
            mb = action.microbatch
            deps: tuple[int, ...] = ()
            if action.type == "F":
                if stage > 0:
                    ops.append(
                        Recv(len(ops), "pp_recv_fwd", stage - 1, 0, 2 * mb, tags={"axis": "pp"})
                    )
                    deps = (len(ops) - 1,)
                ops.append(
                    Compute(
                        len(ops),
                        "compute",
                        forward_flops,
                        0,
                        "gemm",
                        f"{action}",
                        deps,
                        {"phase": "fwd"},
                    )
                )
                if stage < stages - 1:
                    ops.append(
                        Send(
                            len(ops),
                            "pp_send_fwd",
                            stage + 1,
                            0,
                            2 * mb,
                            deps=(len(ops) - 1,),
                            tags={"axis": "pp"},
                        )
                    )
            else:
                if stage < stages - 1:
                    ops.append(
                        Recv(len(ops), "pp_recv_bwd", stage + 1, 0, 2 * mb + 1, tags={"axis": "pp"})
                    )
                    deps = (len(ops) - 1,)
                ops.append(
                    Compute(
                        len(ops),
                        "compute",
                        backward_flops,
                        0,
                        "gemm",
                        f"{action}",
                        deps,
                        {"phase": "bwd"},
                    )
                )
                if stage > 0:
                    ops.append(
                        Send(
                            len(ops),
                            "pp_send_bwd",
                            stage - 1,
                            0,
                            2 * mb + 1,
                            deps=(len(ops) - 1,),
                            tags={"axis": "pp"},
                        )
                    )
        programs[stage] = Program(stage, ops)
    return Schedule(programs=programs, groups={})


@pytest.mark.parametrize("order", [gpipe_order, one_f_one_b_order])
@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 8), (4, 4), (4, 16), (8, 3), (8, 32)])
def test_idle_fraction_matches_reference(order, stages, microbatches):
    machine = cluster(nodes=1, **FREE_NETWORK)
    t_forward, t_backward = 1e-3, 2e-3
    schedule = pipeline_schedule(
        order(stages, microbatches),
        seconds_to_flops(machine, t_forward),
        seconds_to_flops(machine, t_backward),
    )
    times = simulate(schedule, machine)
    expected_step = (microbatches + stages - 1) * (t_forward + t_backward)
    assert times.step_time == pytest.approx(expected_step, rel=1e-9)
    reference = (stages - 1) / (microbatches + stages - 1)
    for rank, program in schedule.programs.items():
        row = account_rank(
            program.ops,
            times.ready[rank],
            times.start[rank],
            times.end[rank],
            times.step_time,
            pipelined=True,
        )
        idle = row["breakdown"]["bubble"] / times.step_time
        assert idle == pytest.approx(reference, rel=1e-9, abs=1e-12)
        assert sum(row["breakdown"].values()) == pytest.approx(times.step_time, rel=1e-12)


def test_one_f_one_b_holds_at_most_p_minus_s_microbatches():
    stages, microbatches = 4, 10
    for stage, actions in one_f_one_b_order(stages, microbatches).items():
        in_flight = peak = 0
        for action in actions:
            in_flight += 1 if action.type == "F" else -1
            peak = max(peak, in_flight)
        assert peak == stages - stage
        assert in_flight == 0


def test_action_notation_round_trips():
    for actions in one_f_one_b_order(3, 5).values():
        for action in actions:
            assert parse_action(str(action)) == action
    assert str(parse_action("1B3")) == "1B3"
    with pytest.raises(ValueError, match="1X3"):
        parse_action("1X3")
