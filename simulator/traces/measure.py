"""What a run's traces measured: its compute ops by kind and shape, its communication
calls by kind, size and group, its steps and the ranks' spread, its unknown kernels.

**Compute.** On a GPU every kernel is one op of its family
(:func:`~simulator.traces.kernels.classify_kernel`); a GEMM's or attention kernel's
shape comes from the CPU op that launched it (the kernel's ``External id``), recorded
with ``record_shapes``. A CPU run's ops are the outermost ATen ops on its compute
thread. Where a parasim replay named its ranges (:mod:`simulator.traces.labels`), an
op is the whole range (what the replay's op took: on a CPU the host's work with the
kernel, on a GPU the kernels launched inside it) and its key is the one it names.

**Communication.** A call's time is the time after its last member arrived: each
member's time from issuing the call (or from its NCCL kernel's start) to its end, the
least of the members'. NCCL's kernels say their collective, algorithm and protocol by
name and their sizes, group and members in their arguments; gloo runs a call on a
worker thread whose range (``gloo:all_reduce``) ends when it completes, matched to the
call a replay's label issued in order, on the worker threads of the call's group.

**Steps and jitter.** ``ProfilerStep#N`` spans delimit the steps; the ranks' relative
spread of compute per step, among ranks that ran as many compute ops in it, is the
jitter (its median over steps, as ``parasim calibrate --scenario`` measures it).
"""

from __future__ import annotations

import functools
import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.arithmetic.layer_ops import ACT_BYTES
from simulator.common.vocabulary import ALL_TO_ALL, GEMM

from .kernels import (
    ATTENTION_FAMILY,
    ATTENTION_OPS,
    COMMUNICATION,
    GEMM_FAMILY,
    GEMM_OPS,
    UNKNOWN,
    KernelClass,
    classify_cpu_op,
    classify_kernel,
    collective_of,
)
from .kineto import Event, RankTrace
from .labels import read_call, read_compute

__all__ = ["CallSample", "OpSample", "RankReader", "TraceMeasurements", "measure_traces"]

#: How many ops before a kernel's launch call are looked at for the one around it.
_ENCLOSING_SCAN = 64
#: Backward attention kernels run about 2.5 forwards' FLOPs (the scores recomputed).
ATTENTION_BACKWARD_FACTOR = 2.5
#: Bytes per element of the data types a trace names (``Input type``, NCCL's ``dtype``).
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "c10::float": 4,
    "double": 8,
    "float64": 8,
    "c10::half": 2,
    "half": 2,
    "float16": 2,
    "c10::bfloat16": 2,
    "bfloat16": 2,
    "long int": 8,
    "int64": 8,
    "long": 8,
    "int": 4,
    "int32": 4,
    "unsigned char": 1,
    "uint8": 1,
    "signed char": 1,
    "int8": 1,
    "bool": 1,
}


def dtype_bytes(name: Any) -> int | None:
    """Bytes per element of a trace's data type name (None for one it does not know)."""
    if not isinstance(name, str):
        return None
    low = name.lower()
    if "float8" in low or "fp8" in low or "f8" in low:
        return 1
    return _DTYPE_BYTES.get(low)


@dataclass(frozen=True, slots=True)
class OpSample:
    """One compute op's measured time on one rank: its family, key (the profile's
    ``op_table`` key where known), FLOPs, bytes, GEMM or attention shape and batch."""

    rank: int
    family: str
    name: str
    start: float
    seconds: float
    key: tuple | None = None
    flops: float = 0.0
    bytes: float = 0.0
    shape: tuple[int, int, int] | None = None
    batch: int = 1
    fp8: bool = False


@dataclass(frozen=True, slots=True)
class CallSample:
    """One communication call's time after its last member arrived (the least of its
    members' times), with its kind, size, group, scope, and NCCL's algorithm and
    protocol where the kernel names them."""

    kind: str
    ranks: int
    bytes: float
    seconds: float
    scope: str
    members: tuple[int, ...] = ()
    algorithm: str | None = None
    protocol: str | None = None
    group: str = ""


@dataclass
class TraceMeasurements:
    """Everything the traces measured (:func:`measure_traces`)."""

    ranks: list[int]
    on_gpu: bool
    devices: list[str]
    per_node: int
    ops: list[OpSample]
    calls: list[CallSample]
    families: dict[str, list[float]]
    unknown: dict[str, list[float]]
    steps: dict[int, list[float]]
    compute_per_step: dict[int, list[float]]
    jitter: float
    host_gap: float
    metadata: dict[str, Any] = field(default_factory=dict)
    labelled: bool = False
    #: the communication backend the traces name (None where none does)
    backend: str | None = None


def _dims(op: Event) -> list:
    dims = op.args.get("Input Dims")
    return dims if isinstance(dims, list) else []


def _is_dims(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and d >= 0 for d in value)


def gemm_shape(op: Event) -> tuple[int, int, int, int, bool] | None:
    """``(m, n, k, batch, fp8)`` of a GEMM ATen op from its recorded shapes."""
    positions = GEMM_OPS.get(op.name)
    dims = _dims(op)
    if positions is None or len(dims) <= max(positions):
        return None
    a, b = dims[positions[0]], dims[positions[1]]
    if not _is_dims(a) or not _is_dims(b) or len(a) < 2 or not b:
        return None
    types = op.args.get("Input type") or []
    fp8 = op.name == "aten::_scaled_mm" or any("Float8" in str(t) for t in types)
    if op.name == "aten::linear":  # the weight is (n, k)
        if len(b) != 2:
            return None
        m, k, n, batch = math.prod(a[:-1]), a[-1], b[0], 1
    elif len(a) == 3 and len(b) == 3:
        batch, m, k, n = a[0], a[1], a[2], b[2]
    elif len(b) == 2:
        m, k, n, batch = math.prod(a[:-1]), a[-1], b[1], 1
    else:
        return None
    if min(m, n, k, batch) <= 0:
        return None
    return m, n, k, batch, fp8


def gemm_key(m: int, n: int, k: int, batch: int, fp8: bool) -> tuple:
    """The ``op_table`` key parasim's lowering gives a GEMM of this shape."""
    flops = 2.0 * batch * m * n * k
    traffic = float(ACT_BYTES * batch * (m * k + k * n + m * n))
    return (str(GEMM), flops, traffic, (m, n, k), batch, fp8)


def attention_flops(op: Event) -> tuple[float, tuple[int, int, int], int] | None:
    """FLOPs, ``(s_q, s_kv, head_dim)`` and batch (sequences × heads) of an attention
    ATen op from its recorded shapes (``(batch, heads, seq, head_dim)`` inputs)."""
    if op.name not in ATTENTION_OPS:
        return None
    dims = [d for d in _dims(op) if _is_dims(d) and len(d) == 4]
    if len(dims) < 2:
        return None
    q, k = dims[0], dims[1]
    batch = q[0] * q[1]
    flops = 4.0 * batch * q[2] * k[2] * q[3]
    if "backward" in op.name:
        flops *= ATTENTION_BACKWARD_FACTOR
    return flops, (q[2], k[2], q[3]), batch


def _moved_bytes(op: Event) -> float:
    """Bytes an ATen op reads and writes, from its recorded shapes: its tensor inputs,
    and an output as large as the largest (0 where it recorded none)."""
    dims, types = _dims(op), op.args.get("Input type") or []
    sizes = []
    for index, shape in enumerate(dims):
        if not _is_dims(shape) or not shape:
            continue
        element = dtype_bytes(types[index]) if index < len(types) else None
        if element is not None:
            sizes.append(math.prod(shape) * element)
    return float(sum(sizes) + max(sizes)) if sizes else 0.0


# -- compute ---------------------------------------------------------------------------


def _outermost(events: Iterable[Event]) -> list[Event]:
    """The events not inside another of ``events`` (in start order)."""
    kept: list[Event] = []
    end = -math.inf
    for event in events:
        if event.start >= end:
            kept.append(event)
            end = event.end
    return kept


def _within(events: Sequence[Event], starts: list[float], span: Event) -> list[Event]:
    """The events of ``events`` (sorted; ``starts`` their starts) that start inside
    ``span``."""
    return list(events[bisect_left(starts, span.start) : bisect_right(starts, span.end)])


def _sample_of_cpu_op(rank: int, op: Event, family: str, seconds: float) -> OpSample:
    """An ATen op's sample, its key and FLOPs from its shapes where it has them."""
    shape = gemm_shape(op) if family == GEMM_FAMILY else None
    if shape is not None:
        m, n, k, batch, fp8 = shape
        key = gemm_key(m, n, k, batch, fp8)
        return OpSample(
            rank, family, op.name, op.start, seconds, key, key[1], key[2], (m, n, k), batch, fp8
        )
    attention = attention_flops(op) if family == ATTENTION_FAMILY else None
    if attention is not None:
        flops, dims, batch = attention
        return OpSample(rank, family, op.name, op.start, seconds, None, flops, 0.0, dims, batch)
    return OpSample(rank, family, op.name, op.start, seconds, bytes=_moved_bytes(op))


class RankReader:
    """One rank's trace read into samples."""

    def __init__(self, trace: RankTrace):
        self.trace = trace
        self.rank = trace.rank
        cpu = trace.of("cpu_op")
        self.cpu_by_id = {
            e.args["External id"]: e for e in cpu if isinstance(e.args.get("External id"), int)
        }
        self.annotations = trace.of("user_annotation")
        self.compute_labels = [e for e in self.annotations if read_compute(e.name) is not None]
        self.call_labels = [e for e in self.annotations if read_call(e.name) is not None]
        self.gloo = [e for e in self.annotations + cpu if collective_of(e.name) is not None]
        self.gloo.sort(key=lambda e: e.start)
        worker_threads = {e.tid for e in self.gloo}
        # the compute thread: the labels', else the one with the most ATen time
        threads: dict[Any, float] = {}
        for event in cpu:
            if event.tid not in worker_threads:
                threads[event.tid] = threads.get(event.tid, 0.0) + event.duration
        if self.compute_labels:
            self.main = self.compute_labels[0].tid
        else:
            self.main = max(threads, key=lambda t: threads[t]) if threads else None
        self.cpu_main = [e for e in cpu if e.tid == self.main]
        self.cpu_main_starts = [e.start for e in self.cpu_main]
        self.kernels = trace.of("kernel", "gpu_memcpy", "gpu_memset")
        runtime = trace.of("cuda_runtime")
        self.launches = {
            e.args["correlation"]: e for e in runtime if isinstance(e.args.get("correlation"), int)
        }
        self.kernels_by_id: dict[Any, list[Event]] = {}
        for kernel in self.kernels:
            self.kernels_by_id.setdefault(kernel.args.get("External id"), []).append(kernel)
        self.kernels_by_id.pop(None, None)
        # each thread's launch calls in start order, with the kernel each launched
        by_thread: dict[Any, list[tuple[float, Event]]] = {}
        for kernel in self.kernels:
            launch = self.launches.get(kernel.args.get("correlation"))
            if launch is not None:
                by_thread.setdefault(launch.tid, []).append((launch.start, kernel))
        self.launched = {
            tid: ([t for t, _ in pairs], [k for _, k in pairs])
            for tid, pairs in ((tid, sorted(v, key=lambda x: x[0])) for tid, v in by_thread.items())
        }
        self.cpu_by_thread: dict[Any, list[Event]] = {}
        for event in cpu:
            self.cpu_by_thread.setdefault(event.tid, []).append(event)
        self.cpu_thread_starts = {
            tid: [e.start for e in events] for tid, events in self.cpu_by_thread.items()
        }

    # -- kernels and ops
    @functools.cached_property
    def classified(self) -> list[tuple[Event, KernelClass]]:
        """Each kernel with its class (:func:`~simulator.traces.kernels.classify_kernel`)."""
        return [(k, classify_kernel(k.name, k.cat)) for k in self.kernels]

    def launcher(self, kernel: Event) -> Event | None:
        """The CPU op that launched ``kernel``: the innermost op around the launch call
        of the kernel's ``correlation`` (older traces give a kernel the correlation as
        its ``External id`` too), else the op of its ``External id``."""
        launch = self.launches.get(kernel.args.get("correlation"))
        if launch is not None:
            ops = self.cpu_by_thread.get(launch.tid, [])
            starts = self.cpu_thread_starts.get(launch.tid, [])
            index = bisect_right(starts, launch.start)
            for op in reversed(ops[max(0, index - _ENCLOSING_SCAN) : index]):
                if op.end >= launch.end:
                    return op
        return self.cpu_by_id.get(kernel.args.get("External id"))

    def kernels_launched_in(self, span: Event) -> list[Event]:
        """The kernels launched inside ``span`` (on its thread): by the CPU ops inside
        it (their ``External id``), or by a launch call inside it (its
        ``correlation``)."""
        found: dict[int, Event] = {}
        for op in _within(self.cpu_main, self.cpu_main_starts, span):
            if op.tid == span.tid:
                for kernel in self.kernels_by_id.get(op.args.get("External id"), ()):
                    found[id(kernel)] = kernel
        starts, kernels = self.launched.get(span.tid, ([], []))
        for kernel in kernels[bisect_left(starts, span.start) : bisect_right(starts, span.end)]:
            found[id(kernel)] = kernel
        return sorted(found.values(), key=lambda k: k.start)

    @functools.cached_property
    def compute_samples(self) -> list[OpSample]:
        """The rank's compute ops, in start order (the module says what an op is)."""
        return self._compute_samples()

    def _compute_samples(self) -> list[OpSample]:
        if self.compute_labels:
            return [self._labelled(span) for span in self.compute_labels]
        if self.trace.on_gpu:
            return [
                self._kernel_sample(k, c) for k, c in self.classified if c.family != COMMUNICATION
            ]
        ops = [
            e
            for e in _outermost(self.cpu_main)
            if not e.name.startswith(("ProfilerStep#", "c10d::", "record_param_comms"))
            and collective_of(e.name) is None
        ]
        return [
            _sample_of_cpu_op(self.rank, e, classify_cpu_op(e.name).family, e.duration) for e in ops
        ]

    def _labelled(self, span: Event) -> OpSample:
        label = read_compute(span.name)
        assert label is not None
        seconds = span.duration
        if self.trace.on_gpu:
            kernels = self.kernels_launched_in(span)
            if kernels:
                seconds = sum(k.duration for k in kernels)
        family = {"gemm": GEMM_FAMILY, "attention": ATTENTION_FAMILY}.get(label.kind, label.kind)
        return OpSample(
            self.rank,
            family,
            span.name,
            span.start,
            seconds,
            label.key,
            label.flops,
            label.bytes,
            label.shape,
            label.batch,
            label.fp8,
        )

    def _kernel_sample(self, kernel: Event, kind: KernelClass) -> OpSample:
        launcher = self.launcher(kernel)
        if launcher is not None and kind.family in (GEMM_FAMILY, ATTENTION_FAMILY):
            sample = _sample_of_cpu_op(self.rank, launcher, kind.family, kernel.duration)
            return OpSample(
                self.rank,
                kind.family,
                kernel.name,
                kernel.start,
                kernel.duration,
                sample.key,
                sample.flops,
                sample.bytes,
                sample.shape,
                sample.batch,
                sample.fp8,
            )
        moved = _moved_bytes(launcher) if launcher is not None else 0.0
        return OpSample(
            self.rank, kind.family, kernel.name, kernel.start, kernel.duration, bytes=moved
        )

    def host_gap(self) -> float:
        """The host's own time between two ops (a CPU run's executor or framework
        between its ops): the median gap between consecutive labelled ranges on the
        compute thread, or between its outermost ops; 0 on a GPU, whose host runs
        ahead of it."""
        if self.trace.on_gpu:
            return 0.0
        spans = _outermost(sorted(self.compute_labels + self.call_labels, key=lambda e: e.start))
        if not spans:
            spans = [e for e in _outermost(self.cpu_main) if not e.name.startswith("ProfilerStep#")]
        gaps = [b.start - a.end for a, b in zip(spans, spans[1:], strict=False) if b.start >= a.end]
        return statistics.median(gaps) if gaps else 0.0


# -- communication -----------------------------------------------------------------------

_COLLECTIVE_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "broadcast": "broadcast",
    "send": "p2p",
    "recv": "p2p",
    "batch_isend_irecv": "p2p",
    "barrier": "barrier",
}


def _members(value: Any) -> tuple[int, ...]:
    """A process group's ranks as a trace writes them (a list, or its text)."""
    if isinstance(value, str):
        value = [v for v in value.strip("[]() ").replace(" ", "").split(",") if v]
        try:
            value = [int(v) for v in value]
        except ValueError:
            return ()
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return ()


@dataclass
class _Member:
    """One member's part of a call: its rank, its time from arriving to the call's end."""

    rank: int
    seconds: float


@dataclass
class _Call:
    kind: str
    bytes: float
    members: tuple[int, ...]
    ranks: int
    group: str
    algorithm: str | None = None
    protocol: str | None = None
    parts: list[_Member] = field(default_factory=list)


def _nccl_call(
    kernel: Event, kind: KernelClass
) -> tuple[str, str, float, tuple[int, ...], int] | None:
    """``(group key, kind, bytes, members, ranks)`` of an NCCL kernel from the
    communication record Kineto attaches to it, or None where it has none."""
    args = kernel.args
    name = str(args.get("Collective name", "")).lower()
    collective = _COLLECTIVE_NAMES.get(name, kind.collective)
    element = dtype_bytes(args.get("dtype")) or dtype_bytes(kind.dtype) or 2
    numbers = [args.get("In msg nelems"), args.get("Out msg nelems")]
    elements = max((v for v in numbers if isinstance(v, int | float) and v >= 0), default=None)
    ranks = args.get("Group size")
    if collective is None or elements is None or not isinstance(ranks, int) or ranks < 1:
        return None
    members = _members(args.get("Process Group Ranks"))
    group = str(args.get("Process Group Name", members or ranks))
    if collective == "all_to_all" or (collective == "p2p" and "all_to_all" in name):
        collective = str(ALL_TO_ALL)
    return group, collective, float(elements * element), members, ranks


def _gpu_calls(readers: list[RankReader]) -> list[_Call]:
    """Calls from NCCL kernels: each member's kernel, matched by group and order (or,
    labelled, by the replay's op), its time the kernel's."""
    calls: dict[tuple, _Call] = {}
    for reader in readers:
        order: dict[str, int] = {}
        labelled = {
            id(k): label for label in reader.call_labels for k in reader.kernels_launched_in(label)
        }
        for kernel, kind in reader.classified:
            if kind.family != COMMUNICATION:
                continue
            label = labelled.get(id(kernel))
            if label is not None:
                call = read_call(label.name)
                assert call is not None
                key_group, collective, size = call.group, call.kind, call.bytes
                members, ranks = call.members, len(call.members)
            else:
                read = _nccl_call(kernel, kind)
                if read is None:
                    continue
                key_group, collective, size, members, ranks = read
            index = order.get(key_group, 0)
            order[key_group] = index + 1
            entry = calls.setdefault(
                (key_group, index),
                _Call(collective, size, members, ranks, key_group, kind.algorithm, kind.protocol),
            )
            entry.parts.append(_Member(reader.rank, kernel.duration))
    return list(calls.values())


def _cpu_calls(readers: list[RankReader]) -> list[_Call]:
    """Calls of a CPU run: each labelled issue matched to the gloo worker range that
    ran it (the first of its kind after it, on a worker thread of its group, in
    order), its time from the issue to the range's end."""
    calls: dict[tuple, _Call] = {}
    for reader in readers:
        order: dict[str, int] = {}
        taken: set[int] = set()
        thread_group: dict[Any, str] = {}
        for issue in reader.call_labels:
            call = read_call(issue.name)
            assert call is not None
            index = order.get(call.group, 0)
            order[call.group] = index + 1
            entry = calls.setdefault(
                (call.group, index),
                _Call(call.kind, call.bytes, call.members, len(call.members), call.group),
            )
            if call.kind == "p2p":
                continue  # gloo's send and receive ranges are the enqueue, not the transfer
            for position, worker in enumerate(reader.gloo):
                if position in taken or worker.end < issue.start:
                    continue
                if collective_of(worker.name) != call.kind:
                    continue
                if thread_group.get(worker.tid, call.group) != call.group:
                    continue
                taken.add(position)
                thread_group[worker.tid] = call.group
                entry.parts.append(_Member(reader.rank, worker.end - issue.start))
                break
    return list(calls.values())


def _scope(members: tuple[int, ...], hosts: dict[int, str | None], per_node: int) -> str:
    """``intra_node`` when the members share a host (or, where the traces name no host,
    a block of ``per_node`` ranks), ``inter_node`` otherwise."""
    if not members:
        return "intra_node"
    named = [hosts.get(m) for m in members]
    if all(h is not None for h in named):
        return "intra_node" if len(set(named)) == 1 else "inter_node"
    return "intra_node" if len({m // per_node for m in members}) == 1 else "inter_node"


# -- the whole run -----------------------------------------------------------------------


def _spread(values: list[float]) -> float:
    """Relative spread (standard deviation over mean, corrected for few values)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2 or mean <= 0:
        return 0.0
    return statistics.pstdev(values) / mean * (n / (n - 1)) ** 0.5


def measure_traces(
    traces: Sequence[RankTrace], readers: Sequence[RankReader] | None = None
) -> TraceMeasurements:
    """What ``traces`` (one per rank of one run) measured (``readers``: theirs, read
    already)."""
    readers = list(readers) if readers is not None else [RankReader(t) for t in traces]
    on_gpu = any(t.on_gpu for t in traces)
    devices = next((t.devices for t in traces if t.devices), [])
    metadata = next((t.metadata for t in traces if t.metadata), {})
    said = metadata.get("per_node")
    per_node = said if isinstance(said, int) and said > 0 else (len(devices) or len(traces))
    hosts = {t.rank: t.host for t in traces}
    ops: list[OpSample] = []
    families: dict[str, list[float]] = {}
    unknown: dict[str, list[float]] = {}
    steps: dict[int, list[float]] = {}
    compute_per_step: dict[int, list[float]] = {}
    ops_per_step: dict[int, list[int]] = {}
    gaps = []
    for reader in readers:
        samples = reader.compute_samples
        ops += samples
        for sample in samples:
            entry = families.setdefault(sample.family, [0, 0.0])
            entry[0] += 1
            entry[1] += sample.seconds
            if sample.family == UNKNOWN:
                named = unknown.setdefault(sample.name, [0, 0.0])
                named[0] += 1
                named[1] += sample.seconds
        if reader.trace.on_gpu:
            for kernel, kind in reader.classified:
                if kind.family == COMMUNICATION:
                    entry = families.setdefault(COMMUNICATION, [0, 0.0])
                    entry[0] += 1
                    entry[1] += kernel.duration
        spans = reader.trace.steps()
        steps[reader.rank] = [s.duration for s in spans]
        starts = [s.start for s in samples]
        compute_per_step[reader.rank] = []
        ops_per_step[reader.rank] = []
        for span in spans:
            inside = samples[bisect_left(starts, span.start) : bisect_right(starts, span.end)]
            compute_per_step[reader.rank].append(sum(s.seconds for s in inside))
            ops_per_step[reader.rank].append(len(inside))
        gaps.append(reader.host_gap())
    raw_calls = _gpu_calls(readers) if on_gpu else _cpu_calls(readers)
    calls = [
        CallSample(
            call.kind,
            call.ranks,
            call.bytes,
            min(part.seconds for part in call.parts),
            _scope(call.members, hosts, per_node),
            call.members,
            call.algorithm,
            call.protocol,
            call.group,
        )
        for call in raw_calls
        if call.parts and call.kind != "barrier"
    ]
    jitter = _jitter(compute_per_step, ops_per_step)
    return TraceMeasurements(
        ranks=[t.rank for t in traces],
        on_gpu=on_gpu,
        devices=devices,
        per_node=per_node,
        ops=ops,
        calls=calls,
        families=families,
        unknown=unknown,
        steps=steps,
        compute_per_step=compute_per_step,
        jitter=jitter,
        host_gap=statistics.median(gaps) if gaps else 0.0,
        metadata=metadata,
        labelled=any(r.compute_labels for r in readers),
        backend=next((t.backend for t in traces if t.backend), None),
    )


def _jitter(compute: dict[int, list[float]], counts: dict[int, list[int]]) -> float:
    """The median over steps of the ranks' relative spread of compute, among ranks that
    ran as many compute ops in the step (ranks of one pipeline stage, say)."""
    spreads = []
    steps = min((len(v) for v in compute.values()), default=0)
    for index in range(steps):
        alike: dict[int, list[float]] = {}
        for rank, values in compute.items():
            alike.setdefault(counts[rank][index], []).append(values[index])
        spreads += [_spread(values) for values in alike.values() if len(values) > 1]
    return min(0.5, statistics.median(spreads)) if spreads else 0.0
