"""Pipeline orders as plain per-stage action lists, in torch.distributed.pipelining's
compact notation.

An :class:`Action` is ``{stage}{type}{microbatch}``: ``0F0`` is stage 0's forward of
micro-batch 0, ``1B3`` stage 1's full backward of micro-batch 3. The types are those
of ``torch.distributed.pipelining.schedules._ComputationType``: ``F`` forward, ``B``
full backward, ``I`` backward for inputs, ``W`` backward for weights, and the
communication actions ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``. The orders here
hold compute actions only; the schedule builder adds the sends and receives a stage
needs around each compute action.

* GPipe: all forwards, then all backwards (Huang et al., 2019).
* 1F1B: stage ``s`` of ``p`` runs ``min(p − s, m)`` forwards, then alternates one
  backward and one forward, then drains the remaining backwards (Narayanan et al.,
  PipeDream-Flush, 2021; Megatron-LM's non-interleaved schedule). This is the order
  ``torch.distributed.pipelining.Schedule1F1B`` runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Action", "parse_action", "gpipe_order", "one_f_one_b_order", "pipeline_order"]

_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


@dataclass(frozen=True, slots=True)
class Action:
    """One pipeline action: ``stage``, ``type`` (F, B, I, W, SEND_F...) and ``microbatch``."""

    stage: int
    type: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.type}{self.microbatch}"

    __repr__ = __str__


def parse_action(text: str) -> Action:
    """Read ``'1B3'`` back into ``Action(1, 'B', 3)``."""
    match = _ACTION_RE.match(text.strip())
    if not match:
        raise ValueError(f"cannot read pipeline action {text!r} (expected e.g. '0F0', '1B3')")
    return Action(int(match.group(1)), match.group(2), int(match.group(3)))


def gpipe_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """GPipe: every stage runs all forwards, then all backwards."""
    return {
        s: [Action(s, "F", i) for i in range(microbatches)]
        + [Action(s, "B", i) for i in range(microbatches)]
        for s in range(stages)
    }


def one_f_one_b_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-backward-one-forward, drain."""
    orders: dict[int, list[Action]] = {}
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        actions = [Action(s, "F", i) for i in range(warmup)]
        next_forward, next_backward = warmup, 0
        while next_backward < microbatches:
            actions.append(Action(s, "B", next_backward))
            next_backward += 1
            if next_forward < microbatches:
                actions.append(Action(s, "F", next_forward))
                next_forward += 1
        orders[s] = actions
    return orders


def pipeline_order(schedule: str, stages: int, microbatches: int) -> dict[int, list[Action]]:
    """The per-stage compute order of a named schedule (``gpipe`` or ``1f1b``)."""
    if schedule == "gpipe":
        return gpipe_order(stages, microbatches)
    if schedule == "1f1b":
        return one_f_one_b_order(stages, microbatches)
    raise ValueError(f"unknown pipeline schedule {schedule!r}")
