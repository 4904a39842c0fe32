"""What ``parasim compare`` reads, shows and writes.

:func:`load_run_dir` reads a run folder (``result.json`` and the Chrome trace
``trace.json``, as ``parasim run`` and ``parasim replay`` write them) back into a
result and a :class:`~simulator.analysis.trace.Trace`;
:func:`simulator.tools.compare.compare_runs` compares two of them. This module then

* prints the step-time error and the time per rank of each op class, predicted
  against measured (:func:`print_compare`);
* writes ``compare.json``, the comparison, and ``compare.html``, the two timelines
  overlaid with each rank's predicted lanes above its measured lanes
  (:func:`write_compare_outputs`, :func:`write_overlay`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulator.analysis.result import StepResult
from simulator.analysis.trace import Trace
from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically, write_json
from simulator.report.chrome_trace import trace_from_chrome
from simulator.report.timeline import write_timeline_html
from simulator.tools.compare import Comparison, overlay_trace
from topologies.units import format_time

__all__ = ["load_run_dir", "print_compare", "write_compare_outputs", "write_overlay"]


def load_run_dir(path: Path) -> tuple[StepResult, Trace]:
    """``result.json`` and the Trace of ``trace.json`` from a run folder."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise ParasimError(
            f"{path}: {what}; compare takes the folders that parasim run and parasim "
            "replay write (each holds result.json and trace.json)"
        )
    try:
        result = StepResult.from_json(json.loads((path / "result.json").read_text()))
        trace = trace_from_chrome(json.loads((path / "trace.json").read_text()))
    except FileNotFoundError as exc:
        raise ParasimError(
            f"{path}: no {Path(exc.filename).name} (not a parasim run folder)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, OSError) as exc:
        raise ParasimError(f"{path}: unreadable run files ({type(exc).__name__})") from None
    return result, trace


def write_overlay(
    p_trace: Trace,
    m_trace: Trace,
    path: Path,
    title: str = "predicted (upper lanes) over measured",
    below: str = "",
) -> None:
    """The timeline page of the two traces overlaid (:func:`overlay_trace`), with the
    HTML ``below`` under it."""
    write_timeline_html(overlay_trace(p_trace, m_trace), path, title=title, below=below)


def write_compare_outputs(
    report: Comparison, p_trace: Trace, m_trace: Trace, out: Path
) -> list[Path]:
    """Write ``compare.json`` (``report``) and ``compare.html`` (the overlay, and below
    it the table the command prints) to ``out``."""
    paths = [out / "compare.json", out / "compare.html"]
    write_json(paths[0], report.to_json())
    first, second = report.labels
    write_atomically(
        paths[1],
        lambda tmp: write_overlay(
            p_trace, m_trace, tmp, f"{first} (upper lanes) over {second}", compare_table(report)
        ),
    )
    return paths


def _percent(error: float | None) -> str:
    return "-" if error is None else f"{100 * error:+.1f}%"


def _gap_name(report: Comparison) -> str:
    return "A against B" if report.mode == "what-if" else "error"


def compare_table(report: Comparison) -> str:
    """The step times and the time per rank of each op class, as an HTML table with
    the columns :func:`print_compare` prints (every cell escaped)."""
    first, second = report.labels
    rows = [("step time", report.step_time)] + [(row.op_class, row) for row in report.op_classes]
    head = "".join(
        f"<th>{html.escape(name)}</th>" for name in ("", first, second, _gap_name(report))
    )
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{format_time(row.predicted_s)}</td>"
        f"<td>{format_time(row.measured_s)}</td><td>{_percent(row.error)}</td></tr>"
        for name, row in rows
    )
    ranks = ", ".join(str(rank) for rank in report.ranks_compared)
    return (
        "<style>#parasim-compare-table{border-collapse:collapse;font:12px sans-serif;"
        "margin:0 0 24px 110px}#parasim-compare-table td,#parasim-compare-table th"
        "{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "#parasim-compare-table td:first-child{text-align:left}</style>"
        "<h3 style='font:bold 14px sans-serif;margin:8px 0 6px 110px'>Step time and time "
        f"per rank by op class (ranks {html.escape(ranks)})</h3>"
        f"<table id='parasim-compare-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def print_compare(
    report: Comparison,
    console: Console,
    outputs: Iterable[str] = (),
    sources: tuple[str, str] | None = None,
) -> None:
    """The step-time error, then the time per rank of each op class as a table
    (``sources``: the two run folders, named in a what-if comparison)."""
    step = report.step_time
    first, second = report.labels
    gap = _gap_name(report)
    if report.mode == "what-if":
        a, b = sources or ("", "")
        console.print(
            f"two runs of the same kind, a what-if: A is {a} ({report.scenario['predicted']}), "
            f"B is {b} ({report.scenario['measured']})"
        )
    console.print(
        f"step time: {first} {format_time(step.predicted_s)}, {second} "
        f"{format_time(step.measured_s)}, {gap} {_percent(step.error)}"
    )
    table = Table(title="time per rank by op class (ranks in both runs)", title_justify="left")
    for column in ("op class", first, second, gap):
        table.add_column(column, justify="left" if column == "op class" else "right")
    for row in report.op_classes:
        table.add_row(
            row.op_class,
            format_time(row.predicted_s),
            format_time(row.measured_s),
            _percent(row.error),
        )
    console.print(table)
    if outputs:
        console.print("wrote " + ", ".join(str(p) for p in outputs))
