"""Pipeline sends and receives grouped into matched batches, so NCCL cannot deadlock.

NCCL runs the point-to-point calls of one communicator in the order they are issued.
If stage 0 issues its send to stage 1 while stage 1 issues its send to stage 0, each
send waits for a receive the other rank has queued behind its own send: a deadlock.
Megatron-LM avoids it by issuing a stage's send and receive together in one
``batch_isend_irecv`` (an NCCL group call, in which they progress together).

:func:`matched_batches` does that for any schedule. For every pair of ranks it walks
both ranks' transfers with each other in program order and cuts them into batches
that hold the same transfers on both sides (a send of one is a receive of the other,
identified by sender, receiver and tag), as small as possible; so both ranks make the
same sequence of group calls. A batch is issued when the last of its ops is reached
in program order, after the dependencies of all of them; where an op in between
depends on an op of the batch, the batch would wait on itself, and its ops are
issued one by one instead (:func:`issuable`).
"""

from __future__ import annotations

from simulator.schedule.ir import Recv, Schedule, Send

__all__ = ["matched_batches", "issuable"]


def _transfer(rank: int, op: Send | Recv) -> tuple[int, int, int]:
    """(sender, receiver, tag) of a send or receive of ``rank``."""
    return (rank, op.peer, op.tag) if type(op) is Send else (op.peer, rank, op.tag)


def matched_batches(schedule: Schedule, rank: int) -> list[list[int]]:
    """The op ids of ``rank``'s sends and receives, cut into batches that its peers cut
    the same way, in program order of each batch's first op."""
    program = schedule.programs[rank].ops
    peers = sorted({op.peer for op in program if isinstance(op, (Send, Recv))})
    batches: list[list[int]] = []
    for peer in peers:
        mine = [op for op in program if isinstance(op, (Send, Recv)) and op.peer == peer]
        theirs = [
            op
            for op in schedule.programs[peer].ops
            if isinstance(op, (Send, Recv)) and op.peer == rank
        ]
        batches += _cut(rank, mine, peer, theirs)
    return sorted(batches, key=lambda batch: batch[0])


def _cut(rank: int, mine: list, peer: int, theirs: list) -> list[list[int]]:
    batches: list[list[int]] = []
    i = j = 0
    while i < len(mine):
        batch: list[int] = []
        mine_ids: set[tuple[int, int, int]] = set()
        their_ids: set[tuple[int, int, int]] = set()
        while True:
            if i < len(mine) and (not batch or their_ids - mine_ids):
                op = mine[i]
                batch.append(op.id)
                mine_ids.add(_transfer(rank, op))
                i += 1
            elif j < len(theirs) and mine_ids - their_ids:
                their_ids.add(_transfer(peer, theirs[j]))
                j += 1
            else:
                break
            if mine_ids == their_ids:
                break
        batches.append(batch)
    return batches


def issuable(schedule: Schedule, rank: int) -> dict[int, list[int]]:
    """For each op id that issues a batch (its last op in program order), the batch's op
    ids; a batch that an op in between depends on is issued op by op instead."""
    ops = schedule.programs[rank].ops
    plan: dict[int, list[int]] = {}
    for batch in matched_batches(schedule, rank):
        members = set(batch)
        first, last = min(batch), max(batch)
        blocked = any(
            members & set(ops[i].deps) for i in range(first + 1, last + 1) if i not in members
        )
        if blocked or len(batch) == 1:
            for op_id in batch:
                plan[op_id] = [op_id]
        else:
            plan[last] = sorted(batch)
    return plan
