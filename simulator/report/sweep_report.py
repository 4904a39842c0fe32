"""What ``parasim sweep`` shows and writes: the ranking table, the counts and the files.

:func:`simulator.tools.sweep.run_sweep` finds and ranks the layouts; this module draws
its :class:`~simulator.tools.sweep.SweepResult`:

* :func:`print_sweep` prints the top layouts as a rich table (each row as two lines on
  a console too narrow for it, see :func:`print_table`) and then the counts of every
  filter (:func:`count_lines`);
* :func:`write_sweep_outputs` writes ``sweep.csv`` (every simulated layout, one row
  each, :data:`CSV_FIELDS`), ``sweep.json`` (:meth:`SweepResult.to_json`) and
  ``sweep.html``, the plotly chart of :func:`sweep_figure`: one bar per top layout,
  stacked by time-breakdown category in :data:`BAR_COLORS`.

:func:`wide_console` and :func:`print_table` also serve ``parasim scale``
(:mod:`simulator.report.scale_report`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from simulator.analysis.metrics import CATEGORIES
from simulator.common.files import write_atomically, write_csv, write_json
from simulator.report.plotly_bundle import PLOTLY_JS, write_plotly_js
from simulator.report.style import BREAKDOWN_COLORS, breakdown_bar
from simulator.tools.sweep import SweepResult
from topologies.units import format_time

__all__ = [
    "BAR_COLORS",
    "CSV_FIELDS",
    "count_lines",
    "print_sweep",
    "print_table",
    "sweep_figure",
    "wide_console",
    "write_sweep_outputs",
]

#: The colour of each time-breakdown category in the sweep's bars.
BAR_COLORS = BREAKDOWN_COLORS
#: The columns of ``sweep.csv``, in order.
CSV_FIELDS = (
    "rank",
    "layout",
    "tp",
    "pp",
    "dp",
    "ep",
    "sp",
    "micro_batch",
    "microbatches",
    "schedule",
    "virtual_stages",
    "recompute",
    "placement",
    "cp",
    "cp_kind",
    "sharding",
    "dp_shard",
    "stage_layers",
    "step_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "peak_bytes_per_gpu",
    "capacity_bytes",
    "memory_fraction",
    *(f"{c}_s" for c in CATEGORIES),
    "bubble_fraction",
    "exposed_comm_fraction",
    "stall_fraction",
    "overrides",
)


def wide_console() -> Console:
    """A console on stdout; when stdout is not a terminal, wide enough for a layout table."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 150))


def _csv_value(row: dict[str, Any], key: str) -> Any:
    if key.endswith("_s") and key[:-2] in CATEGORIES:
        return repr(row["breakdown_mean_s"][key[:-2]])
    value = row[key]
    if key == "placement":
        return "[" + ",".join(value) + "]"
    if key == "stage_layers":
        return "/".join(map(str, value)) if value else ""
    if key == "overrides":
        return " ".join(value)
    if isinstance(value, float):
        return repr(value)
    return value


# a layout's knobs but its placement, and its simulated numbers
_SAME_BUT_PLACEMENT = (
    "tp", "pp", "dp", "ep", "sp", "micro_batch", "schedule", "virtual_stages", "recompute",
    "cp", "cp_kind", "sharding", "dp_shard", "step_time_s", "peak_bytes_per_gpu",
)  # fmt: skip


def top_layouts(result: SweepResult, top: int) -> list[tuple[dict[str, Any], list[str]]]:
    """The ``top`` fastest layouts, each with the placements that give it exactly the same
    numbers (shown as one entry: ``[tp,dp,pp]`` and ``[tp,pp,dp]`` often tie)."""
    groups: list[tuple[dict[str, Any], list[str]]] = []
    index: dict[tuple, int] = {}
    for row in result.rows:
        key = tuple(
            tuple(value) if isinstance(value, list) else value
            for value in (row.get(name) for name in _SAME_BUT_PLACEMENT)
        )
        if key in index:
            groups[index[key]][1].append("[" + ",".join(row["placement"]) + "]")
            continue
        if len(groups) == top:
            continue
        index[key] = len(groups)
        groups.append((row, []))
    return groups


def _label(row: dict[str, Any], also: list[str]) -> str:
    return row["layout"] + (f" (also {' '.join(also)})" if also else "")


def sweep_figure(result: SweepResult, top: int) -> go.Figure:
    """Plotly figure: one horizontal stacked bar per top layout, mean breakdown (s)."""
    shown = top_layouts(result, top)
    rows = [row for row, _ in shown]
    labels = [f"{row['rank']}. {_label(row, also)}" for row, also in shown]
    fig = go.Figure()
    steps = [row["step_time_s"] for row in rows]
    for category in CATEGORIES:
        values = [row["breakdown_mean_s"][category] for row in rows]
        fig.add_trace(breakdown_bar(category, labels, values, steps))
    fig.update_layout(
        barmode="stack",
        title=(
            f"{result.scenario}: the {len(rows)} fastest layouts on {result.gpus} GPUs "
            f"({result.fidelity} fidelity; mean over ranks)"
        ),
        xaxis_title="time per step (s)",
        yaxis={"autorange": "reversed", "automargin": True},
        legend_title="category",
        height=max(360, 140 + 28 * len(rows)),
        template="plotly_white",
    )
    return fig


def write_sweep_outputs(result: SweepResult, out: Path, top: int = 10) -> list[Path]:
    """Write ``sweep.csv``, ``sweep.json`` and ``sweep.html`` (the top layouts) to ``out``."""
    # no timings in the JSON: the same inputs, the same bytes
    rows = (CSV_FIELDS, result.rows, _csv_value)
    charted = [row for row, _ in top_layouts(result, top)]
    return write_table_outputs(
        out, "sweep", rows, result.to_json(), sweep_figure(result, top), charted
    )


def write_table_outputs(
    out: Path,
    stem: str,
    rows: tuple[Iterable[str], list[dict[str, Any]], Any],
    payload: dict[str, Any],
    figure: go.Figure,
    charted: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """``<stem>.csv`` (``rows``: the fields, the rows and how a cell is written),
    ``<stem>.json`` (``payload``) and ``<stem>.html`` (``figure``, loading plotly.js from
    ``plotly.min.js`` beside it, and below it the table of the rows it charts:
    ``charted``, or every row) in ``out``, each written atomically; the paths in that
    order."""
    out = Path(out)
    paths = [out / f"{stem}.csv", out / f"{stem}.json", out / f"{stem}.html"]
    fields, table, value = rows
    write_csv(paths[0], fields, table, value)
    write_json(paths[1], payload)
    chart = figure.to_html(
        include_plotlyjs=PLOTLY_JS,
        full_html=False,
        div_id=f"parasim-{stem}",
        config={"displaylogo": False, "responsive": True},
    )
    shown = [name for name in fields if name != "overrides"]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in shown)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(str(value(row, name)))}</td>" for name in shown)
        + "</tr>"
        for row in (table if charted is None else charted)
    )
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>parasim {stem}</title>"
        "<style>body{font-family:sans-serif} table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "td:nth-child(2),th:nth-child(2){text-align:left}</style></head><body>"
        f"{chart}<h3>The rows charted above ({stem}.csv has every row)</h3>"
        f"<table id='parasim-{stem}-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></body></html>"
    )
    write_atomically(paths[2], lambda tmp: tmp.write_text(page, encoding="utf-8"))
    write_plotly_js(out)
    return paths


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def print_sweep(
    result: SweepResult, console: Console, top: int = 10, outputs: Iterable[str] = ()
) -> None:
    """The top layouts as a rich table, then the counts."""
    cluster = result.cluster
    table = Table(
        title=(
            f"parasim sweep · {result.scenario} · {result.model} on {result.gpus} × "
            f"{cluster['gpu']} ({cluster['nodes']} × {cluster['name']}) · "
            f"global batch {result.global_batch}"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name, justify in (
        ("#", "right"),
        ("layout", "left"),
        ("step time", "right"),
        ("TFLOP/s/GPU", "right"),
        ("MFU", "right"),
        ("memory", "right"),
        ("bubble", "right"),
        ("exp. comm", "right"),
        ("stall", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)
    for row, also in top_layouts(result, top):
        table.add_row(
            str(row["rank"]),
            Text(_label(row, also)),
            format_time(row["step_time_s"]),
            f"{row['tflops_per_gpu']:.1f}",
            _percent(row["mfu"]),
            f"{row['peak_bytes_per_gpu'] / 2**30:.1f}/{row['capacity_bytes'] / 2**30:.0f} GiB",
            _percent(row["bubble_fraction"]),
            _percent(row["exposed_comm_fraction"]),
            _percent(row["stall_fraction"]),
        )
    print_table(console, table, lead=2)
    for line in count_lines(result):
        console.print(line)
    if outputs:
        console.print("wrote " + ", ".join(str(p) for p in outputs))


def print_table(console: Console, table: Table, lead: int) -> None:
    """Print ``table``; on a console too narrow for it, print each row as two lines
    instead (its first ``lead`` cells, then ``header value`` pairs), never squeezed."""
    natural = Measurement.get(console, console.options.update_width(10**6), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(table.title, style="italic")
    columns = [(str(column.header), list(column.cells)) for column in table.columns]
    for i in range(table.row_count):
        head = []
        for header, cells in columns[:lead]:
            value = Text.assemble(cells[i])
            suffix = {"#": ".", "layout": ""}.get(header, f" {header}")
            head.append(value + suffix)
        console.print(Text(" ").join(head))
        pairs = [
            Text.assemble(f"{header} ", cells[i])
            for header, cells in columns[lead:]
            if Text.assemble(cells[i]).plain
        ]
        console.print(Padding(Text(" · ").join(pairs), (0, 0, 0, 4)))


def count_lines(result: SweepResult) -> list[str]:
    """The counts of a sweep, one line each (invalid and pruned with their reasons)."""
    counts = result.counts
    lines = [f"enumerated {counts['enumerated']} layouts"]
    lines.append(f"invalid {counts['invalid']}")
    for reason, n in list(counts["invalid_by_reason"].items())[:8]:
        lines.append(f"  {n:>6} × {reason}")
    if len(counts["invalid_by_reason"]) > 8:
        lines.append(f"  ... {len(counts['invalid_by_reason']) - 8} more reasons in sweep.json")
    terms = ", ".join(f"{term} {n}" for term, n in counts["pruned_by_term"].items())
    lines.append(
        f"pruned for memory {counts['pruned_memory']}"
        + (f" (dominant term: {terms})" if terms else "")
    )
    lines.append(
        f"dominated {counts['dominated']} (a lighter recompute, or ZeRO-1 for ZeRO-2, of the "
        "same layout fits)"
    )
    if counts["failed"]:
        lines.append(f"failed {counts['failed']}")
        for reason, n in counts["failed_by_reason"].items():
            lines.append(f"  {n:>6} × {reason}")
    lines.append(
        f"simulated {counts['simulated']} ({result.fidelity} fidelity) in {result.wall_s:.1f} s"
    )
    return lines
