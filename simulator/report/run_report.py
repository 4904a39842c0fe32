"""``report.html``: one self-contained page that explains a run at a glance.

The page opens with the headline numbers of the step (step time, tokens/s, TFLOP/s per
GPU, MFU, the bubble and exposed-communication shares, peak memory against capacity,
warnings), then draws, each with a caption saying what to read from it:

* ``breakdown``: the time of each rank as a stacked bar of the accounting categories
  (compute, exposed_comm, bubble, imbalance_stall, other); above ``MAX_BREAKDOWN_ROWS``
  ranks, one bar per pipeline stage holds the mean of its ranks;
* ``exposed-comm``: the exposed communication of the same rows split by parallel axis;
* ``memory``: peak memory per pipeline stage stacked by term, against the GPU capacity;
* ``links``: utilisation of the busiest links over the step, in flow fidelity only;
* ``timeline``: the Gantt chart of :func:`simulator.report.timeline.timeline_spec`,
  from the same trace as ``timeline.html`` but held to ``REPORT_MAX_BARS`` bars so the
  page stays a few MB: the ranks and merged bars follow the rule of
  :func:`simulator.report.timeline.fit_trace`, so with too many ops both pages draw the
  run's representative ranks (one per pipeline stage and the critical rank).

Each chart is a plotly div with that id; plotly.js is inlined once in the page head, so
the file opens offline. The page depends only on the run and the title: the same run
gives the same bytes.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from simulator.analysis.links import busiest as busiest_links
from simulator.analysis.links import carried_bytes, link_name, utilisation_bins
from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import MemoryEstimate, RankAccount, StepResult
from simulator.analysis.trace import Trace
from simulator.report.plan_report import plan_figure, plan_lines
from simulator.report.plotly_bundle import SCRIPT_TAG, write_plotly_js
from simulator.report.style import (
    AXIS_COLORS,
    BREAKDOWN_COLORS,
    MEMORY_COLORS,
    OTHER_COLOR,
    PAGE_CSS,
    PLOT_CONFIG,
    base_layout,
    page_figure,
)
from simulator.report.timeline import timeline_spec
from simulator.run.simulate import RunResult, make_trace, trace_ranks
from topologies.units import format_bandwidth, format_bytes, format_time

__all__ = [
    "MAX_BREAKDOWN_ROWS",
    "REPORT_MAX_BARS",
    "LINK_ROWS",
    "LINK_BINS",
    "breakdown_rows",
    "breakdown_figure",
    "exposed_comm_figure",
    "memory_figure",
    "link_heatmap",
    "run_report_html",
    "write_run_report",
]

#: Above this many simulated ranks the breakdown charts show one row per pipeline stage.
MAX_BREAKDOWN_ROWS = 64
#: The most bars the report's timeline draws (``timeline.html`` draws more).
REPORT_MAX_BARS = 8000
#: Links the heatmap shows (the busiest by bytes carried) and time bins per link.
LINK_ROWS = 30
LINK_BINS = 200

_GIB = 2.0**30
_MS = 1e3


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "–"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _parameters(count: float) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"


# --- rows of the breakdown charts ---------------------------------------------------------


def breakdown_rows(result: StepResult) -> tuple[list[dict[str, Any]], str]:
    """The rows the breakdown charts draw and what a row is (``"rank"`` or ``"stage"``).

    Each row has ``label``, ``detail`` (a line for the hover), ``breakdown`` (seconds per
    category) and ``exposed_comm_by_axis`` (seconds per axis). Up to
    ``MAX_BREAKDOWN_ROWS`` simulated ranks give one row each; more give one row per
    pipeline stage, the mean of its ranks.
    """
    per_rank = sorted(result.per_rank, key=lambda row: row.rank)
    critical = result.breakdown.critical_rank
    simulation = result.simulation
    folded = bool(simulation.get("folded"))
    if len(per_rank) <= MAX_BREAKDOWN_ROWS:
        rows = []
        for row in per_rank:
            label = f"stage {row.pp} · r{row.rank}" if folded else f"r{row.rank}"
            if not folded and result.layout.pp > 1:
                label += f" · pp{row.pp}"
            if row.rank == critical:
                label += " ★"
            detail = f"node {row.node} · tp {row.tp} · dp {row.dp} · pp {row.pp}"
            if folded:
                group = " and EP group" if "ep_group" in row.class_coords else ""
                detail += f" · stands for {row.ranks} ranks of its stage{group}"
            if row.rank == critical:
                detail += " · critical rank (sets the step time)"
            rows.append(
                {
                    "label": label,
                    "detail": detail,
                    "breakdown": row.breakdown,
                    "exposed_comm_by_axis": row.exposed_comm_by_axis,
                }
            )
        return rows, "rank"
    stages: dict[int, list[RankAccount]] = {}
    for row in per_rank:
        stages.setdefault(row.pp, []).append(row)
    rows = []
    for stage in sorted(stages):
        members = stages[stage]
        slowest = max(members, key=lambda row: (row.end_s, -row.rank))
        axes = sorted({axis for row in members for axis in row.exposed_comm_by_axis})
        has_critical = any(row.rank == critical for row in members)
        detail = f"mean of {len(members)} ranks · slowest r{slowest.rank}"
        if has_critical:
            detail += f" · holds the critical rank r{critical}"
        rows.append(
            {
                "label": f"stage {stage}" + (" ★" if has_critical else ""),
                "detail": detail,
                "breakdown": {
                    c: sum(row.breakdown.get(c, 0.0) for row in members) / len(members)
                    for c in CATEGORIES
                },
                "exposed_comm_by_axis": {
                    axis: sum(row.exposed_comm_by_axis.get(axis, 0.0) for row in members)
                    / len(members)
                    for axis in axes
                },
            }
        )
    return rows, "stage"


def _figure(with_template: bool) -> go.Figure:
    """An empty chart; without ``with_template`` it holds an empty template from the
    start, so that plotly builds not even its default one (the page adds the
    template's JSON: :func:`~simulator.report.style.page_figure`)."""
    return go.Figure() if with_template else go.Figure(layout={"template": {}})


def _rows_layout(
    rows: list[dict[str, Any]], step: float | None, with_template: bool, **overrides: Any
) -> dict[str, Any]:
    """Layout of a horizontal stacked bar chart with one bar per row, first row on top,
    with a dotted line at the step time unless ``step`` is None."""
    return base_layout(
        with_template,
        barmode="stack",
        bargap=0.25,
        height=110 + max(4, len(rows)) * (22 if len(rows) <= 40 else 14),
        hovermode="closest",
        xaxis={
            "title": {"text": "time in the step (ms)"},
            "rangemode": "tozero",
            "showline": True,
            "linecolor": "#999",
            "zeroline": False,
        },
        yaxis={
            "autorange": "reversed",
            "automargin": True,
            "tickfont": {"size": 11 if len(rows) <= 40 else 9},
        },
        shapes=[
            {
                "type": "line",
                "xref": "x",
                "x0": step * _MS,
                "x1": step * _MS,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"color": "#555", "width": 1, "dash": "dot"},
            }
        ]
        if step
        else [],
        **overrides,
    )


def breakdown_figure(result: StepResult, with_template: bool = True) -> go.Figure:
    """One horizontal stacked bar per row of :func:`breakdown_rows`, one trace per
    category (every category, so the legend is the same for every run). Each chart of
    this module takes ``with_template`` as :func:`~simulator.report.style.base_layout`
    does: the page builds its charts without (:func:`~simulator.report.style.page_figure`)."""
    rows, _ = breakdown_rows(result)
    step = result.step_time_s
    labels = [row["label"] for row in rows]
    fig = _figure(with_template)
    for category in CATEGORIES:
        seconds = [row["breakdown"].get(category, 0.0) for row in rows]
        fig.add_trace(
            go.Bar(
                name=category,
                orientation="h",
                y=labels,
                x=[s * _MS for s in seconds],
                marker={"color": BREAKDOWN_COLORS[category], "line": {"width": 0}},
                customdata=[
                    [format_time(s), _share(s, step), row["detail"]]
                    for s, row in zip(seconds, rows, strict=True)
                ],
                hovertemplate=(
                    f"<b>%{{y}}</b> · {category}<br>%{{customdata[0]}} "
                    "(%{customdata[1]} of the step)<br>%{customdata[2]}<extra></extra>"
                ),
            )
        )
    fig.update_layout(**_rows_layout(rows, step, with_template, showlegend=True))
    fig.update_layout(legend={"title": {"text": "category"}, "traceorder": "normal"})
    return fig


def _axes(rows: list[dict[str, Any]]) -> list[str]:
    present = {axis for row in rows for axis, s in row["exposed_comm_by_axis"].items() if s > 0}
    return [a for a in AXIS_COLORS if a in present] + sorted(present - set(AXIS_COLORS))


def exposed_comm_figure(result: StepResult, with_template: bool = True) -> go.Figure | None:
    """The exposed communication of each row split by parallel axis (one trace per axis
    that has any), or None when no communication was exposed."""
    rows, _ = breakdown_rows(result)
    axes = _axes(rows)
    if not axes:
        return None
    step = result.step_time_s
    fig = _figure(with_template)
    for axis in axes:
        seconds = [row["exposed_comm_by_axis"].get(axis, 0.0) for row in rows]
        fig.add_trace(
            go.Bar(
                name=axis,
                orientation="h",
                y=[row["label"] for row in rows],
                x=[s * _MS for s in seconds],
                marker={"color": AXIS_COLORS.get(axis, OTHER_COLOR), "line": {"width": 0}},
                customdata=[[format_time(s), _share(s, step)] for s in seconds],
                hovertemplate=(
                    f"<b>%{{y}}</b> · {axis} communication<br>%{{customdata[0]}} exposed "
                    "(%{customdata[1]} of the step)<extra></extra>"
                ),
            )
        )
    fig.update_layout(**_rows_layout(rows, None, with_template, showlegend=True))
    fig.update_layout(legend={"title": {"text": "axis"}, "traceorder": "normal"})
    fig.update_xaxes(title_text="exposed communication (ms)")
    return fig


# --- memory ----------------------------------------------------------------------------------


def memory_figure(memory: MemoryEstimate, with_template: bool = True) -> go.Figure:
    """Peak memory per GPU of each pipeline stage stacked by term, the GPU capacity as a
    dashed line (its own trace, named ``capacity …``) and, when out of memory, a red
    capacity line and a note over the chart."""
    stages = memory.per_stage
    capacity = memory.capacity_bytes
    terms: list[str] = []
    for stage in stages:
        terms += [t for t in stage.terms_bytes if t not in terms]
    terms = [t for t in MEMORY_COLORS if t in terms] + [t for t in terms if t not in MEMORY_COLORS]
    x = list(range(len(stages)))
    fig = _figure(with_template)
    for term in terms:
        values = [stage.terms_bytes.get(term, 0.0) for stage in stages]
        fig.add_trace(
            go.Bar(
                name=term.replace("_", " "),
                x=x,
                y=[v / _GIB for v in values],
                marker={"color": MEMORY_COLORS.get(term, OTHER_COLOR), "line": {"width": 0}},
                customdata=[
                    [
                        stage.stage,
                        format_bytes(v),
                        _share(v, stage.total_bytes),
                        format_bytes(stage.total_bytes),
                        stage.in_flight_microbatches,
                    ]
                    for v, stage in zip(values, stages, strict=True)
                ],
                hovertemplate=(
                    f"<b>stage %{{customdata[0]}}</b> · {term.replace('_', ' ')}<br>"
                    "%{customdata[1]} (%{customdata[2]} of %{customdata[3]})<br>"
                    "%{customdata[4]} micro-batches of activations held at the peak"
                    "<extra></extra>"
                ),
            )
        )
    oom = bool(memory.oom)
    line_color = "#B3261E" if oom else "#555"
    fig.add_trace(
        go.Scatter(
            name=f"capacity {format_bytes(capacity)}",
            x=[-0.5, len(stages) - 0.5],
            y=[capacity / _GIB, capacity / _GIB],
            mode="lines",
            line={"color": line_color, "width": 2, "dash": "dash"},
            hovertemplate=f"GPU capacity {format_bytes(capacity)}<extra></extra>",
        )
    )
    peak = memory.peak_bytes_per_gpu
    annotations = []
    if oom:
        annotations.append(
            {
                "text": (
                    f"<b>OUT OF MEMORY</b>: stage {memory.peak_stage} needs "
                    f"{format_bytes(peak)} per GPU, {peak / capacity:.1f}× the "
                    f"{format_bytes(capacity)} it has"
                ),
                "xref": "paper",
                "yref": "paper",
                "x": 0,
                "y": 1,
                "xanchor": "left",
                "yanchor": "bottom",
                "yshift": 4,
                "showarrow": False,
                "font": {"size": 13, "color": "#B3261E"},
                "bgcolor": "#FDECEC",
                "bordercolor": "#E45756",
                "borderwidth": 1,
                "borderpad": 4,
            }
        )
    fig.update_layout(
        **base_layout(
            with_template,
            barmode="stack",
            bargap=0.3 if len(stages) > 1 else 0.6,
            height=420,
            margin={"l": 70, "r": 40, "t": 70 if oom else 40, "b": 50},
            legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"},
            hovermode="closest",
            annotations=annotations,
            xaxis={
                "title": {"text": "pipeline stage (every rank of a stage holds the same)"},
                "tickmode": "array",
                "tickvals": x,
                "ticktext": [str(stage.stage) for stage in stages],
                "range": [-0.5, len(stages) - 0.5],
                "showline": True,
                "linecolor": "#999",
            },
            yaxis={
                "title": {"text": "GiB per GPU"},
                "range": [0, 1.12 * max(capacity, peak) / _GIB],
                "showline": True,
                "linecolor": "#999",
            },
        )
    )
    return fig


# --- links ----------------------------------------------------------------------------------


def link_heatmap(
    run: RunResult, top: int = LINK_ROWS, bins: int = LINK_BINS, with_template: bool = True
) -> go.Figure | None:
    """Utilisation (0..1) of the ``top`` links that carried the most bytes, in ``bins``
    slices of the step, busiest link on top; None when no link carried anything (every
    fidelity but flow)."""

    step = run.times.step_time
    utilisation = run.times.link_utilisation
    if step <= 0 or not utilisation:
        return None
    links = run.scenario.cluster.links
    # the busiest links by the bytes they carried (result.json's own figure), then the
    # bins of those alone: a flow run's series hold millions of points
    carried = carried_bytes(utilisation, step)
    ranked = busiest_links(carried, top, lambda link: link_name(links[link], " → "))
    busiest = [(-carried[link], link_name(links[link], " → "), link) for link in ranked]
    if not busiest:
        return None
    rows = [
        (
            key,
            name,
            link_id,
            links[link_id],
            utilisation_bins(utilisation[link_id], links[link_id].bandwidth, step, bins),
        )
        for key, name, link_id in busiest
    ]
    seen: dict[str, int] = {}
    labels = []
    for _, name, link_id, _, _ in rows:
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name} (link {link_id})")
    width = step / bins
    centres = [round((b + 0.5) * width * _MS, 6) for b in range(bins)]
    fig = _figure(with_template)
    fig.add_trace(
        go.Heatmap(
            z=[[round(min(1.0, v), 4) for v in row[4]] for row in rows],
            x=centres,
            y=labels,
            zmin=0,
            zmax=1,
            colorscale="Blues",
            colorbar={"title": {"text": "utilisation"}, "tickformat": ".0%", "len": 0.9},
            customdata=[
                [[format_bandwidth(row[3].bandwidth), format_bytes(-row[0])]] * bins for row in rows
            ],
            hovertemplate=(
                "<b>%{y}</b><br>around %{x:.3f} ms: %{z:.0%} of %{customdata[0]}<br>"
                "%{customdata[1]} over the step<extra></extra>"
            ),
            xgap=0,
            ygap=1,
        )
    )
    fig.update_layout(
        **base_layout(
            with_template,
            height=110 + 20 * len(rows),
            margin={"l": 40, "r": 40, "t": 20, "b": 50},
            xaxis={"title": {"text": "time in the step (ms)"}, "range": [0, step * _MS]},
            yaxis={"autorange": "reversed", "automargin": True, "tickfont": {"size": 10}},
        )
    )
    return fig


# --- timeline --------------------------------------------------------------------------------


# --- the page --------------------------------------------------------------------------------


def _div(fig: go.Figure | dict[str, Any], div_id: str) -> str:
    """A chart's ``<div>``, drawn from its plain dict (:func:`page_figure`): the page's
    charts are built without a template object, or as dicts, and drawn unvalidated."""
    return pio.to_html(
        page_figure(fig),
        validate=False,
        include_plotlyjs=False,
        full_html=False,
        div_id=div_id,
        config=PLOT_CONFIG,
        default_width="100%",
    )


def _card(label: str, value: str, detail: str = "", bad: bool = False) -> str:
    cls = "card bad" if bad else "card"
    return (
        f'<div class="{cls}"><div class="label">{_esc(label)}</div>'
        f'<div class="value">{_esc(value)}</div><div class="detail">{_esc(detail)}</div></div>'
    )


def _cards(result: StepResult) -> str:
    step = result.step_time_s
    critical = result.breakdown.critical
    mean = result.breakdown.mean
    rank = result.breakdown.critical_rank
    memory = result.memory
    peak, capacity = memory.peak_bytes_per_gpu, memory.capacity_bytes
    cards = [
        _card("step time", format_time(step), f"{result.fidelity} fidelity"),
        _card("throughput", f"{result.tokens_per_s:,.0f}", "tokens/s"),
        _card(
            "per GPU",
            f"{result.tflops_per_gpu:.1f} TFLOP/s",
            f"model FLOPs; {result.hardware_tflops_per_gpu:.1f} with recompute",
        ),
        _card("MFU", f"{100 * result.mfu:.1f}%", f"HFU {100 * result.hfu:.1f}%"),
        _card(
            "pipeline bubble",
            _share(critical["bubble"], step),
            f"of the step on r{rank}; mean {_share(mean['bubble'], step)}",
        ),
        _card(
            "exposed communication",
            _share(critical["exposed_comm"], step),
            f"of the step on r{rank}; mean {_share(mean['exposed_comm'], step)}",
        ),
    ]
    if max(critical.get("imbalance_stall", 0.0), mean.get("imbalance_stall", 0.0)) > 0:
        cards.append(
            _card(
                "imbalance stall",
                _share(critical["imbalance_stall"], step),
                f"of the step on r{rank}; mean {_share(mean['imbalance_stall'], step)}",
            )
        )
    cards.append(
        _card(
            "peak memory" + (" — out of memory" if memory.oom else ""),
            format_bytes(peak),
            f"of {format_bytes(capacity)} per GPU ({_share(peak, capacity)}); stage "
            f"{memory.peak_stage}, mostly {memory.dominant_term.replace('_', ' ')}",
            bad=bool(memory.oom),
        )
    )
    return '<div class="cards">' + "".join(cards) + "</div>"


def _warnings(result: StepResult) -> str:
    items = []
    for warning in result.warnings:
        cls = ' class="oom"' if str(warning).startswith("out of memory") else ""
        items.append(f"<li{cls}>{_esc(warning)}</li>")
    return f'<ul class="warnings">{"".join(items)}</ul>' if items else ""


def _setup(run: RunResult) -> str:
    result, scenario = run.result, run.scenario
    cluster, layout, model = result.cluster, result.layout, result.model
    parallel = scenario.parallel
    per_node = scenario.cluster_spec.gpus_per_node
    schedule = str(layout.schedule)
    if getattr(parallel, "virtual_stages", 1) > 1:
        schedule += f" ({parallel.virtual_stages} virtual stages per rank)"
    simulation = result.simulation
    fidelity = str(result.fidelity)
    if simulation.get("folded"):
        fidelity += (
            f"; {simulation['simulated_ranks']} of {cluster.gpus} ranks simulated, one per "
            "pipeline stage, each standing for its symmetric peers"
        )
    measured = result.measured
    if measured:
        fidelity += f" on {measured.device} ({measured.backend})"
    rows = [
        (
            "cluster",
            f"{cluster.nodes} × {cluster.name}: {cluster.gpus} × {cluster.gpu}"
            f" ({per_node} per node)",
        ),
        ("model", f"{model.name} ({_parameters(model.parameters)} parameters)"),
        (
            "layout",
            f"tp {layout.tp} · pp {layout.pp} · dp {layout.dp} · "
            f"ep {scenario.layout.ep} · sp {'on' if parallel.sp else 'off'} · "
            f"placement {', '.join(layout.placement)}",
        ),
        (
            "schedule",
            f"{schedule} · {_count(layout.microbatches, 'micro-batch', 'micro-batches')} "
            f"of {layout.micro_batch} · "
            f"global batch {layout.global_batch} · recompute {layout.recompute}",
        ),
        # the Recipe's one-line form: Recipe.parse reads it back
        ("recipe", str(scenario.recipe)),
        ("simulation", fidelity),
    ]
    moe = result.moe
    if moe:
        rows.append(
            (
                "experts",
                f"{moe.experts} experts, top-{moe.top_k}, ep {moe.ep}, "
                f"{moe.routing} routing · busiest expert gets "
                f"{moe.imbalance_max:.2f}× the mean · "
                f"{100 * moe.dropped_fraction:.1f}% tokens dropped",
            )
        )
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="setup">{body}</table>'


def _section(section_id: str, heading: str, caption: str, body: str) -> str:
    return (
        f'<section id="section-{section_id}"><h2>{_esc(heading)}</h2>'
        f'<p class="caption">{caption}</p>{body}</section>'
    )


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def run_report_html(
    run: RunResult, title: str, trace: Trace | None = None
) -> tuple[str, dict[str, Any]]:
    """The HTML text of ``report.html`` for ``run`` (a :class:`simulator.run.simulate.RunResult`)
    and a summary: ``charts`` (the div ids drawn, in page order) and ``timeline`` (what
    :func:`~simulator.report.timeline.timeline_spec` says it drew). ``trace`` is the
    trace ``timeline.html`` draws; it is made here the same way when not given."""
    if trace is None:
        trace = make_trace(run, trace_ranks(run)[0])
    result = run.result
    _, row_kind = breakdown_rows(result)
    charts: list[str] = []
    sections: list[str] = []

    summary = _cards(result) + _warnings(result) + _setup(run)
    description = run.scenario.spec.description

    by_what = (
        "one bar per rank"
        if row_kind == "rank"
        else f"one bar per pipeline stage, the mean of its ranks ({len(result.per_rank)} "
        "ranks are too many to draw one by one)"
    )
    sections.append(
        _section(
            "breakdown",
            "Where the step time goes",
            f"Each rank's step split into compute, exposed communication (not hidden behind "
            f"compute), pipeline bubble, waiting for slower peers (imbalance stall) and other "
            f"time; {_esc(by_what)}. ★ marks the critical rank, whose end sets the step time "
            f"(dotted line). Long non-compute segments are the time to win back.",
            _div(breakdown_figure(result, with_template=False), "breakdown"),
        )
    )
    charts.append("breakdown")

    comm = exposed_comm_figure(result, with_template=False)
    comm_caption = (
        "The exposed communication of the same bars split by parallel axis: which "
        "collective or transfer the ranks wait for. Large tp usually means tensor parallelism "
        "crosses a slow link; large dp, that gradient reduction is not overlapped with the "
        "backward; pp, activation hand-offs between stages; ep, expert all-to-alls."
    )
    if comm is not None:
        sections.append(
            _section(
                "exposed-comm",
                "Exposed communication by axis",
                comm_caption,
                _div(comm, "exposed-comm"),
            )
        )
        charts.append("exposed-comm")
    else:
        sections.append(
            _section(
                "exposed-comm",
                "Exposed communication by axis",
                comm_caption,
                _note(
                    "No communication is exposed in this step: all of it overlaps "
                    "with compute (or there is none)."
                ),
            )
        )

    memory = result.memory
    sections.append(
        _section(
            "memory",
            "Memory per GPU",
            "Peak memory of a GPU in each pipeline stage, stacked by what holds it, against "
            "the GPU's capacity (dashed line). A bar above the line does not fit: shard the "
            "optimizer state, recompute activations or split the model further. Allocator "
            "fragmentation and the CUDA context are not counted, so leave some headroom.",
            _div(memory_figure(memory, with_template=False), "memory"),
        )
    )
    charts.append("memory")

    heatmap = link_heatmap(run, with_template=False)
    link_caption = (
        f"Each row is a link, the {LINK_ROWS} that carried the most bytes with the busiest "
        f"on top; colour is the share of its bandwidth in use in each of {LINK_BINS} slices "
        "of the step. Columns lit across many links are collectives; a row that stays dark "
        "blue while others are idle is a hotspot that sets the communication time."
    )
    if heatmap is not None:
        sections.append(
            _section(
                "links", "Link utilisation over the step", link_caption, _div(heatmap, "links")
            )
        )
        charts.append("links")
    else:
        if result.fidelity == "flow":
            line = "No link carried any traffic in this step."
        elif result.fidelity == "measured":
            line = (
                "Link utilisation needs flow fidelity; a measured step records none. "
                "Simulate the scenario with --set simulation.fidelity=flow to see it."
            )
        else:
            line = (
                f"Link utilisation needs flow fidelity; this run is {result.fidelity}. "
                "Run it again with --set simulation.fidelity=flow to see it."
            )
        sections.append(
            _section("links", "Link utilisation over the step", link_caption, _note(line))
        )

    if run.plan is not None:  # the scenario's whole run (its run: section)
        sections.append(
            _section(
                "plan",
                "The whole run",
                " · ".join(plan_lines(run.plan))
                + ". Tokens trained against wall-clock days (the first of the Monte Carlo's "
                "draws, each interruption marked), where the wall time goes, and each phase's "
                "energy with its cost; parasim plan writes the phases' table.",
                _div(plan_figure(run.plan), "plan"),
            )
        )
        charts.append("plan")

    timeline, timeline_info = timeline_spec(trace, title, max_bars=REPORT_MAX_BARS)
    gap = timeline_info.get("merge_gap_s")
    fewer = []
    if len(timeline_info["ranks_shown"]) < len({rec.rank for rec in trace.records}):
        fewer.append(f"only {len(timeline_info['ranks_shown'])} representative ranks are drawn")
    if gap is not None and not timeline_info.get("merge_narrow"):
        fewer.append(f"ops of one kind less than {format_time(gap)} apart are drawn as one bar")
    more = (
        f" To keep this page small, {' and '.join(fewer)}; timeline.html beside it draws "
        "more, and trace.json holds every op of its ranks for https://ui.perfetto.dev."
        if fewer
        else " trace.json holds the same ops for https://ui.perfetto.dev."
    )
    sections.append(
        _section(
            "timeline",
            "Timeline",
            "Every op of the step on its rank and stream, coloured by kind. The hatched "
            "stretches of a compute lane are time that rank waits, named as in the breakdown "
            "above: pipeline bubble (mostly at the start and end of the step), exposed "
            "communication, imbalance stall. Drag to zoom, double-click to reset; click a "
            "legend entry to hide a kind." + _esc(more),
            _div(timeline, "timeline"),
        )
    )
    charts.append("timeline")

    version = result.parasim_version
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)} · parasim report</title>
<style>{PAGE_CSS}</style>
{SCRIPT_TAG}
</head>
<body>
<main>
<h1>{_esc(title)}</h1>
<p class="sub">{_esc(result.scenario)}{" · " + _esc(description) if description else ""}</p>
<section id="summary">{summary}</section>
{"".join(sections)}
<footer>parasim {_esc(version)} · beside this page: result.json (every number above),
trace.json (for Perfetto) and timeline.html (the full timeline)</footer>
</main>
</body>
</html>
"""
    return page, {"charts": charts, "timeline": timeline_info}


def write_run_report(
    run: RunResult, path: str | Path, title: str, trace: Trace | None = None
) -> dict[str, Any]:
    """Write ``report.html`` for ``run`` to ``path``; returns the summary of
    :func:`run_report_html` plus ``path`` and ``bytes``."""
    page, info = run_report_html(run, title, trace)
    data = page.encode("utf-8")
    Path(path).write_bytes(data)
    write_plotly_js(Path(path).parent)
    info.update(path=str(path), bytes=len(data))
    return info
