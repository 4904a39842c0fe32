"""Pipeline orders as the user can state them: per-rank lists of actions in
torch.distributed.pipelining's compact notation, read from and written to its CSV
format, and checked.

An :class:`Action` is ``{stage}{type}{microbatch}``: ``0F0`` is stage 0's forward of
micro-batch 0, ``1B3`` stage 1's full backward of micro-batch 3. The types are those
of ``torch.distributed.pipelining.schedules._ComputationType``: ``F`` forward, ``B``
full backward, ``I`` backward for inputs, ``W`` backward for weights, and the
communication actions ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``. An order is
``{rank: [Action, ...]}`` keyed by pipeline rank ``0..p-1``; ``Action.stage`` is the
global stage (rank ``r`` holds stages ``r, r+p, …``).

:func:`load_csv_order` reads torch's CSV schedule format (one row per rank) and
:func:`dump_csv_order` writes it; :func:`validate_order` checks an order is complete and
can run; :func:`in_flight_peak` counts the micro-batches a rank holds activations for.
The built-in schedules that generate orders are in :mod:`simulator.schedule.pipeline`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, final

from simulator.common.vocabulary import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    OVERLAP_F_B,
    ActionType,
)
from simulator.request.placement import Placement
from topologies.files import read_config_text

__all__ = [
    "Action",
    "COMPUTE_TYPES",
    "parse_action",
    "check_sizes",
    "load_csv_order",
    "dump_csv_order",
    "validate_order",
    "in_flight_peak",
    "Overlap",
    "Step",
    "compute_actions",
]


def check_sizes(stages: int, microbatches: int, virtual: int = 1) -> None:
    for name, value in (("stages", stages), ("microbatches", microbatches), ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} ({value!r}) must be a positive integer")


COMPUTE_TYPES = (FORWARD, FULL_BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)


_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


# A cell of torch's CSV format: compute and communication actions, and the FSDP and
# gradient-reduction bookkeeping actions, which carry no micro-batch.
_CELL_RE = re.compile(
    r"^(\d+)(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d*)$"
)


_OVERLAP_RE = re.compile(r"^\((.*)\)OVERLAP_F_B$")


@dataclass(frozen=True, slots=True)
class Action:
    """One pipeline action: ``stage``, ``type`` (F, B, I, W, SEND_F...) and ``microbatch``."""

    stage: int
    type: ActionType
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.type}{self.microbatch}"

    __repr__ = __str__


@final  # so that ``type(step) is not Overlap`` narrows a Step to an Action
@dataclass(frozen=True, slots=True)
class Overlap:
    """A forward and a full backward of other micro-batches (and stages) run as one
    action, each one's communication hidden behind the other's compute: torch's
    ``OVERLAP_F_B`` (DualPipeV), printed as torch prints it, ``(0F2;1B0)OVERLAP_F_B``."""

    forward: Action
    backward: Action
    type: ClassVar[ActionType] = OVERLAP_F_B

    @property
    def parts(self) -> tuple[Action, Action]:
        return (self.forward, self.backward)

    def __str__(self) -> str:
        return f"({self.forward};{self.backward}){self.type}"

    __repr__ = __str__


#: One step of a rank's order: an action, or two overlapped.
Step = Action | Overlap


def compute_actions(order: Iterable[Step]) -> Iterator[Action]:
    """A rank's actions one by one, an overlapped pair as its forward, then its backward
    (in this order a rank stores the forward's activations while the backward's are
    still held: the pair's memory peak)."""
    for step in order:
        if type(step) is Overlap:
            yield step.forward
            yield step.backward
        else:
            yield step


def parse_action(text: str) -> Action:
    """Read ``'1B3'`` back into ``Action(1, 'B', 3)``."""
    match = _ACTION_RE.match(text.strip())
    if not match:
        raise ValueError(f"cannot read pipeline action {text!r} (expected e.g. '0F0', '1B3')")
    return Action(int(match.group(1)), ActionType(match.group(2)), int(match.group(3)))


def _read_cell(cell: str) -> list[Action]:
    """The compute actions of one CSV cell; communication and FSDP actions give none."""
    text = cell.strip()
    if not text:
        return []
    overlap = _OVERLAP_RE.match(text)
    if overlap:
        return [a for part in overlap.group(1).split(";") for a in _read_cell(part)]
    match = _CELL_RE.match(text)
    if not match:
        raise ValueError("not a pipeline action")
    stage, kind, microbatch = match.groups()
    if kind not in COMPUTE_TYPES:
        return []
    if not microbatch:
        raise ValueError(f"a {kind} action needs a micro-batch")
    return [Action(int(stage), ActionType(kind), int(microbatch))]


def load_csv_order(path: str | Path) -> dict[int, list[Action]]:
    """Read a schedule in ``torch.distributed.pipelining``'s CSV format.

    Row ``r`` (0-based) is rank ``r``'s actions in order, one per cell, as
    ``_PipelineScheduleRuntime._dump_csv`` writes them and ``_load_csv`` reads them.
    Empty cells (idle steps) are skipped, and so are communication (``SEND_F``,
    ``RECV_B``...) and FSDP/gradient-reduction actions (``UNSHARD``, ``RESHARD``,
    ``REDUCE_GRAD``): the schedule builder adds its own. An ``OVERLAP_F_B`` cell gives its
    sub-actions in order. Check the result with :func:`validate_order`.
    """
    orders: dict[int, list[Action]] = {}
    text = read_config_text(path)
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:
        raise ValueError(f"{path}: not a CSV file") from None
    for rank, row in enumerate(rows):
        actions: list[Action] = []
        for column, cell in enumerate(row):
            try:
                actions.extend(_read_cell(cell))
            except ValueError as err:
                raise ValueError(
                    f"{path}: row {rank + 1} (rank {rank}), column {column + 1}: cannot read "
                    f"the cell ({err}; expected e.g. '0F0', '1I2', '0W1')"
                ) from None
        orders[rank] = actions
    if not any(orders.values()):
        raise ValueError(f"{path}: no actions (one row of actions per pipeline rank expected)")
    return orders


def dump_csv_order(order: Mapping[int, Sequence[Action]], path: str | Path) -> None:
    """Write an order in ``torch.distributed.pipelining``'s CSV format, one row per rank."""
    ranks = sorted(order)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"pipeline order ranks {ranks} are not 0..{len(ranks) - 1}")
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        for rank in ranks:
            writer.writerow([str(action) for action in order[rank]])


def validate_order(
    order: Mapping[int, Sequence[Step]], stages: int, microbatches: int, style: str = "loop"
) -> None:
    """Check an order is complete and can run; raise a one-line ValueError otherwise.

    ``stages`` counts the global stages, ``p·v`` for ``p`` ranks of ``v`` model chunks;
    the ranks are the order's keys, which must be ``0..p-1`` with ``p`` dividing
    ``stages``. Every action must sit on the rank that holds its stage (placement
    ``style``: ``loop``, stage ``s`` on rank ``s % p``, or ``v``), and every
    stage must run for each micro-batch one ``F`` and then either one ``B`` or one ``I``
    followed by one ``W``. Finally the ranks are replayed against each other (a forward
    waits for the previous stage's, a backward for the next stage's) to make sure no
    rank waits forever. An overlapped pair (:class:`Overlap`) counts as its forward, then
    its backward.
    """
    check_sizes(stages, microbatches)
    actions_of = {rank: list(compute_actions(steps)) for rank, steps in order.items()}
    ranks = sorted(actions_of)
    if not ranks or ranks != list(range(len(ranks))):
        raise ValueError(f"pipeline order has ranks {ranks}, expected 0..p-1")
    p = len(ranks)
    if stages % p:
        raise ValueError(f"pipeline order has {p} ranks, which do not divide stages({stages})")
    placement = Placement(p, stages // p, style)
    done: dict[tuple[int, int], set[str]] = {}
    for rank in ranks:
        for action in actions_of[rank]:
            where = f"rank {rank}: {action}"
            if action.type not in COMPUTE_TYPES:
                raise ValueError(f"{where} is not a compute action (F, B, I or W)")
            if not 0 <= action.stage < stages or placement.rank_of(action.stage) != rank:
                raise ValueError(
                    f"{where}: stage {action.stage} does not live on rank {rank} "
                    f"({p} ranks, {stages} stages, placed {style})"
                )
            if not 0 <= action.microbatch < microbatches:
                raise ValueError(f"{where}: micro-batch out of range 0..{microbatches - 1}")
            seen = done.setdefault((action.stage, action.microbatch), set())
            if action.type in seen:
                raise ValueError(f"{where} appears twice")
            needs = {
                FORWARD: set(),
                FULL_BACKWARD: {FORWARD},
                BACKWARD_INPUT: {FORWARD},
                BACKWARD_WEIGHT: {BACKWARD_INPUT},
            }[action.type]
            missing = needs - seen
            if missing:
                raise ValueError(
                    f"{where} runs before {action.stage}{min(missing)}{action.microbatch}"
                )
            if (action.type == FULL_BACKWARD and BACKWARD_INPUT in seen) or (
                action.type == BACKWARD_INPUT and FULL_BACKWARD in seen
            ):
                raise ValueError(f"{where}: a micro-batch has either B or I and W, not both")
            seen.add(action.type)
    for stage in range(stages):
        rank = placement.rank_of(stage)
        for mb in range(microbatches):
            seen = done.get((stage, mb), set())
            if FORWARD not in seen:
                raise ValueError(f"rank {rank} never runs {stage}F{mb}")
            if FULL_BACKWARD not in seen and BACKWARD_INPUT not in seen:
                raise ValueError(f"rank {rank} never runs {stage}B{mb} (nor {stage}I{mb})")
            if BACKWARD_INPUT in seen and BACKWARD_WEIGHT not in seen:
                raise ValueError(f"rank {rank} runs {stage}I{mb} but never {stage}W{mb}")
    _check_progress(actions_of, stages)


def _check_progress(order: Mapping[int, Sequence[Action]], total: int) -> None:
    """Replay the ranks in lock-step on their cross-stage dependencies."""
    finished: set[tuple[int, str, int]] = set()
    position = dict.fromkeys(order, 0)

    def needs(action: Action) -> tuple[int, str, int] | None:
        if action.type == FORWARD and action.stage > 0:
            return (action.stage - 1, FORWARD, action.microbatch)
        if action.type in (FULL_BACKWARD, BACKWARD_INPUT) and action.stage < total - 1:
            return (action.stage + 1, BACKWARD_INPUT, action.microbatch)
        return None

    def ready(action: Action) -> bool:
        need = needs(action)
        if need is None:
            return True
        if need[1] == BACKWARD_INPUT:
            # the next stage's input gradient comes from its full or its input backward
            return (need[0], BACKWARD_INPUT, need[2]) in finished or (
                need[0],
                FULL_BACKWARD,
                need[2],
            ) in finished
        return need in finished

    progressed = True
    while progressed:
        progressed = False
        for rank, actions in order.items():
            while position[rank] < len(actions) and ready(actions[position[rank]]):
                action = actions[position[rank]]
                finished.add((action.stage, action.type, action.microbatch))
                position[rank] += 1
                progressed = True
    stuck = [rank for rank, actions in order.items() if position[rank] < len(actions)]
    if stuck:
        waits = []
        for rank in stuck:
            action = order[rank][position[rank]]
            need = needs(action)
            assert need is not None
            kind = FORWARD if need[1] == FORWARD else "B/I"
            waits.append(f"pipeline rank {rank} waits at {action} for {need[0]}{kind}{need[2]}")
        raise ValueError(f"pipeline order can never finish: {'; '.join(waits)}")


def in_flight_peak(actions: Iterable[Step]) -> int:
    """Most micro-batches a rank holds at once: forward run, backward (B or I) not yet.

    Chunks count separately (a micro-batch in flight on two of the rank's stages counts
    twice); the memory model multiplies this by one stage's activations.
    """
    in_flight = peak = 0
    for action in compute_actions(actions):
        if action.type == FORWARD:
            in_flight += 1
            peak = max(peak, in_flight)
        elif action.type in (FULL_BACKWARD, BACKWARD_INPUT):
            in_flight -= 1
    return peak
