"""What ``parasim plan`` shows and writes: the whole run's summary (time to train,
GPU-hours, goodput, cost, energy), a table of its phases, ``plan.json`` and
``plan.html``: the run's progress against wall-clock time with its interruptions drawn,
where the wall time goes (training, checkpoints, work lost, restarts) and each phase's
energy and cost."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simulator.report.sweep_report import (
    PageTable,
    csv_text,
    table_output_names,
    write_table_outputs,
)
from simulator.tools.plan import RunPlan
from topologies.units import format_time

__all__ = ["PLAN_FILES", "plan_figure", "plan_lines", "print_plan", "write_plan_outputs"]

#: What plan writes in its folder: plan.csv (a row per phase), plan.json, plan.html and
#: the page's plotly.js.
PLAN_FILES = tuple(table_output_names("plan"))
#: plan.csv's columns: each phase's figures.
CSV_FIELDS = (
    "name",
    "recipe",
    "gpus",
    "tokens",
    "steps",
    "step_s",
    "tokens_per_s",
    "train_s",
    "wall_s",
    "goodput",
    "checkpoint_stall_s",
    "checkpoint_interval_s",
    "failures",
    "energy_j",
)


def _days(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else format_time(seconds)


def plan_lines(plan: RunPlan) -> list[str]:
    """The run in a few lines: its time to train with its spread and goodput, its
    GPU-hours, cost and energy."""
    data = plan.to_json()
    lines = [
        f"time to train: {_days(plan.wall_s)} (80%: {_days(data['wall_p10_s'])} to "
        f"{_days(data['wall_p90_s'])}), {_days(plan.train_s)} of it training: goodput "
        f"{plan.goodput:.1%} at {plan.failures_per_gpu_hour:.3g} failures per GPU-hour",
        f"GPU-hours: {plan.gpu_hours / 1e6:,.3f} M "
        f"({data['gpu_hours_train'] / 1e6:,.3f} M training)",
    ]
    if plan.cost is not None:
        lines.append(
            f"cost: ${plan.cost:,.0f} at ${plan.price_per_gpu_hour:g} per GPU-hour "
            f"(${data['cost_per_million_tokens']:.3g} per million tokens)"
        )
    if data["energy_mwh"] is not None:
        lines.append(
            f"energy: {data['energy_mwh']:,.1f} MWh ({data['energy_per_token_j']:.3g} J per token)"
        )
    return lines


def print_plan(plan: RunPlan, console: Console, outputs: Iterable[str] = ()) -> None:
    """The run in a few lines, then its phases."""
    console.print(f"parasim plan · {escape(plan.scenario)} · {plan.tokens:.4g} tokens")
    for line in plan_lines(plan):
        console.print(escape(line))
    table = Table(title="phases (layout: tp pp dp and micro-batching)", title_justify="left")
    for column in (
        "phase",
        "recipe",
        "GPUs",
        "tokens",
        "step",
        "tokens/s",
        "wall",
        "goodput",
        "checkpoint",
        "every",
        "failures",
    ):
        table.add_column(column, justify="left" if column in ("phase", "recipe") else "right")
    for phase in plan.phases:
        good = phase.goodput
        table.add_row(
            escape(phase.name),
            escape(" ".join(phase.recipe.split()[:4])),
            f"{phase.gpus:,}",
            f"{phase.tokens:.3g}",
            format_time(phase.step_s),
            f"{phase.tokens_per_s:,.0f}",
            _days(good.wall_mean),
            f"{good.goodput:.1%}",
            format_time(phase.checkpoint.stall_s),
            format_time(good.interval),
            f"{good.failures:.0f}",
        )
    console.print(table)
    for warning in plan.warnings:
        console.print(f"warning: {escape(warning)}")
    if outputs:
        console.print("wrote " + ", ".join(escape(str(p)) for p in outputs))


def plan_figure(plan: RunPlan) -> go.Figure:
    """Progress against wall-clock time (each phase's first trial, interruptions as
    markers), the wall time by what it went to, and energy and cost per phase."""
    figure = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.5, 0.25, 0.25],
        subplot_titles=(
            "tokens trained against wall-clock time",
            "where the wall time goes",
            "energy per phase",
        ),
    )
    offset_s, offset_tokens = 0.0, 0.0
    for phase in plan.phases:
        points = phase.timeline
        scale = phase.tokens / phase.goodput.work if phase.goodput.work > 0 else 0.0
        xs = [(offset_s + wall) / 86400 for wall, _, _ in points]
        ys = [offset_tokens + progress * scale for _, progress, _ in points]
        figure.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", name=f"{phase.name}: progress"), row=1, col=1
        )
        failures = [
            (x, y) for x, y, (_, _, kind) in zip(xs, ys, points, strict=True) if kind == "failure"
        ]
        if failures:
            figure.add_trace(
                go.Scatter(
                    x=[x for x, _ in failures],
                    y=[y for _, y in failures],
                    mode="markers",
                    marker={"symbol": "x", "size": 6, "color": "#c0392b"},
                    name=f"{phase.name}: interruptions",
                ),
                row=1,
                col=1,
            )
        if points:
            offset_s += points[-1][0]
        offset_tokens += phase.tokens
    parts = {
        "training": sum(p.train_s for p in plan.phases),
        "checkpoints": sum(p.goodput.checkpointing for p in plan.phases),
        "work lost": sum(p.goodput.lost for p in plan.phases),
        "restarts": sum(p.goodput.restarting for p in plan.phases),
    }
    figure.add_trace(
        go.Bar(x=list(parts), y=[v / 86400 for v in parts.values()], name="days"), row=1, col=2
    )
    figure.add_trace(
        go.Bar(
            x=[p.name for p in plan.phases],
            y=[(p.energy_j or 0.0) / 3.6e9 for p in plan.phases],
            name="MWh",
            text=[
                f"${p.gpus * p.goodput.wall_mean / 3600 * plan.price_per_gpu_hour:,.0f}"
                if plan.price_per_gpu_hour is not None
                else ""
                for p in plan.phases
            ],
        ),
        row=1,
        col=3,
    )
    figure.update_xaxes(title_text="days", row=1, col=1)
    figure.update_yaxes(title_text="tokens", row=1, col=1)
    figure.update_yaxes(title_text="days", row=1, col=2)
    figure.update_yaxes(title_text="MWh (cost on the bars)", row=1, col=3)
    figure.update_layout(height=520, title=f"{plan.scenario}: the whole run", showlegend=True)
    return figure


def _csv_row(plan: RunPlan) -> list[dict]:
    return [
        {
            "name": p.name,
            "recipe": p.recipe,
            "gpus": p.gpus,
            "tokens": p.tokens,
            "steps": p.steps,
            "step_s": p.step_s,
            "tokens_per_s": p.tokens_per_s,
            "train_s": p.train_s,
            "wall_s": p.goodput.wall_mean,
            "goodput": p.goodput.goodput,
            "checkpoint_stall_s": p.checkpoint.stall_s,
            "checkpoint_interval_s": p.goodput.interval,
            "failures": p.goodput.failures,
            "energy_j": p.energy_j,
        }
        for p in plan.phases
    ]


#: The page's table: (header, cell key).
PAGE_COLUMNS = (
    ("phase", "name"),
    ("layout", "layout"),
    ("GPUs", "gpus"),
    ("tokens", "tokens"),
    ("step time", "step"),
    ("wall time", "wall"),
    ("goodput", "goodput"),
    ("checkpoint", "checkpoint"),
    ("energy", "energy"),
)


def write_plan_outputs(plan: RunPlan, out: Path) -> list[Path]:
    """``plan.csv``, ``plan.json`` and ``plan.html`` in ``out`` (the page's plotly.js
    beside them)."""
    rows = [
        {
            "name": p.name,
            "layout": p.recipe,
            "gpus": f"{p.gpus:,}",
            "tokens": f"{p.tokens:.4g}",
            "step": format_time(p.step_s),
            "wall": _days(p.goodput.wall_mean),
            "goodput": f"{p.goodput.goodput:.1%}",
            "checkpoint": (
                f"{format_time(p.checkpoint.stall_s)} every {format_time(p.goodput.interval)}"
            ),
            "energy": f"{p.energy_j / 3.6e9:,.1f} MWh" if p.energy_j is not None else "",
        }
        for p in plan.phases
    ]
    table = PageTable(PAGE_COLUMNS, rows, "Each phase of the run (plan.csv has them in full).")
    csv_rows = (CSV_FIELDS, _csv_row(plan), lambda row, key: csv_text(row.get(key)))
    return write_table_outputs(out, "plan", csv_rows, plan.to_json(), plan_figure(plan), table)
