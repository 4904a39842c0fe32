"""Reading PyTorch profiler traces: the Chrome-trace JSON that ``torch.profiler`` writes
(``export_chrome_trace``, ``tensorboard_trace_handler``), one file per rank, plain or
gzipped.

A trace is a JSON object whose ``traceEvents`` list holds complete events (``"ph":
"X"``) with a category (``cat``): ``kernel`` (a GPU kernel, ``pid`` its device and
``tid`` its stream), ``gpu_memcpy``/``gpu_memset``, ``cpu_op`` (an ATen op or a c10d
call on a host thread; with ``record_shapes``, ``args`` holds ``Input Dims`` and
``Input type``), ``user_annotation`` (a ``record_function`` range, also what gloo's
worker threads record as ``gloo:all_reduce``...), ``gpu_user_annotation`` (the same
range on a GPU stream) and ``cuda_runtime`` (the launch calls). A kernel names the CPU
op that launched it by ``args["External id"]``. ``distributedInfo`` gives the rank and
the backend, ``deviceProperties`` the GPUs.

Times are microseconds in the file and seconds here. Every problem with a file is one
:class:`TraceError` line naming it: a file that is not JSON, not an object with a
``traceEvents`` list, larger than :data:`MAX_TRACE_BYTES` once decompressed, or whose
events carry times that are not finite numbers (such events are skipped and counted).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.common.errors import ParasimError

__all__ = [
    "MAX_TRACE_BYTES",
    "REPLAY_FOLDER",
    "Event",
    "RankTrace",
    "TraceError",
    "find_traces",
    "looks_like_trace",
    "read_trace",
    "read_traces",
]

#: The largest trace read, decompressed: a few profiled steps of an 8-GPU job write tens
#: of megabytes; a file past this is refused rather than read into memory.
MAX_TRACE_BYTES = 2 * 1024**3
#: The categories kept (the others, python functions and flows, are not read).
KEPT = frozenset(
    {
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "cpu_op",
        "user_annotation",
        "gpu_user_annotation",
        "cuda_runtime",
        "cuda_driver",
    }
)
_SUFFIXES = (".json", ".json.gz")
#: The folder of a ``parasim replay --profile`` run's traces (one per rank).
REPLAY_FOLDER = "kineto"


class TraceError(ParasimError):
    """A trace file parasim cannot read."""


@dataclass(frozen=True, slots=True)
class Event:
    """One complete event: its name, category, start and duration (seconds), host
    process or GPU (``pid``), thread or stream (``tid``) and arguments."""

    name: str
    cat: str
    start: float
    duration: float
    pid: Any
    tid: Any
    args: dict[str, Any]

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class RankTrace:
    """One rank's trace: where it was read, the rank it says (or was given), its
    backend and GPUs, and its events in start order."""

    path: Path
    rank: int
    backend: str | None
    devices: list[str]
    events: list[Event]
    skipped: int = 0
    by_category: dict[str, list[Event]] = field(default_factory=dict)
    host: str | None = None
    #: what parasim's replays add of the machine (``parasim``: its cores, its node size)
    metadata: dict[str, Any] = field(default_factory=dict)

    def of(self, *categories: str) -> list[Event]:
        """The events of ``categories``, in start order."""
        if len(categories) == 1:
            return self.by_category.get(categories[0], [])
        found = [e for c in categories for e in self.by_category.get(c, [])]
        found.sort(key=lambda e: e.start)
        return found

    @property
    def on_gpu(self) -> bool:
        """Whether the trace recorded GPU kernels (else it is a CPU run's: its compute
        is the host's ATen ops)."""
        return bool(self.by_category.get("kernel"))

    def steps(self) -> list[Event]:
        """The ``ProfilerStep#N`` spans ``profiler.step()`` marks, in order."""
        return [
            e for e in self.of("cpu_op", "user_annotation") if e.name.startswith("ProfilerStep#")
        ]


def find_traces(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """The trace files ``paths`` name: a file as given, a folder's ``*.json`` and
    ``*.json.gz`` files (not recursing; a ``parasim replay --profile`` folder's
    ``kineto/`` traces); and the folder files passed over for not being profiler traces
    (a parasim ``result.json`` or ``trace.json``, say), which their first bytes tell."""
    files: list[Path] = []
    passed_over: list[Path] = []
    for path in paths:
        if path.is_dir() and (path / REPLAY_FOLDER).is_dir():
            path = path / REPLAY_FOLDER  # a replay's folder: its profiler traces
        if path.is_dir():
            for candidate in sorted(path.iterdir()):
                if candidate.is_file() and candidate.name.endswith(_SUFFIXES):
                    (files if looks_like_trace(candidate) else passed_over).append(candidate)
        elif path.is_file():
            files.append(path)
        else:
            raise TraceError(f"--from-trace: {path}: no such file or folder")
    if not files:
        shown = ", ".join(str(p) for p in paths)
        raise TraceError(f"--from-trace: no PyTorch profiler trace (*.json, *.json.gz) in {shown}")
    return files, passed_over


def looks_like_trace(path: Path) -> bool:
    """Whether ``path`` starts as a Kineto trace does (a JSON object whose first
    kilobytes name ``traceEvents`` or ``schemaVersion``)."""
    try:
        with _open(path) as handle:
            head = handle.read(65536)
    except (OSError, EOFError, zlib.error):
        return False
    if not head.lstrip().startswith(b"{") or b'"otherData"' in head:  # parasim's own
        return False
    return b'"traceEvents"' in head or b'"schemaVersion"' in head


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _read_bytes(path: Path) -> bytes:
    try:
        with _open(path) as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"trace {path}: cannot be read ({exc})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(
            f"trace {path}: larger than {MAX_TRACE_BYTES / 1024**3:.0f} GiB uncompressed; "
            "profile fewer steps (torch.profiler's schedule: active=1 or 2)"
        )
    return data


def _number(value: Any) -> float | None:
    """A finite number, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def read_trace(path: Path, rank: int | None = None) -> RankTrace:
    """One trace file (``rank``: the rank to take where the trace does not say)."""
    data = _read_bytes(path)
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"trace {path}: not JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("traceEvents"), list):
        raise TraceError(
            f"trace {path}: not a PyTorch profiler trace (a JSON object with a traceEvents list)"
        )
    other = payload.get("otherData")
    if isinstance(other, dict) and "fidelity" in other:
        raise TraceError(
            f"trace {path}: parasim's own trace ({other['fidelity']!s:.20}), not a profiler "
            "trace of a run (parasim replay --profile writes those in its kineto/ folder)"
        )
    info = payload.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    said = info.get("rank")
    if isinstance(said, int) and not isinstance(said, bool) and said >= 0:
        rank = said
    elif rank is None:
        found = _RANK_IN_NAME.search(path.name)
        rank = int(found.group(1)) if found else 0
    devices = [
        str(d.get("name", "")) for d in payload.get("deviceProperties") or [] if isinstance(d, dict)
    ]
    events: list[Event] = []
    skipped = 0
    for raw in payload["traceEvents"]:
        if not isinstance(raw, dict) or raw.get("ph") != "X" or raw.get("cat") not in KEPT:
            continue
        start, duration = _number(raw.get("ts")), _number(raw.get("dur"))
        name = raw.get("name")
        if start is None or duration is None or duration < 0 or not isinstance(name, str):
            skipped += 1
            continue
        args = raw.get("args")
        events.append(
            Event(
                name,
                raw["cat"],
                start * 1e-6,
                duration * 1e-6,
                raw.get("pid"),
                raw.get("tid"),
                args if isinstance(args, dict) else {},
            )
        )
    events.sort(key=lambda e: e.start)
    by_category: dict[str, list[Event]] = {}
    for event in events:
        by_category.setdefault(event.cat, []).append(event)
    backend, host, metadata = info.get("backend"), payload.get("host_name"), payload.get("parasim")
    return RankTrace(
        path,
        rank,
        backend if isinstance(backend, str) else None,
        devices,
        events,
        skipped,
        by_category,
        host if isinstance(host, str) else None,
        metadata if isinstance(metadata, dict) else {},
    )


def read_traces(paths: Sequence[Path]) -> tuple[list[RankTrace], list[Path]]:
    """Every trace ``paths`` name (:func:`find_traces`), one per rank, by rank; and the
    files passed over. Two files of one rank are refused: a folder of several runs'
    traces must be split."""
    files, passed_over = find_traces(paths)
    traces = [read_trace(path, index) for index, path in enumerate(files)]
    seen: dict[int, Path] = {}
    for trace in traces:
        if trace.rank in seen:
            raise TraceError(
                f"--from-trace: {seen[trace.rank]} and {trace.path} are both rank {trace.rank}'s "
                "trace; give one run's traces (one file per rank)"
            )
        seen[trace.rank] = trace.path
    traces.sort(key=lambda t: t.rank)
    return traces, passed_over
