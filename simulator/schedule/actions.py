"""Lowering pass: a pipeline rank's compute actions, with the sends and receives each
needs, as torch.distributed.pipelining's lowering adds them (``_add_send_recv``).

A forward of any stage but the first receives its input activation first
(``RECV_F``), and a forward of any stage but the last sends its output on
(``SEND_F``); a backward (``B`` or its input half ``I``) of any stage but the last
receives the output gradient first (``RECV_B``), and one of any stage but the first
sends the input gradient back (``SEND_B``). The weight half ``W`` needs neither, and
neither does a hand-over between two stages on one rank (the turn of a V-shaped
placement), which the rank's own order already sequences. The actions print in
torch's notation, so a rank's lowered order reads like its CSV row::

    >>> from simulator.request.placement import Placement
    >>> order = one_f_one_b_order(2, 2)[1]
    >>> [str(a) for a in with_communication(order, Placement(2))]
    ['1RECV_F0', '1F0', '1B0', '1SEND_B0', '1RECV_F1', '1F1', '1B1', '1SEND_B1']
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.request.orders import Action
from simulator.request.placement import Placement

__all__ = ["with_communication"]


def with_communication(order: Sequence[Action], placement: Placement) -> list[Action]:
    """``order`` (one rank's compute actions over ``placement``'s stages) with its
    receives before and sends after the actions that need them."""
    lowered: list[Action] = []
    last = placement.stages - 1

    def crosses(stage: int, other: int) -> bool:
        return not placement.same_rank(stage, other)

    for action in order:
        stage, mb = action.stage, action.microbatch
        if action.type == "F":
            if stage > 0 and crosses(stage, stage - 1):
                lowered.append(Action(stage, "RECV_F", mb))
            lowered.append(action)
            if stage < last and crosses(stage, stage + 1):
                lowered.append(Action(stage, "SEND_F", mb))
        elif action.type in ("B", "I"):
            if stage < last and crosses(stage, stage + 1):
                lowered.append(Action(stage, "RECV_B", mb))
            lowered.append(action)
            if stage > 0 and crosses(stage, stage - 1):
                lowered.append(Action(stage, "SEND_B", mb))
        elif action.type == "W":
            lowered.append(action)
        else:
            raise ValueError(f"unsupported pipeline action {action}")
    return lowered
