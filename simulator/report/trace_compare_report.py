"""What ``parasim compare PREDICTED TRACE_DIR`` shows and writes: the prediction against
a real run's profiler traces (:func:`simulator.traces.compare.compare_with_traces`).

It prints the step times, the step's categories and the time per rank of each op kind
side by side with the prediction's error, then the largest differences with their
likely mechanism and the profile field that would absorb each; and writes
``compare.json`` (the comparison) and ``compare.html`` (the predicted timeline above
the measured one, the same tables below)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simulator.analysis.trace import Trace
from simulator.common.files import write_atomically, write_json
from simulator.report.compare_report import COMPARE_FILES, write_overlay
from simulator.tools.compare import Row
from simulator.traces.compare import TraceComparison
from topologies.units import format_time

__all__ = ["print_trace_compare", "trace_compare_tables", "write_trace_compare_outputs"]


def _percent(difference: float | None) -> str:
    return "-" if difference is None else f"{round(100 * difference, 1) + 0.0:+.1f}%"


def _cells(row: Row) -> tuple[str, str, str, str]:
    def time(seconds: float | None) -> str:
        return "-" if seconds is None else format_time(seconds)

    return (row.name, time(row.first), time(row.second), _percent(row.difference))


def _sections(report: TraceComparison) -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    step = (
        f"the measured step: ProfilerStep#{report.step_index}"
        if report.step_index >= 0
        else ("the measured step: the traces' whole span (no ProfilerStep# marks)")
    )
    return [
        (step, [_cells(report.step)]),
        ("where the step goes (mean over the ranks)", [_cells(r) for r in report.categories]),
        ("time per rank by op kind (the median rank)", [_cells(r) for r in report.kinds]),
    ]


def _difference_lines(report: TraceComparison) -> list[str]:
    return [
        f"{index}. {d.place}: {format_time(abs(d.seconds))} {'more' if d.seconds > 0 else 'less'}"
        f" in the run: {d.mechanism} (absorbed by {d.field})"
        for index, d in enumerate(report.differences, 1)
    ]


def print_trace_compare(
    report: TraceComparison, console: Console, outputs: Iterable[str] = ()
) -> None:
    """The comparison as tables, then the differences named."""
    console.print("a prediction against a run's profiler traces: the prediction's error")
    console.print(f"  predicted  {escape(report.predicted_folder)}  {escape(report.scenario)}")
    ranks = ", ".join(map(str, report.ranks))
    console.print(f"  measured   {escape(report.traces_folder)}  ranks {ranks}")
    for title, rows in _sections(report):
        table = Table(title=title, title_justify="left")
        for column in ("", "predicted", "measured", "error"):
            table.add_column(column, justify="left" if not column else "right")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
    if report.differences:
        console.print("where they part ways, the largest first:")
        for line in _difference_lines(report):
            console.print("  " + escape(line))
    if outputs:
        console.print("wrote " + ", ".join(escape(str(p)) for p in outputs))


def trace_compare_tables(report: TraceComparison) -> str:
    """The printed tables and differences as HTML (every cell escaped)."""
    style = (
        "<style>.parasim-trace-compare{border-collapse:collapse;font:12px sans-serif;"
        "margin:0 0 18px 110px}.parasim-trace-compare td,.parasim-trace-compare th{border:"
        "1px solid #ccc;padding:2px 8px;text-align:right}.parasim-trace-compare "
        "td:first-child{text-align:left}</style>"
    )
    heading = "<h3 style='font:bold 14px sans-serif;margin:8px 0 6px 110px'>{}</h3>"
    parts = [style]
    for title, rows in _sections(report):
        head = "".join(f"<th>{name}</th>" for name in ("", "predicted", "measured", "error"))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in rows
        )
        parts.append(heading.format(html.escape(title)))
        parts.append(
            f"<table class='parasim-trace-compare'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )
    if report.differences:
        parts.append(heading.format("Where they part ways, the largest first"))
        items = "".join(f"<li>{html.escape(line[3:])}</li>" for line in _difference_lines(report))
        style = "font:12px sans-serif;margin-left:110px"
        parts.append(f"<ol id='parasim-differences' style='{style}'>{items}</ol>")
    return "".join(parts)


def write_trace_compare_outputs(
    report: TraceComparison, predicted: Trace, measured: Trace, out: Path
) -> list[Path]:
    """``compare.json`` and ``compare.html`` (the predicted timeline's lanes above the
    measured one's, the tables below) in ``out``."""
    paths = [out / name for name in COMPARE_FILES[:2]]
    write_json(paths[0], report.to_json())
    write_atomically(
        paths[1],
        lambda tmp: write_overlay(
            predicted, measured, tmp, ("predicted", "measured"), trace_compare_tables(report)
        ),
    )
    return paths
