"""What ``parasim sweep`` shows and writes: the ranking table, the counts and the files.

:func:`simulator.tools.sweep.run_sweep` finds and ranks the layouts; this module draws
its :class:`~simulator.tools.sweep.SweepResult`:

* :func:`print_sweep` prints the top layouts as a rich table (each row as two lines on
  a console too narrow for it, see :func:`print_table`), numbered 1, 2, 3... (the
  placements that tie share an entry), then the global batch and how ``--batch`` set it
  (:func:`batch_line`), where the scenario's own layout stands (:func:`own_line`) and
  the counts of every filter (:func:`count_lines`);
* :func:`write_sweep_outputs` writes ``sweep.csv`` (every simulated layout, one row
  each, :data:`CSV_FIELDS`, numbers in full precision), ``sweep.json``
  (:meth:`SweepResult.to_json`) and ``sweep.html``: the plotly chart of
  :func:`sweep_figure`, one bar per top layout stacked by time-breakdown category in
  :data:`BAR_COLORS`, and below it the table of those layouts for reading
  (:data:`PAGE_COLUMNS`: the decisive numbers first, in ms, % and GiB, a knob left
  blank where it does not apply to the row), with the scenario's own layout marked,
  added below the top ones when it is not among them.

:func:`wide_console`, :func:`print_table` and :func:`write_table_outputs` also serve
``parasim scale`` (:mod:`simulator.report.scale_report`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import plotly.graph_objects as go
from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from simulator.analysis.metrics import CATEGORIES
from simulator.common.files import write_atomically, write_csv, write_json
from simulator.report.console import open_console
from simulator.report.plotly_bundle import PLOTLY_JS, write_plotly_js
from simulator.report.style import BREAKDOWN_COLORS, breakdown_bar
from simulator.request.knobs import KNOB, SEARCHED
from simulator.tools.sweep import SweepResult
from topologies.units import format_time

__all__ = [
    "BAR_COLORS",
    "CSV_FIELDS",
    "PAGE_COLUMNS",
    "PageTable",
    "batch_line",
    "policy_text",
    "own_line",
    "count_lines",
    "print_sweep",
    "print_table",
    "sweep_figure",
    "wide_console",
    "write_sweep_outputs",
    "write_table_outputs",
]

#: The colour of each time-breakdown category in the sweep's bars.
BAR_COLORS = BREAKDOWN_COLORS
#: The columns of ``sweep.csv``, in order.
KNOB_FIELDS = tuple(
    name
    for knob in SEARCHED
    for name in ((knob.name, "microbatches") if knob.form == "micro" else (knob.name,))
)
#: The columns of ``sweep.csv``, in order: the searched knobs (with the micro-batch
#: count), then the numbers.
CSV_FIELDS = (
    "rank",
    "layout",
    *KNOB_FIELDS,
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
#: The knobs' columns of a page's table: (header, cell key).
KNOB_COLUMNS = tuple(
    (KNOB[name].heading if name in KNOB else "micro-batches", name) for name in KNOB_FIELDS
)


def wide_console() -> Console:
    """A console on stdout; when stdout is not a terminal, wide enough for a layout table."""
    console = open_console()
    return console if console.is_terminal else open_console(width=max(console.width, 150))


def _csv_value(row: dict[str, Any], key: str) -> Any:
    if key.endswith("_s") and key[:-2] in CATEGORIES:
        return repr(row["breakdown_mean_s"][key[:-2]])
    value = row[key]
    if key == "overrides":
        return " ".join(value)
    return csv_text(value)


def csv_text(value: Any) -> Any:
    """A value as the CSV files write it: a placement ``[tp,dp,pp]``, a stage split
    ``7/8/7``, a float in full precision, nothing for None."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return _knob_text(value)
    if isinstance(value, float):
        return repr(value)
    return value


# a layout's knobs but its placement, and its simulated numbers
_SAME_BUT_PLACEMENT = (
    *(knob.name for knob in SEARCHED if knob.form != "grid"),
    "step_time_s",
    "peak_bytes_per_gpu",
)


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
    labels = [f"{n}. {_label(row, also)}" for n, (row, also) in enumerate(shown, 1)]
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
    shown = top_layouts(result, top)
    entries = [{**row, "_entry": n, "_also": also} for n, (row, also) in enumerate(shown, 1)]
    own = result.scenario_layout
    if own is not None:
        mine = next((e for e in entries if e["layout"] == own.get("layout")), None)
        if mine is None:
            entries.append({**own, "_entry": None, "_also": [], "_gap": True})
            mine = entries[-1]
        mine["_own"] = _own_note(own, len(result.rows))
    table = PageTable(
        PAGE_COLUMNS,
        [_page_row(result, entry) for entry in entries],
        f"The {len(shown)} fastest layouts charted above, numbered as on the console "
        "(sweep.csv has every simulated layout, in full precision); the highlighted row "
        "is the scenario's own layout. A blank cell: the knob does not apply to that row.",
    )
    return write_table_outputs(
        out, "sweep", rows, result.to_json(), sweep_figure(result, top), table
    )


@dataclass(frozen=True)
class PageTable:
    """The table below a page's chart, for reading: ``columns`` (the header and the
    key of each cell, in order; a column blank in every row is left out), the ``rows``
    (each a dict of cells as text; ``_mark``: the row is the scenario's own, with that
    note; ``_gap``: an ellipsis row goes before it) and the ``caption`` above it."""

    columns: tuple[tuple[str, str], ...]
    rows: list[dict[str, str]]
    caption: str


def _cell_html(row: dict[str, str], key: str) -> str:
    text = html.escape(row.get(key, ""))
    if key == "layout" and row.get("_mark"):
        text += f"<br><span class='note'>{html.escape(row['_mark'])}</span>"
    return f"<td class='{key}'>{text}</td>"


def _table_html(stem: str, table: PageTable) -> str:
    """The HTML of ``table``: a header, its rows, the scenario's own one marked."""
    columns = [
        (header, key)
        for header, key in table.columns
        if any(row.get(key) for row in table.rows) or key == "layout"
    ]
    head = "".join(f"<th class='{key}'>{html.escape(header)}</th>" for header, key in columns)
    body = []
    for row in table.rows:
        if row.get("_gap"):
            body.append(f"<tr class='gap'><td colspan='{len(columns)}'>…</td></tr>")
        marked = " class='scenario'" if row.get("_mark") else ""
        body.append(f"<tr{marked}>" + "".join(_cell_html(row, key) for _, key in columns) + "</tr>")
    return (
        f"<p class='caption'>{html.escape(table.caption)}</p>"
        f"<table id='parasim-{stem}-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


#: The page's style: the table's numbers aligned right in a compact font, the layout
#: wrapped within a width so the decisive columns after it stay on screen, the
#: scenario's own row highlighted.
PAGE_STYLE = (
    "body{font-family:sans-serif;margin:12px}"
    "table{border-collapse:collapse;font-size:12px;font-variant-numeric:tabular-nums}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}"
    "th{background:#f4f4f4;position:sticky;top:0}"
    "td.layout,th.layout{text-align:left;white-space:normal;min-width:14em;max-width:24em}"
    "tr.scenario td{background:#fff4c2;font-weight:bold}"
    "tr.gap td{text-align:center;color:#888;border-left:none;border-right:none}"
    ".note{font-weight:normal;font-style:italic;color:#7a5b00}"
    ".caption{font-size:13px;color:#444}"
)


def table_output_names(stem: str) -> list[str]:
    """The files :func:`write_table_outputs` writes for ``stem``, in its order."""
    return [f"{stem}.csv", f"{stem}.json", f"{stem}.html", PLOTLY_JS]


def write_table_outputs(
    out: Path,
    stem: str,
    rows: tuple[tuple[str, ...], list[dict[str, Any]], Any],
    payload: dict[str, Any],
    figure: go.Figure,
    table: PageTable,
) -> list[Path]:
    """``<stem>.csv`` (``rows``: the fields, the rows and how a cell is written),
    ``<stem>.json`` (``payload``) and ``<stem>.html`` (``figure``, loading plotly.js from
    ``plotly.min.js`` beside it, and below it ``table``) in ``out``, each written
    atomically; the paths in that order."""
    out = Path(out)
    paths = [out / name for name in table_output_names(stem)[:3]]
    fields, csv_rows, value = rows
    write_csv(paths[0], fields, csv_rows, value)
    write_json(paths[1], payload)
    chart = figure.to_html(
        include_plotlyjs=PLOTLY_JS,
        full_html=False,
        div_id=f"parasim-{stem}",
        config={"displaylogo": False, "responsive": True},
    )
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>parasim {stem}</title>"
        f"<style>{PAGE_STYLE}</style></head><body>"
        f"{chart}{_table_html(stem, table)}</body></html>"
    )
    write_atomically(paths[2], lambda tmp: tmp.write_text(page, encoding="utf-8"))
    write_plotly_js(out)
    return paths


#: The columns of the page's table: (header, cell key), the decisive numbers first.
PAGE_COLUMNS = (
    ("#", "entry"),
    ("layout", "layout"),
    ("step time", "step"),
    ("memory per GPU", "memory"),
    ("MFU", "mfu"),
    ("TFLOP/s per GPU", "tflops"),
    ("tokens/s", "tokens"),
    ("bubble", "bubble"),
    ("exposed comm.", "exposed"),
    ("stall", "stall"),
    *KNOB_COLUMNS,
)


def memory_cell(row: dict[str, Any]) -> str:
    """``1.8 of 80 GiB``, with ``does not fit`` where it does not."""
    peak, capacity = row["peak_bytes_per_gpu"], row["capacity_bytes"]
    text = f"{peak / 2**30:.1f} of {capacity / 2**30:.0f} GiB"
    return text + (" (does not fit)" if peak > capacity else "")


def knob_cells(row: dict[str, Any], experts: int | None) -> dict[str, str]:
    """A layout's knobs as text, blank where one does not matter to the row (its
    knob's ``matters``: CP's kind without CP, SP without TP, the schedule without a
    pipeline...) and expert parallelism in a dense model."""
    cells = {}
    for knob in SEARCHED:
        value = row.get(knob.name, knob.default)
        shown = knob.matters is None or knob.matters(row)
        cells[knob.name] = _knob_text(value) if shown else ""
    if not experts:
        cells["ep"] = ""
    cells["microbatches"] = str(row["microbatches"]) if "microbatches" in row else ""
    return cells


def _knob_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        if all(isinstance(v, int) for v in value):
            return "/".join(map(str, value))
        return "[" + ",".join(value) + "]"
    return str(value)


def _page_row(result: SweepResult, entry: dict[str, Any]) -> dict[str, str]:
    """One entry of the page's table as text (:data:`PAGE_COLUMNS`)."""
    cells = {
        "entry": str(entry["_entry"]) if entry["_entry"] is not None else "",
        "layout": _label(entry, entry["_also"]) if entry.get("layout") else "(not valid here)",
        "_mark": entry.get("_own", ""),
        "_gap": "yes" if entry.get("_gap") else "",
    }
    if entry.get("layout"):
        cells |= knob_cells(entry, result.experts)
    if "peak_bytes_per_gpu" in entry:
        cells["memory"] = memory_cell(entry)
    if "step_time_s" in entry:
        cells |= {
            "step": format_time(entry["step_time_s"]),
            "mfu": _percent(entry["mfu"]),
            "tflops": f"{entry['tflops_per_gpu']:.1f}",
            "tokens": f"{entry['tokens_per_s']:,.0f}",
            "bubble": _percent(entry["bubble_fraction"]),
            "exposed": _percent(entry["exposed_comm_fraction"]),
            "stall": _percent(entry["stall_fraction"]),
        }
    return cells


def _own_note(own: dict[str, Any], ranked: int) -> str:
    """The note beside the scenario's own layout in the page's table (``ranked``
    layouts in all)."""
    status = own["status"]
    if status == "simulated":
        where = f"#{own['rank']} of {ranked} in sweep.csv" if own.get("rank") else "not ranked"
        return f"the scenario's own layout ({where}{_unranked(own)})"
    return f"the scenario's own layout: {_own_problem(own)}"


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def print_sweep(
    result: SweepResult, console: Console, top: int = 10, outputs: Iterable[str] = ()
) -> None:
    """The top layouts as a rich table, then the counts."""
    cluster = result.cluster
    table = Table(
        title=escape(
            f"parasim sweep · {result.scenario} · {result.model} on {result.gpus} × "
            f"{cluster['gpu']} ({cluster['nodes']} × {cluster['name']}) · "
            f"global batch {result.global_batch}"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"),
        ("layout", "left"),
        ("step time", "right"),
        ("TFLOP/s/GPU", "right"),
        ("MFU", "right"),
        ("memory", "right"),
        ("bubble", "right"),
        ("exp. comm", "right"),
        ("stall", "right"),
    )
    if result.objective != "step":
        columns = (
            *columns[:3],
            (OBJECTIVE_HEADER[result.objective], "right"),
            ("goodput", "right"),
            *columns[3:],
        )
        table.title = f"{table.title} · ranked by {result.objective}"
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for entry, (row, also) in enumerate(top_layouts(result, top), 1):
        extra = []
        if result.objective != "step":
            extra = [objective_text(result.objective, row), _percent(row["run"]["goodput"])]
        table.add_row(
            str(entry),
            Text(_label(row, also)),
            format_time(row["step_time_s"]),
            *extra,
            f"{row['tflops_per_gpu']:.1f}",
            _percent(row["mfu"]),
            f"{row['peak_bytes_per_gpu'] / 2**30:.1f}/{row['capacity_bytes'] / 2**30:.0f} GiB",
            _percent(row["bubble_fraction"]),
            _percent(row["exposed_comm_fraction"]),
            _percent(row["stall_fraction"]),
        )
    print_table(console, table, lead=2)
    inside = interval_line(result)
    if inside is not None:
        console.print(escape(inside))
    own = own_line(result)
    for line in [batch_line(result.batch, result.global_batch, result.gpus)]:
        console.print(escape(line))
    if own is not None:
        console.print(Text(own, style="bold"))
    for line in count_lines(result):
        console.print(escape(line))
    if outputs:
        console.print("wrote " + ", ".join(escape(str(p)) for p in outputs))


#: The column of a sweep ranked on a run's objective.
OBJECTIVE_HEADER = {"time-to-train": "time to train", "cost": "cost", "energy": "energy"}


def objective_text(objective: str, row: dict[str, Any]) -> str:
    """A row's objective, in its unit (days, dollars, MWh)."""
    value = row["objective_value"]
    if objective == "time-to-train":
        return f"{value / 86400:,.2f} days"
    if objective == "cost":
        return f"${value:,.0f}"
    return f"{value / 3.6e9:,.1f} MWh"


def interval_line(result: SweepResult) -> str | None:
    """``the best layout's 80% interval is 9.6-11.9 s: #2-#4 lie inside it``: which
    layouts parasim cannot tell from the best (simulator.analysis.trust)."""
    rows = [row for row in result.rows if row.get("status", "simulated") == "simulated"]
    if not rows or not rows[0].get("interval"):
        return None
    best = rows[0]
    step, interval = best["step_time_s"], best["interval"]
    high = step * interval["high"]
    inside = [i for i, row in enumerate(rows[1:], 2) if row["step_time_s"] <= high]
    band = (
        f"the best layout's {interval['level']:.0%} interval is "
        f"{format_time(step * interval['low'])}–{format_time(high)}"
    )
    if not inside:
        return f"{band}: the next layout lies outside it"
    span = f"#{inside[0]}" if len(inside) == 1 else f"#{inside[0]}–#{inside[-1]}"
    line = (
        f"{band}: {span} lie inside it, so parasim cannot rank "
        f"{'it' if len(inside) == 1 else 'them'} apart from the best with confidence"
    )
    if inside[-1] == len(rows) and result.counts.get("bounded"):
        # the search ranked no further than this: layouts it left out may lie inside too
        line += f", nor perhaps layouts beyond the {len(rows)} ranked (--top ranks more)"
    return line


def policy_text(batch: dict[str, Any]) -> str:
    """``--batch per-gpu: each GPU keeps ...``: what the policy of a search at another
    size did with the scenario's global batch (:func:`simulator.tools.sweep.scaled_batch`),
    and what the other choice would do."""
    own, own_gpus = batch["scenario_global_batch"], batch["scenario_gpus"]
    share = f"{own / own_gpus:.3g} sequences ({own:,} over {own_gpus:,} GPUs)"
    return {
        "per-gpu": f"--batch per-gpu: each GPU keeps the scenario's {share}; "
        f"--batch fixed keeps {own:,}",
        "tokens": f"--batch tokens: each GPU keeps about the scenario's {share}, in whole "
        f"sequences; --batch fixed keeps {own:,}",
        "fixed": f"--batch fixed: the scenario's {own:,} (on {own_gpus:,} GPUs) at every "
        "size; --batch per-gpu grows it with the GPUs",
    }[batch["policy"]]


def batch_line(batch: dict[str, Any], global_batch: int, gpus: int) -> str:
    """``global batch 512 (--batch per-gpu: ...)``: the global batch a sweep used and
    how it was set (:func:`policy_text`)."""
    own, own_gpus = batch["scenario_global_batch"], batch["scenario_gpus"]
    if batch["policy"] is None or gpus == own_gpus and global_batch == own:
        return f"global batch {global_batch:,} (the scenario's, on its own {own_gpus:,} GPUs)"
    return f"global batch {global_batch:,} ({policy_text(batch)})"


def _unranked(own: dict[str, Any]) -> str:
    why = own.get("unranked")
    return f": {why}" if why else ""


def _own_problem(own: dict[str, Any]) -> str:
    """Why the scenario's own layout has no step time here."""
    status = own["status"]
    if status == "pruned":
        return (
            f"does not fit in memory ({own['peak_bytes_per_gpu'] / 2**30:.1f} GiB of "
            f"{own['capacity_bytes'] / 2**30:.0f} GiB per GPU, mostly {own['dominant_term']})"
        )
    if status == "invalid":
        return f"not a valid layout here: {own['reason']}"
    return f"failed to simulate: {own['reason']}"


def own_line(result: SweepResult) -> str | None:
    """Where the scenario's own layout stands: its rank and step time against the
    fastest, or why it has none."""
    own = result.scenario_layout
    if own is None:
        return None
    name = f"the scenario's own layout{' ' + own['layout'] if own.get('layout') else ''}"
    if own["status"] != "simulated":
        return f"{name}: {_own_problem(own)}"
    step = own["step_time_s"]
    best = result.rows[0]["step_time_s"] if result.rows else step
    where = (
        f"#{own['rank']} of {len(result.rows)} in sweep.csv"
        if own.get("rank")
        else f"not ranked{_unranked(own)}"
    )
    return f"{name}: {where}, {format_time(step)} a step ({step / best:.2f}× the fastest)"


def print_table(console: Console, table: Table, lead: int) -> None:
    """Print ``table``; on a console too narrow for it, print each row as two lines
    instead (its first ``lead`` cells, then ``header value`` pairs), never squeezed."""
    natural = Measurement.get(console, console.options.update_width(10**6), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(table.title, style="italic")
    # the sweep's and the scale's tables hold text cells only: strings and Texts
    columns = [
        (str(column.header), cast("list[str | Text]", list(column.cells)))
        for column in table.columns
    ]
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
    if counts.get("bounded"):
        lines.append(
            f"left out {counts['bounded']} (their lower bound on the step, or the step, "
            f"exceeds {format_time(counts['bound_s'])}, the slowest the ranking keeps; "
            "--exhaustive simulates them all)"
        )
    if counts["failed"]:
        lines.append(f"failed {counts['failed']}")
        for reason, n in counts["failed_by_reason"].items():
            lines.append(f"  {n:>6} × {reason}")
    lines.append(
        f"simulated {counts['simulated']} ({result.fidelity} fidelity) in {result.wall_s:.1f} s"
    )
    return lines
