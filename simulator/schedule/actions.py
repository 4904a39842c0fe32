"""Lowering pass: a pipeline rank's compute actions, with the sends and receives each
needs, as torch.distributed.pipelining's lowering adds them (``_add_send_recv``).

A forward of any stage but the first receives its input activation first
(``RECV_F``), and a forward of any stage but the last sends its output on
(``SEND_F``); a backward (``B`` or its input half ``I``) of any stage but the last
receives the output gradient first (``RECV_B``), and one of any stage but the first
sends the input gradient back (``SEND_B``). The weight half ``W`` needs neither, and
neither does a hand-over between two stages on one rank (the turn of a V-shaped
placement), which the rank's own order already sequences. An overlapped pair
(:class:`~simulator.request.orders.Overlap`) receives what both its halves need before
it and sends what both give after it. The actions print in
torch's notation, so a rank's lowered order reads like its CSV row::

    >>> from simulator.request.placement import Placement
    >>> order = one_f_one_b_order(2, 2)[1]
    >>> [str(a) for a in with_communication(order, Placement(2))]
    ['1RECV_F0', '1F0', '1B0', '1SEND_B0', '1RECV_F1', '1F1', '1B1', '1SEND_B1']
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.common.vocabulary import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
)
from simulator.request.orders import Action, Overlap, Step
from simulator.request.placement import Placement

__all__ = ["with_communication"]


def with_communication(order: Sequence[Step], placement: Placement) -> list[Step]:
    """``order`` (one rank's compute actions over ``placement``'s stages) with its
    receives before and sends after the actions that need them."""
    lowered: list[Step] = []
    last = placement.stages - 1
    same_rank = placement.same_rank
    append = lowered.append
    backwards = (FULL_BACKWARD, BACKWARD_INPUT)

    def receive(action: Action) -> None:
        stage, kind = action.stage, action.type
        if kind == FORWARD:
            if stage > 0 and not same_rank(stage, stage - 1):
                append(Action(stage, RECV_F, action.microbatch))
        elif kind in backwards:
            if stage < last and not same_rank(stage, stage + 1):
                append(Action(stage, RECV_B, action.microbatch))
        elif kind != BACKWARD_WEIGHT:
            raise ValueError(f"unsupported pipeline action {action}")

    def send(action: Action) -> None:
        stage, kind = action.stage, action.type
        if kind == FORWARD:
            if stage < last and not same_rank(stage, stage + 1):
                append(Action(stage, SEND_F, action.microbatch))
        elif kind in backwards and stage > 0 and not same_rank(stage, stage - 1):
            append(Action(stage, SEND_B, action.microbatch))

    for step in order:
        if type(step) is Overlap:
            receive(step.forward)
            receive(step.backward)
            append(step)
            send(step.forward)
            send(step.backward)
        else:
            receive(step)
            append(step)
            send(step)
    return lowered
