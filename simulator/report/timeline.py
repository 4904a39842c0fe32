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

A browser cannot draw a million bars, so the chart holds at most ``max_bars``. When the
trace has more, a representative subset of ranks is drawn: the ranks listed in
``trace.meta["representative_ranks"]`` if present (thinned evenly if even they do not
fit), otherwise evenly spaced ranks that include the first and the last. A note above
the chart then says how many ranks of how many are shown; it also appears when the
trace itself holds only some ranks of the job (``meta["world"]`` larger than the ranks
present). The file embeds plotly.js, so it opens offline.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from simulator.analysis.trace import OpRecord, Trace, category_of
from simulator.report.chrome_trace import select_ranks, stream_order
from topologies.units import format_bytes, format_flops, format_time

__all__ = ["CATEGORY_COLORS", "IDLE_COLORS", "timeline_figure", "write_timeline_html"]

#: Fixed colour of each display category; the order is the legend order.
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

_FONT = "Inter, 'Helvetica Neue', Helvetica, Arial, sans-serif"
_DIV_ID = "parasim-timeline"
_MARGIN = {"l": 110, "r": 150, "t": 130, "b": 40}


def _display_category(rec: OpRecord) -> str:
    cat = category_of(rec)
    return cat if cat in CATEGORY_COLORS else "other"


def _human_bytes(n: float) -> str:
    return format_bytes(n)


def _human_flops(n: float) -> str:
    return format_flops(n).replace("FLOP/s", "FLOP")


def _human_time(seconds: float) -> str:
    return format_time(seconds)


def coalesce(records: list[OpRecord], resolution: float) -> list[OpRecord]:
    """Merge ops that follow each other in one lane, in one category, less than
    ``resolution`` seconds apart, into one bar: at a zoom where such gaps are below a
    pixel the chart looks the same, with far fewer bars. A merged bar's label names its
    first and last op and how many it holds; bytes and FLOPs are summed."""
    lanes: dict[tuple[int, str], list[OpRecord]] = defaultdict(list)
    for rec in records:
        lanes[(rec.rank, rec.stream)].append(rec)
    merged: list[OpRecord] = []
    for lane in lanes.values():
        lane.sort(key=lambda r: (r.start, r.op_id))
        run: list[OpRecord] = []
        for rec in lane:
            if run and (
                _display_category(rec) != _display_category(run[-1])
                or rec.start - run[-1].end > resolution
            ):
                merged.append(_merge(run))
                run = []
            run.append(rec)
        if run:
            merged.append(_merge(run))
    return merged


def _merge(run: list[OpRecord]) -> OpRecord:
    if len(run) == 1:
        return run[0]
    first, last = run[0], run[-1]
    shared = {k: v for k, v in first.tags.items() if all(r.tags.get(k) == v for r in run)}
    # how much of the merged span its ops were busy: drawn as the bar's opacity
    shared["busy_s"] = sum(r.end - r.start for r in run)
    return replace(
        first,
        label=f"{len(run)} ops: {first.label} … {last.label}",
        tags=shared,
        end=max(r.end for r in run),
        bytes=sum(r.bytes for r in run),
        flops=sum(r.flops for r in run),
    )


def _hover(rec: OpRecord, cat: str, lane: str) -> str:
    tags = rec.tags
    lines = [f"<b>{rec.label or rec.kind}</b>", f"{cat} · {rec.kind} · {lane}"]
    where = []
    if tags.get("layer") is not None:
        where.append(f"layer {tags['layer']}")
    if tags.get("microbatch") is not None:
        where.append(f"micro-batch {tags['microbatch']}")
    if tags.get("stage") is not None:
        where.append(f"stage {tags['stage']}")
    if tags.get("phase") is not None:
        where.append(str(tags["phase"]))
    if where:
        lines.append(" · ".join(where))
    lines.append(
        f"start {rec.start * 1e3:.4f} ms · duration {_human_time(max(0.0, rec.end - rec.start))}"
    )
    if tags.get("busy_s") is not None:
        lines.append(f"busy {_human_time(tags['busy_s'])} of that span")
    if rec.start > rec.ready:
        lines.append(f"waited {_human_time(rec.start - rec.ready)} before starting")
    size = [_human_bytes(rec.bytes)]
    if rec.flops:
        size.append(_human_flops(rec.flops))
    lines.append(" · ".join(size))
    if rec.group is not None:
        lines.append(f"group {rec.group}")
    if rec.peer is not None:
        lines.append(f"peer r{rec.peer}")
    return "<br>".join(lines)


def _pick_records(trace: Trace, max_bars: int) -> tuple[list[OpRecord], dict[str, Any]]:
    """The records to draw and a summary of what was kept, in one pass (plus a sort
    only when a single rank alone exceeds ``max_bars``)."""
    counts: dict[int, int] = defaultdict(int)
    for rec in trace.records:
        counts[rec.rank] += 1
    total = len(trace.records)
    # the trace itself may hold only some ranks of the job (meta["world"] says how many)
    world = trace.meta.get("world")
    ranks_total = max(len(counts), int(world)) if isinstance(world, int) else len(counts)
    # representative ranks mean something unless they are every rank of the job
    reps = [r for r in trace.meta.get("representative_ranks") or () if r in counts]
    if set(reps) == set(counts) and ranks_total == len(counts):
        reps = []
    ranks = select_ranks(counts, max_bars, reps)
    keep = set(ranks)
    records = (
        trace.records if len(keep) == len(counts) else [r for r in trace.records if r.rank in keep]
    )
    truncated = len(records) > max_bars
    if truncated:
        records = sorted(records, key=lambda r: (r.start, r.rank, r.op_id))[:max_bars]
    if len(keep) == ranks_total:
        selection = "all ranks"
    elif reps and keep == set(reps):
        selection = "representative ranks"
    elif reps:
        selection = "evenly spaced representative ranks"
    elif len(keep) == len(counts):
        selection = "the ranks in the trace"
    else:
        selection = "evenly spaced ranks"
    info = {
        "ranks_shown": ranks,
        "ranks_total": ranks_total,
        "bars": len(records),
        "bars_total": total,
        "capped": len(records) < total or len(keep) < ranks_total,
        "truncated": truncated,
        "selection": selection,
    }
    return records, info


def _cap_note(info: dict[str, Any], max_bars: int) -> str:
    note = _rank_note(info, max_bars)
    if "merge_gap_s" in info:
        gap = info["merge_gap_s"]
        # below a nanosecond the merge joins only ops that touch: say so, not "0.25 ns"
        apart = "that touch" if gap < 1e-9 else f"less than {_human_time(gap)} apart"
        note += (
            f"; ops of one kind {apart} are drawn as one bar "
            f"({info['coalesced_from']:,} ops; trace.json has each one)"
        )
    return note


def _rank_note(info: dict[str, Any], max_bars: int) -> str:
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
    if info["bars"] == info["bars_total"]:
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


def _idle_bars(
    trace: Trace, lane_of: dict[tuple[int, str], int]
) -> dict[str, dict[str, list[Any]]]:
    """Bars for the idle stretches of each drawn rank's compute lane
    (``trace.meta["idle"]``, from the time accounting), by category."""
    bars: dict[str, dict[str, list[Any]]] = {}
    for rank_text, intervals in (trace.meta.get("idle") or {}).items():
        lane = lane_of.get((int(rank_text), "compute"))
        if lane is None:
            continue
        for category, lo, hi in intervals:
            if category not in IDLE_COLORS or hi <= lo:
                continue
            col = bars.setdefault(category, {"base": [], "x": [], "y": [], "text": []})
            col["base"].append(lo * 1e3)
            col["x"].append((hi - lo) * 1e3)
            col["y"].append(lane)
            col["text"].append(
                f"<b>{_IDLE_NAMES[category]}</b><br>r{rank_text} compute idle "
                f"{_human_time(hi - lo)}<br>from {_human_time(lo)} to {_human_time(hi)}"
            )
    return {cat: bars[cat] for cat in IDLE_COLORS if cat in bars}


def timeline_figure(
    trace: Trace, title: str, max_bars: int = 30000
) -> tuple[go.Figure, dict[str, Any]]:
    """The Gantt chart of ``trace`` and a summary: ``ranks_shown``, ``ranks_total``,
    ``bars``, ``bars_total``, ``lanes``, ``categories``, ``capped``, ``truncated`` and
    ``selection`` (how the ranks shown were chosen)."""
    if max_bars < 1:
        raise ValueError(f"max_bars must be at least 1, got {max_bars}")
    info_extra: dict[str, Any] = {}
    if len(trace.records) > max_bars and trace.step_time > 0:
        # Merge touching ops first; widen the merge only as far as the budget needs.
        for divisions in (1e9, 3e4, 1e4, 5e3, 2e3):
            coalesced = coalesce(trace.records, trace.step_time / divisions)
            if len(coalesced) <= max_bars:
                break
        info_extra = {
            "coalesced_from": len(trace.records),
            "merge_gap_s": trace.step_time / divisions,
        }
        trace = replace(trace, records=coalesced)
    records, info = _pick_records(trace, max_bars)
    if info_extra:
        info.update(info_extra, capped=True)

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

    bars: dict[str, dict[str, list[Any]]] = {}
    for rec in records:
        cat = _display_category(rec)
        lane = lane_of[(rec.rank, rec.stream)]
        col = bars.get(cat)
        if col is None:
            col = bars[cat] = {"base": [], "x": [], "y": [], "text": [], "opacity": []}
        span = max(0.0, rec.end - rec.start)
        busy = rec.tags.get("busy_s")
        col["opacity"].append(
            1.0 if busy is None or span <= 0 else max(0.25, min(1.0, busy / span))
        )
        col["base"].append(rec.start * 1e3)
        col["x"].append(span * 1e3)
        col["y"].append(lane)
        col["text"].append(_hover(rec, cat, lane_names[lane]))

    idle = _idle_bars(trace, lane_of)
    fig = go.Figure()
    categories = [cat for cat in CATEGORY_COLORS if cat in bars]
    for cat in categories:
        col = bars[cat]
        fig.add_trace(
            go.Bar(
                name=cat,
                orientation="h",
                base=col["base"],
                x=col["x"],
                y=col["y"],
                width=0.78,
                # no outline: on narrow bars a white outline washes the colour out
                # merged bars are as opaque as their ops were busy over the span
                marker={
                    "color": CATEGORY_COLORS[cat],
                    "line": {"width": 0},
                    "opacity": col["opacity"],
                },
                hovertext=col["text"],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    for cat, col in idle.items():
        fig.add_trace(
            go.Bar(
                name=_IDLE_NAMES[cat],
                orientation="h",
                base=col["base"],
                x=col["x"],
                y=col["y"],
                width=0.78,
                marker={
                    "color": "rgba(255,255,255,0)",
                    "line": {"width": 0},
                    "pattern": {"shape": "/", "fgcolor": IDLE_COLORS[cat], "solidity": 0.35},
                },
                hovertext=col["text"],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    categories += [_IDLE_NAMES[cat] for cat in idle]

    n_lanes = len(lane_names)
    lane_px = 22 if n_lanes <= 80 else 14
    # at least enough room for the legend next to the plot
    height = _MARGIN["t"] + _MARGIN["b"] + max(240, n_lanes * lane_px)
    step_ms = trace.step_time * 1e3

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
                "text": _cap_note(info, max_bars),
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

    fig.update_layout(
        title={
            "text": title_text,
            "x": 0.01,
            "xanchor": "left",
            "yref": "container",
            "y": 1,
            "yanchor": "top",
            "pad": {"t": 14},
        },
        template="plotly_white",
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
            "range": [0, step_ms * 1.01] if step_ms > 0 else None,
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
        shapes=shapes,
        annotations=annotations,
    )
    info["lanes"] = n_lanes
    info["categories"] = categories
    return fig, info


def write_timeline_html(
    trace: Trace, path: str | Path, title: str, max_bars: int = 30000
) -> dict[str, Any]:
    """Write the timeline of ``trace`` to ``path`` as a self-contained HTML file.

    Returns the summary of :func:`timeline_figure` plus ``path``: which ranks are
    shown, how many bars were drawn, and whether the chart was capped. The file
    depends only on the trace, the title and ``max_bars``, not on ``path``.
    """
    fig, info = timeline_figure(trace, title, max_bars=max_bars)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(trace.meta.get("scenario") or "parasim"))
    fig.write_html(
        str(path),
        include_plotlyjs=True,
        full_html=True,
        div_id=_DIV_ID,
        config={
            "scrollZoom": True,
            "displaylogo": False,
            "responsive": True,
            "modeBarButtonsToRemove": ["lasso2d", "select2d"],
            "toImageButtonOptions": {"filename": f"{slug}-timeline", "scale": 2},
        },
    )
    info["path"] = str(path)
    return info
