"""What ``parasim compare`` reads, shows and writes.

:func:`load_run_dir` reads a run folder (``result.json`` and the Chrome trace,
``trace.json`` or ``trace.json.gz``, as ``parasim run`` and ``parasim replay`` write
them) back into a result and a :class:`~simulator.analysis.trace.Trace`, refusing in one
line whatever is not such a folder (:class:`~simulator.report.chrome_trace.TraceFileError`);
:func:`simulator.tools.compare.compare_runs` compares two of them. This module then

* prints the two runs (folder, scenario, overrides), the step times, the peak memory
  per GPU and the time per rank of each op class, with the relative difference
  (:func:`print_compare`);
* writes ``compare.json``, the comparison, and ``compare.html``, the two timelines
  overlaid with each rank's lanes of the first side above those of the second, and the
  same tables below (:func:`write_compare_outputs`, :func:`write_overlay`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import StepResult
from simulator.analysis.trace import Trace
from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically, write_json
from simulator.report.chrome_trace import (
    TRACE_NAMES,
    TraceFileError,
    find_trace_file,
    json_kind,
    parse_json,
    read_bounded,
    read_trace_file,
)
from simulator.report.plotly_bundle import PLOTLY_JS
from simulator.report.timeline import write_timeline_html
from simulator.tools.compare import Comparison, Side, overlay_trace
from topologies.units import format_bytes, format_time

__all__ = [
    "COMPARE_FILES",
    "RESULT_LIMIT",
    "load_run_dir",
    "read_result_file",
    "print_compare",
    "compare_table",
    "write_compare_outputs",
    "write_overlay",
]

#: The largest ``result.json`` read, in bytes: a result holds one row per simulated
#: rank (about 1.5 kB each), a few MB for thousands of ranks.
RESULT_LIMIT = 256_000_000


def load_run_dir(path: Path) -> tuple[StepResult, Trace]:
    """``result.json`` and the Trace of ``trace.json`` (or ``trace.json.gz``) from a
    run folder; a :class:`ParasimError` in one line when ``path`` is not such a folder
    or a file in it cannot be read as parasim writes it."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise ParasimError(
            f"{path}: {what}; compare takes the folders that parasim run and parasim "
            "replay write (each holds result.json and trace.json)"
        )
    missing = [name for name in ("result.json",) if not (path / name).exists()]
    trace_file = find_trace_file(path)
    if trace_file is None:
        missing.append(" or ".join(TRACE_NAMES))
    if missing or trace_file is None:
        raise ParasimError(
            f"{path}: no {' and no '.join(missing)} (not a folder parasim run or parasim "
            "replay wrote; parasim run --outputs result writes no trace to compare)"
        )
    return read_result_file(path / "result.json"), read_trace_file(trace_file)


def read_result_file(path: Path) -> StepResult:
    """The :class:`StepResult` of a ``result.json``, its fields checked where compare
    reads them; a :class:`ParasimError` in one line when it is not a result parasim
    wrote."""
    data = parse_json(read_bounded(path, RESULT_LIMIT), str(path))
    if not isinstance(data, dict):
        raise TraceFileError(f"{path}: {json_kind(data)}, not a result (an object)")
    _check_result(data, str(path))
    try:
        return StepResult.from_json(data)
    except KeyError as exc:
        raise TraceFileError(f"{path}: no field {exc} (not a result parasim wrote)") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFileError(
            f"{path}: not in the form of parasim's result.json ({_first_line(exc)})"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _field(data: dict[str, Any], dotted: str, where: str) -> Any:
    """The value at ``dotted`` (``memory.oom``) of ``data``, or the error naming it."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise TraceFileError(f"{where}: no field {dotted} (not a result parasim wrote)")
        node = node[part]
    return node


def _check_result(data: dict[str, Any], where: str) -> None:
    """The fields compare reads, with the types parasim writes: names as strings,
    times and sizes as finite numbers of at least 0, ``memory.oom`` a boolean, the
    overrides a list of strings, ``measured`` an object where there is one."""

    def number(dotted: str) -> None:
        value = _field(data, dotted, where)
        try:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and 0 <= float(value) < math.inf
        except OverflowError:  # an integer beyond a float's range
            ok = False
        if not ok:
            raise TraceFileError(
                f"{where}: {dotted} is {value!r:.40}, not a finite number of at least 0"
            )

    for name in ("scenario", "fidelity"):
        if not isinstance(_field(data, name, where), str):
            raise TraceFileError(f"{where}: {name} is not a string")
    for dotted in ("step_time_s", "memory.peak_bytes_per_gpu", "memory.capacity_bytes"):
        number(dotted)
    for category in CATEGORIES:
        number(f"breakdown.mean.{category}")
    if not isinstance(_field(data, "memory.oom", where), bool):
        raise TraceFileError(f"{where}: memory.oom is not true or false")
    overrides = data.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise TraceFileError(f"{where}: overrides is not a list of strings")
    if data.get("measured") is not None and not isinstance(data["measured"], dict):
        raise TraceFileError(f"{where}: measured is not an object")


def write_overlay(
    first: Trace,
    second: Trace,
    path: Path,
    labels: tuple[str, str] = ("predicted", "measured"),
    below: str = "",
) -> None:
    """The timeline page of the two traces overlaid (:func:`overlay_trace`), lanes
    labelled by ``labels``, with the HTML ``below`` under it."""
    title = f"{labels[0]} (upper lanes) over {labels[1]}"
    write_timeline_html(overlay_trace(first, second, labels), path, title=title, below=below)


#: What compare writes in its folder (the page's plotly.js beside it).
COMPARE_FILES = ("compare.json", "compare.html", PLOTLY_JS)


def write_compare_outputs(report: Comparison, first: Trace, second: Trace, out: Path) -> list[Path]:
    """Write ``compare.json`` (``report``) and ``compare.html`` (the overlay of the
    traces of ``report``'s two sides, in its order, and below it the tables the command
    prints) to ``out``."""
    paths = [out / name for name in COMPARE_FILES[:2]]
    write_json(paths[0], report.to_json())
    write_atomically(
        paths[1],
        lambda tmp: write_overlay(first, second, tmp, report.labels, compare_table(report)),
    )
    return paths


def _percent(difference: float | None) -> str:
    """A relative difference as a signed percentage (a difference that rounds to
    nothing is +0.0%); "-" where there is none."""
    if difference is None:
        return "-"
    return f"{round(100 * difference, 1) + 0.0:+.1f}%"


def _difference_title(report: Comparison) -> str:
    """The column of the relative difference: ``error``, or ``A against B``."""
    return "A against B" if report.mode == "what-if" else "error"


def _made_by(side: Side) -> str:
    """What made a run: its scenario, fidelity and overrides."""
    overrides = " ".join(f"--set {o}" for o in side.overrides) or "as in its file"
    return f"{side.scenario} ({side.fidelity}) · {overrides}"


def _memory_cell(side: Side) -> str:
    if side.peak_bytes_per_gpu is None:
        return "not measured"
    verdict = " (OUT OF MEMORY)" if side.oom else ""
    return (
        f"{format_bytes(side.peak_bytes_per_gpu)} of {format_bytes(side.capacity_bytes)}{verdict}"
    )


def _time_cell(seconds: float | None) -> str:
    return "-" if seconds is None else format_time(seconds)


def _rows(report: Comparison) -> list[tuple[str, str, str, str]]:
    """The rows both tables show: step time, peak memory per GPU, then each op class
    (name, first side, second side, difference)."""
    first, second = report.sides
    memory = (report.memory.name, _memory_cell(first), _memory_cell(second))
    times = [
        (row.name, _time_cell(row.first), _time_cell(row.second), _percent(row.difference))
        for row in (report.step_time, *report.op_classes)
    ]
    return [times[0], (*memory, _percent(report.memory.difference)), *times[1:]]


def _runs_table(report: Comparison) -> str:
    cells = "".join(
        f"<tr><td>{html.escape(side.label)}</td><td>{html.escape(side.folder)}</td>"
        f"<td>{html.escape(_made_by(side))}</td></tr>"
        for side in report.sides
    )
    return (
        "<table id='parasim-compare-runs'><thead><tr><th></th><th>folder</th>"
        f"<th>run</th></tr></thead><tbody>{cells}</tbody></table>"
    )


def compare_table(report: Comparison) -> str:
    """The two runs (folder, scenario, overrides), then the step times, the peak memory
    per GPU and the time per rank of each op class, as HTML tables with the columns
    :func:`print_compare` prints (every cell escaped)."""
    first, second = report.labels
    head = "".join(
        f"<th>{html.escape(name)}</th>" for name in ("", first, second, _difference_title(report))
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in _rows(report)
    )
    ranks = ", ".join(str(rank) for rank in report.ranks_compared)
    style = (
        "<style>#parasim-compare-table,#parasim-compare-runs{border-collapse:collapse;"
        "font:12px sans-serif;margin:0 0 24px 110px}"
        "#parasim-compare-table td,#parasim-compare-table th,#parasim-compare-runs td,"
        "#parasim-compare-runs th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "#parasim-compare-table td:first-child,#parasim-compare-runs td{text-align:left}"
        "</style>"
    )
    heading = "<h3 style='font:bold 14px sans-serif;margin:8px 0 6px 110px'>{}</h3>"
    return (
        style
        + heading.format("The runs")
        + _runs_table(report)
        + heading.format(
            "Step time, peak memory per GPU and time per rank by op class (ranks "
            f"{html.escape(ranks)})"
        )
        + f"<table id='parasim-compare-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def print_compare(report: Comparison, console: Console, outputs: Iterable[str] = ()) -> None:
    """The two runs, then the step times, the peak memory per GPU and the time per rank
    of each op class as a table, each with the relative difference."""
    first, second = report.labels
    gap = _difference_title(report)
    if report.mode == "what-if":
        console.print("two runs of the same kind, a what-if: A against B")
    else:
        console.print("a prediction against a measurement: the prediction's error")
    width = max(len(side.label) for side in report.sides)
    for side in report.sides:
        console.print(f"  {side.label:<{width}}  {escape(side.folder)}  {escape(_made_by(side))}")
    step = report.step_time
    console.print(
        f"step time: {first} {_time_cell(step.first)}, {second} {_time_cell(step.second)}, "
        f"{gap} {_percent(step.difference)}"
    )
    if report.within_interval:
        console.print(
            "the difference is inside the predictions' trust intervals: parasim cannot "
            "tell these two apart with confidence"
        )
    table = Table(
        title="step time, memory and time per rank by op class",
        title_justify="left",
    )
    for column in ("", first, second, gap):
        table.add_column(column, justify="left" if column == "" else "right")
    for index, row in enumerate(_rows(report)):
        table.add_row(*(escape(cell) for cell in row), end_section=index == 1)
    console.print(table)
    if any(side.measured for side in report.sides):
        console.print("peak memory per GPU: a replay does not measure it")
    if outputs:
        console.print("wrote " + ", ".join(escape(str(p)) for p in outputs))
