"""Calls measured in a scenario's own step (:func:`hardware.opbench.measured_calls`):
matched across ranks as the backends match them, timed from the last member's issue."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hardware.opbench import measured_calls  # noqa: E402
from simulator.engine.collectives import even_equivalent  # noqa: E402
from simulator.schedule.ir import Collective, Compute, Program, Recv, Schedule, Send  # noqa: E402


def _schedule() -> Schedule:
    def program(rank: int) -> Program:
        peer = 1 - rank
        splits = (0.0, 3e6) if rank == 0 else (1e6, 0.0)
        p2p = Send(3, "pp", peer, 5e5, tag=7) if rank == 0 else Recv(3, "pp", peer, 5e5, tag=7)
        return Program(
            rank,
            [
                Compute(0, "compute", 1e6, 0.0, "gemm"),
                Collective(1, "tp", "all_reduce", "g", 1e6, deps=(0,)),
                Collective(2, "tp", "all_to_all", "g", 4e6, deps=(1,), splits=splits),
                p2p,
                Collective(4, "tp", "all_reduce", "g", 1e6, deps=(2,)),
            ],
        )

    return Schedule({0: program(0), 1: program(1)}, {"g": (0, 1)})


def test_a_call_is_timed_from_its_last_member_s_issue_and_averaged_by_size():
    # per rank, per pass: (op id, issued, completed)
    calls = {
        0: [
            [(1, 1.0, 2.0), (2, 3.0, 3.5), (3, 4.0, 4.2), (4, 5.0, 5.3)],
            [(1, 1.0, 1.4), (2, 3.0, 3.5), (3, 4.0, 4.4), (4, 5.0, 5.2)],
        ],
        1: [
            [(1, 1.5, 2.0), (2, 3.2, 3.5), (3, 4.1, 4.3), (4, 5.1, 5.3)],
            [(1, 1.2, 1.4), (2, 3.0, 3.5), (3, 4.2, 4.5), (4, 5.0, 5.2)],
        ],
    }
    rows = {(r["kind"], r["bytes"]): r for r in measured_calls(_schedule(), calls, per_node=2)}
    # the two all-reduces of 1 MB, two passes each: 0.5, 0.2 then 0.2, 0.2 seconds
    assert rows[("all_reduce", 1e6)]["seconds"] == pytest.approx((0.5 + 0.2 + 0.2 + 0.2) / 4)
    # the uneven all-to-all is keyed by the even size its busiest member stands for
    size = even_equivalent({0: (0.0, 3e6), 1: (1e6, 0.0)}, [0, 1])
    assert rows[("all_to_all", size)]["seconds"] == pytest.approx((0.3 + 0.5) / 2)
    # a send and its receive: from the later post to the receive's end
    assert rows[("p2p", 5e5)]["seconds"] == pytest.approx((0.2 + 0.3) / 2)
    assert all(r["ranks"] == 2 and r["scope"] == "intra_node" for r in rows.values())
    across = measured_calls(_schedule(), calls, per_node=1)
    assert {r["scope"] for r in across} == {"inter_node"}
