"""The bodies of blocks, written once and shared: a pipeline action's (:class:`ActionBody`)
and a layer's backward in a stage's last backward (:class:`LayerBody`), and a body as
the step's ranks share it with the rank that lowered it (:class:`SharedBody`).
:mod:`simulator.schedule.layers` writes them; :class:`~simulator.schedule.context.StepConfig`
keeps the shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ActionBody", "LayerBody", "SharedBody"]

B = TypeVar("B")


@dataclass(frozen=True, slots=True)
class ActionBody:
    """A pipeline action's ops written once as a block's body: its ``ops``, their
    compute ``flops`` and ``bytes``, the ``microbatch`` it was written for, and the
    weight gradients it leaves for a later ``W`` action (``deferred``: an ``I``
    action's)."""

    ops: tuple
    flops: float
    bytes: float
    microbatch: int
    deferred: tuple = ()


@dataclass(frozen=True, slots=True)
class LayerBody:
    """A layer's backward in a stage's last backward, written once as a block's body
    (:meth:`RankLowering._layer_block`): its ``ops``, their compute ``flops`` and
    ``bytes``, its ``last`` compute op, the gradients it completes (``ready``: parameters,
    the body op that completes them, expert?), the weight gradients it defers, and
    ``exits``, the body ops the next op waits for."""

    ops: tuple
    flops: float
    bytes: float
    last: int
    ready: tuple[tuple[int, int, bool], ...]
    deferred: tuple
    exits: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SharedBody(Generic[B]):
    """A body lowered once for every rank of the step that runs the same ops: the body
    (None: a block would not keep the times) and the rank that lowered it, whose
    process groups the others retarget (``StepConfig.shared_bodies``, ``layer_bodies``)."""

    body: B | None
    rank: int
