"""Draw a Trace as an interactive Gantt chart in one self-contained HTML file.

Each (rank, stream) pair gets a horizontal lane, labelled like ``r5 compute``; lanes
are grouped by rank (the ``compute`` lane first within a rank), ranks by pipeline
stage and node (a rule and a label mark each group), and every other rank is shaded so
the groups read at a glance. The idle stretches of each compute lane — pipeline
bubbles, imbalance stalls, exposed communication, as the time accounting attributes
them (``trace.meta["idle"]``) — are drawn hatched in the breakdown charts' colours. Each op is a bar
from its start to its end, in milliseconds. Bars are split into one plotly trace per
display category (forward, backward, recompute, optimizer, ``comm:tp``, ``comm:dp``,
``comm:pp``, ``comm:sp``, ``comm:ep``, other), so clicking a legend entry hides or
shows a category, and each category keeps a fixed colour across reports. Hovering a
bar shows its label, category, layer, micro-batch, bytes, FLOPs, start, duration and,
for communication, how long the rank waited before the transfer began.

A browser cannot draw a million bars, so the chart holds at most ``max_bars``, and the
ops of a full-width chart thinner than half a pixel would each be drawn a pixel wide,
making a lane that is busy a third of the time look solid. :func:`fit_trace` decides
what is drawn: trains of such thin ops become one bar as opaque as they were busy;
when the ops still do not fit, touching ops merge, then only the ranks in
``trace.meta["representative_ranks"]`` are kept, then wider merges and fewer ranks
follow. A note above the chart says what was merged and which ranks are shown.
``timeline.html`` also carries the drawn ranks' ops one by one, in the categories where
some were merged, and a zoom that leaves few enough in view redraws them so
(:func:`write_timeline_html`). The chart is built
as the plain dict plotly.js draws (:func:`timeline_spec`); :func:`timeline_figure` gives
it as a plotly object. The page loads plotly.js from the one ``plotly.min.js`` beside
it, so it opens offline.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from simulator.analysis.trace import OpRecord, Trace
from simulator.report.chrome_trace import select_ranks, stream_order
from simulator.report.coalesce import CATEGORY_COLORS, coalesce
from simulator.report.coalesce import display_category as _display_category
from simulator.report.plotly_bundle import PLOTLY_JS, write_plotly_js
from topologies.units import format_bytes, format_flops, format_time

__all__ = [
    "CATEGORY_COLORS",
    "TEMPLATE",
    "IDLE_COLORS",
    "timeline_figure",
    "template_json",
    "timeline_spec",
    "write_timeline_html",
]

#: Idle stretches of a compute lane, by the time accounting's category: the colours of
#: the breakdown charts, hatched so they never read as work.
IDLE_COLORS: dict[str, str] = {
    "bubble": "#EECA3B",
    "imbalance_stall": "#B279A2",
    "exposed_comm": "#E45756",
    "other": "#BAB0AC",
}
_IDLE_NAMES = {
    "bubble": "idle: pipeline bubble",
    "imbalance_stall": "idle: imbalance stall",
    "exposed_comm": "idle: exposed comm",
    "other": "idle: other",
}

_lane_key = attrgetter("rank", "stream")
_start_of = attrgetter("start")

_FONT = "Inter, 'Helvetica Neue', Helvetica, Arial, sans-serif"
_DIV_ID = "parasim-timeline"
_MARGIN = {"l": 110, "r": 150, "t": 130, "b": 56}


@functools.lru_cache(maxsize=4096)  # a trace's ops move a few sizes, many times over
def _human_bytes(n: float) -> str:
    return format_bytes(n)


@functools.lru_cache(maxsize=4096)
def _human_flops(n: float) -> str:
    return format_flops(n).replace("FLOP/s", "FLOP")


@functools.lru_cache(maxsize=1 << 16)  # an analytic step's ops repeat their durations
def _human_time(seconds: float) -> str:
    return format_time(seconds)


@functools.lru_cache(maxsize=4096)
def _size_line(size: float, flops: float) -> str:
    return f"{_human_bytes(size)} · {_human_flops(flops)}" if flops else _human_bytes(size)


def _hover(rec: OpRecord, cat: str, lane: str) -> str:
    tags = rec.tags
    text = f"<b>{rec.label or rec.kind}</b><br>{cat} · {rec.kind} · {lane}"
    where = [
        f"{name} {tags[key]}"
        for key, name in (("layer", "layer"), ("microbatch", "micro-batch"), ("stage", "stage"))
        if tags.get(key) is not None
    ]
    if tags.get("phase") is not None:
        where.append(str(tags["phase"]))
    if where:
        text += "<br>" + " · ".join(where)
    start, end, ready = rec.start, rec.end, rec.ready
    text += f"<br>start {start * 1e3:.4f} ms · duration {_human_time(max(0.0, end - start))}"
    if tags.get("busy_s") is not None:
        text += f"<br>busy {_human_time(tags['busy_s'])} of that span"
    if start > ready:
        text += f"<br>waited {_human_time(start - ready)} before starting"
    text += "<br>" + _size_line(rec.bytes, rec.flops)
    if rec.group is not None:
        text += f"<br>group {rec.group}"
    if rec.peer is not None:
        text += f"<br>peer r{rec.peer}"
    return text


#: The time resolution of a full-width chart, as a fraction of the step: half a pixel of
#: a chart 1,000 pixels wide. Trains of ops this short and this close are drawn as one
#: bar, as opaque as they were busy; a browser would draw each of them a pixel wide
#: and the lane solid, as if always busy.
PIXEL_DIVISIONS = 2e3
#: When one rank alone has too many bars even so: two pixels.
COARSE_DIVISIONS = 500
#: The most op-by-op bars ``timeline.html`` carries for zooming in (about 40 bytes each).
MAX_EXACT_BARS = 400_000


def fit_trace(trace: Trace, max_bars: int) -> tuple[Trace, dict[str, Any]]:
    """The trace a chart of at most ``max_bars`` bars draws, and what it kept.

    One rule for every chart of a trace, so ``timeline.html`` and ``report.html`` show
    the same ranks. Trains of ops shorter and closer than half a pixel of a full-width
    chart (:data:`PIXEL_DIVISIONS`) are always one bar, as opaque as its ops were busy.
    When the ops do not fit ``max_bars``: ops of one kind that touch in a lane are
    merged (nothing drawn changes); then only the ranks in
    ``meta["representative_ranks"]`` are kept (when they are some of the ranks
    present); then ops of one kind closer than half a pixel are merged whatever their
    length; then the largest evenly spaced subset of those ranks that fits is kept
    (:func:`~simulator.report.chrome_trace.select_ranks`); last, a single rank that
    still does not fit has ops closer than two pixels merged
    (:data:`COARSE_DIVISIONS`), and is cut at ``max_bars`` ops in time order if even
    that is too many. Idle
    stretches (``meta["idle"]``) shorter than the merge gap are left out with the gaps
    the merged bars cover.

    The summary holds ``ranks_shown``, ``ranks_total``, ``bars``, ``bars_total``,
    ``capped``, ``truncated``, ``selection`` (how the ranks were chosen), and when ops
    were merged ``merge_gap_s``, ``merge_narrow`` (only ops shorter than the gap) and
    ``coalesced_from``; ``exact`` is the same ranks' records with at most touching ops
    merged, which a zoomed-in view draws op by op (None when nothing else was merged).
    """
    if max_bars < 1:
        raise ValueError(f"max_bars must be at least 1, got {max_bars}")
    counts = Counter(rec.rank for rec in trace.records)
    total = len(trace.records)
    # the trace itself may hold only some ranks of the job (meta["world"] says how many)
    world = trace.meta.get("world")
    ranks_total = max(len(counts), int(world)) if isinstance(world, int) else len(counts)
    # representative ranks mean something unless they are every rank of the job
    reps = [r for r in dict.fromkeys(trace.meta.get("representative_ranks") or ()) if r in counts]
    if set(reps) == set(counts) and ranks_total == len(counts):
        reps = []
    step = trace.step_time

    def derived(how: tuple, source: list[OpRecord], make: Callable[[], list[OpRecord]]):
        """``make()``, once per trace for the same ``source`` list and ``how``."""
        key = (id(source), *how)
        known = trace.derived.get(key)
        if known is None or known[0] is not source:
            known = trace.derived[key] = (source, make())
        return known[1]

    records, gap, narrow = trace.records, 0.0, False
    if total > max_bars and step > 0:
        touching = records
        records = derived(("touching",), touching, lambda: coalesce(touching, step * 1e-9))
        gap = step * 1e-9 if len(records) < total else 0.0
    if len(records) > max_bars and reps and len(reps) < len(counts):
        keep, every = set(reps), records
        records = derived(("reps",), every, lambda: [r for r in every if r.rank in keep])
    exact = records
    if step > 0:
        pixel = step / PIXEL_DIVISIONS
        records = derived(
            ("narrow", pixel), exact, lambda: coalesce(exact, pixel, narrower_than=pixel)
        )
        if len(records) < len(exact):
            gap, narrow = pixel, True
        else:
            records = exact
        if len(records) > max_bars:
            gap, narrow = pixel, False
            records = coalesce(exact, gap)
    drawn = Counter(rec.rank for rec in records)
    if len(records) > max_bars:
        keep = set(select_ranks(drawn, max_bars, reps))
        records = [rec for rec in records if rec.rank in keep]
        exact = [rec for rec in exact if rec.rank in keep]
        if len(records) > max_bars and step > 0:  # one rank: two pixels, then cut
            gap, narrow = step / COARSE_DIVISIONS, False
            records = coalesce(exact, gap)
        drawn = Counter(rec.rank for rec in records)
    truncated = len(records) > max_bars
    if truncated:
        records = sorted(records, key=lambda r: (r.start, r.rank, r.op_id))[:max_bars]
    ranks = sorted(drawn)
    keep = set(ranks)
    if len(keep) == ranks_total:
        selection = "all ranks"
    elif reps and keep == set(reps):
        selection = "representative ranks"
    elif reps and keep < set(reps):
        selection = "evenly spaced representative ranks"
    elif keep == set(counts):
        selection = "the ranks in the trace"
    else:
        selection = "evenly spaced ranks"
    kept_ops = sum(counts[r] for r in keep)
    info: dict[str, Any] = {
        "ranks_shown": ranks,
        "ranks_total": ranks_total,
        "bars": len(records),
        "bars_total": total,
        "capped": len(records) < total or len(keep) < ranks_total,
        "truncated": truncated,
        "selection": selection,
    }
    if gap > 0:
        info.update(merge_gap_s=gap, merge_narrow=narrow, coalesced_from=kept_ops)
    meta = dict(trace.meta)
    if meta.get("idle"):
        meta["idle"] = {
            rank: [item for item in intervals if item[2] - item[1] >= gap]
            for rank, intervals in meta["idle"].items()
            if int(rank) in keep
        }
    # the op-by-op records a zoomed-in view swaps in, when more than touching ops were
    # merged and they are few enough to carry in the page
    coarse = gap > step * 1e-9 and not truncated
    info["exact"] = exact if coarse and 0 < len(exact) <= MAX_EXACT_BARS else None
    return replace(trace, records=records, meta=meta), info


def _cap_note(info: dict[str, Any], max_bars: int, zoomable: bool = False) -> str:
    """The note above a chart that does not draw every op of the trace as its own bar:
    which ranks it shows, and on a second line which ops share a bar."""
    merged = "merge_gap_s" in info
    parts = []
    if not merged or info["truncated"] or len(info["ranks_shown"]) < info["ranks_total"]:
        parts.append(_rank_note(info, max_bars, counts=not merged or info["truncated"]))
    if merged:
        gap = info["merge_gap_s"]
        # below a nanosecond the merge joins only ops that touch: say so, not "0.25 ns"
        if gap < 1e-9:
            which = "Ops of one kind that touch"
        elif info.get("merge_narrow"):
            which = f"Ops shorter than {_human_time(gap)} and as close to each other"
        else:
            which = f"Ops of one kind less than {_human_time(gap)} apart"
        where = "zoom in to see each one" if zoomable else "trace.json has each one"
        parts.append(
            f"{which} are drawn as one bar, as opaque as they were busy "
            f"({info['coalesced_from']:,} ops; {where})"
        )
    return "<br>".join(parts)


def _rank_note(info: dict[str, Any], max_bars: int, counts: bool = True) -> str:
    shown, total = len(info["ranks_shown"]), info["ranks_total"]
    if info["truncated"] and shown == total:
        return (
            f"Showing the first {info['bars']:,} of {info['bars_total']:,} ops "
            f"(max_bars={max_bars:,})"
        )
    if info["truncated"]:
        which = ", ".join(f"r{r}" for r in info["ranks_shown"])
        return (
            f"Showing {shown} of {total} ranks ({which}), only their first "
            f"{info['bars']:,} of {info['bars_total']:,} ops (max_bars={max_bars:,})"
        )
    if info["bars"] == info["bars_total"] or not counts:
        return f"Showing {shown} of {total} ranks, {info['selection']}"
    return (
        f"Showing {shown} of {total} ranks, {info['selection']} "
        f"({info['bars']:,} of {info['bars_total']:,} ops; max_bars={max_bars:,})"
    )


def _place(trace: Trace, rank: int) -> tuple[int, int]:
    """(pipeline stage, node) of a rank, from the trace's metadata (0 when unknown)."""
    stage = trace.meta.get("stage_of_rank", {}).get(str(rank), 0)
    per_node = trace.meta.get("gpus_per_node") or 0
    return stage, rank // per_node if per_node else 0


def _empty_columns() -> dict[str, list[Any]]:
    return {"base": [], "x": [], "y": [], "text": [], "opacity": []}


def _op_columns(
    records: list[OpRecord],
    lane_of: dict[tuple[int, str], int],
    lane_names: list[str],
    compact: bool = False,
) -> dict[str, dict[str, list[Any]]]:
    """The bars of ``records`` by display category: start and length in milliseconds,
    lane, and either the hover text and opacity (a merged bar is as opaque as its ops
    were busy over its span) or, ``compact``, only each op's label, rounded to the
    nanosecond for the page's zoom-in data."""
    bars: dict[str, dict[str, list[Any]]] = {}
    if compact:
        for rec in records:
            cat = _display_category(rec)
            col = bars.get(cat)
            if col is None:
                col = bars[cat] = {"base": [], "x": [], "y": [], "label": []}
            start = rec.start
            col["base"].append(round(start * 1e3, 6))
            col["x"].append(round(max(0.0, rec.end - start) * 1e3, 6))
            col["y"].append(lane_of[(rec.rank, rec.stream)])
            col["label"].append(rec.label or rec.kind)
        return bars
    for rec in records:
        cat = _display_category(rec)
        lane = lane_of[(rec.rank, rec.stream)]
        span = max(0.0, rec.end - rec.start)
        col = bars.setdefault(cat, _empty_columns())
        busy = rec.tags.get("busy_s")
        col["opacity"].append(
            1.0 if busy is None or span <= 0 else max(0.25, min(1.0, busy / span))
        )
        col["base"].append(rec.start * 1e3)
        col["x"].append(span * 1e3)
        col["y"].append(lane)
        col["text"].append(_hover(rec, cat, lane_names[lane]))
    return bars


def _idle_bars(
    trace: Trace, lane_of: dict[tuple[int, str], int], compact: bool = False
) -> dict[str, dict[str, list[Any]]]:
    """Bars for the idle stretches of each drawn rank's compute lane
    (``trace.meta["idle"]``, from the time accounting), by category; ``compact`` as in
    :func:`_op_columns`."""
    bars: dict[str, dict[str, list[Any]]] = {}
    for rank_text, intervals in (trace.meta.get("idle") or {}).items():
        lane = lane_of.get((int(rank_text), "compute"))
        if lane is None:
            continue
        for category, lo, hi in intervals:
            if category not in IDLE_COLORS or hi <= lo:
                continue
            if compact:
                col = bars.setdefault(category, {"base": [], "x": [], "y": [], "label": []})
                col["base"].append(round(lo * 1e3, 6))
                col["x"].append(round((hi - lo) * 1e3, 6))
                col["y"].append(lane)
                col["label"].append(_IDLE_NAMES[category])
                continue
            col = bars.setdefault(category, _empty_columns())
            col["base"].append(lo * 1e3)
            col["x"].append((hi - lo) * 1e3)
            col["y"].append(lane)
            col["text"].append(
                f"<b>{_IDLE_NAMES[category]}</b><br>r{rank_text} compute idle "
                f"{_human_time(hi - lo)}<br>from {_human_time(lo)} to {_human_time(hi)}"
            )
    return {cat: bars[cat] for cat in IDLE_COLORS if cat in bars}


def timeline_figure(
    trace: Trace,
    title: str,
    max_bars: int = 30000,
    zoom_detail: bool = False,
    validate: bool = False,
) -> tuple[go.Figure, dict[str, Any]]:
    """The Gantt chart of ``trace`` and a summary: ``ranks_shown``, ``ranks_total``,
    ``bars``, ``bars_total``, ``lanes``, ``categories``, ``capped``, ``truncated`` and
    ``selection`` (how the ranks shown were chosen), as :func:`fit_trace` chose them.

    With ``zoom_detail``, when more than touching ops were merged, the summary's
    ``detail`` holds the drawn ranks' ops one by one, for each legend entry where some
    were merged (per trace: start and length in ms, lane and label, sorted by lane and
    time), for a page script to draw when zoomed in (:func:`write_timeline_html`); its
    ``max_bars`` is what the other entries' bars leave of the chart's. With
    ``validate``, plotly checks the bars too (the same figure, several times slower for
    a large trace). The figure is :func:`timeline_spec`'s, as a plotly object."""
    spec, info = timeline_spec(trace, title, max_bars=max_bars, zoom_detail=zoom_detail)
    return go.Figure(spec, _validate=validate), info


#: The plotly template of every chart parasim draws.
TEMPLATE = "plotly_white"


@functools.cache
def template_json(name: str) -> dict[str, Any]:
    """A plotly template as the plain dict a figure's JSON carries, read from the file
    plotly ships it in: what ``plotly.io.templates[name]`` builds its object from (the
    object, checked against every trace type, takes a quarter of a second the first
    time in a process: more than drawing a chart). Shared, not to be changed."""
    from importlib.resources import files

    text = (files("plotly") / "package_data" / "templates" / f"{name}.json").read_text()
    return json.loads(text)


def _merged_categories_only(drawn: list[OpRecord], exact: list[OpRecord]) -> list[OpRecord]:
    """The ops of ``exact`` in the display categories where ``drawn`` merged some: a
    zoom redraws only those; the others are drawn op by op already. A merged bar is a
    record of its own, not one of ``exact``'s: its category and its ops' categories
    all count as merged."""
    drawn_ids, exact_ids = set(map(id, drawn)), set(map(id, exact))
    merged = {_display_category(rec) for rec in drawn if id(rec) not in exact_ids}
    merged |= {_display_category(rec) for rec in exact if id(rec) not in drawn_ids}
    return [rec for rec in exact if _display_category(rec) in merged]


def _bar(name: str, col: dict[str, list[Any]], marker: dict[str, Any]) -> dict[str, Any]:
    """One legend entry's horizontal bars (a plotly ``bar`` trace, as a dict)."""
    return {
        "type": "bar",
        "name": name,
        "orientation": "h",
        "base": col["base"],
        "x": col["x"],
        "y": col["y"],
        "width": 0.78,
        "marker": marker,
        "hovertext": col["text"],
        "hovertemplate": "%{hovertext}<extra></extra>",
    }


def timeline_spec(
    trace: Trace, title: str, max_bars: int = 30000, zoom_detail: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`timeline_figure`'s chart as the plain ``{"data": ..., "layout": ...}``
    dict plotly.js draws, and its summary. The pages draw this dict as it is
    (``plotly.io.to_html(spec, validate=False)``): building a plotly object of tens of
    thousands of bars costs more than drawing them, and a validated figure made from
    it is the same (``tests/test_reports.py`` holds them equal)."""
    shown, info = fit_trace(trace, max_bars)
    records = shown.records
    exact = info.pop("exact")

    streams: dict[int, set[str]] = defaultdict(set)
    for rec in records:
        streams[rec.rank].add(rec.stream)
    lane_of: dict[tuple[int, str], int] = {}
    lane_names: list[str] = []
    rank_spans: list[tuple[int, int]] = []
    groups: list[tuple[str, int]] = []  # (pipeline stage and node, first lane)
    for rank in sorted(streams, key=lambda r: (*_place(trace, r), r)):
        first = len(lane_names)
        group = "stage {} · node {}".format(*_place(trace, rank))
        if not groups or groups[-1][0] != group:
            groups.append((group, first))
        for stream in stream_order(streams[rank]):
            lane_of[(rank, stream)] = len(lane_names)
            lane_names.append(f"r{rank} {stream}")
        rank_spans.append((first, len(lane_names) - 1))

    step_ms = trace.step_time * 1e3
    bars = _op_columns(records, lane_of, lane_names)
    idle = _idle_bars(shown, lane_of)
    if not zoom_detail or not exact:
        exact = []
    if exact:
        exact = _merged_categories_only(records, exact)
    if exact:  # by lane, then start; ties keep their order (a stable sort)
        lanes = np.fromiter(map(lane_of.__getitem__, map(_lane_key, exact)), np.intp, len(exact))
        starts = np.fromiter(map(_start_of, exact), float, len(exact))
        exact = [exact[i] for i in np.lexsort((starts, lanes)).tolist()]
    exact_bars = _op_columns(exact, lane_of, lane_names, compact=True) if exact else {}
    exact_idle = _idle_bars(trace, lane_of, compact=True) if exact else {}
    exact_idle = {  # idle stretches the merge left out, as for the ops
        cat: col
        for cat, col in exact_idle.items()
        if len(col["x"]) != len(idle.get(cat, {}).get("x", ()))
    }
    data: list[dict[str, Any]] = []
    categories = [cat for cat in CATEGORY_COLORS if cat in bars or cat in exact_bars]
    detail: list[dict[str, Any]] = []
    for cat in categories:
        col = bars.get(cat) or _empty_columns()
        if cat in exact_bars:
            detail.append({"trace": len(data), "name": cat, **exact_bars[cat]})
        # no outline: on narrow bars a white outline washes the colour out; merged bars
        # are as opaque as their ops were busy over the span
        marker = {"color": CATEGORY_COLORS[cat], "line": {"width": 0}, "opacity": col["opacity"]}
        data.append(_bar(cat, col, marker))
    idle_categories = [cat for cat in IDLE_COLORS if cat in idle or cat in exact_idle]
    for cat in idle_categories:
        col = idle.get(cat) or _empty_columns()
        if cat in exact_idle:
            detail.append(
                {"trace": len(data), "name": _IDLE_NAMES[cat], "idle": True, **exact_idle[cat]}
            )
        pattern = {"shape": "/", "fgcolor": IDLE_COLORS[cat], "solidity": 0.35}
        marker = {"color": "rgba(255,255,255,0)", "line": {"width": 0}, "pattern": pattern}
        data.append(_bar(_IDLE_NAMES[cat], col, marker))
    # an axis at the bottom too: an empty trace on a second x axis that follows the first
    data.append(
        {
            "type": "scatter",
            "x": [None],
            "y": [None],
            "xaxis": "x2",
            "showlegend": False,
            "hoverinfo": "skip",
            "name": "axis",
        }
    )
    if detail:
        zoomed = {entry["trace"] for entry in detail}
        info["detail"] = {
            # the bars of the legend entries drawn op by op already stay as they are
            "max_bars": max_bars
            - sum(
                len(bar["x"])
                for i, bar in enumerate(data)
                if bar["type"] == "bar" and i not in zoomed
            ),
            "step_ms": step_ms,
            "lanes": lane_names,
            "traces": detail,
        }
    categories += [_IDLE_NAMES[cat] for cat in idle_categories]

    n_lanes = len(lane_names)
    lane_px = 22 if n_lanes <= 80 else 14
    # at least enough room for the legend next to the plot
    height = _MARGIN["t"] + _MARGIN["b"] + max(240, n_lanes * lane_px)

    shapes: list[dict[str, Any]] = [
        {
            "type": "rect",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": lo - 0.5,
            "y1": hi + 0.5,
            "fillcolor": "#F1F3F6",
            "line": {"width": 0},
            "layer": "below",
        }
        for i, (lo, hi) in enumerate(rank_spans)
        if i % 2 == 1
    ]
    if step_ms > 0:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "x0": step_ms,
                "x1": step_ms,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"color": "#555", "width": 1, "dash": "dot"},
            }
        )

    scenario = trace.meta.get("scenario")
    sub = []
    if scenario and str(scenario) not in title:
        sub.append(f"scenario {scenario}")
    sub.append(f"step time {_human_time(trace.step_time)}")
    if trace.meta.get("fidelity"):
        sub.append(f"{trace.meta['fidelity']} fidelity")
    title_text = f"{title}<br><span style='font-size:13px;color:#555'>{' · '.join(sub)}</span>"

    group_labels = [
        {
            "text": name,
            "xref": "paper",
            "yref": "y",
            "x": 1,
            "y": first - 0.5,
            "xanchor": "right",
            "yanchor": "top",
            "showarrow": False,
            "font": {"size": 10, "color": "#666"},
        }
        for name, first in groups
        if len(groups) > 1
    ]
    shapes += [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": first - 0.5,
            "y1": first - 0.5,
            "line": {"color": "#B8BEC6", "width": 1},
            "layer": "below",
        }
        for _, first in groups[1:]
    ]
    annotations: list[dict[str, Any]] = []
    if info["capped"]:
        annotations.append(
            {
                "text": _cap_note(info, max_bars, zoomable=bool(info.get("detail"))),
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 1,
                "xanchor": "left",
                "yanchor": "bottom",
                "yshift": 30,
                "showarrow": False,
                "align": "left",
                "font": {"size": 12, "color": "#8A4B00"},
                "bgcolor": "#FFF4E0",
                "bordercolor": "#E0A040",
                "borderwidth": 1,
                "borderpad": 4,
            }
        )

    annotations += group_labels  # after the note, which reads first

    layout = dict(
        title={
            "text": title_text,
            "x": 0.01,
            "xanchor": "left",
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 14},
        },
        template=template_json(TEMPLATE),
        font={"family": _FONT, "size": 12, "color": "#222"},
        barmode="overlay",
        bargap=0.1,
        height=height,
        margin=_MARGIN,
        plot_bgcolor="white",
        paper_bgcolor="white",
        hovermode="closest",
        hoverlabel={"font": {"family": _FONT, "size": 12}, "align": "left"},
        dragmode="zoom",
        legend={
            "title": {"text": "category"},
            "x": 1.01,
            "xanchor": "left",
            "y": 1,
            "yanchor": "top",
            "traceorder": "normal",
            "itemclick": "toggle",
            "itemdoubleclick": "toggleothers",
        },
        xaxis={
            "side": "top",
            "ticksuffix": " ms",
            **({"range": [0, step_ms * 1.01]} if step_ms > 0 else {}),
            "rangemode": "tozero",
            "showgrid": True,
            "gridcolor": "#E6E8EB",
            "zeroline": False,
            "showline": True,
            "linecolor": "#999",
            "mirror": True,
            "showspikes": True,
            "spikemode": "across",
            "spikethickness": 1,
            "spikecolor": "#888",
            "spikedash": "dot",
        },
        # the same time axis again at the bottom, for long charts
        xaxis2={
            "matches": "x",
            "overlaying": "x",
            "side": "bottom",
            "anchor": "y",
            "ticksuffix": " ms",
            "showgrid": False,
            "zeroline": False,
            "showline": False,
        },
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(n_lanes)),
            "ticktext": lane_names,
            "tickfont": {"size": 11 if lane_px > 14 else 9},
            "range": [n_lanes - 0.5, -0.5],
            "showgrid": False,
            "zeroline": False,
            "showline": True,
            "linecolor": "#999",
            "mirror": True,
        },
    )
    # as a validated figure writes them: an empty list is no list
    layout.update(
        {key: items for key, items in (("shapes", shapes), ("annotations", annotations)) if items}
    )
    info["lanes"] = n_lanes
    info["categories"] = categories
    return {"data": data, "layout": layout}, info


#: Redraws the ops of the zoomed window from the page's op-by-op data, merging only
#: trains of ops shorter and closer than half a pixel at that zoom (as the chart first
#: drawn does at full width), and goes back to the first drawing when even that is more
#: than ``max_bars`` bars. Zoomed in, no lane is drawn busy where it was idle.
_ZOOM_SCRIPT = """
(function () {
  const gd = document.getElementById('{plot_id}');
  const detail = DETAIL;
  if (!gd || !detail) { return; }
  const first = detail.traces.map(t => {
    const d = gd.data[t.trace];
    return {base: d.base, x: d.x, y: d.y, hovertext: d.hovertext, opacity: d.marker.opacity};
  });
  const time = ms => ms >= 1 ? ms.toFixed(3) + ' ms' : ms >= 1e-3
    ? (ms * 1e3).toFixed(3) + ' \u00b5s' : (ms * 1e6).toFixed(1) + ' ns';
  // the bars of one trace in [lo, hi]: ops shorter than res and less than res apart
  // in one lane become one bar, as opaque as they were busy
  function bars(t, lo, hi, res, merge) {
    const out = {base: [], x: [], y: [], hovertext: [], opacity: []};
    let run = [];
    const flush = () => {
      if (!run.length) { return; }
      const a = run[0], b = run[run.length - 1];
      const start = t.base[a];
      let end = start, busy = 0;
      for (const i of run) { end = Math.max(end, t.base[i] + t.x[i]); busy += t.x[i]; }
      out.base.push(start); out.x.push(end - start); out.y.push(t.y[a]);
      out.opacity.push(end > start ? Math.max(0.25, Math.min(1, busy / (end - start))) : 1);
      const head = run.length === 1 ? '<b>' + t.label[a] + '</b>'
        : '<b>' + run.length + ' ops: ' + t.label[a] + ' \u2026 ' + t.label[b] + '</b>';
      out.hovertext.push(head + '<br>' + t.name + ' \u00b7 ' + detail.lanes[t.y[a]] +
        '<br>start ' + start.toFixed(4) + ' ms \u00b7 duration ' + time(end - start) +
        (run.length > 1 ? '<br>busy ' + time(busy) + ' of that span' : ''));
      run = [];
    };
    let end = -Infinity;
    for (let i = 0; i < t.base.length; i++) {
      if (t.base[i] > hi || t.base[i] + t.x[i] < lo) { continue; }
      const thin = merge && t.x[i] < res;
      if (run.length && (!thin || t.y[i] !== t.y[run[0]] || t.base[i] - end > res)) {
        flush();
      }
      if (!thin) { run = [i]; flush(); continue; }
      end = run.length ? Math.max(end, t.base[i] + t.x[i]) : t.base[i] + t.x[i];
      run.push(i);
    }
    flush();
    return out;
  }
  let zoomed = false;
  function show() {
    const range = gd._fullLayout.xaxis.range;
    const lo = Math.min(range[0], range[1]), hi = Math.max(range[0], range[1]);
    const res = (hi - lo) / PIXELS;
    const drawn = detail.traces.map(t => bars(t, lo, hi, res, !t.idle));
    const count = drawn.reduce((n, b) => n + b.x.length, 0);
    const full = lo <= 0 && hi >= detail.step_ms;
    const use = count <= detail.max_bars && !full ? drawn : first;
    if (use === first && !zoomed) { return; }
    zoomed = use !== first;
    gd.dataset.view = zoomed ? 'ops' : 'merged';
    Plotly.restyle(gd, {
      base: use.map(b => b.base), x: use.map(b => b.x), y: use.map(b => b.y),
      hovertext: use.map(b => b.hovertext), 'marker.opacity': use.map(b => b.opacity),
    }, detail.traces.map(t => t.trace));
  }
  gd.dataset.view = 'merged';
  gd.on('plotly_relayout', show);
})();
"""


def write_timeline_html(
    trace: Trace, path: str | Path, title: str, max_bars: int = 30000, below: str = ""
) -> dict[str, Any]:
    """Write the timeline of ``trace`` to ``path`` as an HTML file that loads plotly.js
    from ``plotly.min.js`` beside it (:mod:`simulator.report.plotly_bundle`), with the
    HTML ``below`` (already escaped) under the chart.

    Returns the summary of :func:`timeline_figure` plus ``path``: which ranks are
    shown, how many bars were drawn, and whether the chart was capped. When ops were
    merged to fit ``max_bars``, the page also carries the drawn ranks' ops one by one
    (in the categories where some were merged) and draws them instead of the merged
    bars once a zoom leaves at most ``max_bars`` in view, all bars counted. The file
    depends only on the trace, the title, ``max_bars`` and ``below``, not on ``path``.
    """
    spec, info = timeline_spec(trace, title, max_bars=max_bars, zoom_detail=True)
    detail = info.pop("detail", None)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(trace.meta.get("scenario") or "parasim"))
    # "</" cannot end the script early: labels are the scenario's own strings
    data = json.dumps(detail, separators=(",", ":")).replace("</", "<\\/")
    page = pio.to_html(
        spec,
        validate=False,
        include_plotlyjs=PLOTLY_JS,
        full_html=True,
        div_id=_DIV_ID,
        post_script=(
            _ZOOM_SCRIPT.replace("DETAIL", data).replace("PIXELS", f"{PIXEL_DIVISIONS:g}")
            if detail
            else None
        ),
        config={
            "scrollZoom": True,
            "displaylogo": False,
            "responsive": True,
            "modeBarButtonsToRemove": ["lasso2d", "select2d"],
            "toImageButtonOptions": {"filename": f"{slug}-timeline", "scale": 2},
        },
    )
    if below:
        end = page.rindex("</body>")
        page = page[:end] + below + page[end:]
    Path(path).write_text(page, encoding="utf-8")
    write_plotly_js(Path(path).parent)
    info["path"] = str(path)
    info["zoom_detail"] = detail is not None
    return info
