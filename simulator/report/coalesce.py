"""Merging ops that a chart could not tell apart into one bar.

A timeline of hundreds of thousands of ops cannot draw each one: ops of one display
category that follow each other in a lane (a rank's stream) less than a resolution
apart look the same drawn as one bar. Such runs that are themselves thinner than the
resolution cannot be told apart at all, whatever their category: a train of them (a
layer's recompute, then its backward, then the next layer's recompute...) becomes one
bar too, in the colour of what it mostly is by time (:func:`dominant_offset`), as a
pixel would blend them — drawn one by one, the category drawn last would cover the
others. A run wider than the resolution (a micro-batch's whole forward) keeps its own
bar and category. :func:`coalesce`
finds those runs with arrays over the whole trace at once, sorted by lane and time, and
builds only the merged bars one by one; :func:`coalesce_one_by_one` is the same rule
written op by op, for lanes whose ops overlap and as the reference the array version is
tested against.

A chart asks for several merges of one trace (touching ops, then half a pixel, then
two pixels, for ``timeline.html`` and again for ``report.html``), so the columns the
arrays are made of (lane, start, end, op id, category, busy time) are read from the
records once: each merge keeps its input's columns and derives its output's from them
(:func:`_columns_of`), and the last few merges are kept whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from simulator.analysis.trace import OpRecord, category_of

__all__ = [
    "CATEGORY_COLORS",
    "coalesce",
    "coalesce_one_by_one",
    "display_category",
    "dominant_offset",
]

#: The categories a chart draws, each in a fixed colour; the order is the legend order.
#: Any other category is drawn as "other".
CATEGORY_COLORS: dict[str, str] = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "recompute": "#B279A2",
    "optimizer": "#54A24B",
    "comm:tp": "#E45756",
    "comm:dp": "#72B7B2",
    "comm:pp": "#EECA3B",
    "comm:sp": "#FF9DA6",
    "comm:ep": "#9D755D",
    "comm:cp": "#D67195",
    "other": "#BAB0AC",
}


def display_category(rec: OpRecord) -> str:
    """The category a chart draws ``rec`` in (:func:`category_of`, or ``"other"``)."""
    cat = category_of(rec)
    return cat if cat in CATEGORY_COLORS else "other"


@dataclass(frozen=True)
class _Columns:
    """The arrays a merge works on, one entry per record of a list, in its order:
    its lane (by first appearance of ``(rank, stream)``), start, end, op id, display
    category (a code into ``categories``) and busy time (:func:`_busy`)."""

    lane: np.ndarray
    start: np.ndarray
    end: np.ndarray
    op_id: np.ndarray
    category: np.ndarray
    categories: list[str]
    busy: np.ndarray


_lane_key = attrgetter("rank", "stream")
_start = attrgetter("start")
_end = attrgetter("end")
_op_id = attrgetter("op_id")


def _busy(rec: OpRecord) -> float:
    """How long ``rec`` ran: its span, or for a merged bar the time its ops ran."""
    return rec.tags.get("busy_s", rec.end - rec.start)


def dominant_offset(categories: Sequence[object], busy: Sequence[float]) -> int:
    """Where in a run of ops the first op of the category it mostly is, by busy time,
    stands (the op whose kind and tags a merged bar takes); a tie goes to the category
    that comes first in the run. ``categories`` and ``busy`` are the run's, op by op."""
    totals: dict[object, float] = {}
    first: dict[object, int] = {}
    for index, (category, seconds) in enumerate(zip(categories, busy, strict=True)):
        totals[category] = totals.get(category, 0.0) + seconds
        first.setdefault(category, index)
    most = max(totals.values())
    return min(first[category] for category, total in totals.items() if total == most)


def _read_columns(records: list[OpRecord]) -> _Columns:
    """The columns of ``records``, read record by record (categories coded in the
    order they first appear)."""
    count = len(records)
    keys = list(map(_lane_key, records))
    lanes = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    categories: list[str] = []
    codes: dict[str, int] = {}

    def code(rec: OpRecord) -> int:
        name = display_category(rec)
        found = codes.get(name)
        if found is None:
            found = codes[name] = len(categories)
            categories.append(name)
        return found

    return _Columns(
        lane=np.fromiter(map(lanes.__getitem__, keys), np.intp, count),
        start=np.fromiter(map(_start, records), float, count),
        end=np.fromiter(map(_end, records), float, count),
        op_id=np.fromiter(map(_op_id, records), float, count),
        category=np.fromiter(map(code, records), np.intp, count),
        categories=categories,
        busy=np.fromiter(map(_busy, records), float, count),
    )


#: Columns of the last few lists merged or made by a merge, by the list's identity
#: (and length); the list is held so that no other takes its id.
_COLUMNS: dict[tuple[int, int], tuple[list[OpRecord], _Columns]] = {}


def _columns_of(records: list[OpRecord]) -> _Columns:
    known = _COLUMNS.get((id(records), len(records)))
    if known is not None and known[0] is records:
        return known[1]
    columns = _read_columns(records)
    _remember_columns(records, columns)
    return columns


def _remember_columns(records: list[OpRecord], columns: _Columns) -> None:
    if len(_COLUMNS) >= 8:
        _COLUMNS.clear()
    _COLUMNS[(id(records), len(records))] = (records, columns)


#: The last few merges, by their input list's identity and the parameters: the
#: timeline and the report fit the same trace, and ask for the same merges.
_COALESCED: dict[tuple, tuple[list[OpRecord], list[OpRecord]]] = {}


def coalesce(
    records: list[OpRecord], resolution: float, narrower_than: float | None = None
) -> list[OpRecord]:
    """Merge ops that follow each other in one lane, in one category, less than
    ``resolution`` seconds apart, into one bar: at a zoom where such gaps are below a
    pixel the chart looks the same, with far fewer bars. Two such runs of different
    categories that follow each other as closely, each spanning less than
    ``resolution``, merge too, and a bar of several categories takes the kind and
    category of what it mostly is, by time (:func:`dominant_offset`). With
    ``narrower_than``, only ops shorter than that are merged (trains of ops too thin to
    draw one by one); wider ops keep their own bar. A merged bar's label names its first
    and last op and how many it holds, its ``busy_s`` tag how long its ops ran (drawn as
    its opacity); bytes and FLOPs are summed. Bars come lane by lane (lanes in order of first
    appearance), in order of start then op id within a lane.

    The runs are found with arrays over every lane at once; only the merged bars are
    built one by one. The same calls give the same bars as :func:`coalesce_one_by_one`,
    the rule written op by op."""
    key = (id(records), len(records), resolution, narrower_than)
    cached = _COALESCED.get(key)
    if cached is not None and cached[0] is records:
        return cached[1]
    merged, columns = _coalesce(records, resolution, narrower_than)
    if len(_COALESCED) >= 4:
        _COALESCED.clear()
    _COALESCED[key] = (records, merged)
    if columns is not None:
        _remember_columns(merged, columns)
    return merged


def _coalesce(
    records: list[OpRecord], resolution: float, narrower_than: float | None
) -> tuple[list[OpRecord], _Columns | None]:
    count = len(records)
    if count == 0:
        return [], None
    columns = _columns_of(records)
    order = np.lexsort((columns.op_id, columns.start, columns.lane))
    lane = columns.lane[order]
    start = columns.start[order]
    end = columns.end[order]
    category = columns.category[order]
    busy = columns.busy[order]
    same_lane = lane[1:] == lane[:-1]
    alone = (end - start >= narrower_than) if narrower_than is not None else np.zeros(count, bool)
    close = np.zeros(count, dtype=bool)  # after an op of its lane, less than resolution apart
    close[1:] = same_lane & ~alone[1:] & ~alone[:-1] & (start[1:] - end[:-1] <= resolution)
    breaks = ~close
    breaks[1:] |= category[1:] != category[:-1]
    firsts = np.flatnonzero(breaks)
    # runs of one category, each thinner than resolution, that follow each other closely
    # in a lane are one run of several
    thin = np.maximum.reduceat(end, firsts) - start[firsts] < resolution
    blend = close[firsts[1:]] & thin[1:] & thin[:-1]
    if blend.any():
        breaks[firsts[1:][blend]] = False
        firsts = np.flatnonzero(breaks)
    sizes = np.diff(np.append(firsts, count))
    ordered = [records[i] for i in order.tolist()]
    merged = [ordered[a] for a in firsts.tolist()]  # a run of one is its own op
    run_category = category[firsts]
    mixed = np.maximum.reduceat(category, firsts) != np.minimum.reduceat(category, firsts)
    categories = columns.categories
    for j in np.flatnonzero(sizes > 1).tolist():
        a, b = int(firsts[j]), int(firsts[j] + sizes[j])
        lead = dominant_offset(category[a:b].tolist(), busy[a:b].tolist()) if mixed[j] else 0
        bar = merged[j] = _merge(ordered[a:b], lead)
        name = display_category(bar)  # the tags the run shares may name another
        if name != categories[run_category[j]]:
            if name not in categories:
                categories.append(name)
            run_category[j] = categories.index(name)
    overlapping = np.unique(lane[1:][same_lane & (end[1:] < end[:-1])])
    if overlapping.size:  # lanes whose ops overlap: the plain rule for those
        plain = set(overlapping.tolist())
        return _with_plain_lanes(
            ordered, lane, firsts, merged, plain, resolution, narrower_than
        ), None
    out = _Columns(
        lane=lane[firsts],
        start=start[firsts],
        end=np.maximum.reduceat(end, firsts),
        op_id=columns.op_id[order][firsts],
        category=run_category,
        categories=categories,
        busy=np.add.reduceat(busy, firsts),
    )
    return merged, out


def _with_plain_lanes(
    ordered: list[OpRecord],
    lane: np.ndarray,
    firsts: np.ndarray,
    merged: list[OpRecord],
    plain: set[int],
    resolution: float,
    narrower_than: float | None,
) -> list[OpRecord]:
    """``merged`` (the bars of ``ordered``, sorted by lane, whose runs start at
    ``firsts``) with the bars of the lanes in ``plain``, whose ops overlap, made again
    by the op-by-op rule; runs never cross lanes, so every other lane's bars stand."""
    op_cuts = [0, *(np.flatnonzero(np.diff(lane)) + 1).tolist(), len(lane)]
    run_lane = lane[firsts]
    bar_cuts = [0, *(np.flatnonzero(np.diff(run_lane)) + 1).tolist(), len(run_lane)]
    bars: list[OpRecord] = []
    for a, b, c, d in zip(op_cuts, op_cuts[1:], bar_cuts, bar_cuts[1:], strict=False):
        if int(lane[a]) in plain:
            bars += coalesce_one_by_one(ordered[a:b], resolution, narrower_than)
        else:
            bars += merged[c:d]
    return bars


def coalesce_one_by_one(
    records: list[OpRecord], resolution: float, narrower_than: float | None = None
) -> list[OpRecord]:
    """:func:`coalesce`'s rule, op by op: for lanes whose ops overlap, and as the
    reference the array version is tested against."""
    lanes: dict[tuple[int, str], list[OpRecord]] = defaultdict(list)
    for rec in records:
        lanes[(rec.rank, rec.stream)].append(rec)
    merged: list[OpRecord] = []
    for lane in lanes.values():
        lane.sort(key=lambda r: (r.start, r.op_id))
        # runs of one category: [ops, end, whether it follows the run before closely]
        runs: list[tuple[list[OpRecord], float, bool]] = []
        run: list[OpRecord] = []
        end, close = 0.0, False
        for rec in lane:
            alone = narrower_than is not None and rec.end - rec.start >= narrower_than
            near = bool(run) and not alone and rec.start - end <= resolution
            if run and not (near and display_category(rec) == display_category(run[-1])):
                runs.append((run, end, close))
                run = []
            if alone:
                runs.append(([rec], rec.end, False))
                end, close = rec.end, False
                continue
            if not run:
                close = near
            end = max(end, rec.end) if run else rec.end
            run.append(rec)
        if run:
            runs.append((run, end, close))
        merged += [_merge(ops, _lead(ops)) for ops in _blend(runs, resolution)]
    return merged


def _blend(
    runs: list[tuple[list[OpRecord], float, bool]], resolution: float
) -> list[list[OpRecord]]:
    """The ops of each bar of a lane: its runs of one category (each with its end and
    whether it follows the run before closely), neighbours thinner than ``resolution``
    joined."""
    bars: list[list[OpRecord]] = []
    thin_before = False
    for ops, end, close in runs:
        thin = end - ops[0].start < resolution
        if bars and close and thin and thin_before:
            bars[-1] = bars[-1] + ops
        else:
            bars.append(ops)
        thin_before = thin
    return bars


def _lead(run: list[OpRecord]) -> int:
    """The offset in ``run`` of the op whose kind a bar of its ops takes
    (:func:`dominant_offset`)."""
    return dominant_offset([display_category(rec) for rec in run], [_busy(rec) for rec in run])


def _merge(run: list[OpRecord], lead: int = 0) -> OpRecord:
    """One bar for the ops of ``run`` (in lane order), of the op kind and display
    category of ``run[lead]``: what the bar mostly is."""
    if len(run) == 1:
        return run[0]
    first, last, kind = run[0], run[-1], run[lead]
    shared = dict(first.tags)  # the tags every op of the run has, with first's values
    for rec in run:
        tags = rec.tags
        if tags is not first.tags:
            for key in [key for key, value in shared.items() if not tags.get(key) == value]:
                del shared[key]
            if not shared:
                break
    for key in _CATEGORY_TAGS:  # the tags that make the bar's category: the lead's
        if key in kind.tags:
            shared[key] = kind.tags[key]
        else:
            shared.pop(key, None)
    # how much of the merged span its ops were busy: drawn as the bar's opacity
    shared["busy_s"] = sum([_busy(r) for r in run])
    return OpRecord(
        first.rank,
        first.op_id,
        first.stream,
        kind.op,
        kind.kind,
        f"{len(run)} ops: {first.label} … {last.label}",
        shared,
        first.ready,
        first.start,
        max([r.end for r in run]),
        sum([r.bytes for r in run]),
        sum([r.flops for r in run]),
        kind.group,
        kind.peer,
    )


#: The tags :func:`~simulator.analysis.trace.category_of` reads, beside the op.
_CATEGORY_TAGS = ("phase", "axis")
