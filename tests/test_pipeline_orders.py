"""Pipeline orders: their structure, the same orders as torch.distributed.pipelining's
schedule classes, torch's CSV format, and the bubble each one leaves when replayed
through the engine with free communication."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from simulator.analysis.metrics import account_rank
from simulator.common.vocabulary import PIPELINE_SCHEDULES
from simulator.engine.core import simulate
from simulator.request.orders import (
    Action,
    Overlap,
    compute_actions,
    dump_csv_order,
    in_flight_peak,
    load_csv_order,
    validate_order,
)
from simulator.request.placement import Placement
from simulator.schedule.ir import Compute, Program, Recv, Schedule, Send
from simulator.schedule.pipeline import (
    dualpipev_order,
    gpipe_order,
    interleaved_1f1b_order,
    one_f_one_b_order,
    pipeline_order,
    zb_h1_order,
    zb_h2_order,
    zbv_order,
)

from .helpers import FREE_NETWORK, cluster, seconds_to_flops

SIZES = [(1, 1), (1, 4), (2, 1), (2, 2), (2, 8), (3, 7), (4, 3), (4, 4), (4, 8), (8, 16)]
INTERLEAVED = [(1, 2, 2), (2, 2, 2), (2, 4, 3), (4, 4, 2), (4, 8, 2), (4, 12, 3), (8, 16, 4)]


def as_text(order):
    return {rank: [str(a) for a in actions] for rank, actions in order.items()}


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "zb-h2"])
@pytest.mark.parametrize("stages,microbatches", SIZES)
def test_orders_are_complete_and_run(schedule, stages, microbatches):
    order = pipeline_order(schedule, stages, microbatches)
    validate_order(order, stages, microbatches)
    split = schedule.startswith("zb")
    for rank, actions in order.items():
        assert {a.stage for a in actions} == {rank}
        counts = Counter(a.type for a in actions)
        expected = {"F": microbatches}
        expected.update({"I": microbatches, "W": microbatches} if split else {"B": microbatches})
        assert counts == expected
        for kind in counts:
            # each kind of pass takes the micro-batches in order
            assert [a.microbatch for a in actions if a.type == kind] == list(range(microbatches))
        if split:
            position = {(a.type, a.microbatch): i for i, a in enumerate(actions)}
            for mb in range(microbatches):
                assert position["F", mb] < position["I", mb] < position["W", mb]


@pytest.mark.parametrize("stages,microbatches,virtual", INTERLEAVED)
def test_interleaved_order_is_complete_and_runs(stages, microbatches, virtual):
    order = interleaved_1f1b_order(stages, microbatches, virtual)
    validate_order(order, stages * virtual, microbatches)
    assert order == pipeline_order("interleaved-1f1b", stages, microbatches, virtual)
    for rank, actions in order.items():
        assert {a.stage for a in actions} == set(range(rank, stages * virtual, stages))
        for stage in range(rank, stages * virtual, stages):
            for kind in "FB":
                mbs = [a.microbatch for a in actions if a.stage == stage and a.type == kind]
                assert mbs == list(range(microbatches))
        # warm-up: (v-1)·p + 2(p-1-r) forwards, then one more before the first backward
        warmup = (virtual - 1) * stages + 2 * (stages - 1 - rank)
        assert in_flight_peak(actions) == min(warmup + 1, virtual * microbatches)


@pytest.mark.parametrize("stages,microbatches", SIZES)
def test_in_flight_micro_batches(stages, microbatches):
    for s in range(stages):
        assert in_flight_peak(gpipe_order(stages, microbatches)[s]) == microbatches
        one_f_one_b = min(stages - s, microbatches)
        assert in_flight_peak(one_f_one_b_order(stages, microbatches)[s]) == one_f_one_b
        # ZB-H1 keeps 1F1B's activation memory; ZB-H2 up to 2p-1 on the first stage
        assert in_flight_peak(zb_h1_order(stages, microbatches)[s]) == one_f_one_b
        two_p = min(2 * (stages - 1 - s) + 1, microbatches)
        assert in_flight_peak(zb_h2_order(stages, microbatches)[s]) == two_p


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (4, 4), (4, 9), (8, 16)])
def test_zb_h1_holds_p_micro_batches_before_their_weight_pass(stages, microbatches):
    """The paper's memory argument: every stage keeps ``p`` micro-batches whose W has
    not run (stage 0 as many as 1F1B holds), so ZB-H1 needs no more than 1F1B."""
    for actions in zb_h1_order(stages, microbatches).values():
        pending = peak = 0
        for action in actions:
            pending += {"F": 1, "W": -1}.get(action.type, 0)
            peak = max(peak, pending)
        assert peak == stages


def test_in_flight_counts_chunks_separately():
    actions = [Action(0, "F", 0), Action(2, "F", 0), Action(2, "I", 0), Action(0, "B", 0)]
    assert in_flight_peak(actions) == 2
    assert in_flight_peak([]) == 0


def test_pipeline_order_names_and_errors():
    assert set(PIPELINE_SCHEDULES) == {
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zb-h1",
        "zb-h2",
        "zbv",
        "dualpipev",
    }
    assert pipeline_order("1f1b", 4, 8) == one_f_one_b_order(4, 8)
    assert pipeline_order("dualpipev", 4, 8, virtual=2) == dualpipev_order(4, 8)
    assert pipeline_order("zb-h2", 4, 8) == zb_h2_order(4, 8)
    assert pipeline_order("zbv", 4, 8, virtual=2) == zbv_order(4, 8)
    with pytest.raises(ValueError, match=r"'zbv' places 2 model chunks per rank"):
        pipeline_order("zbv", 4, 8)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'pipedream'"):
        pipeline_order("pipedream", 4, 8)
    with pytest.raises(ValueError, match=r"virtual stages \(2\).*'1f1b'"):
        pipeline_order("1f1b", 4, 8, virtual=2)
    with pytest.raises(ValueError, match=r"microbatches\(6\) % stages\(4\) = 2"):
        interleaved_1f1b_order(4, 6, 2)
    with pytest.raises(ValueError, match=r"microbatches \(0\)"):
        zb_h1_order(4, 0)
    with pytest.raises(ValueError, match=r"virtual \(0\)"):
        interleaved_1f1b_order(4, 8, 0)


def parse(rows):
    return {rank: [Action(int(t[0]), t[1], int(t[2:])) for t in row] for rank, row in rows.items()}


@pytest.mark.parametrize(
    "rows,microbatches,message",
    [
        ({0: ["0F0", "0I0"], 1: ["1F0", "1B0"]}, 1, "rank 0 runs 0I0 but never 0W0"),
        ({0: ["0F0", "0W0", "0I0"], 1: ["1F0", "1B0"]}, 1, "rank 0: 0W0 runs before 0I0"),
        ({0: ["0F0", "0B0", "0F0"], 1: ["1F0", "1B0"]}, 1, "0F0 appears twice"),
        ({0: ["0F0", "0B0"], 1: ["1F0", "1I0", "1B0", "1W0"]}, 1, "either B or I and W"),
        ({0: ["0F0"], 1: ["1F0", "1B0"]}, 1, r"never runs 0B0 \(nor 0I0\)"),
        ({0: ["0F0", "0B0"], 1: ["1F0"]}, 1, "never runs 1B0"),
        ({0: ["0F0", "0B0"], 1: ["0F1", "1B0"]}, 2, "stage 0 does not live on rank 1"),
        ({0: ["0F0", "0B0"], 1: ["1F0", "1B3"]}, 1, "out of range"),
        ({0: ["0F0", "0B0"], 2: ["2F0", "2B0"]}, 1, r"has ranks \[0, 2\], expected 0..p-1"),
        # one rank holding stage 0 only: stage 1 would be its second chunk
        ({0: ["0F0", "0B0"]}, 1, "rank 0 never runs 1F0"),
        # rank 0 wants 1's gradient of micro-batch 0 before sending it micro-batch 1
        (
            {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]},
            2,
            "can never finish: pipeline rank 0 waits at 0B0 for 1B/I0; "
            "pipeline rank 1 waits at 1F1 for 0F1",
        ),
    ],
)
def test_validate_order_errors(rows, microbatches, message):
    with pytest.raises(ValueError, match=message) as info:
        validate_order(parse(rows), 2, microbatches)
    assert "\n" not in str(info.value)


def test_validate_order_counts_global_stages():
    order = interleaved_1f1b_order(2, 4, 3)
    validate_order(order, 6, 4)
    with pytest.raises(ValueError, match=r"2 ranks, which do not divide stages\(5\)"):
        validate_order(order, 5, 4)
    with pytest.raises(ValueError, match="rank 0: 4F0: stage 4 does not live on rank 0"):
        validate_order(order, 4, 4)


def test_validate_order_rejects_communication_actions():
    order = one_f_one_b_order(2, 1)
    order[0].insert(1, Action(0, "SEND_F", 0))
    with pytest.raises(ValueError, match="0SEND_F0 is not a compute action"):
        validate_order(order, 2, 1)


# ---------------------------------------------------------------- torch's own orders


@pytest.fixture(scope="module")
def torch_schedules():
    pytest.importorskip("torch")
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def stage_stand_in(stage_index: int, num_stages: int, ranks: int) -> SimpleNamespace:
    """What torch's schedule classes read from a pipeline stage to build their orders.

    The orders are computed for every rank in the constructor; no process group, model
    or device is needed. ``submod=None`` passes the zero-bubble schedule's
    torch.compile check."""
    return SimpleNamespace(
        stage_index=stage_index,
        num_stages=num_stages,
        group_rank=stage_index % ranks,
        group_size=ranks,
        is_first=stage_index == 0,
        is_last=stage_index == num_stages - 1,
        submod=None,
    )


def torch_compute_order(pipeline_order_):
    """torch's order with idle steps (None) and non-compute actions (REDUCE_GRAD) left out."""
    return {
        rank: [
            str(a)
            for a in actions
            if a is not None and a.computation_type.value in ("F", "B", "I", "W", "OVERLAP_F_B")
        ]
        for rank, actions in pipeline_order_.items()
    }


@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 1), (2, 8), (4, 4), (4, 10), (8, 3)])
def test_gpipe_matches_torch(torch_schedules, stages, microbatches):
    schedule = torch_schedules.ScheduleGPipe(stage_stand_in(0, stages, stages), microbatches)
    assert torch_compute_order(schedule.pipeline_order) == as_text(
        gpipe_order(stages, microbatches)
    )


@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 2), (2, 8), (4, 4), (4, 10), (8, 32)])
def test_one_f_one_b_matches_torch(torch_schedules, stages, microbatches):
    """``Schedule1F1B`` needs ``m >= p``. In torch 2.13 its ``_get_pipeline_order`` (the
    order torch's schedule visualiser reads; ``_step_microbatches``, which runs the step,
    counts from 0 on every rank) numbers the last rank's forwards 1..m instead of
    0..m-1: with no warm-up forward its counter is incremented before the first one.
    That rank is compared after shifting those indices back."""
    schedule = torch_schedules.Schedule1F1B(stage_stand_in(0, stages, stages), microbatches)
    theirs = torch_compute_order(schedule.pipeline_order)
    last = theirs[stages - 1]
    forwards = sorted(int(a[len(f"{stages - 1}F") :]) for a in last if "F" in a)
    if forwards == list(range(1, microbatches + 1)):
        theirs[stages - 1] = [
            f"{stages - 1}F{int(a.split('F')[1]) - 1}" if "F" in a else a for a in last
        ]
    assert theirs == as_text(one_f_one_b_order(stages, microbatches))


@pytest.mark.parametrize(
    "stages,microbatches,virtual",
    [(1, 2, 2), (2, 2, 2), (2, 6, 3), (4, 4, 2), (4, 8, 2), (4, 12, 3), (4, 8, 4), (8, 16, 2)],
)
def test_interleaved_matches_torch(torch_schedules, stages, microbatches, virtual):
    local = [stage_stand_in(c * stages, stages * virtual, stages) for c in range(virtual)]
    schedule = torch_schedules.ScheduleInterleaved1F1B(local, microbatches)
    assert torch_compute_order(schedule.pipeline_order) == as_text(
        interleaved_1f1b_order(stages, microbatches, virtual)
    )


@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 1), (2, 6), (4, 2), (4, 8), (8, 16)])
def test_zb_h1_matches_torch(torch_schedules, stages, microbatches):
    """torch's ``ScheduleInterleavedZeroBubble`` with one stage per rank is the paper's
    ZB-H1 (ZB1P). torch has no class for ZB-H2; its order is checked against torch's
    validator and dry run in :func:`test_torch_loads_and_runs_our_csv`."""
    local = [stage_stand_in(0, stages, stages)]
    schedule = torch_schedules.ScheduleInterleavedZeroBubble(local, microbatches)
    assert torch_compute_order(schedule.pipeline_order) == as_text(
        zb_h1_order(stages, microbatches)
    )


# ---------------------------------------------------------------- CSV


ALL_ORDERS = [
    ("gpipe", 4, 6, 1),
    ("1f1b", 4, 6, 1),
    ("interleaved-1f1b", 4, 8, 2),
    ("interleaved-1f1b", 2, 4, 3),
    ("zb-h1", 4, 6, 1),
    ("zb-h2", 4, 8, 1),
]


@pytest.mark.parametrize("schedule,stages,microbatches,virtual", ALL_ORDERS)
def test_csv_round_trip(tmp_path, schedule, stages, microbatches, virtual):
    order = pipeline_order(schedule, stages, microbatches, virtual)
    path = tmp_path / "schedule.csv"
    dump_csv_order(order, path)
    first = path.read_text().splitlines()[0]
    assert first == ",".join(str(a) for a in order[0])
    assert load_csv_order(path) == order


def test_csv_skips_idle_communication_and_bookkeeping_cells(tmp_path):
    path = tmp_path / "schedule.csv"
    path.write_text(
        "0UNSHARD,0F0,0SEND_F0,,0F1,0SEND_F1, ,0RECV_B0,0I0,(0F2;0W0)OVERLAP_F_B,0I1,0W1,"
        "0RECV_B1,0I2,0W2,0REDUCE_GRAD,0RESHARD\n"
        ",1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F2,1F2,1B2,1SEND_B2\n"
    )
    order = load_csv_order(path)
    assert as_text(order) == {
        0: ["0F0", "0F1", "0I0", "0F2", "0W0", "0I1", "0W1", "0I2", "0W2"],
        1: ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    }
    validate_order(order, 2, 3)


@pytest.mark.parametrize("cell", ["0X1", "F0", "0F", "0F0x", "abc"])
def test_csv_bad_cell_names_row_column_and_cell(tmp_path, cell):
    path = tmp_path / "bad.csv"
    path.write_text(f"0F0,0B0\n1F0,{cell},1B0\n")
    with pytest.raises(
        ValueError, match=r"row 2 \(rank 1\), column 2: cannot read the cell"
    ) as info:
        load_csv_order(path)
    assert f"'{cell}'" not in str(info.value)  # the file's content is not quoted


@pytest.mark.parametrize(
    "content, message",
    [("", "no actions"), ("\n\n", "no actions"), (b"\xff\xfe0F0", "not UTF-8 text")],
)
def test_an_empty_or_unreadable_order_file_is_one_line_about_the_file(tmp_path, content, message):
    path = tmp_path / "order.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError, match=f"^{path}: {message}"):
        load_csv_order(path)
    with pytest.raises(ValueError, match="not a regular file"):
        load_csv_order("/dev/zero")


@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
def test_csv_written_by_torch_loads(torch_schedules, tmp_path, fmt):
    stages, microbatches, virtual = 4, 8, 2
    local = [stage_stand_in(c * stages, stages * virtual, stages) for c in range(virtual)]
    schedule = torch_schedules.ScheduleInterleaved1F1B(local, microbatches)
    path = tmp_path / f"{fmt}.csv"
    schedule._dump_csv(str(path), format=fmt)
    if fmt == "compute_comms":
        assert "SEND_F" in path.read_text()
    else:
        assert ",," in path.read_text()  # torch writes its idle steps as empty cells
    assert load_csv_order(path) == interleaved_1f1b_order(stages, microbatches, virtual)


@pytest.mark.parametrize("schedule,stages,microbatches,virtual", ALL_ORDERS)
def test_torch_loads_and_runs_our_csv(
    torch_schedules, tmp_path, schedule, stages, microbatches, virtual
):
    """torch's runtime reads our CSV, validates it, adds its sends and receives, and its
    dry run finishes every rank's actions; its own CSV dump reads back to our order."""
    order = pipeline_order(schedule, stages, microbatches, virtual)
    path = tmp_path / "ours.csv"
    dump_csv_order(order, path)
    local = [stage_stand_in(c * stages, stages * virtual, stages) for c in range(virtual)]
    runtime = torch_schedules._PipelineScheduleRuntime(local, microbatches)
    runtime._load_csv(str(path), format="compute_only")
    assert runtime.stage_index_to_group_rank == {s: s % stages for s in range(stages * virtual)}
    # torch 2.13's dry run knows compute and send/recv actions only; leave out the
    # FSDP and gradient-reduction bookkeeping its lowering adds
    bookkeeping = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}
    with_comms = {
        rank: [a for a in actions if a.computation_type.value not in bookkeeping]
        for rank, actions in runtime.pipeline_order_with_comms.items()
    }
    ran = torch_schedules._simulate_comms_compute(
        with_comms, lambda s: runtime.stage_index_to_group_rank[s], stages * virtual
    )
    assert torch_compute_order(ran) == as_text(order)
    exported = tmp_path / "theirs.csv"
    runtime._dump_csv(str(exported), format="compute_comms")
    assert load_csv_order(exported) == order


# ---------------------------------------------------------------- bubbles


def replay_schedule(
    order, ranks: int, microbatches: int, flops: dict[str, float], style: str = "loop"
) -> Schedule:
    """Each action one compute op of ``flops[type]``; activations and gradients travel as
    zero-byte sends between neighbouring stages on different ranks (placed in
    ``style``); two stages on one rank hand over through the rank's own order.

    Every (direction, chunk) has its own send and receive stream, so a rank waiting for
    one chunk's input never holds up another chunk's; a transfer's tag names its
    sending stage, micro-batch and direction."""
    stages = 1 + max(a.stage for steps in order.values() for a in compute_actions(steps))
    placement = Placement(ranks, stages // ranks, style)
    phase = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}

    def crosses(stage: int, other: int) -> bool:
        return not placement.same_rank(stage, other)

    def tag(stage: int, mb: int, direction: int) -> int:
        return (stage * microbatches + mb) * 2 + direction

    programs = {}
    for rank, steps in order.items():
        ops: list = []
        for step in steps:
            if type(step) is Overlap:  # one op of F&B, its halves' transfers around it
                _replay_overlap(ops, step, flops, placement, tag, stages)
                continue
            action = step
            stage, mb, chunk = action.stage, action.microbatch, placement.chunk_of(action.stage)
            deps: tuple[int, ...] = ()
            if action.type == "F" and stage > 0 and crosses(stage, stage - 1):
                peer, key = placement.rank_of(stage - 1), tag(stage - 1, mb, 0)
                ops.append(
                    Recv(len(ops), f"pp_recv_fwd.c{chunk}", peer, 0, key, tags={"axis": "pp"})
                )
                deps = (len(ops) - 1,)
            if action.type in ("B", "I") and stage < stages - 1 and crosses(stage, stage + 1):
                peer, key = placement.rank_of(stage + 1), tag(stage + 1, mb, 1)
                ops.append(
                    Recv(len(ops), f"pp_recv_bwd.c{chunk}", peer, 0, key, tags={"axis": "pp"})
                )
                deps = (len(ops) - 1,)
            ops.append(
                Compute(
                    len(ops),
                    "compute",
                    flops[action.type],
                    0,
                    "gemm",
                    str(action),
                    deps,
                    {"phase": phase[action.type], "stage": stage, "microbatch": mb},
                )
            )
            done = (len(ops) - 1,)
            if action.type == "F" and stage < stages - 1 and crosses(stage, stage + 1):
                peer, key = placement.rank_of(stage + 1), tag(stage, mb, 0)
                ops.append(
                    Send(
                        len(ops),
                        f"pp_send_fwd.c{chunk}",
                        peer,
                        0,
                        key,
                        deps=done,
                        tags={"axis": "pp"},
                    )
                )
            if action.type in ("B", "I") and stage > 0 and crosses(stage, stage - 1):
                peer, key = placement.rank_of(stage - 1), tag(stage, mb, 1)
                ops.append(
                    Send(
                        len(ops),
                        f"pp_send_bwd.c{chunk}",
                        peer,
                        0,
                        key,
                        deps=done,
                        tags={"axis": "pp"},
                    )
                )
        programs[rank] = Program(rank, ops)
    return Schedule(programs=programs, groups={})


def _replay_overlap(ops, pair, flops, placement, tag, stages) -> None:
    """An overlapped pair as one compute op of ``flops['F&B']``, after the receives of
    both halves and before their sends."""
    received = []
    forward, backward = pair.forward, pair.backward
    for action, other, direction, stream in (
        (forward, forward.stage - 1, 0, "pp_recv_fwd"),
        (backward, backward.stage + 1, 1, "pp_recv_bwd"),
    ):
        if 0 <= other < stages and not placement.same_rank(action.stage, other):
            key = tag(other, action.microbatch, direction)
            chunk = placement.chunk_of(action.stage)
            peer = placement.rank_of(other)
            ops.append(Recv(len(ops), f"{stream}.c{chunk}", peer, 0, key, tags={"axis": "pp"}))
            received.append(len(ops) - 1)
    ops.append(
        Compute(len(ops), "compute", flops["F&B"], 0, "gemm", str(pair), tuple(received),
                {"phase": "fwd", "stage": forward.stage, "microbatch": forward.microbatch})
    )  # fmt: skip
    done = (len(ops) - 1,)
    for action, other, direction, stream in (
        (forward, forward.stage + 1, 0, "pp_send_fwd"),
        (backward, backward.stage - 1, 1, "pp_send_bwd"),
    ):
        if 0 <= other < stages and not placement.same_rank(action.stage, other):
            key = tag(action.stage, action.microbatch, direction)
            chunk = placement.chunk_of(action.stage)
            peer = placement.rank_of(other)
            ops.append(Send(len(ops), f"{stream}.c{chunk}", peer, 0, key, deps=done,
                            tags={"axis": "pp"}))  # fmt: skip


def run_free(order, ranks: int, microbatches: int, seconds: dict[str, float], style="loop"):
    """Replay with free communication: the step time and each rank's bubble (seconds)."""
    machine = cluster(nodes=1, **FREE_NETWORK)
    flops = {kind: seconds_to_flops(machine, t) for kind, t in seconds.items()}
    schedule = replay_schedule(order, ranks, microbatches, flops, style)
    times = simulate(schedule, machine)
    bubbles = {}
    for rank, program in schedule.programs.items():
        row = account_rank(
            program.ops,
            times.ready[rank],
            times.start[rank],
            times.end[rank],
            times.step_time,
            pipelined=True,
        )
        assert sum(row["breakdown"].values()) == pytest.approx(times.step_time, rel=1e-12)
        bubbles[rank] = row["breakdown"]["bubble"]
    return schedule, times, bubbles


@pytest.mark.parametrize(
    "stages,microbatches,virtual",
    [(2, 2, 2), (2, 8, 3), (4, 4, 2), (4, 8, 1), (4, 8, 2), (4, 16, 4), (8, 8, 2), (8, 32, 3)],
)
def test_interleaved_idle_fraction(stages, microbatches, virtual):
    """Each chunk's forward takes ``f/v`` and its backward ``2f/v``: the idle fraction
    is ``(p−1)/(v·m + p−1)`` on every rank (Narayanan et al., SC'21, section 2.2)."""
    f = 1e-3
    order = interleaved_1f1b_order(stages, microbatches, virtual)
    _, times, bubbles = run_free(
        order, stages, microbatches, {"F": f / virtual, "B": 2 * f / virtual}
    )
    reference = (stages - 1) / (virtual * microbatches + stages - 1)
    step = (virtual * microbatches + stages - 1) * 3 * f / virtual
    assert times.step_time == pytest.approx(step, rel=1e-9)
    for bubble in bubbles.values():
        assert bubble / times.step_time == pytest.approx(reference, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (4, 4), (4, 10), (8, 8), (8, 24)])
@pytest.mark.parametrize(
    "t_f,t_b,t_w",
    [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (3.0, 2.0, 1.5)],
)
def test_zb_h1_bubble(stages, microbatches, t_f, t_b, t_w):
    """ZB-H1 idles ``(p−1)(T_F + T_B − T_W)`` per stage against 1F1B's
    ``(p−1)(T_F + T_B + T_W)`` (Qi et al., ICLR 2024, section 2.1), with ``T_B`` the
    input-backward time, here for ``m ≥ p`` and ``T_W ≤ min(T_F, T_B)``."""
    unit = 1e-3
    seconds = {"F": t_f * unit, "I": t_b * unit, "W": t_w * unit, "B": (t_b + t_w) * unit}
    busy = microbatches * (t_f + t_b + t_w) * unit

    _, times, bubbles = run_free(zb_h1_order(stages, microbatches), stages, microbatches, seconds)
    bubble = (stages - 1) * (t_f + t_b - t_w) * unit
    assert times.step_time == pytest.approx(busy + bubble, rel=1e-9)
    for rank_bubble in bubbles.values():
        assert rank_bubble == pytest.approx(bubble, rel=1e-9, abs=1e-15)

    _, times, bubbles = run_free(
        one_f_one_b_order(stages, microbatches), stages, microbatches, seconds
    )
    bubble = (stages - 1) * (t_f + t_b + t_w) * unit
    assert times.step_time == pytest.approx(busy + bubble, rel=1e-9)
    for rank_bubble in bubbles.values():
        assert rank_bubble == pytest.approx(bubble, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("t_f,t_b,t_w", [(1.0, 1.0, 2.0), (1.0, 2.0, 1.5), (2.0, 1.0, 3.0)])
def test_zb_h1_bubble_with_a_long_weight_pass(t_f, t_b, t_w):
    """Outside the paper's case, a ``W`` longer than ``T_F`` or ``T_B`` no longer fits
    the gaps it fills: the bubble stays at ``(p−1)·max(T_F, T_B)``, as the docstring of
    :func:`zb_h1_order` says."""
    stages, microbatches, unit = 4, 8, 1e-3
    seconds = {"F": t_f * unit, "I": t_b * unit, "W": t_w * unit}
    _, _, bubbles = run_free(zb_h1_order(stages, microbatches), stages, microbatches, seconds)
    for bubble in bubbles.values():
        assert bubble == pytest.approx((stages - 1) * max(t_f, t_b) * unit, rel=1e-9)


@pytest.mark.parametrize("stages,microbatches", [(2, 3), (2, 8), (4, 7), (4, 12), (8, 15), (8, 24)])
def test_zb_h2_has_no_bubble_inside_a_stage(stages, microbatches):
    """ZB-H2 with ``T_F = T_B = T_W = T`` and ``m ≥ 2p−1`` (Qi et al., ICLR 2024,
    section 2.2): stage ``s`` computes without a gap from ``s·T`` to ``s·T + 3mT``;
    the step is a parallelogram whose only idle time is the ``(p−1)·T`` offset."""
    t = 1e-3
    seconds = {"F": t, "I": t, "W": t}
    schedule, times, bubbles = run_free(
        zb_h2_order(stages, microbatches), stages, microbatches, seconds
    )
    assert times.step_time == pytest.approx((3 * microbatches + stages - 1) * t, rel=1e-9)
    for rank, program in schedule.programs.items():
        computes = [op for op in program.ops if isinstance(op, Compute)]
        starts = [times.start[rank][op.id] for op in computes]
        ends = [times.end[rank][op.id] for op in computes]
        assert starts[0] == pytest.approx(rank * t, rel=1e-9, abs=1e-15)
        assert ends[-1] == pytest.approx(rank * t + 3 * microbatches * t, rel=1e-9)
        for previous_end, start in zip(ends, starts[1:], strict=False):
            assert start == pytest.approx(previous_end, rel=1e-9)
        assert bubbles[rank] == pytest.approx((stages - 1) * t, rel=1e-9)


# ---------------------------------------------------------------- ZB-V


@pytest.mark.parametrize(
    "ranks,microbatches",
    [(1, 1), (2, 1), (2, 3), (2, 8), (3, 5), (4, 2), (4, 8), (4, 11), (8, 16), (8, 20)],
)
def test_zbv_matches_torch(torch_schedules, ranks, microbatches):
    """``ScheduleZBVZeroBubble`` builds its order in its constructor from two stages per
    rank placed as a V."""
    schedule = torch_v_schedule(torch_schedules.ScheduleZBVZeroBubble, ranks, microbatches)
    ours = zbv_order(ranks, microbatches)
    assert torch_compute_order(schedule.pipeline_order) == as_text(ours)
    validate_order(ours, 2 * ranks, microbatches, "v")


def torch_v_schedule(schedule_class, ranks: int, microbatches: int):
    """A torch schedule of two stages per rank placed as a V, built for rank 0 (its
    constructor computes every rank's order)."""
    local = [
        SimpleNamespace(**{**vars(stage_stand_in(s, 2 * ranks, ranks)), "group_rank": 0})
        for s in Placement(ranks, 2, "v").stages_of(0)
    ]
    return schedule_class(local, microbatches)


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 24)])
def test_zbv_holds_one_f_one_b_s_first_stage_on_every_rank(ranks, microbatches):
    """ZB-V's peak is ``p`` micro-batches of a rank's layers, 1F1B's first stage's, on
    every rank (Qi et al., ICLR 2024, section 6): ``2p`` activations of half a stage."""
    order = zbv_order(ranks, microbatches)
    assert [in_flight_peak(order[rank]) for rank in range(ranks)] == [2 * ranks] * ranks
    one_f_one_b = one_f_one_b_order(ranks, microbatches)
    assert in_flight_peak(one_f_one_b[0]) == ranks


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (2, 9), (4, 8), (4, 13), (8, 16), (8, 32)])
def test_zbv_bubble(ranks, microbatches):
    """With ``T_F = T_B = T_W = T`` per stage (``T/2`` a chunk) and free communication
    every rank idles ``(p−1)·T/2``, half ZB-H1's ``(p−1)·T`` (Qi et al., ICLR 2024,
    section 6); the turn of the V hands over on its rank without a send."""
    chunk = 1e-3
    seconds = {"F": chunk, "I": chunk, "W": chunk, "B": 2 * chunk}
    order = zbv_order(ranks, microbatches)
    schedule, times, bubbles = run_free(order, ranks, microbatches, seconds, style="v")
    busy = 2 * microbatches * 3 * chunk
    assert times.step_time == pytest.approx(busy + (ranks - 1) * chunk, rel=1e-9)
    for bubble in bubbles.values():
        assert bubble == pytest.approx((ranks - 1) * chunk, rel=1e-9, abs=1e-15)
    # rank p−1 holds both sides of the turn (stages p−1 and p): no send between them
    turn = schedule.programs[ranks - 1].ops
    assert not any(type(op) is Send and op.peer == ranks - 1 for op in turn)


# ---------------------------------------------------------------- DualPipeV


@pytest.mark.parametrize(
    "ranks,microbatches",
    [(1, 2), (2, 4), (2, 7), (3, 6), (3, 9), (4, 8), (4, 11), (8, 16), (8, 21)],
)
def test_dualpipev_matches_torch(torch_schedules, ranks, microbatches):
    """``ScheduleDualPipeV`` builds every rank's order, its overlapped pairs as
    ``(F;B)OVERLAP_F_B``, in its constructor from two stages per rank placed as a V."""
    schedule = torch_v_schedule(torch_schedules.ScheduleDualPipeV, ranks, microbatches)
    ours = dualpipev_order(ranks, microbatches)
    assert torch_compute_order(schedule.pipeline_order) == as_text(ours)
    validate_order(ours, 2 * ranks, microbatches, "v")
    with pytest.raises(ValueError, match="at least as many micro-batches as its"):
        dualpipev_order(ranks, 2 * ranks - 1)


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (2, 9), (4, 8), (4, 13), (8, 16), (8, 32)])
def test_dualpipev_holds_pp_plus_one_chunks(ranks, microbatches):
    """The DualPipe README's activation per device: ``PP + 1`` chunks (its ``PP`` the
    ``2p`` stages), the overlapped forward's before its backward frees its own."""
    order = dualpipev_order(ranks, microbatches)
    assert [in_flight_peak(order[rank]) for rank in range(ranks)] == [2 * ranks + 1] * ranks


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (2, 9), (4, 8), (4, 13), (8, 16), (8, 24)])
@pytest.mark.parametrize(
    "t_f,t_b,t_w,t_fb",
    [(1, 2, 1, 3), (2, 3, 1, 5), (1, 1.5, 0.5, 2.5), (1, 2, 1, 2), (1, 2, 1, 2.5), (2, 3, 1, 4)],
)
def test_dualpipev_bubble(ranks, microbatches, t_f, t_b, t_w, t_fb):
    """With per-chunk times ``F``, ``B`` (full backward), ``W`` (``I = B − W = F``, the
    zero-bubble papers' setting) and an overlapped pair's ``F&B ≤ F + B``, and free
    communication, the most idle rank idles ``(PP/2 − 1)(F&B + B − 3W)`` (the DualPipe
    README's table, ``PP = 2p`` stages); every rank does when the pair gains nothing
    from its overlap (``F&B = F + B``)."""
    assert t_b - t_w == t_f and t_fb <= t_f + t_b
    unit = 1e-3
    seconds = {"F": t_f, "B": t_b, "I": t_b - t_w, "W": t_w, "F&B": t_fb}
    order = dualpipev_order(ranks, microbatches)
    _, times, bubbles = run_free(
        order, ranks, microbatches, {k: v * unit for k, v in seconds.items()}, style="v"
    )
    expected = (ranks - 1) * (t_fb + t_b - 3 * t_w) * unit
    assert max(bubbles.values()) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    if t_fb == t_f + t_b:
        for rank, bubble in bubbles.items():
            assert bubble == pytest.approx(expected, rel=1e-9, abs=1e-12), rank
