"""Pipeline orders as plain per-rank action lists, in torch.distributed.pipelining's
compact notation.

An :class:`Action` is ``{stage}{type}{microbatch}``: ``0F0`` is stage 0's forward of
micro-batch 0, ``1B3`` stage 1's full backward of micro-batch 3. The types are those
of ``torch.distributed.pipelining.schedules._ComputationType``: ``F`` forward, ``B``
full backward, ``I`` backward for inputs, ``W`` backward for weights, and the
communication actions ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``. The orders here
hold compute actions only; the schedule builder adds the sends and receives a stage
needs around each compute action.

An order is ``{rank: [Action, ...]}`` keyed by pipeline rank ``0..p-1``. ``Action.stage``
is the global stage index. With ``v`` virtual stages per rank (interleaving) there are
``p·v`` stages and rank ``r`` holds stages ``r, r+p, r+2p, ...``: stage ``s`` lives on rank
``s % p`` as model chunk ``s // p``, as ``torch.distributed.pipelining`` places them.
Without interleaving rank and stage coincide.

* GPipe: all forwards, then all backwards (Huang et al., 2019).
* 1F1B: stage ``s`` of ``p`` runs ``min(p − s, m)`` forwards, then alternates one
  backward and one forward, then drains the remaining backwards (Narayanan et al.,
  PipeDream-Flush, 2021; Megatron-LM's non-interleaved schedule). This is the order
  ``torch.distributed.pipelining.Schedule1F1B`` runs.
* Interleaved 1F1B: each rank holds ``v`` model chunks and walks them depth-first in
  rounds of ``p`` micro-batches (Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21). The order is the one
  ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` builds. Idle fraction with
  equal stages and free communication: ``(p−1)/(v·m + p−1)``.
* ZB-V: two chunks per rank placed as a V, with ZB-H1's split backward (below).
* ZB-H1 and ZB-H2: the backward split into ``I`` (gradient for the input) and ``W``
  (gradient for the weights), with the ``W`` passes moved to fill the bubbles (Qi, Wan,
  Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2). ZB-H1 keeps
  1F1B's activation memory and cuts the bubble to ``(p−1)(T_F + T_B − T_W)``; ZB-H2
  holds up to ``2p − 1`` micro-batches on the first stage and has no bubble inside any
  stage when ``T_F = T_B = T_W``.

Actions, the CSV format of custom orders and their checks are in
:mod:`simulator.request.orders`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from simulator.common.vocabulary import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    CHUNKS_PER_RANK,
    FORWARD,
    FULL_BACKWARD,
    PIPELINE_SCHEDULES,
    ActionType,
)
from simulator.request.orders import Action, Overlap, Step, check_sizes
from simulator.request.placement import Placement

__all__ = [
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_1f1b_order",
    "zb_h1_order",
    "zb_h2_order",
    "zbv_order",
    "dualpipev_order",
    "pipeline_order",
]


def gpipe_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """GPipe: every stage runs all forwards, then all backwards."""
    check_sizes(stages, microbatches)
    return {
        s: [Action(s, FORWARD, i) for i in range(microbatches)]
        + [Action(s, FULL_BACKWARD, i) for i in range(microbatches)]
        for s in range(stages)
    }


def one_f_one_b_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-backward-one-forward, drain."""
    check_sizes(stages, microbatches)
    orders: dict[int, list[Action]] = {}
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        actions = [Action(s, FORWARD, i) for i in range(warmup)]
        next_forward, next_backward = warmup, 0
        while next_backward < microbatches:
            actions.append(Action(s, FULL_BACKWARD, next_backward))
            next_backward += 1
            if next_forward < microbatches:
                actions.append(Action(s, FORWARD, next_forward))
                next_forward += 1
        orders[s] = actions
    return orders


def interleaved_1f1b_order(stages: int, microbatches: int, virtual: int) -> dict[int, list[Action]]:
    """Interleaved 1F1B with ``virtual`` model chunks per rank (Narayanan et al., SC'21).

    ``stages`` is the number of pipeline ranks ``p``; the order has ``p·virtual`` global
    stages, stage ``s`` on rank ``s % p``. Rank ``r`` runs ``(v−1)·p + 2(p−1−r)`` warm-up
    forwards (at most ``v·m``), then alternates one forward and one backward, then drains.
    Its ``k``-th forward belongs to chunk ``(k // p) % v`` and its ``k``-th backward to chunk
    ``v−1 − (k // p) % v``, so micro-batches move through the chunks in rounds of ``p``
    (depth first). This is ``torch.distributed.pipelining.ScheduleInterleaved1F1B``'s
    order. Like Megatron-LM, the micro-batches must be a multiple of the ranks. Where
    ``m = p`` Megatron-LM runs all ``v·m`` forwards first; this order keeps the warm-up
    formula, as torch does, with the same step time. ``virtual = 1`` gives torch's order
    for one chunk: 1F1B's bubble with ``2(p−1−r)`` warm-up forwards instead of ``p−1−r``.
    """
    check_sizes(stages, microbatches, virtual)
    if microbatches % stages:
        raise ValueError(
            f"interleaved 1F1B needs the micro-batches to be a multiple of the pipeline "
            f"stages: microbatches({microbatches}) % stages({stages}) = "
            f"{microbatches % stages}"
        )
    total = microbatches * virtual
    placement = Placement(stages, virtual)
    orders: dict[int, list[Action]] = {}
    for rank in range(stages):
        warmup = min((virtual - 1) * stages + 2 * (stages - 1 - rank), total)

        def action(k: int, kind: ActionType, rank: int = rank) -> Action:
            chunk = (k // stages) % virtual
            if kind == FULL_BACKWARD:
                chunk = virtual - 1 - chunk
            microbatch = (k // (stages * virtual)) * stages + k % stages
            return Action(placement.stage_of(rank, chunk), kind, microbatch)

        actions = [action(k, FORWARD) for k in range(warmup)]
        for k in range(total - warmup):
            actions.append(action(warmup + k, FORWARD))
            actions.append(action(k, FULL_BACKWARD))
        actions.extend(action(k, FULL_BACKWARD) for k in range(total - warmup, total))
        orders[rank] = actions
    return orders


def _zero_bubble_order(stages: int, microbatches: int, factor: int) -> dict[int, list[Action]]:
    """The handcrafted zero-bubble orders: ``factor`` 1 is ZB-H1, 2 is ZB-H2."""
    check_sizes(stages, microbatches)
    orders: dict[int, list[Action]] = {}
    for s in range(stages):
        warmup = min(factor * (stages - 1 - s), microbatches)
        actions = [Action(s, FORWARD, i) for i in range(warmup)]
        next_weight = 0
        for i in range(microbatches):
            if warmup + i < microbatches:
                actions.append(Action(s, FORWARD, warmup + i))
            actions.append(Action(s, BACKWARD_INPUT, i))
            if i >= factor * s:
                actions.append(Action(s, BACKWARD_WEIGHT, next_weight))
                next_weight += 1
        actions.extend(Action(s, BACKWARD_WEIGHT, i) for i in range(next_weight, microbatches))
        orders[s] = actions
    return orders


def zb_h1_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.1).

    Stage ``s`` runs 1F1B's ``p−1−s`` warm-up forwards, then per micro-batch ``i`` the
    next forward, ``I`` of ``i`` and, from ``i = s`` on, the oldest pending ``W``; the
    ``s`` remaining ``W`` passes close the order. With ``m ≥ p`` every stage so holds
    ``p`` micro-batches whose ``W`` has not run, and stage ``s`` at most ``p − s`` whose
    ``I`` has not run, as in 1F1B. The ``I`` passes climb the pipeline without waiting
    for ``W`` and the delayed ``W`` passes fill the drain, so with free communication
    every stage idles ``(p−1)(T_F + T_B − T_W)`` against 1F1B's ``(p−1)(T_F + T_B + T_W)``
    (``T_B`` the ``I`` time), for ``m ≥ p`` and ``T_W ≤ min(T_F, T_B)`` (the paper draws
    it with ``T_F = T_B = T_W``). A longer ``W`` no longer fits the gaps it fills: the
    replayed idle time is then ``(p−1)·max(T_F, T_B)``. The order is
    ``torch.distributed.pipelining.ScheduleInterleavedZeroBubble`` with one stage per
    rank (torch's ZB1P).
    """
    return _zero_bubble_order(stages, microbatches, 1)


def zb_h2_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.2).

    As ZB-H1 with twice the warm-up: stage ``s`` runs ``2(p−1−s)`` warm-up forwards (the
    first stage holds up to ``2p−1`` micro-batches) and starts its ``W`` passes from
    micro-batch ``2s`` on, so the last stages run their ``W`` passes at the tail and the
    step takes the shape of a parallelogram. With ``T_F = T_B = T_W = T``, free
    communication and ``m ≥ 2p−1`` no stage idles between its first and its last pass:
    stage ``s`` is busy from ``s·T`` to ``s·T + 3mT``. The only idle time left is the
    ``(p−1)·T`` start-up offset, which the paper removes across steps by replacing the
    optimizer's synchronisation with a post-update validation.
    """
    return _zero_bubble_order(stages, microbatches, 2)


def zbv_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """ZB-V (Qi, Wan, Huang, Lin, "Pipeline Parallelism with Controllable Memory",
    NeurIPS 2024; "Zero Bubble Pipeline Parallelism", ICLR 2024, section 6): two model
    chunks per rank placed as a V (:mod:`simulator.request.placement`), so rank ``r``
    holds stages ``r`` and ``2p−1−r`` and the first and last stage share rank 0; the
    backward split into ``I`` and ``W`` as in ZB-H1.

    ``stages`` is the number of pipeline ranks ``p``. Rank ``r`` runs ``2(p−r)−1``
    forwards of chunk 0, then ``r`` pairs of forwards (chunk 1, chunk 0), then ``p−r``
    rounds of chunk 1's ``F, I, W``; in the steady state one ``F, I, W`` of chunk 0 and
    one of chunk 1; then drains ``I`` of both chunks and the pending ``W`` passes. With
    ``m ≥ 2p`` every rank holds at most ``2p`` chunk activations, ``p`` micro-batches'
    worth of its layers: 1F1B's first stage's peak, on every rank. With ``T_F = T_B =
    T_W = T`` per stage (``T/2`` per chunk) and free communication every rank idles
    ``(p−1)·T/2``, against ZB-H1's ``(p−1)·T`` and 1F1B's ``3(p−1)·T``. This is the
    order ``torch.distributed.pipelining.ScheduleZBVZeroBubble`` builds (its idle slots
    dropped): like torch, it plans ``max(2p−1, m)`` micro-batches and keeps those below
    ``m``.
    """
    check_sizes(stages, microbatches)
    placement = Placement(stages, 2, "v")
    planned = max(2 * stages - 1, microbatches)
    return {
        rank: [
            action
            for action in _ZbvRank(stages, rank, *placement.stages_of(rank)).plan(planned)
            if action.microbatch < microbatches
        ]
        for rank in range(stages)
    }


class _ZbvRank:
    """One rank's ZB-V order as torch builds it, counting each chunk's passes."""

    def __init__(self, ranks: int, rank: int, first: int, second: int):
        self.ranks, self.rank, self.first, self.second = ranks, rank, first, second
        self.count = {
            (first, FORWARD): 0,
            (second, FORWARD): 0,
            (first, BACKWARD_INPUT): 0,
            (second, BACKWARD_INPUT): 0,
        }
        self.weights = {first: 0, second: 0}
        self.actions: list[Action] = []

    def run(self, stage: int, kind: ActionType) -> None:
        key = (stage, kind)
        self.actions.append(Action(stage, kind, self.count[key]))
        self.count[key] += 1

    def weigh(self, stage: int) -> None:
        self.actions.append(Action(stage, BACKWARD_WEIGHT, self.weights[stage]))
        self.weights[stage] += 1

    def plan(self, planned: int) -> list[Action]:
        p, r, first, second, count = self.ranks, self.rank, self.first, self.second, self.count
        for _ in range(2 * (p - r) - 1):
            self.run(first, FORWARD)
        for _ in range(r):
            self.run(second, FORWARD)
            self.run(first, FORWARD)
        for _ in range(p - r):
            self.run(second, FORWARD)
            self.run(second, BACKWARD_INPUT)
            self.weigh(second)
        while (
            count[(second, FORWARD)] < count[(first, FORWARD)] or count[(first, FORWARD)] < planned
        ):
            if count[(first, FORWARD)] < planned:
                self.run(first, FORWARD)
            self.run(first, BACKWARD_INPUT)
            self.weigh(first)
            self.run(second, FORWARD)
            self.run(second, BACKWARD_INPUT)
            self.weigh(second)
        for _ in range(r):
            self.run(first, BACKWARD_INPUT)
            self.run(second, BACKWARD_INPUT)
        for _ in range(p - r):
            self.run(first, BACKWARD_INPUT)
            self.weigh(first)
        for stage in (second, first):
            while self.weights[stage] < count[(stage, BACKWARD_INPUT)]:
                self.weigh(stage)
        return self.actions


def dualpipev_order(stages: int, microbatches: int) -> dict[int, list[Step]]:
    """DualPipeV (DeepSeek's DualPipe cut in half, Sea AI Lab's "cut-in-half"; the
    DualPipe repository, ``dualpipe/dualpipev.py``): two model chunks per rank placed as
    a V, and in the steady state each rank runs a forward of one chunk overlapped with
    the full backward of the other (:class:`~simulator.request.orders.Overlap`), so that
    one micro-batch's communication (an MoE layer's all-to-alls) runs behind the other's
    compute.

    ``stages`` is the number of pipeline ranks ``p``; ``microbatches`` must be at least
    the ``2p`` stages. Rank ``r`` runs ``2(p−r−1)`` forwards of chunk 0, ``r+1`` pairs of
    forwards (chunk 0, chunk 1), ``p−r−1`` rounds of chunk 1's ``I``, a pending ``W``
    and a forward; then ``m−2p+r+1`` rounds of two overlapped pairs (chunk 0's forward
    with chunk 1's backward, chunk 1's forward with chunk 0's backward; the last rank
    does not overlap its first), ``p−r−1`` rounds of chunk 1's backward and an
    overlapped pair, ``r+1`` backwards of both chunks (the second half split into
    ``I`` and ``W``), ``p−r−1`` rounds of a ``W`` and chunk 0's backward, and the
    ``W`` passes left. With per-chunk times ``F``, ``B`` (full backward), ``W`` and an
    overlapped pair's ``F&B``, every rank idles ``(p−1)(F&B + B − 3W)`` (the DualPipe
    README's table, with its PP the ``2p`` stages) and holds at most ``2p+1`` chunk
    activations. This is the order ``torch.distributed.pipelining.ScheduleDualPipeV``
    builds.
    """
    check_sizes(stages, microbatches)
    if microbatches < 2 * stages:
        raise ValueError(
            f"DualPipeV needs at least as many micro-batches as its {2 * stages} stages "
            f"(got {microbatches})"
        )
    placement = Placement(stages, 2, "v")
    return {
        rank: _DualPipeVRank(stages, rank, *placement.stages_of(rank)).plan(microbatches)
        for rank in range(stages)
    }


class _DualPipeVRank:
    """One rank's DualPipeV order as torch builds it, counting each chunk's passes."""

    def __init__(self, ranks: int, rank: int, first: int, second: int):
        self.ranks, self.rank, self.first, self.second = ranks, rank, first, second
        self.forwards = {first: 0, second: 0}
        self.backwards = {first: 0, second: 0}  # B and I share one count, as in torch
        self.pending: list[Action] = []  # W passes owed, oldest first
        self.steps: list[Step] = []

    def _forward(self, stage: int) -> Action:
        action = Action(stage, FORWARD, self.forwards[stage])
        self.forwards[stage] += 1
        return action

    def _backward(self, stage: int, kind: ActionType) -> Action:
        action = Action(stage, kind, self.backwards[stage])
        self.backwards[stage] += 1
        if kind == BACKWARD_INPUT:
            self.pending.append(Action(stage, BACKWARD_WEIGHT, action.microbatch))
        return action

    def run(self, stage: int, kind: ActionType) -> None:
        self.steps.append(self._forward(stage) if kind == FORWARD else self._backward(stage, kind))

    def overlap(self, forward: int, backward: int) -> None:
        self.steps.append(Overlap(self._forward(forward), self._backward(backward, FULL_BACKWARD)))

    def weigh(self) -> None:
        if self.pending:
            self.steps.append(self.pending.pop(0))

    def plan(self, microbatches: int) -> list[Step]:
        p, r, first, second = self.ranks, self.rank, self.first, self.second
        for _ in range(2 * (p - r - 1)):
            self.run(first, FORWARD)
        for _ in range(r + 1):
            self.run(first, FORWARD)
            self.run(second, FORWARD)
        for _ in range(p - r - 1):
            self.run(second, BACKWARD_INPUT)
            self.weigh()
            self.run(second, FORWARD)
        for i in range(microbatches - 2 * p + r + 1):
            if i == 0 and r == p - 1:  # not overlapped: a shorter bubble
                self.run(first, FORWARD)
                self.run(second, FULL_BACKWARD)
            else:
                self.overlap(first, second)
            self.overlap(second, first)
        for _ in range(p - r - 1):
            self.run(second, FULL_BACKWARD)
            self.overlap(second, first)
        split = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            self.run(second, BACKWARD_INPUT if split else FULL_BACKWARD)
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            self.run(first, BACKWARD_INPUT if split else FULL_BACKWARD)
        for _ in range(p - r - 1):
            self.weigh()
            self.run(first, BACKWARD_INPUT if split else FULL_BACKWARD)
        for _ in range(r + 1):
            self.weigh()
        return self.steps


_BUILDERS: dict[str, Callable[[int, int], Mapping[int, Sequence[Step]]]] = {
    "gpipe": gpipe_order,
    "1f1b": one_f_one_b_order,
    "zb-h1": zb_h1_order,
    "zb-h2": zb_h2_order,
    "zbv": zbv_order,
    "dualpipev": dualpipev_order,
}


def pipeline_order(
    schedule: str, stages: int, microbatches: int, virtual: int = 1
) -> Mapping[int, Sequence[Step]]:
    """The per-rank compute order of a named schedule (one of :data:`PIPELINE_SCHEDULES`).

    ``virtual`` (model chunks per rank) applies to ``interleaved-1f1b`` only. Orders
    are memoised (the builder and the memory estimate ask for the same one), so the
    returned lists are shared: read them, do not change them.
    """
    return _pipeline_order(schedule, stages, microbatches, virtual)


@functools.lru_cache(maxsize=16)
def _pipeline_order(
    schedule: str, stages: int, microbatches: int, virtual: int
) -> Mapping[int, Sequence[Step]]:
    if schedule == "interleaved-1f1b":
        return interleaved_1f1b_order(stages, microbatches, virtual)
    if schedule not in _BUILDERS:
        raise ValueError(
            f"unknown pipeline schedule {schedule!r} "
            f"(expected one of {', '.join(PIPELINE_SCHEDULES)})"
        )
    chunks = CHUNKS_PER_RANK.get(schedule, 1)
    if virtual != chunks and chunks == 1:
        raise ValueError(
            f"virtual stages ({virtual}) need the interleaved-1f1b schedule, not {schedule!r}"
        )
    if virtual != chunks:
        raise ValueError(
            f"schedule {schedule!r} places {chunks} model chunks per rank, not "
            f"virtual stages ({virtual})"
        )
    return _BUILDERS[schedule](stages, microbatches)
