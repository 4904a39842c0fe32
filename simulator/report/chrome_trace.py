"""Write a Trace as a Chrome trace file, for Perfetto, chrome://tracing and HTA.

The output is the JSON-object form of the Chrome trace event format: one process per
rank (``pid`` is the rank) and one thread per stream. A stream's ``tid`` is a small
integer, the same on every rank: ``compute`` is 1, the other streams follow sorted by
name (0 is avoided because Perfetto reads ``tid`` 0 as "same as ``pid``"). Every op
becomes a complete event (``"ph": "X"``) whose ``ts`` and ``dur`` are in microseconds;
its ``args`` keep the op kind, bytes, FLOPs, tags, group or peer and ``ready_us``, the
instant the op was issued (for a collective, when this rank arrived). Communication ops
are named ``nccl:<kind> <label>``.

Two kinds of flow arrows link the ranks:

* each send is joined to its matching recv by a flow event pair (``"ph": "s"`` on the
  send, ``"ph": "f"`` on the recv, ids 1, 2, ...): the n-th send from rank a to rank b
  with a given micro-batch and phase matches the n-th recv on rank b from rank a with
  the same micro-batch and phase, in program order (``op_id``);
* the members of each collective instance are chained by flow-v2 fields on their own
  complete events (``bind_id``, ``flow_out`` on the first member, ``flow_in`` and
  ``flow_out`` on the middle ones, ``flow_in`` on the last, in order of slice start).
  As in NCCL, the collectives of one group are matched by their order on that group:
  the n-th collective of group g on every rank is one instance. Members are numbered on
  each rank's full op list, so capping never links ops of different instances. The
  bind ids start at 2**32, above any id a viewer gives to the send/recv flows.

The top-level ``distributedInfo`` (``backend``, ``rank``, ``world_size``) is what
Holistic Trace Analysis (HTA) reads to place a file; the combined file gives the lowest
rank it shows and lists all of them in ``otherData.ranks_in_file``.
:func:`write_rank_traces` writes one file per rank in the form HTA's parser expects of
a PyTorch-profiler trace: GPU work has ``"cat": "kernel"`` and ``args.stream``,
``args.device`` and ``args.correlation``, and communication kernels are named
``ncclDevKernel_<Kind>`` (HTA recognises them by the pattern ``^nccl.*Kernel``).

The writer makes one pass over the records (plus a sort of each send/recv queue and
collective group) and encodes events as it goes; the same trace always gives a
byte-identical file. ``max_events`` caps the number of op events: when the trace has
more, a representative subset of ranks is kept (see :func:`select_ranks`) and
``otherData.capped`` says what was left out.
"""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import math
import sys
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeGuard

from simulator.analysis.trace import OpRecord, Trace, category_of
from simulator.common.errors import ParasimError
from simulator.common.machine import machine_memory

__all__ = [
    "chrome_trace_events",
    "write_chrome_trace",
    "write_rank_traces",
    "rank_trace_name",
    "trace_from_chrome",
    "read_trace_file",
    "read_bounded",
    "parse_json",
    "json_kind",
    "find_trace_file",
    "largest_trace_text",
    "TraceFileError",
    "TRACE_NAMES",
    "select_ranks",
    "stream_order",
]

_COMM_OPS = frozenset({"collective", "send", "recv"})

# Perfetto numbers the send/recv (v1) flows it reads with a 32-bit counter from 0 and
# keeps the collective (v2) bind ids as written, in the same table: starting the bind
# ids at 2**32 keeps the two apart.
_COLLECTIVE_BIND_BASE = 1 << 32


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


#: One send-to-recv arrow: its category, then the send's rank, thread and instant (µs),
#: then the recv's; arrow ``i`` of a list has the flow id ``i + 1``.
_Flow = tuple[str, int, int, float, int, int, float]


def _flow_arrows(records: Sequence[OpRecord], tids: Mapping[str, int]) -> tuple[list[_Flow], int]:
    """Flow arrows from each send to its matching recv, and the number left unmatched.

    A send and a recv match on their two ranks, micro-batch and phase; where a key has
    more than one of either, they pair in program order (``op_id``, then position).
    Arrows are listed in key order: by the two ranks, then by micro-batch and phase
    compared by their ``repr`` (so that any values sort), joined by a NUL (which no
    ``repr`` holds) into one string that sorts as the pair would. A key's sends and
    recvs are one position each as a rule, a list only where there are more."""
    sends: dict[tuple[Any, ...], Any] = {}
    recvs: dict[tuple[Any, ...], Any] = {}
    for i, rec in enumerate(records):
        peer = rec.peer
        if peer is None:
            continue
        op = rec.op
        if op == "send":
            ends, src, dst = sends, rec.rank, peer
        elif op == "recv":
            ends, src, dst = recvs, peer, rec.rank
        else:
            continue
        tags = rec.tags
        microbatch, phase = tags.get("microbatch"), tags.get("phase")
        # typed, as their reprs would be: 1, 1.0 and True are three micro-batches
        key = (src, dst, type(microbatch), microbatch, type(phase), phase)
        found = ends.get(key)
        if found is None:
            ends[key] = i
        elif type(found) is int:
            ends[key] = [found, i]
        else:
            found.append(i)

    def in_order(found: Any) -> list[int]:
        if found is None:
            return []
        if type(found) is int:
            return [found]
        return sorted(found, key=lambda i: (records[i].op_id, i))

    def order(key: tuple[Any, ...]) -> tuple[Any, Any, str]:
        return key[0], key[1], f"{key[3]!r}\x00{key[5]!r}"

    arrows: list[_Flow] = []
    unmatched = 0
    for key in sorted(sends.keys() | recvs.keys(), key=order):
        out, inc = sends.get(key), recvs.get(key)
        if type(out) is int and type(inc) is int:  # one of each, the rule
            pairs: Iterable[tuple[int, int]] = ((out, inc),)
        else:
            out, inc = in_order(out), in_order(inc)
            unmatched += abs(len(out) - len(inc))
            pairs = zip(out, inc, strict=False)
        for s, r in pairs:
            snd, rcv = records[s], records[r]
            arrows.append(
                (
                    category_of(snd),
                    int(snd.rank),
                    tids[snd.stream],
                    _mid_us(snd),
                    int(rcv.rank),
                    tids[rcv.stream],
                    _mid_us(rcv),
                )
            )
    return arrows, unmatched


def _flow_events(arrows: Iterable[_Flow]) -> Iterator[dict[str, Any]]:
    """The flow event pairs (``"ph": "s"`` on the send, ``"f"`` on the recv) of
    ``arrows``, as dicts."""
    for flow_id, (cat, src, src_tid, src_ts, dst, dst_tid, dst_ts) in enumerate(arrows, 1):
        common = {"name": "p2p", "cat": cat, "id": flow_id}
        yield {**common, "ph": "s", "pid": src, "tid": src_tid, "ts": src_ts}
        yield {**common, "ph": "f", "bp": "e", "pid": dst, "tid": dst_tid, "ts": dst_ts}


def _flow_texts(arrows: Iterable[_Flow]) -> Iterator[str]:
    """:func:`_flow_events`, each already encoded as ``_ENCODER`` would encode it."""
    for flow_id, (cat, src, src_tid, src_ts, dst, dst_tid, dst_ts) in enumerate(arrows, 1):
        common = f'"cat":{_string(cat)},"id":{flow_id},"name":"p2p","ph":'
        yield f'{{{common}"s","pid":{src},"tid":{src_tid},"ts":{_number(src_ts)}}}'
        yield f'{{"bp":"e",{common}"f","pid":{dst},"tid":{dst_tid},"ts":{_number(dst_ts)}}}'


def _group_order(
    records: Iterable[OpRecord], ranks: set[int]
) -> dict[tuple[str, int], list[OpRecord]]:
    """The collectives of ``ranks``, keyed by ``(group, n)``: the n-th collective on that
    group in each rank's program order (``op_id``), NCCL's matching rule."""
    queues: dict[tuple[int, str], list[tuple[int, int, OpRecord]]] = defaultdict(list)
    for i, rec in enumerate(records):
        if rec.op == "collective" and rec.group is not None and rec.rank in ranks:
            queues[(rec.rank, rec.group)].append((rec.op_id, i, rec))
    instances: dict[tuple[str, int], list[OpRecord]] = defaultdict(list)
    for (_, group), queue in queues.items():
        queue.sort(key=lambda t: (t[0], t[1]))
        for n, (_, _, rec) in enumerate(queue):
            instances[(group, n)].append(rec)
    return instances


def _collective_binds(
    all_records: Sequence[OpRecord], kept: Sequence[OpRecord]
) -> dict[int, dict[str, Any]]:
    """Flow-v2 fields chaining the members of each collective instance, by position in
    ``kept``. Instances are numbered on ``all_records`` (every op of each kept rank), so
    a cap that cuts a rank short never shifts the matching; instances with fewer than
    two members shown get no arrow. A chain runs in order of slice start, then of
    position in the file, so its first event is the first a viewer reads."""
    position = {id(rec): i for i, rec in enumerate(kept) if rec.op == "collective"}
    if not position:
        return {}
    instances = _group_order(all_records, {rec.rank for rec in kept})
    binds: dict[int, dict[str, Any]] = {}
    bind_id = _COLLECTIVE_BIND_BASE
    for key in sorted(instances):
        shown = sorted(
            (_us(rec.start), position[id(rec)]) for rec in instances[key] if id(rec) in position
        )
        if len(shown) < 2:
            continue
        last = len(shown) - 1
        for j, (_, pos) in enumerate(shown):
            fields: dict[str, Any] = {"bind_id": bind_id}
            if j > 0:
                fields["flow_in"] = True
            if j < last:
                fields["flow_out"] = True
            binds[pos] = fields
        bind_id += 1
    return binds


def _world_size(trace: Trace) -> int:
    """The job's world size: ``meta["world"]`` when the trace has it, else one more than
    the highest rank."""
    world = trace.meta.get("world")
    if isinstance(world, int | float) and not isinstance(world, bool) and world > 0:
        return int(world)
    return max((int(rec.rank) for rec in trace.records), default=0) + 1


def _distributed_info(rank: int, world_size: int) -> dict[str, Any]:
    return {"backend": "nccl", "rank": int(rank), "world_size": int(world_size)}


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
        self.gpus_per_node = int(gpus_per_node) if gpus_per_node else None
        self.lanes = lanes
        self.metadata = _metadata_events(lanes, self.tids, self.gpus_per_node)
        self.arrows, unmatched = _flow_arrows(self.records, self.tids)
        self.binds = _collective_binds(trace.records, self.records)
        self.ranks = sorted(lanes)
        self.world_size = _world_size(trace)
        self.distributed = _distributed_info(self.ranks[0] if self.ranks else 0, self.world_size)
        other: dict[str, Any] = dict(trace.meta)
        other.setdefault("step_time_s", trace.step_time)
        other["ranks_in_file"] = self.ranks
        if unmatched:
            other["unmatched_p2p"] = unmatched
        if capped is not None:
            other["capped"] = capped
        self.other = other

    def op_events(self) -> Iterator[dict[str, Any]]:
        tids, binds = self.tids, self.binds
        for i, rec in enumerate(self.records):
            event = _complete_event(rec, tids[rec.stream])
            if i in binds:
                event.update(binds[i])
            yield event

    def op_event_texts(self) -> Iterator[str]:
        """:meth:`op_events`, each already encoded as ``_ENCODER`` would encode it
        (:func:`_encode_complete`): the writer's hot loop."""
        tids, binds = self.tids, self.binds
        cache = _TextCache()
        for i, rec in enumerate(self.records):
            yield _encode_complete(rec, tids[rec.stream], binds.get(i), cache)


def chrome_trace_events(trace: Trace, max_events: int | None = None) -> dict[str, Any]:
    """The Chrome trace (JSON object form) of ``trace``, as a dict ready for ``json``.

    ``max_events`` caps the number of op events (``None`` keeps every op).
    """
    plan = _Plan(trace, max_events)
    events = [*plan.metadata, *plan.op_events(), *_flow_events(plan.arrows)]
    return {
        "distributedInfo": plan.distributed,
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": plan.other,
    }


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
_string = json.encoder.encode_basestring_ascii  # the encoder's own (ensure_ascii)


# what ``repr`` calls the floats JSON has its own names for
_SPECIAL_NUMBERS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _number(value: float) -> str:
    """A float as ``_ENCODER`` writes it (``repr``, and JSON's names for the rest)."""
    text = repr(value)
    return _SPECIAL_NUMBERS.get(text, text)


def _rounded_text(value: float) -> str:
    """``_number(round(value, 3))``, about three times faster: the ``.3f`` format rounds as
    ``round`` does (both correctly, half to even, on the exact binary value), and below
    10¹² the shortest text that reads back as the rounded float is that decimal
    without its trailing zeros (``repr`` writes no exponent there)."""
    if -1e12 < value < 1e12:
        text = f"{value:.3f}".rstrip("0")
        return text + "0" if text[-1] == "." else text
    return _number(round(value, 3))


def _tags_text(tags: dict[str, Any], shapes: dict[tuple[Any, ...], Any] | None = None) -> str:
    """``_ENCODER.encode(tags)``, written out directly for the usual flat tags (string
    keys; int, string or float values). ``shapes`` holds, by a dict's keys in their
    own order, those keys sorted with their encoded ``"key":`` text, so that tags of
    one shape are sorted and escaped once."""
    shape = tuple(tags)
    order = None if shapes is None else shapes.get(shape)
    if order is None:
        if not all(type(key) is str for key in shape):  # the encoder's own sort and names
            return _ENCODER.encode(tags)
        order = [(key, f"{_string(key)}:") for key in sorted(shape)]
        if shapes is not None:
            shapes[shape] = order
    parts = []
    for key, key_text in order:
        value = tags[key]
        kind = type(value)
        if kind is str:
            parts.append(key_text + _string(value))
        elif kind is int:
            parts.append(key_text + int.__repr__(value))
        elif kind is float:
            parts.append(key_text + _number(value))
        else:
            return _ENCODER.encode(tags)
    return "{" + ",".join(parts) + "}"


class _TextCache:
    """What one writer has already encoded: each tags dict with its category for the
    op type first seen with it (by identity, kept alive here so that no other dict
    takes its id), and the fixed text around each shape of op (:func:`_op_shape`)."""

    __slots__ = ("tags", "shapes", "ops")

    def __init__(self) -> None:
        self.tags: dict[int, tuple[dict[str, Any], str, str, str]] = {}
        self.shapes: dict[tuple[Any, ...], Any] = {}
        self.ops: dict[tuple[Any, ...], tuple[str, str, str, str, str]] = {}


def _op_shape(rec: OpRecord, tid: int) -> tuple[str, str, str, str, str]:
    """The text an op event holds around what changes from op to op (label, op id,
    instants, tags), for every op of the same shape: rank, thread, op, kind, bytes,
    FLOPs, group and peer. In order: up to the label, from it to the op id, from there
    to ``ready_us``, the name's opening (before the label), and from ``"ph"`` to
    ``"ts"``."""
    head = f'{{"args":{{"bytes":{_number(float(rec.bytes))},"flops":{_number(float(rec.flops))}'
    if rec.group is not None:
        head += f',"group":{_ENCODER.encode(rec.group)}'
    head += f',"kind":{_string(rec.kind)},"label":'
    middle = f',"op":{_string(rec.op)},"op_id":'
    peer = rec.peer
    ready = ""
    if peer is not None:
        ready = f',"peer":{int.__repr__(peer) if type(peer) is int else _ENCODER.encode(peer)}'
    ready += ',"ready_us":'
    # the name is the label, or the kind without one; a communication op's has an
    # "nccl:<kind> " before it: its JSON string is that text, then the label's own
    # string without its opening quote (neither part escapes across the join)
    name = _string(f"nccl:{rec.kind} ")[:-1] if rec.op in _COMM_OPS else '"'
    tail = f',"ph":"X","pid":{int(rec.rank)},"tid":{int(tid)},"ts":'
    return head, middle, ready, name, tail


def _encode_complete(
    rec: OpRecord, tid: int, bind: dict[str, Any] | None, cache: _TextCache | None = None
) -> str:
    """``_ENCODER.encode`` of :func:`_complete_event` (with ``bind``'s fields), written
    out key by key in sorted order: several times faster, byte for byte the same
    (``tests/test_trace_format.py`` holds them equal). ``cache`` carries what earlier
    calls of one writer encoded."""
    if cache is None:
        cache = _TextCache()
    start = rec.start
    ts_text = _rounded_text(start * 1e6)
    ts = float(ts_text)  # the rounded float itself (JSON's names read back too)
    if rec.ready == start and ts - ts == 0.0:  # issued as it began (and finite): waited 0
        ready_text, wait_text = ts_text, "0.0"
    else:
        ready_text = _rounded_text(rec.ready * 1e6)
        wait_text = _rounded_text(ts - float(ready_text))
    end = rec.end
    if end == start:
        duration_text = "0.0"
    else:
        duration_text = _rounded_text(round(end * 1e6, 3) - ts)
        if duration_text[0] in "-N":  # max(0.0, ...): negative, -0.0 or NaN is 0.0
            duration_text = "0.0"
    tags = rec.tags
    known = cache.tags.get(id(tags))
    if known is None or known[0] is not tags:
        known = cache.tags[id(tags)] = (
            tags,
            _tags_text(tags, cache.shapes),
            rec.op,
            _string(category_of(rec)),
        )
    # the category follows the tags and the op type (ops of two types may share tags)
    cat_text = known[3] if known[2] == rec.op else _string(category_of(rec))
    shape = (rec.rank, tid, rec.op, rec.kind, rec.bytes, rec.flops, rec.group, rec.peer)
    parts = cache.ops.get(shape)
    if parts is None:
        parts = cache.ops[shape] = _op_shape(rec, tid)
    head, middle, ready, name, tail = parts
    label = rec.label
    if label:
        label_text = _string(label)
        name_text = name + label_text[1:]
    else:
        label_text = '""'
        name_text = name[:-1] + '"' if name != '"' else _string(rec.kind)
    text = (
        f"{head}{label_text}{middle}{int(rec.op_id)}{ready}{ready_text}"
        f',"tags":{known[1]},"wait_us":{wait_text}}}'
    )
    if bind is None:
        return f'{text},"cat":{cat_text},"dur":{duration_text},"name":{name_text}{tail}{ts_text}}}'
    text += f',"bind_id":{int(bind["bind_id"])},"cat":{cat_text},"dur":{duration_text}'
    if bind.get("flow_in"):
        text += ',"flow_in":true'
    if bind.get("flow_out"):
        text += ',"flow_out":true'
    return f'{text},"name":{name_text}{tail}{ts_text}}}'


_CHUNK = 20000


class _SpillingSink:
    """The text of one file, written plain unless it grows past ``limit`` characters:
    then the rest streams through gzip (level 1: fast, and event JSON compresses about
    tenfold; no time stamp in the header, so equal traces give equal bytes). Until the
    limit is passed the text is held in memory, so at most ``limit`` characters are.

    Gzip compresses on a thread of its own, a chunk at a time and in order, while the
    caller encodes the next chunk: zlib lets go of the interpreter while it works, so
    the two share a second core where there is one. At most two chunks wait."""

    def __init__(self, path: str | Path, limit: int | None) -> None:
        self.path, self.limit = Path(path), limit
        self.held: list[str] = []
        self.size = 0
        self.file: Any = open(self.path, "w", encoding="utf-8") if limit is None else None
        self.raw: Any = None
        self.zipper: ThreadPoolExecutor | None = None
        self.pending: collections.deque[Future[Any]] = collections.deque()

    @property
    def gzipped(self) -> bool:
        return self.raw is not None

    def write(self, text: str) -> None:
        if self.zipper is not None:
            self._compress(self.zipper, text)
            return
        if self.file is not None:
            self.file.write(text)
            return
        self.held.append(text)
        self.size += len(text)
        if self.limit is not None and self.size > self.limit:
            self.raw = open(self.path, "wb")
            self.file = gzip.GzipFile(
                filename="", mode="wb", fileobj=self.raw, compresslevel=1, mtime=0
            )
            self.zipper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-gzip")
            self._compress(self.zipper, "".join(self.held))
            self.held = []

    def _compress(self, zipper: ThreadPoolExecutor, text: str) -> None:
        while len(self.pending) >= 2:
            self.pending.popleft().result()
        self.pending.append(zipper.submit(self.file.write, text.encode("utf-8")))

    def close(self) -> None:
        if self.file is None:  # under the limit: written plain, in one go
            self.path.write_text("".join(self.held), encoding="utf-8")
            return
        try:
            if self.zipper is not None:
                try:
                    while self.pending:
                        self.pending.popleft().result()
                finally:
                    self.zipper.shutdown(wait=True, cancel_futures=True)
        finally:
            self.file.close()
            if self.raw is not None:
                self.raw.close()


def _write_document(
    path: str | Path,
    distributed: dict[str, Any],
    other: dict[str, Any],
    events: Iterable[dict[str, Any] | str],
    gzip_over: int | None = None,
) -> bool:
    """Write one trace document, one event per line; past ``gzip_over`` characters,
    gzipped (:class:`_SpillingSink`). Returns whether it was. ``distributedInfo`` comes
    first, on its own line and with a space after each colon: HTA finds a file's rank
    by searching the first lines for ``"rank": <n>`` before it parses anything."""
    encode = _ENCODER.encode
    events = iter(events)

    def text(event: dict[str, Any] | str) -> str:
        return event if isinstance(event, str) else encode(event)

    sink = _SpillingSink(path, gzip_over)
    try:
        sink.write('{"distributedInfo": ')
        sink.write(json.dumps(distributed, sort_keys=True))
        sink.write(',\n"displayTimeUnit":"ms",\n"otherData":')
        sink.write(encode(other))
        sink.write(',\n"traceEvents":[\n')
        first = True
        while chunk := list(itertools.islice(events, _CHUNK)):
            if not first:
                sink.write(",\n")
            sink.write(",\n".join(map(text, chunk)))
            first = False
        sink.write("\n]}\n")
    finally:
        sink.close()
    return sink.gzipped


def write_chrome_trace(
    trace: Trace, path: str | Path, max_events: int | None = None, gzip_over: int | None = None
) -> bool:
    """Write ``trace`` as a Chrome trace JSON file at ``path``, one event per line.

    Open it in https://ui.perfetto.dev or chrome://tracing. Events are encoded as they
    are made, so memory stays small for large traces; the same trace always gives a
    byte-identical file. ``max_events`` caps the number of op events. With
    ``gzip_over``, a file that would be larger than that many bytes is written gzipped
    instead (which Perfetto and chrome://tracing open as it is); the return value says
    whether it was.
    """
    plan = _Plan(trace, max_events)
    events: Iterator[dict[str, Any] | str] = itertools.chain(
        plan.metadata, plan.op_event_texts(), _flow_texts(plan.arrows)
    )
    return _write_document(path, plan.distributed, plan.other, events, gzip_over)


def rank_trace_name(rank: int) -> str:
    """The file name :func:`write_rank_traces` gives the trace of ``rank``."""
    return f"rank{int(rank)}.trace.json"


def _kernel_name(rec: OpRecord) -> str:
    """A GPU kernel name in the form HTA classifies: ``ncclDevKernel_<Kind>`` for
    communication (``all_reduce`` becomes ``ncclDevKernel_AllReduce``), the op kind
    (``gemm``, ``attention``...) for compute, so kernels of one kind add up together."""
    if rec.op in _COMM_OPS:
        return "ncclDevKernel_" + "".join(part.capitalize() for part in rec.kind.split("_"))
    return rec.kind


def _whole_us(seconds: float) -> int:
    """Seconds to whole microseconds, rounded to the nearest (half up)."""
    return math.floor(_us(seconds) + 0.5)


def _kernel_event(rec: OpRecord, tid: int, device: int, correlation: int) -> dict[str, Any]:
    """An op as a GPU kernel of a PyTorch-profiler trace: the stream is its thread and
    the display category moves into ``args.category``.

    ``ts`` and ``dur`` are whole microseconds (``args.ready_us`` keeps nanoseconds):
    HTA rounds fractional timestamps inward (start up, end down), which gives a kernel
    shorter than a microsecond a negative duration and breaks its breakdowns. Both
    ends are rounded to the nearest microsecond instead, so back-to-back ops stay
    back-to-back and no duration is negative."""
    event = _complete_event(rec, tid)
    start = _whole_us(rec.start)
    event["ts"] = start
    event["dur"] = max(0, _whole_us(rec.end) - start)
    event["args"].update(
        category=event["cat"],
        device=device,
        stream=tid,
        correlation=correlation,
    )
    event["name"] = _kernel_name(rec)
    event["cat"] = "kernel"
    return event


def _rank_events(plan: _Plan, rank: int, records: Iterable[OpRecord]) -> Iterator[dict[str, Any]]:
    """The events of one rank's file: its metadata, then its ``records`` as kernels."""
    yield from _metadata_events({rank: plan.lanes[rank]}, plan.tids, plan.gpus_per_node)
    device = rank % plan.gpus_per_node if plan.gpus_per_node else rank
    for correlation, rec in enumerate(records, start=1):
        yield _kernel_event(rec, plan.tids[rec.stream], device, correlation)


def write_rank_traces(
    trace: Trace, folder: str | Path, max_events: int | None = None
) -> list[Path]:
    """Write one trace file per rank shown into ``folder``, for Holistic Trace Analysis.

    Each file (named by :func:`rank_trace_name`) holds that rank's ops as GPU kernels
    (``"cat": "kernel"`` with ``args.stream``, ``args.device``, the rank's GPU on its
    node, and ``args.correlation``), communication named ``ncclDevKernel_<Kind>``, and
    its own ``distributedInfo``; ``hta.trace_analysis.TraceAnalysis(trace_dir=folder)``
    reads the folder as one job (keep other JSON files out of it: HTA takes every
    ``.json`` there for a rank's trace). Files have no flow arrows, which would span two
    files. The ranks shown are those of :func:`write_chrome_trace` with the same
    ``max_events``. Returns the paths written, in rank order; the same trace always
    gives byte-identical files.
    """
    plan = _Plan(trace, max_events)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    by_rank: dict[int, list[OpRecord]] = defaultdict(list)
    for rec in plan.records:
        by_rank[rec.rank].append(rec)
    paths = []
    for rank in plan.ranks:
        path = out / rank_trace_name(rank)
        other = {**plan.other, "ranks_in_file": [rank]}
        for key in ("idle", "stage_of_rank"):  # per-rank metadata: this rank's only
            if isinstance(other.get(key), dict):
                other[key] = {k: v for k, v in other[key].items() if k == str(rank)}
        distributed = _distributed_info(rank, plan.world_size)
        _write_document(path, distributed, other, _rank_events(plan, rank, by_rank[rank]))
        paths.append(path)
    return paths


# ------------------------------------------------------------------------- reading back


class TraceFileError(ParasimError):
    """A trace file that cannot be read back: missing, not JSON, too large, or not the
    Chrome trace parasim writes (one line naming the file, the event and the field)."""


#: Python holds a parsed trace in about 5 bytes of memory per byte of its text (4 for
#: the JSON objects and 1 for the op records, measured on gpt3-175b's 42 MB trace), plus
#: the text itself: 6 in all. ``parasim compare`` reads two traces, in at most half the
#: machine's memory (as :func:`~simulator.run.simulate.check_size` allows a run).
TRACE_READ_BYTES_PER_BYTE = 6
#: The largest trace text read where the machine's memory is unknown: 1 GB (a
#: 3,072-GPU step's representative ranks write about 80 MB).
TRACE_TEXT_FALLBACK = 1_000_000_000
#: The longest time a trace may hold, in microseconds: about 31 years. Far above any
#: step, and low enough that sums of millions of durations stay finite.
LONGEST_TRACE_US = 1e15
#: The highest rank (a Chrome trace's ``pid``) read back.
HIGHEST_RANK = 2**31 - 1
#: The names of parasim's trace files, plain and gzipped (:func:`find_trace_file`).
TRACE_NAMES = ("trace.json", "trace.json.gz")


def largest_trace_text() -> int:
    """The most characters of trace text :func:`read_trace_file` reads: what two traces
    take to read in half the machine's memory (:data:`TRACE_READ_BYTES_PER_BYTE`)."""
    available = machine_memory()
    if available is None:
        return TRACE_TEXT_FALLBACK
    return int(available / 2 / (2 * TRACE_READ_BYTES_PER_BYTE))


def find_trace_file(folder: Path) -> Path | None:
    """The trace file of a run folder: ``trace.json``, or ``trace.json.gz`` (a large
    trace); the newer where both are there; None where neither is."""
    found = [folder / name for name in TRACE_NAMES if (folder / name).exists()]
    if not found:
        return None
    return max(found, key=lambda path: path.stat().st_mtime)


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the file ``path`` (decompressed when its name ends in ``.gz``),
    refused past ``limit`` bytes before more are read, as it is when it is not a file
    (a folder, a device, a pipe that would never end) or cannot be read: a
    :class:`TraceFileError` in one line."""
    try:
        if not path.is_file():
            raise TraceFileError(f"{path}: not a file")
        size = path.stat().st_size
        if path.suffix != ".gz":
            if size > limit:
                raise TraceFileError(f"{path}: {size:,} bytes; parasim reads at most {limit:,}")
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
        else:
            with gzip.open(path, "rb") as handle:
                data = handle.read(limit + 1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceFileError(f"{path}: not a readable gzip file ({exc})") from None
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise TraceFileError(f"{path}: more than {limit:,} bytes; parasim reads at most that")
    return data


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON has")


def parse_json(data: bytes, source: str) -> Any:
    """The JSON value of ``data``, the bytes of a file parasim wrote (a trace, a result)
    read back strictly: anything that is not UTF-8 JSON (``NaN`` and ``Infinity``
    included, and integers of thousands of digits) or nests deeper than Python parses is
    a :class:`TraceFileError` naming ``source``, in one line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"{source}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # NaN, Infinity, an integer of thousands of digits
        raise TraceFileError(f"{source}: not JSON parasim reads ({exc})") from None
    except RecursionError:
        raise TraceFileError(f"{source}: JSON nested deeper than parasim reads") from None


def read_trace_file(path: Path, limit: int | None = None) -> Trace:
    """The Trace of the Chrome trace file at ``path`` (``.gz``: gzipped), as
    :func:`trace_from_chrome` reads it. Anything it cannot read is a
    :class:`TraceFileError` in one line: a file that is not there or not a file, more
    than ``limit`` bytes of text (default :func:`largest_trace_text`), not gzip, not
    UTF-8, not JSON (``NaN`` and ``Infinity`` included), nested deeper than Python
    parses, or not a trace."""
    data = read_bounded(Path(path), largest_trace_text() if limit is None else limit)
    return trace_from_chrome(parse_json(data, str(path)), str(path))


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _float(value: Any, where: str, field: str) -> float:
    """``value``, a JSON number, as a float (an integer too large for one is infinite),
    or the error."""
    if not _is_number(value):
        raise TraceFileError(f"{where}: {field} is {_shown(value)}, not a number")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _time_us(value: Any, where: str, field: str, lowest: float = -LONGEST_TRACE_US) -> float:
    """``value`` as a time in microseconds within the trace's bounds, or the error."""
    number = _float(value, where, field)
    if not (lowest <= number <= LONGEST_TRACE_US):
        raise TraceFileError(
            f"{where}: {field} is {_shown(value)}, not a time between {lowest:g} and "
            f"{LONGEST_TRACE_US:g} µs"
        )
    return number


def _count(value: Any, where: str, field: str) -> float:
    """A byte or FLOP count: a finite number of at least 0."""
    number = _float(value, where, field)
    if not (0 <= number < math.inf):
        raise TraceFileError(f"{where}: {field} is {_shown(value)}, not a finite count")
    return number


def _integer(value: Any, where: str, field: str, highest: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= highest:
        raise TraceFileError(
            f"{where}: {field} is {_shown(value)}, not an integer from 0 to {highest}"
        )
    return value


def _text(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise TraceFileError(f"{where}: {field} is {_shown(value)}, not a string")
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: ``an object``, ``null``, ``a string``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    return names.get(type(value), "a number")


def _shown(value: Any) -> str:
    """A value of a file, short, for a message."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


_SCALARS = (str, int, float, bool, type(None))


#: The tags the reports compute with, beside the names and numbers they only show: the
#: category's (:func:`~simulator.analysis.trace.category_of`) and a merged bar's busy time.
_NAME_TAGS = ("phase", "axis")


def _tags(value: Any, where: str) -> dict[str, Any]:
    """``args.tags``: an object of plain values (parasim's tags are names and numbers),
    ``phase`` and ``axis`` names, ``busy_s`` a count."""
    if not isinstance(value, dict):
        raise TraceFileError(f"{where}: args.tags is {_shown(value)}, not an object")
    for key, item in value.items():
        if not isinstance(item, _SCALARS) or (isinstance(item, float) and not math.isfinite(item)):
            raise TraceFileError(f"{where}: args.tags.{key} is {_shown(item)}, not a plain value")
        if key in _NAME_TAGS:
            _text(item, where, f"args.tags.{key}")
    if "busy_s" in value:
        _count(value["busy_s"], where, "args.tags.busy_s")
    return value


_NUMBERS = (int, float)
_FLOAT_MAX = sys.float_info.max
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _plain_tags(tags: Any) -> bool:
    """Whether ``tags`` are as parasim writes them (:func:`_tags` says what is not)."""
    if type(tags) is not dict:
        return False
    for value in tags.values():
        kind = type(value)
        if kind not in _PLAIN_TYPES or (kind is float and not -_FLOAT_MAX <= value <= _FLOAT_MAX):
            return False
    busy = tags.get("busy_s", 0.0)
    return (
        type(tags.get("phase", "")) is str
        and type(tags.get("axis", "")) is str
        and type(busy) in _NUMBERS
        and 0 <= busy <= _FLOAT_MAX
    )


def _plain_record(
    event: dict[str, Any], thread_names: dict[tuple[int, Any], str]
) -> OpRecord | None:
    """The op record of a complete event as parasim writes it, checked with the fewest
    operations (a trace holds hundreds of thousands); None where anything is off, for
    :func:`_record` to say what."""
    get: Callable[..., Any] = event.get  # JSON values, None where absent: checked below
    rank, tid, ts, dur, args = get("pid"), get("tid"), get("ts"), get("dur"), get("args")
    if not (
        type(rank) is int
        and 0 <= rank <= HIGHEST_RANK
        and type(tid) in (int, str)
        and type(ts) in _NUMBERS
        and -LONGEST_TRACE_US <= ts <= LONGEST_TRACE_US
        and type(dur) in _NUMBERS
        and 0 <= dur <= LONGEST_TRACE_US
        and type(args) is dict
    ):
        return None
    name = get("name", "")
    label = args.get("label", name if type(name) is str else "")
    op_id, op, kind = args.get("op_id"), args.get("op"), args.get("kind")
    ready, tags = args.get("ready_us", ts), args.get("tags", {})
    size, flops = args.get("bytes", 0.0), args.get("flops", 0.0)
    group, peer = args.get("group"), args.get("peer")
    if not (
        type(label) is str
        and type(op_id) is int
        and 0 <= op_id < 2**63
        and type(op) is str
        and isinstance(kind, str)  # a kind enum's member in memory, its value in a file
        and type(ready) in _NUMBERS
        and -LONGEST_TRACE_US <= ready <= LONGEST_TRACE_US
        and type(size) in _NUMBERS
        and 0 <= size <= _FLOAT_MAX
        and type(flops) in _NUMBERS
        and 0 <= flops <= _FLOAT_MAX
        and (group is None or type(group) is str)
        and (peer is None or (type(peer) is int and 0 <= peer <= HIGHEST_RANK))
        and _plain_tags(tags)
    ):
        return None
    start = ts / 1e6
    return OpRecord(
        rank,
        op_id,
        thread_names.get((rank, tid), str(tid)),
        op,
        kind,
        label,
        tags,
        ready / 1e6,
        start,
        start + dur / 1e6,
        size,
        flops,
        group,
        peer,
    )


def _record(
    event: dict[str, Any], where: str, thread_names: dict[tuple[int, Any], str]
) -> OpRecord:
    """The op record of one complete (``"ph": "X"``) event, each field checked in turn:
    the first that is not as parasim writes it is a :class:`TraceFileError` naming it."""
    rank = _integer(event.get("pid"), where, "pid (the rank)", HIGHEST_RANK)
    tid = event.get("tid")
    if not (isinstance(tid, str) or (isinstance(tid, int) and not isinstance(tid, bool))):
        raise TraceFileError(f"{where}: tid is {_shown(tid)}, not a thread id")
    ts = _time_us(event.get("ts"), where, "ts")
    dur = _time_us(event.get("dur"), where, "dur", lowest=0.0)
    args = event.get("args")
    if not isinstance(args, dict):
        raise TraceFileError(
            f"{where}: args is {_shown(args)}, not an object (not a parasim trace)"
        )
    name = event.get("name", "")
    label = _text(args.get("label", name if isinstance(name, str) else ""), where, "args.label")
    group, peer = args.get("group"), args.get("peer")
    return OpRecord(
        rank=rank,
        op_id=_integer(args.get("op_id"), where, "args.op_id", 2**63 - 1),
        stream=thread_names.get((rank, tid), str(tid)),
        op=_text(args.get("op"), where, "args.op"),
        kind=_text(args.get("kind"), where, "args.kind"),
        label=label,
        tags=_tags(args.get("tags", {}), where),
        ready=_time_us(args.get("ready_us", ts), where, "args.ready_us") / 1e6,
        start=ts / 1e6,
        end=ts / 1e6 + dur / 1e6,
        bytes=_count(args.get("bytes", 0.0), where, "args.bytes"),
        flops=_count(args.get("flops", 0.0), where, "args.flops"),
        group=None if group is None else _text(group, where, "args.group"),
        peer=None if peer is None else _integer(peer, where, "args.peer", HIGHEST_RANK),
    )


def _thread_names(events: list[Any]) -> dict[tuple[int, Any], str]:
    """The stream of each (pid, tid), from the ``thread_name`` metadata events that are
    well formed (a malformed one only loses a lane its name)."""
    names: dict[tuple[int, Any], str] = {}
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "M":
            continue
        args = event.get("args")
        if event.get("name") == "thread_name" and isinstance(args, dict):
            pid, tid, name = event.get("pid"), event.get("tid"), args.get("name")
            if isinstance(pid, int) and isinstance(tid, int | str) and isinstance(name, str):
                names[(pid, tid)] = name
    return names


def _meta(other: Any) -> dict[str, Any]:
    """``otherData`` as a Trace's metadata, the fields the charts read kept only where
    they have the types parasim writes (``idle``, ``stage_of_rank``...)."""
    if not isinstance(other, dict):
        return {}
    meta = dict(other)
    meta.pop("ranks_in_file", None)
    meta.pop("step_time_s", None)
    for key in ("scenario", "fidelity"):
        if key in meta and not isinstance(meta[key], str):
            del meta[key]
    for key in ("world", "gpus_per_node"):
        value = meta.get(key)
        if key in meta and not (
            isinstance(value, int) and not isinstance(value, bool) and 0 < value <= HIGHEST_RANK + 1
        ):
            del meta[key]
    ranks = meta.get("representative_ranks")
    if "representative_ranks" in meta and not (
        isinstance(ranks, list)
        and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
    ):
        del meta["representative_ranks"]
    stages = meta.get("stage_of_rank")
    if "stage_of_rank" in meta and not (
        isinstance(stages, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in stages.values())
    ):
        del meta["stage_of_rank"]
    if "idle" in meta and not _idle_ok(meta["idle"]):
        del meta["idle"]
    return meta


def _idle_ok(idle: Any) -> bool:
    """Whether ``otherData.idle`` is as parasim writes it: by rank (a number as text),
    lists of ``[category, from, to]`` in seconds."""
    if not isinstance(idle, dict):
        return False
    for rank, intervals in idle.items():
        if not rank.isdigit() or not isinstance(intervals, list):
            return False
        for item in intervals:
            if not (
                isinstance(item, list)
                and len(item) == 3
                and isinstance(item[0], str)
                and all(_is_number(x) and abs(float(x)) <= LONGEST_TRACE_US for x in item[1:])
            ):
                return False
    return True


def trace_from_chrome(document: Any, source: str = "the trace") -> Trace:
    """Read back a Trace written by :func:`write_chrome_trace` (op records only).

    ``document`` is the JSON object form (``traceEvents`` and ``otherData``) or the bare
    array of events, which the Chrome trace format allows too. Complete events
    (``"ph": "X"``) become records; metadata names the streams; other events (flows,
    instants, counters) are passed over. An event that is not the complete event
    parasim writes (a missing or null ``args.op``, a string ``ts``, a negative ``dur``,
    a time beyond :data:`LONGEST_TRACE_US`) is a :class:`TraceFileError` naming
    ``source``, the event and the field. The step time is ``otherData.step_time_s``,
    else the end of the last op."""
    if isinstance(document, list):
        events, other = document, {}
    elif isinstance(document, dict) and isinstance(document.get("traceEvents"), list):
        events, other = document["traceEvents"], document.get("otherData", {})
    else:
        kind = (
            "an object without a traceEvents list"
            if isinstance(document, dict)
            else json_kind(document)
        )
        raise TraceFileError(
            f"{source}: {kind}; a Chrome trace is an object with traceEvents or an array of events"
        )
    thread_names = _thread_names(events)
    records = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceFileError(f"{source}: event {index} is {_shown(event)}, not an object")
        if event.get("ph") == "X":
            record = _plain_record(event, thread_names)
            if record is None:
                record = _record(event, f"{source}: event {index}", thread_names)
            records.append(record)
    if not records:
        raise TraceFileError(
            f'{source}: no op events (complete events, "ph": "X"), so no op to compare'
        )
    meta = _meta(other)
    step = other.get("step_time_s") if isinstance(other, dict) else None
    if _is_number(step) and 0 <= float(step) <= LONGEST_TRACE_US / 1e6:
        step_time = float(step)
    else:
        step_time = max(0.0, max(rec.end for rec in records))
    return Trace(records=records, step_time=step_time, meta=meta)
