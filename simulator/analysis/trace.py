"""The Trace: what happened to every op of one simulated (or measured) step.

A Trace is the common output format of the SimPy engine and of the hardware
executor, so a prediction and a measurement can be overlaid op by op. Each
:class:`OpRecord` holds the op's identity (rank, id, stream, label, tags) and three
instants, all in seconds from the start of the step:

``ready``
    every dependency and the previous op of its stream had finished: the op was
    issued (for a collective, this rank arrived at it);
``start``
    the work began (a collective: the last member arrived; a send/recv: both sides
    were posted; a compute op: same as ``ready``);
``end``
    the op finished.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["OpRecord", "Trace", "category_of"]


@dataclass(slots=True)
class OpRecord:
    """One op as it ran on one rank."""

    rank: int
    op_id: int
    stream: str
    op: str  # "compute" | "collective" | "send" | "recv"
    kind: str  # gemm, attention, elementwise, optimizer, all_reduce, send, ...
    label: str
    tags: dict[str, Any]
    ready: float
    start: float
    end: float
    bytes: float = 0.0
    flops: float = 0.0
    group: str | None = None
    peer: int | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


def category_of(record: OpRecord) -> str:
    """The display category of an op: forward, backward, recompute, optimizer, or
    ``comm:<axis>`` for communication (``comm:tp``, ``comm:dp``, ``comm:pp``...)."""
    if record.op == "compute":
        phase = record.tags.get("phase", "fwd")
        if phase == "fwd":
            return "forward"
        if phase.startswith("bwd"):
            return "backward"
        return phase  # recompute, optimizer
    return f"comm:{record.tags.get('axis', 'other')}"


@dataclass
class Trace:
    """All op records of one step, plus free-form metadata (scenario name, fidelity)."""

    records: list[OpRecord]
    step_time: float
    meta: dict[str, Any] = field(default_factory=dict)
    #: what the charts of this trace worked out from its records, by the list they came
    #: from and how (``timeline.html`` and ``report.html`` fit the same trace to their
    #: own bar budgets, and share the steps those have in common)
    derived: dict[tuple, tuple[list, list]] = field(default_factory=dict, repr=False, compare=False)

    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})

    def to_json(self) -> str:
        payload = {
            "step_time_s": self.step_time,
            "meta": self.meta,
            "records": [asdict(r) for r in self.records],
        }
        return json.dumps(payload, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        payload = json.loads(text)
        return cls(
            records=[OpRecord(**r) for r in payload["records"]],
            step_time=payload["step_time_s"],
            meta=payload.get("meta", {}),
        )
