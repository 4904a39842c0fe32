"""Writing one rank's program of the Schedule IR, op by op.

The lowering passes append ops through a :class:`ProgramWriter`: it numbers them,
shares one tag dict among the ops with the same tags (a program has millions of ops
and a few thousand tag sets), and counts the ops the host issued since the current
pipeline action's first compute op (``host_index``, which the engine uses to hold an
op until the host has issued it).

A :class:`Writing` is where a rank's lowering writes now, shared by the layer lowering
and the gradient pass: the writer of the program (or of the block body being written),
its latest compute op, the ops the next compute op waits for, the all-gathers in
flight, the stage of the action and where completed gradients go. A block's body is
written with :meth:`Writing.body`, which hands out a fresh writer and restores the
program's afterwards.

Once a layer's ops are written as a block (``RankLowering._layer_block`` in
:mod:`simulator.schedule.layers`), a dep may name an op inside it: ``(block id, body
op id)``. The writer turns such deps into the op's ``deps`` and ``points``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from simulator.arithmetic.layer_ops import OpCost
from simulator.common.vocabulary import GEMM, CollectiveKind
from simulator.schedule.ir import Block, Collective, Compute, Op, Recv, Send

__all__ = ["ProgramWriter", "Writing"]


class ProgramWriter:
    """Appends ops to one rank's program: ids in order, one shared tag dict per tag set,
    and the count of ops the host issued in the current pipeline action."""

    def __init__(self, rank: int):
        self.rank = rank
        self.ops: list[Op] = []
        self._tags: dict[tuple, dict[str, Any]] = {}
        self.issued = 0  # ops issued since the action's first compute op
        self.action_open = True  # the next compute op is its action's first
        self.refs = False  # whether a dep may name an op inside a block (a layer's)

    _TAG_KEYS = ("stage", "layer", "microbatch", "phase", "axis")

    @staticmethod
    def _points(deps: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``deps`` that may name ops inside blocks, as an op's ``deps`` and ``points``."""
        if not any(type(dep) is tuple for dep in deps):
            return deps, ()
        ids = tuple(dep[0] if type(dep) is tuple else dep for dep in deps)
        return ids, tuple(dep[1] if type(dep) is tuple else -1 for dep in deps)

    def tags(self, **values: Any) -> dict[str, Any]:
        """One shared dict per distinct tag set (ops of a program share their tags)."""
        assert values.keys() <= set(self._TAG_KEYS), values.keys()
        get = values.get
        return self.tag_set(
            get("axis"), get("layer"), get("microbatch"), get("phase"), get("stage")
        )

    def tag_set(self, axis, layer, microbatch, phase, stage) -> dict[str, Any]:
        """:meth:`tags` with every tag given (None: not set)."""
        key = (axis, layer, microbatch, phase, stage)
        cached = self._tags.get(key)
        if cached is None:
            cached = self._tags[key] = {}  # keys in sorted order
            if axis is not None:
                cached["axis"] = axis
            if layer is not None:
                cached["layer"] = layer
            if microbatch is not None:
                cached["microbatch"] = microbatch
            if phase is not None:
                cached["phase"] = phase
            if stage is not None:
                cached["stage"] = stage
        return cached

    def compute(
        self,
        cost: OpCost,
        label: str,
        deps: tuple,
        tags: dict[str, Any],
        beside_comm: tuple[int, ...] = (),
        stream: str = "compute",
    ) -> int:
        """A compute op on ``stream``. On the compute stream it may open its pipeline
        action (its host index then counts from it); on another stream (FSDP2's copy-in
        streams) the host issues it as it reaches it, never as an action's first op."""
        op_id = len(self.ops)
        side = stream != "compute"
        if self.action_open and not side:
            self.issued, self.action_open = 0, False
        points: tuple[int, ...] = ()
        if self.refs:
            deps, points = self._points(deps)
        self.ops.append(
            Compute(
                op_id,
                stream,
                cost.flops,
                cost.bytes,
                cost.kind,
                label,
                deps,
                tags,
                cost.shape,
                cost.batch,
                beside_comm,
                max(1, self.issued) if side else self.issued,
                cost.fp8,
                points,
                cost.kernels,
            )
        )
        self.issued += cost.kernels
        return op_id

    def collective(
        self,
        kind: CollectiveKind,
        group: str,
        size: float,
        stream: str,
        label: str,
        deps: tuple,
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        points: tuple[int, ...] = ()
        if self.refs:
            deps, points = self._points(deps)
        self.ops.append(
            Collective(op_id, stream, kind, group, size, label, deps, tags, None, points)
        )
        self.issued += 1
        return op_id

    def block(
        self,
        body: tuple[Compute | Collective, ...],
        flops: float,
        nbytes: float,
        label: str,
        deps: tuple,
        body_microbatch: int,
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        points: tuple[int, ...] = ()
        if self.refs:
            deps, points = self._points(deps)
        self.ops.append(
            Block(op_id, "compute", body, flops, nbytes, label, deps, tags, body_microbatch, points)
        )
        return op_id

    def p2p(
        self,
        op_type: type[Send] | type[Recv],
        stream: str,
        peer: int,
        size: float,
        tag: int,
        label: str,
        deps: tuple,
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        points: tuple[int, ...] = ()
        if self.refs:
            deps, points = self._points(deps)
        self.ops.append(op_type(op_id, stream, peer, size, tag, label, deps, tags, points))
        self.issued += 1
        return op_id

    def inline(
        self, ops: tuple[Op, ...], deps: tuple, exits: tuple[int, ...]
    ) -> tuple[int, tuple[int, ...]]:
        """Append ``ops`` (ids local to them, as a block's body) to the program as one
        action: renumbered, each op without deps waiting for ``deps``, their tags the
        program's and their host indices counted as this writer counts them. Returns the
        id of the last compute op and ``exits`` (ops of ``ops``) as program ids."""
        offset = len(self.ops)
        last = -1
        for op in ops:
            moved = [dep + offset for dep in op.deps] if op.deps else list(deps)
            tags = self.tags(**op.tags) if op.tags else op.tags
            changes: dict[str, Any] = {"id": op.id + offset, "deps": tuple(moved), "tags": tags}
            if type(op) is Compute:
                side = op.stream != "compute"
                if self.action_open and not side:
                    self.issued, self.action_open = 0, False
                changes["host_index"] = max(1, self.issued) if side else self.issued
                if op.beside_comm:
                    changes["beside_comm"] = tuple(i + offset for i in op.beside_comm)
                self.issued += op.kernels
                last = op.id + offset
            else:
                self.issued += 1
            self.ops.append(replace(op, **changes))
        return last, tuple(exit + offset for exit in exits)


class Writing:
    """Where one rank's lowering writes now (see the module docstring): ``w`` the writer,
    ``last`` the latest compute op (or ``(block, op)`` inside a layer's block),
    ``waits`` the ops on other streams the next compute op waits for, ``gathers`` the
    all-gathers in flight that the next GEMM runs beside, ``stage`` the stage of the
    action being written, ``sink`` what receives the gradients a layer completes while a
    body is written (None: the gradient pass, which holds this state: it is not held
    back, so the two make no reference cycle)."""

    __slots__ = ("rank", "w", "last", "waits", "gathers", "stage", "sink")

    def __init__(self, rank: int):
        self.rank = rank
        self.w = ProgramWriter(rank)
        self.last: Any = 0
        self.waits: list[Any] = []
        self.gathers: list[int] = []
        self.stage = 0
        self.sink: Any = None

    @contextmanager
    def strand(self, stage: int) -> Iterator[ProgramWriter]:
        """Write one half of an overlapped pair into a fresh writer: its own stage, no
        last op, nothing to wait for and no all-gather in flight; then come back to the
        program as it was (the strand's ``last`` and ``waits`` are read inside)."""
        outer = self.w, self.last, self.waits, self.gathers, self.stage
        self.w, self.last, self.waits, self.gathers = ProgramWriter(self.rank), 0, [], []
        self.stage = stage
        try:
            yield self.w
        finally:
            self.w, self.last, self.waits, self.gathers, self.stage = outer

    @contextmanager
    def body(self, sink: Any = None) -> Iterator[ProgramWriter]:
        """Write into a fresh writer (a block's body, with no last op and nothing to
        wait for; ``sink``: where its completed gradients go instead), then come back to
        the program as it was."""
        outer = self.w, self.last, self.waits, self.sink
        self.w, self.last, self.waits = ProgramWriter(self.rank), 0, []
        if sink is not None:
            self.sink = sink
        try:
            yield self.w
        finally:
            self.w, self.last, self.waits, self.sink = outer

    def run(self, cost: OpCost, label: str, beside_comm: tuple[int, ...] = (), **tags: Any) -> int:
        """A compute op after the last one; ``beside_comm``: the collectives of this rank
        in flight beside it by construction (their NCCL kernels share the SMs).

        In-flight all-gathers (:attr:`gathers`) run beside the next GEMM, which works on
        the chunks already gathered, and the op after it waits for them; any other op
        waits for them first."""
        overlapped = False
        if self.gathers:
            if cost.kind == GEMM and cost.batch == 1:
                overlapped = True
                beside_comm = (*beside_comm, *self.gathers)
            else:
                self.waits.extend(self.gathers)
                self.gathers = []
        deps, self.waits = tuple(self.waits), []
        get = tags.get
        tagset = self.w.tag_set(None, get("layer"), get("microbatch"), get("phase"), self.stage)
        self.last = self.w.compute(cost, label, deps, tagset, beside_comm)
        if overlapped:
            self.waits.extend(self.gathers)
            self.gathers = []
        return self.last

    def after_last(self) -> tuple[int, ...]:
        """Deps of an op that must follow everything the compute stream has done."""
        return (*([self.last] if self.w.ops else []), *self.waits)

    def wait_for(self, op: int | None) -> None:
        """Make the next compute op wait for ``op`` (None: nothing)."""
        if op is not None:
            self.waits.append(op)
