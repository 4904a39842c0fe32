"""What the GPU path of the replay relies on, checked without a GPU: exact result checks
for any group size, pipeline transfers issued as matched batches (so NCCL cannot
deadlock), and jobs started by plain ``srun``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hardware.executor import make_buffers  # noqa: E402
from hardware.p2p import issuable, matched_batches  # noqa: E402
from hardware.runtime import SLURM_PORT, adopt_slurm_environment  # noqa: E402
from simulator.request.scenario import load_scenario  # noqa: E402
from simulator.run.simulate import per_rank_schedule  # noqa: E402
from simulator.schedule.ir import Recv, Send  # noqa: E402

from .conftest import SCENARIOS  # noqa: E402


def test_result_checks_are_exact_for_a_group_of_72_ranks():
    """The replay fills rank r's buffer with r + 1 and checks the sum; on a GPU its
    matrices are bf16, but its communication buffers are fp32, so a 72-rank ring sum is
    exact in any order (bf16 would round 2,628 to 2,624)."""
    buffers, element = make_buffers(torch.device("cpu"))
    buffers.dtype = torch.bfloat16  # what a GPU rank uses for its matrices
    acc = buffers.get("ar", "tp", 1024)
    assert acc.dtype == torch.float32 and element == 4
    members = range(72)
    expected = float(sum(m + 1 for m in members))
    for start in (0, 17, 71):  # a ring adds the members' chunks in a rotated order
        acc.zero_()
        for i in range(72):
            acc += float((start + i) % 72 + 1)
        assert bool((acc == expected).all())
    lossy = torch.zeros(1, dtype=torch.bfloat16)
    for m in members:
        lossy += m + 1
    assert float(lossy.item()) != expected  # why the check must not run in bf16


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1"],
        ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1", "parallel.schedule=gpipe"],
        ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1", "parallel.schedule=zb-h1"],
        [
            "cluster.gpus_per_node=4",
            "parallel.tp=1",
            "parallel.pp=4",
            "parallel.dp=1",
            "model.layers=8",
        ],
    ],
)
def test_pipeline_transfers_go_out_as_matched_batches(overrides):
    """Both ranks of every pair cut their transfers with each other into batches that
    hold the same transfers, in the same order; every send and receive is issued once."""
    schedule = per_rank_schedule(load_scenario(SCENARIOS / "cpu-tiny.yaml", overrides))

    def transfers(rank: int, ids: list[int]) -> set[tuple[int, int, int]]:
        ops = schedule.programs[rank].ops
        return {
            (rank, ops[i].peer, ops[i].tag)
            if type(ops[i]) is Send
            else (ops[i].peer, rank, ops[i].tag)
            for i in ids
        }

    paired = 0
    for rank in schedule.programs:
        for peer in schedule.programs:
            if peer <= rank:
                continue
            mine = [
                b
                for b in matched_batches(schedule, rank)
                if schedule.programs[rank].ops[b[0]].peer == peer
            ]
            theirs = [
                b
                for b in matched_batches(schedule, peer)
                if schedule.programs[peer].ops[b[0]].peer == rank
            ]
            assert [transfers(rank, b) for b in mine] == [transfers(peer, b) for b in theirs]
            paired += len(mine)
    assert paired > 0
    for rank, program in schedule.programs.items():
        plan = issuable(schedule, rank)
        issued = sorted(i for ids in plan.values() for i in ids)
        p2p = [op.id for op in program.ops if type(op) in (Send, Recv)]
        assert issued == p2p
        for last, ids in plan.items():
            assert last == max(ids)  # issued when its last op is reached


def test_a_steady_1f1b_stage_sends_and_receives_together():
    schedule = per_rank_schedule(
        load_scenario(
            SCENARIOS / "cpu-tiny.yaml",
            ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1", "training.micro_batch=1"],
        )
    )
    batches = issuable(schedule, 0).values()
    ops = schedule.programs[0].ops
    mixed = [b for b in batches if {type(ops[i]) for i in b} == {Send, Recv}]
    assert mixed, "1F1B's steady state sends a forward while it receives a backward"


def test_plain_srun_tasks_join_as_torchrun_ranks():
    env = {
        "SLURM_PROCID": "11",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "3",
        "SLURM_NTASKS_PER_NODE": "8(x2)",
        "SLURM_NNODES": "2",
        "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
    }
    adopt_slurm_environment(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "11",
        "16",
        "3",
        "8",
    )
    assert env["MASTER_ADDR"] == "10.0.0.7" and env["MASTER_PORT"] == str(SLURM_PORT)
    # under srun torchrun, torchrun's own variables win
    torchrun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "5", "WORLD_SIZE": "16"}
    adopt_slurm_environment(torchrun)
    assert torchrun["RANK"] == "5" and "LOCAL_RANK" not in torchrun
    # no per-node count: the tasks over the nodes
    bare = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2"}
    adopt_slurm_environment(bare)
    assert bare["LOCAL_WORLD_SIZE"] == "4"
