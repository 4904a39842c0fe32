"""Where a prediction and a real run part ways: a simulated run folder set against the
profiler traces of the run it predicts (``parasim compare PREDICTED TRACE_DIR``).

**The measured step.** The traces' ``ProfilerStep#N`` spans delimit the steps; the step
compared is the one whose slowest rank took the median time (the traces' whole span
where they mark none). Each rank's step is cut into what the model accounts:

- *compute*, by kind (GEMM, attention, elementwise with norms and copies, optimizer):
  the time some compute ran (kernels on any stream, or a CPU run's ops);
- *exposed communication*: the time communication ran and no compute did;
- *host*: the GPU idle because the host had not launched the next kernel yet (the
  kernel's launch call began after the GPU had gone idle); on a CPU run, the host's
  own gaps between ops;
- *waiting*: the rest, idle for another rank (a pipeline bubble, a slower peer).

The prediction's mean breakdown sets beside them: compute, exposed communication,
``bubble`` with ``imbalance_stall`` against *waiting*, ``other`` against *host*.

**The differences named.** Each place the measured step departs from the predicted
one is a candidate, with its mechanism and the profile field that would absorb it,
ranked by the seconds it moves the step:

- a **slow rank**: the slowest rank computed more than the median of the ranks that ran
  as many compute ops (its excess; ``gpu.jitter``);
- **another NCCL algorithm or protocol** than the model chose for a collective kind
  (the kernels' names against the prediction's ``collective_choices``; the difference
  of that kind's time; ``comm.<kind>.<scope>``);
- a **collective slower** (or faster) than modelled, per kind (``comm.<kind>.<scope>``);
- an **overlap the run did not get**: exposed communication beyond what the
  collectives' own differences explain (the recipe's overlap knobs);
- a **kernel slower than its shape predicts**, per compute kind, from the median rank
  (so that one slow rank is not read as slow kernels; ``gpu.matmul_efficiency`` and
  ``gpu.gemm_table`` for GEMMs, ``gpu.attention_efficiency``, ``gpu.hbm_bandwidth``);
- a **host-bound stretch** (``gpu.kernel_launch_overhead``);
- **waiting** beyond the prediction's bubble and stall that no slow rank explains.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simulator.analysis.result import StepResult
from simulator.analysis.trace import OpRecord, Trace
from simulator.common.vocabulary import BARRIER
from simulator.tools.compare import Row

from .kernels import COMMUNICATION, collective_of
from .kineto import Event, RankTrace
from .measure import OpSample, RankReader, measure_traces

__all__ = ["Difference", "TraceComparison", "compare_with_traces", "measured_trace"]

#: Measured compute families as the model's compute kinds.
KIND_OF_FAMILY = {
    "gemm": "gemm",
    "attention": "attention",
    "elementwise": "elementwise",
    "norm": "elementwise",
    "copy": "elementwise",
    "optimizer": "optimizer",
    "unknown": "unknown",
}
#: The profile field that absorbs a compute kind's difference.
FIELD_OF_KIND = {
    "gemm": "gpu.matmul_efficiency and gpu.gemm_table (gpu.op_table for these shapes)",
    "grouped_gemm": "gpu.matmul_efficiency",
    "attention": "gpu.attention_efficiency",
    "elementwise": "gpu.hbm_bandwidth",
    "optimizer": "gpu.hbm_bandwidth",
    "unknown": "gpu.op_table (kernels parasim could not classify)",
}
#: The step's categories as compared: measured name, predicted categories, label.
CATEGORY_ROWS = (
    ("compute", ("compute",), "compute"),
    ("exposed_comm", ("exposed_comm",), "exposed communication"),
    ("waiting", ("bubble", "imbalance_stall"), "waiting (bubble, stall)"),
    ("host", ("other",), "host gaps (other)"),
)
#: Differences named (the largest first).
NAMED = 3


@dataclass(frozen=True)
class Difference:
    """One place the run departs from the prediction: where, by what mechanism, the
    profile field that would absorb it, and the seconds it moves the step (positive:
    the run is slower there)."""

    place: str
    mechanism: str
    field: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "place": self.place,
            "mechanism": self.mechanism,
            "field": self.field,
            "seconds": self.seconds,
        }


@dataclass
class TraceComparison:
    """A prediction against a run's traces (``compare.json``)."""

    predicted_folder: str
    traces_folder: str
    scenario: str
    step: Row
    categories: list[Row]
    kinds: list[Row]
    differences: list[Difference]
    ranks: list[int]
    step_index: int
    choices: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def row(r: Row, name: str) -> dict[str, Any]:
            return {
                name: r.name,
                "predicted_s": r.first,
                "measured_s": r.second,
                "error": r.difference,
            }

        return {
            "mode": "traces",
            "labels": ["predicted", "measured"],
            "runs": {
                "predicted": {"folder": self.predicted_folder, "scenario": self.scenario},
                "measured": {"folder": self.traces_folder, "ranks": self.ranks},
            },
            "step_time": row(self.step, "name"),
            "measured_step": self.step_index,
            "categories": [row(r, "category") for r in self.categories],
            "op_kinds": [row(r, "kind") for r in self.kinds],
            "collective_choices": self.choices,
            "differences": [d.to_json() for d in self.differences],
        }


# -- the measured step ---------------------------------------------------------------------


@dataclass
class _RankStep:
    """One rank's measured step: its window, compute and communication inside it."""

    rank: int
    start: float
    end: float
    compute: list[OpSample]
    comm: list[tuple[Event, str, str | None, str | None]]  # event, kind, algorithm, protocol
    host: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[float, float]], taken: list[tuple[float, float]]) -> float:
    """The length of ``intervals`` (a union) outside ``taken`` (a union)."""
    total = 0.0
    j = 0
    for a, b in intervals:
        cursor = a
        while j < len(taken) and taken[j][1] <= cursor:
            j += 1
        k = j
        while k < len(taken) and taken[k][0] < b:
            lo, hi = max(taken[k][0], cursor), min(taken[k][1], b)
            if lo > cursor:
                total += lo - cursor
            cursor = max(cursor, hi)
            k += 1
        total += max(0.0, b - cursor)
    return total


def _chosen_step(readers: list[RankReader]) -> tuple[int, dict[int, tuple[float, float]]]:
    """The step compared (its index) and each rank's window of it."""
    spans = {r.rank: r.trace.steps() for r in readers}
    count = min((len(s) for s in spans.values()), default=0)
    if count == 0:
        windows = {}
        for reader in readers:
            events = reader.trace.events
            windows[reader.rank] = (
                min((e.start for e in events), default=0.0),
                max((e.end for e in events), default=0.0),
            )
        return -1, windows
    readers_by_rank = {r.rank: r for r in readers}
    windows_of = [
        {rank: _after_barrier(readers_by_rank[rank], spans[rank][i]) for rank in spans}
        for i in range(count)
    ]
    slowest = [max(end - start for start, end in w.values()) for w in windows_of]
    index = slowest.index(statistics.median_low(slowest))
    return index, windows_of[index]


#: The calls a step may open with to keep its ranks in step (a replay's opening barrier).
_BARRIERS = ("c10d::barrier", "gloo:barrier", "nccl:barrier")


def _after_barrier(reader: RankReader, span: Event) -> tuple[float, float]:
    """A step's window on one rank: its span, from where the rank left a barrier that
    opens it (the step's work begins once every rank is in; the wait is not the step's)."""
    opening = [
        e.end
        for e in reader.trace.of("cpu_op", "user_annotation")
        if e.name in _BARRIERS and span.start <= e.start < span.start + span.duration / 2
    ]
    return (max(opening) if opening else span.start), span.end


def _rank_step(reader: RankReader, window: tuple[float, float], host_gap: float) -> _RankStep:
    start, end = window
    # a GPU's work of the step may end after the host's span of it: kernels launched in it
    compute = [s for s in reader.compute_samples if start <= s.start < end]
    comm: list[tuple[Event, str, str | None, str | None]] = []
    if reader.trace.on_gpu:
        for kernel, kind in reader.classified:
            if kind.family == COMMUNICATION and start <= kernel.start < end:
                comm.append((kernel, kind.collective or "unknown", kind.algorithm, kind.protocol))
    else:
        for worker in reader.gloo:
            collective = collective_of(worker.name) or "unknown"
            # a barrier is the run keeping its ranks in step, not the step's work
            if start <= worker.start < end and collective != BARRIER:
                comm.append((worker, collective, None, None))
    host = _gpu_host_gaps(reader, start, end) if reader.trace.on_gpu else host_gap * len(compute)
    last = max([end] + [s.start + s.seconds for s in compute] + [e.end for e, *_ in comm])
    return _RankStep(reader.rank, start, last, compute, comm, host)


def _gpu_host_gaps(reader: RankReader, start: float, end: float) -> float:
    """The GPU's idle time in the step from ``start`` to ``end`` that ended with a
    kernel the host launched only after the GPU had gone idle."""
    busy = -float("inf")
    total = 0.0
    for kernel in reader.kernels:  # in start order
        if not start <= kernel.start < end:
            continue
        if busy > -float("inf") and kernel.start > busy:
            launch = reader.launches.get(kernel.args.get("correlation"))
            if launch is not None and launch.start >= busy:
                total += kernel.start - busy
        busy = max(busy, kernel.end)
    return total


def measured_trace(steps: Sequence[_RankStep], scenario: str) -> Trace:
    """The measured step as parasim's :class:`Trace` (each rank's times from its step's
    start): compute ops on a ``compute`` lane, communication on ``comm``."""
    records = []
    for step in steps:
        for index, sample in enumerate(step.compute):
            records.append(
                OpRecord(
                    rank=step.rank,
                    op_id=index,
                    stream="compute",
                    op="compute",
                    kind=KIND_OF_FAMILY.get(sample.family, sample.family),
                    label=sample.name[:120],
                    tags={"phase": "measured"},
                    ready=sample.start - step.start,
                    start=sample.start - step.start,
                    end=sample.start - step.start + sample.seconds,
                    flops=sample.flops,
                    bytes=sample.bytes,
                )
            )
        for index, (event, kind, _, _) in enumerate(step.comm):
            records.append(
                OpRecord(
                    rank=step.rank,
                    op_id=len(step.compute) + index,
                    stream="comm",
                    op="collective",
                    kind=kind,
                    label=event.name[:120],
                    tags={"axis": "measured"},
                    ready=event.start - step.start,
                    start=event.start - step.start,
                    end=event.end - step.start,
                )
            )
    step_time = max((s.seconds for s in steps), default=0.0)
    return Trace(records, step_time, {"scenario": scenario, "fidelity": "measured (profiler)"})


# -- the comparison ------------------------------------------------------------------------


def _categories(step: _RankStep) -> dict[str, float]:
    compute = _union([(s.start, s.start + s.seconds) for s in step.compute])
    comm = _union([(e.start, e.end) for e, *_ in step.comm])
    exposed = _minus(comm, compute)
    busy = _length(compute)
    idle = max(0.0, step.seconds - busy - exposed)
    host = min(idle, step.host)
    return {"compute": busy, "exposed_comm": exposed, "host": host, "waiting": idle - host}


def _step_time(steps: Sequence[_RankStep], traces: Sequence[RankTrace]) -> float:
    """The measured step: from when the last rank began it to when the last one ended
    it, where the traces share a host's clock; else the longest rank's own step (two
    hosts' clocks are never compared)."""
    hosts = {trace.host for trace in traces}
    if len(hosts) == 1 and None not in hosts:
        return max(s.end for s in steps) - max(s.start for s in steps)
    return max(s.seconds for s in steps)


def _breakdown_of(result: StepResult, rank: int) -> dict[str, float]:
    """The prediction's breakdown of ``rank`` (its class's row), or its mean where the
    result has no row for it (a rank beyond the predicted layout)."""
    try:
        return result.rank_figures(rank).breakdown
    except ValueError:
        return result.breakdown.mean


def _per_kind(step: _RankStep) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for sample in step.compute:
        kind = KIND_OF_FAMILY.get(sample.family, sample.family)
        kinds[kind] = kinds.get(kind, 0.0) + sample.seconds
    for event, kind, _, _ in step.comm:
        kinds[kind] = kinds.get(kind, 0.0) + event.duration
    return kinds


def _predicted_kinds(trace: Trace, ranks: set[int]) -> dict[str, float]:
    """Per op kind, the median over ``ranks`` of the predicted time in that kind."""
    per_rank: dict[int, dict[str, float]] = {rank: {} for rank in ranks}
    for record in trace.records:
        if record.rank in per_rank:
            kinds = per_rank[record.rank]
            kinds[record.kind] = kinds.get(record.kind, 0.0) + record.end - record.start
    names = {kind for kinds in per_rank.values() for kind in kinds}
    return {
        kind: statistics.median(kinds.get(kind, 0.0) for kinds in per_rank.values())
        for kind in names
    }


def _choices(result: StepResult) -> dict[str, str]:
    """The prediction's algorithm/protocol per collective kind (its most used)."""
    counts = (result.simulation or {}).get("collective_choices") or {}
    best: dict[str, tuple[int, str]] = {}
    for name, count in counts.items():
        kind, _, choice = str(name).partition("/")
        if choice and count > best.get(kind, (-1, ""))[0]:
            best[kind] = (count, choice)
    return {kind: choice for kind, (_, choice) in best.items()}


def _measured_choices(steps: Sequence[_RankStep]) -> dict[str, str]:
    counts: dict[str, dict[str, int]] = {}
    for step in steps:
        for _, kind, algorithm, protocol in step.comm:
            if algorithm and protocol:
                name = f"{algorithm}/{protocol}"
                counts.setdefault(kind, {})[name] = counts.setdefault(kind, {}).get(name, 0) + 1
    return {kind: max(found, key=lambda n: found[n]) for kind, found in counts.items()}


def _slow_rank(steps: Sequence[_RankStep]) -> tuple[int, float, float] | None:
    """``(rank, excess seconds, its median peer's compute)`` of the slowest rank among
    ranks that ran as many compute ops, where one computed more than the median."""
    alike: dict[int, list[_RankStep]] = {}
    for step in steps:
        alike.setdefault(len(step.compute), []).append(step)
    found = None
    for group in alike.values():
        if len(group) < 2:
            continue
        totals = {s.rank: sum(c.seconds for c in s.compute) for s in group}
        median = statistics.median(totals.values())
        rank = max(totals, key=lambda r: totals[r])
        excess = totals[rank] - median
        if found is None or excess > found[1]:
            found = (rank, excess, median)
    return found


def compare_with_traces(
    predicted: tuple[StepResult, Trace],
    traces: Sequence[RankTrace],
    folders: tuple[str, str] = ("", ""),
) -> tuple[TraceComparison, Trace]:
    """The prediction against the run the traces recorded, and the measured step as a
    :class:`Trace` (for the two timelines)."""
    result, predicted_trace = predicted
    readers = [RankReader(trace) for trace in traces]
    measurements = measure_traces(traces, readers)
    index, windows = _chosen_step(readers)
    steps = [_rank_step(r, windows[r.rank], measurements.host_gap) for r in readers]
    step_time = _step_time(steps, traces)
    ranks = [s.rank for s in steps]
    # the step's categories: the mean over the measured ranks, against the prediction's
    # figures of the same ranks (each rank's class's row, in a folded run)
    figures = [_breakdown_of(result, rank) for rank in ranks]
    categories = [
        Row(
            label,
            statistics.fmean(sum(f.get(c, 0.0) for c in predicted_names) for f in figures),
            statistics.fmean(_categories(s)[name] for s in steps),
        )
        for name, predicted_names, label in CATEGORY_ROWS
    ]
    # op kinds: the median rank's, over the ranks the predicted trace shows too (one
    # slow rank is a slow rank, not slow kernels)
    shown = set(predicted_trace.ranks()) & set(ranks) or set(ranks)
    per_rank_kinds = [_per_kind(s) for s in steps if s.rank in shown]
    measured_kinds = {
        kind: statistics.median(k.get(kind, 0.0) for k in per_rank_kinds)
        for kind in {k for found in per_rank_kinds for k in found}
    }
    predicted_kinds = _predicted_kinds(predicted_trace, shown)
    kinds = [
        Row(kind, predicted_kinds.get(kind, 0.0), measured_kinds.get(kind, 0.0))
        for kind in sorted(set(predicted_kinds) | set(measured_kinds))
    ]
    chosen, ran = _choices(result), _measured_choices(steps)
    differences = _differences(
        categories, kinds, chosen, ran, _slow_rank(steps), measurements.calls, measurements.on_gpu
    )
    comparison = TraceComparison(
        predicted_folder=folders[0],
        traces_folder=folders[1],
        scenario=result.scenario,
        step=Row("step time", result.step_time_s, step_time),
        categories=categories,
        kinds=kinds,
        differences=differences,
        ranks=ranks,
        step_index=index,
        choices={kind: {"predicted": chosen.get(kind, "-"), "measured": ran[kind]} for kind in ran},
    )
    return comparison, measured_trace(steps, result.scenario)


def _scope_of(kind: str, calls) -> str:
    scopes = [c.scope for c in calls if c.kind == kind]
    return statistics.mode(scopes) if scopes else "intra_node"


def _differences(
    categories: list[Row],
    kinds: list[Row],
    chosen: dict[str, str],
    ran: dict[str, str],
    slow: tuple[int, float, float] | None,
    calls,
    on_gpu: bool,
) -> list[Difference]:
    """Every candidate, the largest first (:data:`NAMED` of them kept)."""
    found: list[Difference] = []
    by_name = {row.name: row for row in categories}
    comm_kinds = {row.name for row in kinds if row.name not in FIELD_OF_KIND}
    explained_comm = 0.0
    for row in kinds:
        delta = (row.second or 0.0) - (row.first or 0.0)
        if row.name in comm_kinds:
            scope = _scope_of(row.name, calls)
            explained_comm += delta
            if row.name in ran and chosen.get(row.name) and ran[row.name] != chosen[row.name]:
                mechanism = (
                    f"NCCL ran {row.name} as {ran[row.name]} where the model chose "
                    f"{chosen[row.name]}"
                )
            else:
                mechanism = f"{row.name} calls {'slower' if delta > 0 else 'faster'} than modelled"
            found.append(
                Difference(f"{row.name} calls", mechanism, f"comm.{row.name}.{scope}", delta)
            )
        else:
            verdict = "slower" if delta > 0 else "faster"
            found.append(
                Difference(
                    f"{row.name} kernels",
                    f"{row.name} kernels {verdict} than their shapes predict",
                    FIELD_OF_KIND.get(row.name, "gpu.op_table"),
                    delta,
                )
            )
    if slow is not None and slow[1] > 0:
        rank, excess, median = slow
        share = excess / median if median > 0 else 0.0
        found.append(
            Difference(
                f"rank {rank}",
                f"a slow rank: rank {rank} computed {share:.0%} more than its peers, who "
                "waited for it",
                "gpu.jitter",
                excess,
            )
        )
    exposed = by_name["exposed communication"]
    unexplained = (exposed.second or 0.0) - (exposed.first or 0.0) - max(0.0, explained_comm)
    if unexplained > 0:
        found.append(
            Difference(
                "communication beside compute",
                "an overlap the run did not get: communication the model hid ran exposed",
                "the recipe's overlap knobs (tp_comm_overlap, overlap_grad_reduce)",
                unexplained,
            )
        )
    host = by_name["host gaps (other)"]
    found.append(
        Difference(
            "host gaps",
            "a host-bound stretch: the GPU waited for the host to launch its next kernel"
            if on_gpu
            else "the host's own gaps between ops (the framework or executor between them)",
            "gpu.kernel_launch_overhead",
            (host.second or 0.0) - (host.first or 0.0),
        )
    )
    waiting = by_name["waiting (bubble, stall)"]
    extra = (waiting.second or 0.0) - (waiting.first or 0.0) - (slow[1] if slow else 0.0)
    found.append(
        Difference(
            "waiting",
            "ranks waited for one another longer than modelled (a bubble, a late peer)",
            "gpu.jitter",
            extra,
        )
    )
    found.sort(key=lambda d: -abs(d.seconds))
    return [d for d in found if d.seconds != 0][:NAMED]
