"""The names parasim's replays give their ranges in a profiler trace, so that a trace
says which of the schedule's ops each range ran, whoever reads it.

``parasim replay --profile`` wraps each compute op in a ``record_function`` range named
:func:`compute_label` (the op's kind, FLOPs, bytes, GEMM or attention shape, batch and
FP8: what decides its time in the model, the key of a profile's ``gpu.op_table``), and
marks each communication call where the rank issued it (:func:`call_label`: the call's
kind, its group and members, its bytes; where it ran is the backend's own record, a
gloo worker's range or an NCCL kernel). Numbers are written as ``repr`` writes them, so
they read back to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CallLabel",
    "ComputeLabel",
    "call_label",
    "compute_label",
    "read_call",
    "read_compute",
]

_COMPUTE = "parasim.compute"
_CALL = "parasim.call"
_SEPARATOR = "|"


@dataclass(frozen=True, slots=True)
class ComputeLabel:
    """A compute op's key: kind, FLOPs, bytes, shape, batch, FP8."""

    kind: str
    flops: float
    bytes: float
    shape: tuple[int, int, int] | None
    batch: int
    fp8: bool

    @property
    def key(self) -> tuple:
        return (self.kind, self.flops, self.bytes, self.shape, self.batch, self.fp8)


@dataclass(frozen=True, slots=True)
class CallLabel:
    """A communication call: the rank's op id, its kind (``p2p`` for a send or a
    receive), the group it runs on (a send's ``src>dst:tag``), the group's members and
    its bytes."""

    op: int
    kind: str
    group: str
    members: tuple[int, ...]
    bytes: float


def compute_label(
    kind: str, flops: float, size: float, shape: tuple[int, int, int] | None, batch: int, fp8: bool
) -> str:
    shown = "-" if shape is None else "x".join(str(int(d)) for d in shape)
    fields = (
        _COMPUTE,
        kind,
        repr(float(flops)),
        repr(float(size)),
        shown,
        str(batch),
        str(int(fp8)),
    )
    return _SEPARATOR.join(fields)


def read_compute(name: str) -> ComputeLabel | None:
    """The op a :func:`compute_label` names (None for any other name)."""
    if not name.startswith(_COMPUTE + _SEPARATOR):
        return None
    try:
        _, kind, flops, size, shape, batch, fp8 = name.split(_SEPARATOR)
        dims = None if shape == "-" else tuple(int(d) for d in shape.split("x"))
        if dims is not None and len(dims) != 3:
            return None
        return ComputeLabel(kind, float(flops), float(size), dims, int(batch), fp8 == "1")
    except ValueError:
        return None


def call_label(op: int, kind: str, group: str, members: tuple[int, ...], size: float) -> str:
    fields = (_CALL, str(op), kind, group, ",".join(map(str, members)), repr(float(size)))
    return _SEPARATOR.join(fields)


def read_call(name: str) -> CallLabel | None:
    """The call a :func:`call_label` names (None for any other name)."""
    if not name.startswith(_CALL + _SEPARATOR):
        return None
    try:
        _, op, kind, group, members, size = name.split(_SEPARATOR)
        ranks = tuple(int(m) for m in members.split(","))
        return CallLabel(int(op), kind, group, ranks, float(size))
    except ValueError:
        return None
