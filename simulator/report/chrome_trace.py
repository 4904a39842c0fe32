"""Write a Trace as a Chrome trace file, for Perfetto and chrome://tracing.

The output is the JSON-object form of the Chrome trace event format: one process per
rank (``pid`` is the rank) and one thread per stream. A stream's ``tid`` is a small
integer, the same on every rank: ``compute`` is 1, the other streams follow sorted by
name (0 is avoided because Perfetto reads ``tid`` 0 as "same as ``pid``"). Every op
becomes a complete event (``"ph": "X"``) whose ``ts`` and ``dur`` are in microseconds;
its ``args`` keep the op kind, bytes, FLOPs, tags, group or peer and ``ready_us``, the
instant the op was issued (for a collective, when this rank arrived). Communication ops
are named ``nccl:<kind> <label>`` so tools that look for NCCL kernels by name recognise
them. Each send is joined to its matching recv by a flow arrow: the n-th send from rank
a to rank b with a given micro-batch and phase matches the n-th recv on rank b from rank
a with the same micro-batch and phase, in program order (``op_id``).

The writer makes one pass over the records (plus a sort of each send/recv queue) and
encodes events as it goes; the same trace always gives a byte-identical file.
``max_events`` caps the number of op events: when the trace has more, a representative
subset of ranks is kept (see :func:`select_ranks`) and ``otherData.capped`` says what
was left out.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.trace import OpRecord, Trace, category_of

__all__ = [
    "chrome_trace_events",
    "write_chrome_trace",
    "trace_from_chrome",
    "select_ranks",
    "stream_order",
]

_COMM_OPS = frozenset({"collective", "send", "recv"})


SIDES = ("predicted", "measured")


def stream_order(streams: Iterable[str]) -> list[str]:
    """Streams in display order: ``compute`` first, then the others sorted by name.

    Streams of an overlay (``"predicted compute"``, ``"measured tp"``) keep the
    predicted ones above the measured ones, each side in that order."""

    def key(name: str) -> tuple[int, int, str]:
        side, _, stream = name.partition(" ")
        if side in SIDES and stream:
            return (SIDES.index(side), stream != "compute", stream)
        return (-1, name != "compute", name)

    return sorted(set(streams), key=key)


def select_ranks(
    counts: Mapping[int, int], budget: int, preferred: Sequence[int] | None = None
) -> list[int]:
    """The ranks to draw so that their op count fits ``budget``, in ascending order.

    ``counts`` maps each rank to its number of ops. When everything fits, every rank
    is kept. Otherwise the candidates are the ``preferred`` ranks that exist (all ranks
    when there are none), and the largest evenly spaced subset of the candidates that
    fits is kept, always including the first and the last candidate. At least one rank
    is returned, even if it alone exceeds the budget (the caller then truncates it).
    """
    ranks = sorted(counts)
    if not ranks:
        return []
    if sum(counts.values()) <= budget:
        return ranks
    pool = [r for r in dict.fromkeys(preferred or ()) if r in counts] or ranks
    total = sum(counts[r] for r in pool)
    if total <= budget:
        return sorted(pool)
    n = len(pool)
    k = max(1, min(n, int(budget // (total / n))))
    while k > 1:
        chosen = [pool[round(i * (n - 1) / (k - 1))] for i in range(k)]
        used = sum(counts[r] for r in chosen)
        if used <= budget:
            return sorted(chosen)
        k = max(1, min(k - 1, int(k * budget / used)))
    return [pool[0]]


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond."""
    return round(seconds * 1e6, 3)


def _mid_us(rec: OpRecord) -> float:
    """The middle of an op's slice: a flow event there binds to that slice even when
    another slice on the same thread ends exactly where this one starts."""
    return _us((rec.start + rec.end) / 2)


def _op_name(rec: OpRecord) -> str:
    if rec.op in _COMM_OPS:
        return f"nccl:{rec.kind} {rec.label}" if rec.label else f"nccl:{rec.kind}"
    return rec.label or rec.kind


def _complete_event(rec: OpRecord, tid: int) -> dict[str, Any]:
    ts = _us(rec.start)
    end = _us(rec.end)
    args: dict[str, Any] = {
        "label": rec.label,
        "op": rec.op,
        "kind": rec.kind,
        "op_id": int(rec.op_id),
        "bytes": float(rec.bytes),
        "flops": float(rec.flops),
        "tags": rec.tags,
        "ready_us": _us(rec.ready),
        "wait_us": round(ts - _us(rec.ready), 3),
    }
    if rec.group is not None:
        args["group"] = rec.group
    if rec.peer is not None:
        args["peer"] = rec.peer
    return {
        "name": _op_name(rec),
        "cat": category_of(rec),
        "ph": "X",
        "pid": int(rec.rank),
        "tid": tid,
        "ts": ts,
        "dur": max(0.0, round(end - ts, 3)),
        "args": args,
    }


def _metadata_events(
    lanes: Mapping[int, set[str]], tids: Mapping[str, int], gpus_per_node: int | None
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for key in sorted(lanes):
        rank = int(key)
        streams = stream_order(lanes[key])
        main_tid = tids[streams[0]]
        name = f"rank {rank}"
        if gpus_per_node:
            name += f" (node {rank // gpus_per_node})"
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "tid": main_tid,
                "args": {"name": name},
            }
        )
        events.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": rank,
                "tid": main_tid,
                "args": {"sort_index": rank},
            }
        )
        for stream in streams:
            tid = tids[stream]
            events.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": stream},
                }
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
    return events


def _p2p_key(rec: OpRecord, src: int, dst: int) -> tuple[Any, ...]:
    tags = rec.tags
    return (src, dst, repr(tags.get("microbatch")), repr(tags.get("phase")))


def _flow_events(
    records: Sequence[OpRecord], tids: Mapping[str, int]
) -> tuple[list[dict[str, Any]], int]:
    """Flow arrows from each send to its matching recv, and the number left unmatched."""
    sends: dict[tuple[Any, ...], list[tuple[int, int, OpRecord]]] = defaultdict(list)
    recvs: dict[tuple[Any, ...], list[tuple[int, int, OpRecord]]] = defaultdict(list)
    for i, rec in enumerate(records):
        if rec.peer is None:
            continue
        if rec.op == "send":
            sends[_p2p_key(rec, rec.rank, rec.peer)].append((rec.op_id, i, rec))
        elif rec.op == "recv":
            recvs[_p2p_key(rec, rec.peer, rec.rank)].append((rec.op_id, i, rec))

    events: list[dict[str, Any]] = []
    unmatched = 0
    flow_id = 0
    for key in sorted(sends.keys() | recvs.keys()):
        out = sorted(sends.get(key, []), key=lambda t: (t[0], t[1]))
        inc = sorted(recvs.get(key, []), key=lambda t: (t[0], t[1]))
        unmatched += abs(len(out) - len(inc))
        for (_, _, snd), (_, _, rcv) in zip(out, inc, strict=False):
            flow_id += 1
            common = {"name": "p2p", "cat": category_of(snd), "id": flow_id}
            events.append(
                {
                    **common,
                    "ph": "s",
                    "pid": int(snd.rank),
                    "tid": tids[snd.stream],
                    "ts": _mid_us(snd),
                }
            )
            events.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "pid": int(rcv.rank),
                    "tid": tids[rcv.stream],
                    "ts": _mid_us(rcv),
                }
            )
    return events, unmatched


def _kept_records(
    trace: Trace, max_events: int | None
) -> tuple[list[OpRecord], dict[str, Any] | None]:
    """The records to write and, when capped, a note of what was left out."""
    records = trace.records
    if max_events is None or len(records) <= max_events:
        return records, None
    counts: dict[int, int] = defaultdict(int)
    for rec in records:
        counts[rec.rank] += 1
    preferred = trace.meta.get("representative_ranks")
    keep = set(select_ranks(counts, max_events, preferred))
    kept = [rec for rec in records if rec.rank in keep]
    truncated = len(kept) > max_events
    if truncated:
        kept.sort(key=lambda r: (r.start, r.rank, r.op_id))
        kept = kept[:max_events]
    note = {
        "max_events": max_events,
        "ranks_shown": sorted(keep),
        "ranks_total": len(counts),
        "events_shown": len(kept),
        "events_total": len(records),
        "truncated_in_time": truncated,
    }
    return kept, note


class _Plan:
    """Everything the writer needs, computed in one pass before any op event is made."""

    def __init__(self, trace: Trace, max_events: int | None) -> None:
        self.records, capped = _kept_records(trace, max_events)
        lanes: dict[int, set[str]] = defaultdict(set)
        for rec in self.records:
            lanes[rec.rank].add(rec.stream)
        all_streams: set[str] = set()
        for streams in lanes.values():
            all_streams |= streams
        self.tids = {stream: i for i, stream in enumerate(stream_order(all_streams), start=1)}
        gpus_per_node = trace.meta.get("gpus_per_node")
        self.metadata = _metadata_events(
            lanes, self.tids, int(gpus_per_node) if gpus_per_node else None
        )
        self.flows, unmatched = _flow_events(self.records, self.tids)
        other: dict[str, Any] = dict(trace.meta)
        other.setdefault("step_time_s", trace.step_time)
        if unmatched:
            other["unmatched_p2p"] = unmatched
        if capped is not None:
            other["capped"] = capped
        self.other = other

    def op_events(self) -> Iterator[dict[str, Any]]:
        tids = self.tids
        for rec in self.records:
            yield _complete_event(rec, tids[rec.stream])


def chrome_trace_events(trace: Trace, max_events: int | None = None) -> dict[str, Any]:
    """The Chrome trace (JSON object form) of ``trace``, as a dict ready for ``json``.

    ``max_events`` caps the number of op events (``None`` keeps every op).
    """
    plan = _Plan(trace, max_events)
    events = [*plan.metadata, *plan.op_events(), *plan.flows]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": plan.other}


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
_CHUNK = 20000


def write_chrome_trace(trace: Trace, path: str | Path, max_events: int | None = None) -> None:
    """Write ``trace`` as a Chrome trace JSON file at ``path``, one event per line.

    Open it in https://ui.perfetto.dev or chrome://tracing. Events are encoded as they
    are made, so memory stays small for large traces; the same trace always gives a
    byte-identical file. ``max_events`` caps the number of op events.
    """
    plan = _Plan(trace, max_events)
    encode = _ENCODER.encode
    events = itertools.chain(plan.metadata, plan.op_events(), plan.flows)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"displayTimeUnit":"ms",\n"otherData":')
        fh.write(encode(plan.other))
        fh.write(',\n"traceEvents":[\n')
        first = True
        while chunk := list(itertools.islice(events, _CHUNK)):
            if not first:
                fh.write(",\n")
            fh.write(",\n".join(map(encode, chunk)))
            first = False
        fh.write("\n]}\n")


def trace_from_chrome(document: dict[str, Any]) -> Trace:
    """Read back a Trace written by :func:`write_chrome_trace` (op records only)."""
    thread_names: dict[tuple[int, int], str] = {}
    for event in document.get("traceEvents", []):
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            thread_names[(event["pid"], event["tid"])] = event["args"]["name"]
    records = []
    for event in document.get("traceEvents", []):
        if event.get("ph") != "X":
            continue
        args = event["args"]
        start = event["ts"] / 1e6
        records.append(
            OpRecord(
                rank=event["pid"],
                op_id=args["op_id"],
                stream=thread_names.get((event["pid"], event["tid"]), str(event["tid"])),
                op=args["op"],
                kind=args["kind"],
                label=args.get("label", event["name"]),
                tags=args.get("tags", {}),
                ready=args.get("ready_us", event["ts"]) / 1e6,
                start=start,
                end=start + event["dur"] / 1e6,
                bytes=args.get("bytes", 0.0),
                flops=args.get("flops", 0.0),
                group=args.get("group"),
                peer=args.get("peer"),
            )
        )
    other = dict(document.get("otherData", {}))
    return Trace(records=records, step_time=float(other.pop("step_time_s", 0.0)), meta=other)
