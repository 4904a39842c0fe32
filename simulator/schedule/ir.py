"""The Schedule IR: per-rank programs of ops on named streams.

A :class:`Schedule` maps every rank to a :class:`Program` and names the process groups
its collectives use. A Program is an ordered list of ops; each op runs on a *stream*
(like a CUDA stream: ops of one stream run in program order) and may also wait for
``deps``, the ids of ops on other streams of the same rank. Op ids are the op's index
in its program.

Four op types exist:

``Compute``
    ``flops``, ``bytes`` (HBM traffic), ``kind`` (gemm, attention, elementwise,
    optimizer) and, for a GEMM, its ``shape`` ``(m, n, k)``.
``Collective``
    ``kind`` (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier)
    on ``group``. ``bytes`` is the buffer size per rank in nccl-tests' sense: the
    all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the
    all-to-all send buffer. ``splits`` (optional) gives an uneven all-to-all's bytes
    per peer. Collectives of one group are matched by their order on that group.
``Send`` / ``Recv``
    ``peer`` rank, ``bytes`` and an integer ``tag``; matched by (src, dst, tag), in
    order when a tag repeats.

``tags`` carry ``layer``, ``microbatch``, ``stage``, ``phase`` and the parallel
``axis`` of a communication; metrics are computed from tags, never from labels.
Schedules round-trip through JSON unchanged (:meth:`Schedule.to_json`,
:meth:`Schedule.from_json`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Compute",
    "Collective",
    "Send",
    "Recv",
    "Op",
    "Program",
    "Schedule",
    "COLLECTIVE_KINDS",
]

COLLECTIVE_KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "barrier",
)


@dataclass(slots=True)
class Compute:
    id: int
    stream: str
    flops: float
    bytes: float
    kind: str
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, int, int] | None = None
    type = "compute"


@dataclass(slots=True)
class Collective:
    id: int
    stream: str
    kind: str
    group: str
    bytes: float
    label: str = ""
    deps: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)
    splits: tuple[float, ...] | None = None
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


@dataclass(slots=True)
class Send(_PointToPoint):
    type = "send"


@dataclass(slots=True)
class Recv(_PointToPoint):
    type = "recv"


Op = Compute | Collective | Send | Recv
_OP_TYPES: dict[str, type] = {
    "compute": Compute,
    "collective": Collective,
    "send": Send,
    "recv": Recv,
}
_TUPLE_FIELDS = ("deps", "shape", "splits")


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

    @property
    def num_ops(self) -> int:
        return sum(len(p.ops) for p in self.programs.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "meta": self.meta,
            "groups": {name: list(members) for name, members in self.groups.items()},
            "programs": {
                str(rank): [dict(asdict(op), type=op.type) for op in program.ops]
                for rank, program in self.programs.items()
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Schedule:
        programs: dict[int, Program] = {}
        for rank_text, ops in payload["programs"].items():
            rank = int(rank_text)
            loaded: list[Op] = []
            for raw in ops:
                fields = dict(raw)
                op_type = _OP_TYPES[fields.pop("type")]
                for name in _TUPLE_FIELDS:
                    if fields.get(name) is not None:
                        fields[name] = tuple(fields[name])
                loaded.append(op_type(**fields))
            programs[rank] = Program(rank, loaded)
        groups = {name: tuple(members) for name, members in payload["groups"].items()}
        return cls(programs=programs, groups=groups, meta=payload.get("meta", {}))

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(json.loads(text))
