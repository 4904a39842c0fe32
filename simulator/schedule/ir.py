"""The Schedule IR: per-rank programs of ops on named streams.

A :class:`Schedule` maps every rank to a :class:`Program` and names the process groups
its collectives use. A Program is an ordered list of ops; each op runs on a *stream*
(like a CUDA stream: ops of one stream run in program order) and may also wait for
``deps``, the ids of ops on other streams of the same rank. Op ids are the op's index
in its program.

Five op types exist:

``Compute``
    ``flops``, ``bytes`` (HBM traffic), ``kind`` (gemm, attention, elementwise,
    optimizer) and, for a GEMM, its ``shape`` ``(m, n, k)`` (``batch`` of them for a
    batched GEMM); for the attention kernel ``(s_q, s_kv, head_dim)`` over ``batch``
    sequences × heads.
``Collective``
    ``kind`` (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier)
    on ``group``. ``bytes`` is the buffer size per rank in nccl-tests' sense: the
    all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the
    all-to-all send buffer. ``splits`` (optional) gives an uneven all-to-all's bytes
    per peer, and ``matrix`` every member's, which the simulators read instead: in a
    folded step the members that are not simulated send theirs too, and where an EP
    group's ranks run copies of one program their calls keep its rank's splits.
    Collectives of one group are matched by their order on that group.
``Send`` / ``Recv``
    ``peer`` rank, ``bytes`` and an integer ``tag``; matched by (src, dst, tag), in
    order when a tag repeats.
``Block``
    one pipeline action (a forward or backward of one stage and micro-batch) whose
    inner ops only wait for each other: its ``body`` is that action's ops, with ids
    local to the body, on the compute and ``tp`` streams. The block starts when its
    deps allow and lasts its body's makespan, which is exact whenever the body's
    collectives need no partner that is simulated separately (a folded TP group in
    analytic fidelity). Bodies are shared between the actions that run the same ops,
    so a step's millions of ops become a block per action over a few bodies per stage.

Points
    An op waits for the end of each of its ``deps``; where it waits for an op inside a
    block's body instead (the gradient of one layer, in a stage's last backward written
    in blocks of layers: ``RankLowering._layer_block``), its ``points`` say which:
    aligned with ``deps``, ``points[i]`` is the body op's id in block ``deps[i]``, or
    -1 for the dep's own end. Empty (most ops): every dep's own end.

``tags`` carry ``layer``, ``microbatch``, ``stage``, ``phase`` and the parallel
``axis`` of a communication; metrics are computed from tags, never from labels.
Schedules round-trip through JSON unchanged (:meth:`Schedule.to_json`,
:meth:`Schedule.from_json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simulator.common.vocabulary import COLLECTIVE_KINDS, CollectiveKind, ComputeKind

if TYPE_CHECKING:
    from simulator.request.layout import Layout

__all__ = [
    "Compute",
    "Collective",
    "Send",
    "Recv",
    "Block",
    "Op",
    "Program",
    "Schedule",
    "COLLECTIVE_KINDS",
    "retarget",
    "retargeter",
]


@dataclass(slots=True)
class Compute:
    id: int
    stream: str
    flops: float
    bytes: float
    kind: ComputeKind
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, int, int] | None = None
    batch: int = 1  # a batched GEMM's count, or the attention kernel's batch × heads
    # ids of the collectives of this program (or block body) that run beside it by
    # construction (overlapped TP/SP collectives): their NCCL kernels take some SMs
    beside_comm: tuple[int, ...] = ()
    # ops the host issued in this op's pipeline action before it, counted from the
    # action's first compute op: the host issues one op per host_overhead
    host_index: int = 0
    fp8: bool = False  # a GEMM on the GPU's FP8 tensor cores
    points: tuple[int, ...] = ()  # see "Points" in the module docstring
    # kernels the op launches (an eager chain of elementwise kernels): each pays the
    # GPU's launch overhead and the host's dispatch
    kernels: int = 1
    type = "compute"


@dataclass(slots=True)
class Collective:
    id: int
    stream: str
    kind: CollectiveKind
    group: str
    bytes: float
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    splits: tuple[float, ...] | None = None
    points: tuple[int, ...] = ()
    # an uneven all-to-all of a folded group, or of ranks running copies of one program:
    # every member's bytes to every member, rows by source in the group's member order
    # (a numpy array, shared by the calls that move the same bytes)
    matrix: Any = None
    type = "collective"


@dataclass(slots=True)
class _PointToPoint:
    id: int
    stream: str
    peer: int
    bytes: float
    tag: int
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    points: tuple[int, ...] = ()


@dataclass(slots=True)
class Send(_PointToPoint):
    type = "send"


@dataclass(slots=True)
class Recv(_PointToPoint):
    type = "recv"


@dataclass(slots=True)
class Block:
    id: int
    stream: str
    body: tuple[Compute | Collective, ...]
    flops: float
    bytes: float
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    # the micro-batch the body's labels and tags name (a body serves every micro-batch)
    body_microbatch: int = 0
    points: tuple[int, ...] = ()
    kind = "block"
    type = "block"


Op = Compute | Collective | Send | Recv | Block


def retarget(op: Op, rank: int, layout: Layout, source: Layout | None = None) -> Op:
    """``op`` as ``rank`` runs it, written for a rank in the same place on its own
    groups: the same compute (shared, not copied), collectives on ``rank``'s groups of
    the same axes, sends and receives to ``rank``'s neighbours in the same stages.
    ``source``: the layout ``op`` was written on, when not ``layout`` (the same grid,
    placed otherwise). An op that would not change is returned itself."""
    return retargeter(rank, layout, source)(op)


def retargeter(rank: int, layout: Layout, source: Layout | None = None) -> Callable[[Op], Op]:
    """:func:`retarget` to ``rank``, for many ops: each group's and peer's new name is
    worked out once (a body or a program names a few groups many times)."""
    groups: dict[str, str] = {}
    peers: dict[int, int] = {}
    origin = source or layout

    def move(op: Op) -> Op:
        kind = type(op)
        if kind is Compute:
            return op
        if kind is Collective:
            coll = cast(Collective, op)
            group = groups.get(coll.group)
            if group is None:
                group = groups[coll.group] = layout.group_name(
                    layout.axis_of_group(coll.group), rank
                )
            if group == coll.group:
                return op
            return Collective(
                coll.id,
                coll.stream,
                coll.kind,
                group,
                coll.bytes,
                coll.label,
                coll.deps,
                coll.tags,
                coll.splits,
                coll.points,
                coll.matrix,
            )
        if kind is Block:
            raise TypeError("a block is retargeted through its body")
        p2p = cast("Send | Recv", op)
        peer = peers.get(p2p.peer)
        if peer is None:
            peer = peers[p2p.peer] = layout.stage_rank(rank, origin.coords(p2p.peer)["pp"])
        if peer == p2p.peer:
            return op
        # dataclasses.replace, spelled out: several times faster
        return cast("type[Send | Recv]", kind)(
            p2p.id, p2p.stream, peer, p2p.bytes, p2p.tag, p2p.label, p2p.deps, p2p.tags, p2p.points
        )

    return move


_OP_TYPES: dict[str, type] = {
    "compute": Compute,
    "collective": Collective,
    "send": Send,
    "recv": Recv,
    "block": Block,
}
_TUPLE_FIELDS = ("deps", "shape", "splits", "beside_comm", "points")


@dataclass
class Program:
    """The ops of one rank, in program order (``ops[i].id == i``)."""

    rank: int
    ops: list[Op] = field(default_factory=list)

    def streams(self) -> list[str]:
        seen: dict[str, None] = {}
        for op in self.ops:
            seen.setdefault(op.stream, None)
        return list(seen)


@dataclass
class Schedule:
    """``{rank: Program}`` plus the process groups (name → member ranks)."""

    programs: dict[int, Program]
    groups: dict[str, tuple[int, ...]]
    meta: dict[str, Any] = field(default_factory=dict)

    # folded schedules: every folded group -> the members of each group it stands for
    # (itself included), and every simulated rank -> the ranks it stands for, aligned so
    # that the i-th image of a rank talks to the i-th image of its peers
    images: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    rank_images: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # a search's schedule (``build_step``'s ``share_bodies``): id(block body) -> (that
    # body, the body it was retargeted from), the same ops on another stage's groups;
    # a hint to time it once when the groups cost the same (not serialised)
    body_templates: dict[int, tuple[tuple, tuple]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def num_ops(self) -> int:
        """IR ops, a block counting as one."""
        return sum(len(p.ops) for p in self.programs.values())

    @property
    def expanded_ops(self) -> int:
        """Ops with every block's body counted op by op."""
        return sum(
            len(op.body) if type(op) is Block else 1
            for program in self.programs.values()
            for op in program.ops
        )

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "version": 1,
            "meta": self.meta,
            "groups": {name: list(members) for name, members in self.groups.items()},
            "programs": {
                str(rank): [_op_dict(op) for op in program.ops]
                for rank, program in self.programs.items()
            },
        }
        if self.images:
            payload["images"] = {n: [list(m) for m in g] for n, g in self.images.items()}
            payload["rank_images"] = {str(r): list(i) for r, i in self.rank_images.items()}
        return payload

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Schedule:
        programs = {
            int(rank): Program(int(rank), [_op_from_dict(raw) for raw in ops])
            for rank, ops in payload["programs"].items()
        }
        groups = {name: tuple(members) for name, members in payload["groups"].items()}
        images = {
            name: tuple(tuple(m) for m in members)
            for name, members in payload.get("images", {}).items()
        }
        rank_images = {int(r): tuple(i) for r, i in payload.get("rank_images", {}).items()}
        return cls(programs, groups, payload.get("meta", {}), images, rank_images)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(json.loads(text))


def _op_dict(op: Op) -> dict[str, Any]:
    if type(op) is Block:
        fields = {name: getattr(op, name) for name in Block.__slots__ if name != "body"}
        raw = dict(fields, body=[_op_dict(inner) for inner in op.body], type=op.type)
    else:
        raw = dict(asdict(op), type=op.type)
        if raw.get("matrix") is not None:
            raw["matrix"] = raw["matrix"].tolist()
        elif "matrix" in raw:
            del raw["matrix"]
    if not raw["points"]:  # most ops wait for their deps' own ends: said by omission
        del raw["points"]
    return raw


def _op_from_dict(raw: dict[str, Any]) -> Op:
    fields = dict(raw)
    op_type = _OP_TYPES[fields.pop("type")]
    for name in _TUPLE_FIELDS:
        if fields.get(name) is not None:
            fields[name] = tuple(fields[name])
    if op_type is Block:
        fields["body"] = tuple(_op_from_dict(inner) for inner in fields["body"])
    elif op_type is Compute:
        fields["kind"] = ComputeKind(fields["kind"])
    elif op_type is Collective:
        fields["kind"] = CollectiveKind(fields["kind"])
        if fields.get("matrix") is not None:
            fields["matrix"] = np.array(fields["matrix"], dtype=float)
    return op_type(**fields)
