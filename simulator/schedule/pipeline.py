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
* ZB-H1 and ZB-H2: the backward split into ``I`` (gradient for the input) and ``W``
  (gradient for the weights), with the ``W`` passes moved to fill the bubbles (Qi, Wan,
  Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2). ZB-H1 keeps
  1F1B's activation memory and cuts the bubble to ``(p−1)(T_F + T_B − T_W)``; ZB-H2
  holds up to ``2p − 1`` micro-batches on the first stage and has no bubble inside any
  stage when ``T_F = T_B = T_W``.

:func:`load_csv_order` reads torch's CSV schedule format (one row per rank) and
:func:`dump_csv_order` writes it; :func:`validate_order` checks an order is complete and
can run; :func:`in_flight_peak` counts the micro-batches a rank holds activations for.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.common.vocabulary import PIPELINE_SCHEDULES

__all__ = [
    "Action",
    "COMPUTE_TYPES",
    "SCHEDULES",
    "parse_action",
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_1f1b_order",
    "zb_h1_order",
    "zb_h2_order",
    "pipeline_order",
    "load_csv_order",
    "dump_csv_order",
    "validate_order",
    "in_flight_peak",
]

COMPUTE_TYPES = ("F", "B", "I", "W")
SCHEDULES = PIPELINE_SCHEDULES

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


def _check_sizes(stages: int, microbatches: int, virtual: int = 1) -> None:
    for name, value in (("stages", stages), ("microbatches", microbatches), ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} ({value!r}) must be a positive integer")


def gpipe_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """GPipe: every stage runs all forwards, then all backwards."""
    _check_sizes(stages, microbatches)
    return {
        s: [Action(s, "F", i) for i in range(microbatches)]
        + [Action(s, "B", i) for i in range(microbatches)]
        for s in range(stages)
    }


def one_f_one_b_order(stages: int, microbatches: int) -> dict[int, list[Action]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-backward-one-forward, drain."""
    _check_sizes(stages, microbatches)
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
    _check_sizes(stages, microbatches, virtual)
    if microbatches % stages:
        raise ValueError(
            f"interleaved 1F1B needs the micro-batches to be a multiple of the pipeline "
            f"stages: microbatches({microbatches}) % stages({stages}) = "
            f"{microbatches % stages}"
        )
    total = microbatches * virtual
    orders: dict[int, list[Action]] = {}
    for rank in range(stages):
        warmup = min((virtual - 1) * stages + 2 * (stages - 1 - rank), total)

        def action(k: int, kind: str, rank: int = rank) -> Action:
            chunk = (k // stages) % virtual
            if kind == "B":
                chunk = virtual - 1 - chunk
            microbatch = (k // (stages * virtual)) * stages + k % stages
            return Action(chunk * stages + rank, kind, microbatch)

        actions = [action(k, "F") for k in range(warmup)]
        for k in range(total - warmup):
            actions.append(action(warmup + k, "F"))
            actions.append(action(k, "B"))
        actions.extend(action(k, "B") for k in range(total - warmup, total))
        orders[rank] = actions
    return orders


def _zero_bubble_order(stages: int, microbatches: int, factor: int) -> dict[int, list[Action]]:
    """The handcrafted zero-bubble orders: ``factor`` 1 is ZB-H1, 2 is ZB-H2."""
    _check_sizes(stages, microbatches)
    orders: dict[int, list[Action]] = {}
    for s in range(stages):
        warmup = min(factor * (stages - 1 - s), microbatches)
        actions = [Action(s, "F", i) for i in range(warmup)]
        next_weight = 0
        for i in range(microbatches):
            if warmup + i < microbatches:
                actions.append(Action(s, "F", warmup + i))
            actions.append(Action(s, "I", i))
            if i >= factor * s:
                actions.append(Action(s, "W", next_weight))
                next_weight += 1
        actions.extend(Action(s, "W", i) for i in range(next_weight, microbatches))
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


_BUILDERS: dict[str, Callable[[int, int], dict[int, list[Action]]]] = {
    "gpipe": gpipe_order,
    "1f1b": one_f_one_b_order,
    "zb-h1": zb_h1_order,
    "zb-h2": zb_h2_order,
}


def pipeline_order(
    schedule: str, stages: int, microbatches: int, virtual: int = 1
) -> dict[int, list[Action]]:
    """The per-rank compute order of a named schedule (one of :data:`SCHEDULES`).

    ``virtual`` (model chunks per rank) applies to ``interleaved-1f1b`` only. Orders
    are memoised (the builder and the memory estimate ask for the same one), so the
    returned lists are shared: read them, do not change them.
    """
    return _pipeline_order(schedule, stages, microbatches, virtual)


@functools.lru_cache(maxsize=16)
def _pipeline_order(
    schedule: str, stages: int, microbatches: int, virtual: int
) -> dict[int, list[Action]]:
    if schedule == "interleaved-1f1b":
        return interleaved_1f1b_order(stages, microbatches, virtual)
    if schedule not in _BUILDERS:
        raise ValueError(
            f"unknown pipeline schedule {schedule!r} (expected one of {', '.join(SCHEDULES)})"
        )
    if virtual != 1:
        raise ValueError(
            f"virtual stages ({virtual}) need the interleaved-1f1b schedule, not {schedule!r}"
        )
    return _BUILDERS[schedule](stages, microbatches)


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
    return [Action(int(stage), kind, int(microbatch))]


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
    with open(path, newline="") as handle:
        for rank, row in enumerate(csv.reader(handle)):
            actions: list[Action] = []
            for column, cell in enumerate(row):
                try:
                    actions.extend(_read_cell(cell))
                except ValueError as err:
                    raise ValueError(
                        f"{path}: row {rank + 1} (rank {rank}), column {column + 1}: "
                        f"cannot read {cell!r} ({err}; expected e.g. '0F0', '1I2', '0W1')"
                    ) from None
            orders[rank] = actions
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


def validate_order(order: Mapping[int, Sequence[Action]], stages: int, microbatches: int) -> None:
    """Check an order is complete and can run; raise a one-line ValueError otherwise.

    ``stages`` counts the global stages, ``p·v`` for ``p`` ranks of ``v`` model chunks;
    the ranks are the order's keys, which must be ``0..p-1`` with ``p`` dividing
    ``stages``. Every action must sit on rank ``s % p`` for its stage ``s``, and every
    stage must run for each micro-batch one ``F`` and then either one ``B`` or one ``I``
    followed by one ``W``. Finally the ranks are replayed against each other (a forward
    waits for the previous stage's, a backward for the next stage's) to make sure no
    rank waits forever.
    """
    _check_sizes(stages, microbatches)
    ranks = sorted(order)
    if not ranks or ranks != list(range(len(ranks))):
        raise ValueError(f"pipeline order has ranks {ranks}, expected 0..p-1")
    p = len(ranks)
    if stages % p:
        raise ValueError(f"pipeline order has {p} ranks, which do not divide stages({stages})")
    done: dict[tuple[int, int], set[str]] = {}
    for rank in ranks:
        for action in order[rank]:
            where = f"rank {rank}: {action}"
            if action.type not in COMPUTE_TYPES:
                raise ValueError(f"{where} is not a compute action (F, B, I or W)")
            if not 0 <= action.stage < stages or action.stage % p != rank:
                raise ValueError(
                    f"{where}: stage {action.stage} does not live on rank {rank} "
                    f"({p} ranks, {stages} stages, stage s on rank s % {p})"
                )
            if not 0 <= action.microbatch < microbatches:
                raise ValueError(f"{where}: micro-batch out of range 0..{microbatches - 1}")
            seen = done.setdefault((action.stage, action.microbatch), set())
            if action.type in seen:
                raise ValueError(f"{where} appears twice")
            needs = {"F": set(), "B": {"F"}, "I": {"F"}, "W": {"I"}}[action.type]
            missing = needs - seen
            if missing:
                raise ValueError(
                    f"{where} runs before {action.stage}{min(missing)}{action.microbatch}"
                )
            if (action.type == "B" and "I" in seen) or (action.type == "I" and "B" in seen):
                raise ValueError(f"{where}: a micro-batch has either B or I and W, not both")
            seen.add(action.type)
    for stage in range(stages):
        rank = stage % p
        for mb in range(microbatches):
            seen = done.get((stage, mb), set())
            if "F" not in seen:
                raise ValueError(f"rank {rank} never runs {stage}F{mb}")
            if "B" not in seen and "I" not in seen:
                raise ValueError(f"rank {rank} never runs {stage}B{mb} (nor {stage}I{mb})")
            if "I" in seen and "W" not in seen:
                raise ValueError(f"rank {rank} runs {stage}I{mb} but never {stage}W{mb}")
    _check_progress(order, stages)


def _check_progress(order: Mapping[int, Sequence[Action]], total: int) -> None:
    """Replay the ranks in lock-step on their cross-stage dependencies."""
    finished: set[tuple[int, str, int]] = set()
    position = dict.fromkeys(order, 0)

    def needs(action: Action) -> tuple[int, str, int] | None:
        if action.type == "F" and action.stage > 0:
            return (action.stage - 1, "F", action.microbatch)
        if action.type in ("B", "I") and action.stage < total - 1:
            return (action.stage + 1, "I", action.microbatch)
        return None

    def ready(action: Action) -> bool:
        need = needs(action)
        if need is None:
            return True
        if need[1] == "I":
            # the next stage's input gradient comes from its full or its input backward
            return (need[0], "I", need[2]) in finished or (need[0], "B", need[2]) in finished
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
            kind = "F" if need[1] == "F" else "B/I"
            waits.append(f"rank {rank} waits at {action} for {need[0]}{kind}{need[2]}")
        raise ValueError(f"pipeline order can never finish: {'; '.join(waits)}")


def in_flight_peak(actions: Iterable[Action]) -> int:
    """Most micro-batches a rank holds at once: forward run, backward (B or I) not yet.

    Chunks count separately (a micro-batch in flight on two of the rank's stages counts
    twice); the memory model multiplies this by one stage's activations.
    """
    in_flight = peak = 0
    for action in actions:
        if action.type == "F":
            in_flight += 1
            peak = max(peak, in_flight)
        elif action.type in ("B", "I"):
            in_flight -= 1
    return peak
