"""What ``parasim scale`` shows and writes: the scaling table and the files.

:func:`simulator.tools.scale.run_scale` simulates each size; this module draws its
:class:`~simulator.tools.scale.ScaleResult`:

* :func:`print_scale` prints one row per size (layout, batch, step time, tokens/s,
  TFLOP/s per GPU, MFU, memory, scaling efficiency), then how ``--batch`` set the
  global batch and a line for each size where no layout fits or the layout runs out
  of memory;
* :func:`write_scale_outputs` writes ``scale.csv`` (:data:`CSV_FIELDS`, numbers in
  full precision), ``scale.json`` (:meth:`ScaleResult.to_json`) and ``scale.html``,
  the plotly chart of :func:`scale_figure` (tokens/s against GPUs beside the ideal
  linear line, and the efficiency on a second axis) above the table of the sizes for
  reading (:data:`PAGE_COLUMNS`), the scenario's own size marked.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from simulator.report.sweep_report import (
    KNOB_COLUMNS,
    KNOB_FIELDS,
    PageTable,
    csv_text,
    knob_cells,
    memory_cell,
    policy_text,
    print_table,
    write_table_outputs,
)
from simulator.tools.scale import ScaleResult
from topologies.units import format_time

__all__ = ["CSV_FIELDS", "PAGE_COLUMNS", "print_scale", "scale_figure", "write_scale_outputs"]

#: The columns of ``scale.csv``, in order.
CSV_FIELDS = (
    "gpus",
    "nodes",
    "layout",
    *KNOB_FIELDS,
    "global_batch",
    "step_time_s",
    "tokens_per_s",
    "ideal_tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "peak_bytes_per_gpu",
    "capacity_bytes",
    "oom",
    "speedup",
    "efficiency",
    "overrides",
)


def _csv_value(row: dict[str, Any], key: str) -> Any:
    value = row.get(key)
    if key == "overrides" and value is not None:
        return " ".join(value)
    return csv_text(value)


def scale_figure(result: ScaleResult) -> go.Figure:
    """Plotly figure: tokens/s against GPUs with the ideal linear line, and the scaling
    efficiency on a second axis."""
    rows = [row for row in result.rows if row["layout"] is not None]
    x = [row["gpus"] for row in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[row["tokens_per_s"] for row in rows],
            name="throughput",
            mode="lines+markers",
            customdata=[row["layout"] for row in rows],
            hovertemplate="%{x} GPUs: %{y:,.0f} tokens/s<br>%{customdata}<extra></extra>",
            line={"color": "#4C78A8", "width": 3},
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[row["ideal_tokens_per_s"] for row in rows],
            name="ideal (linear)",
            mode="lines",
            hovertemplate="%{x} GPUs: %{y:,.0f} tokens/s if linear<extra></extra>",
            line={"color": "#9D9D9D", "dash": "dash"},
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[100 * row["efficiency"] for row in rows],
            name="scaling efficiency",
            mode="lines+markers",
            hovertemplate="%{x} GPUs: efficiency %{y:.1f}%<extra></extra>",
            line={"color": "#E45756", "dash": "dot"},
        ),
        secondary_y=True,
    )
    how = "fastest layout at each size" if result.best else "the scenario's tp and pp"
    fig.update_layout(
        title=(
            f"{result.scenario}: scaling of {result.model}, --batch {result.batch['policy']} "
            f"({how}; {result.fidelity} fidelity)"
        ),
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
        hovermode="x unified",
    )
    fig.update_xaxes(title_text="GPUs", type="log", tickvals=x, ticktext=[str(v) for v in x])
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", secondary_y=False)
    # round ticks of their own: plotly would otherwise line them up with the left axis
    # (0, 33.7, 67.5, ...)
    fig.update_yaxes(
        title_text="scaling efficiency (%)",
        range=[0, 110],
        tickmode="array",
        tickvals=[0, 20, 40, 60, 80, 100],
        showgrid=False,
        secondary_y=True,
    )
    return fig


#: The columns of the page's table: (header, cell key), the decisive numbers first.
PAGE_COLUMNS = (
    ("GPUs", "gpus"),
    ("layout", "layout"),
    ("global batch", "global_batch"),
    ("step time", "step"),
    ("memory per GPU", "memory"),
    ("tokens/s", "tokens"),
    ("ideal tokens/s", "ideal"),
    ("efficiency", "efficiency"),
    ("speedup", "speedup"),
    ("MFU", "mfu"),
    ("TFLOP/s per GPU", "tflops"),
    ("nodes", "nodes"),
    *KNOB_COLUMNS,
)


def _page_row(result: ScaleResult, row: dict[str, Any]) -> dict[str, str]:
    """One size of the page's table as text (:data:`PAGE_COLUMNS`)."""
    own = row["gpus"] == result.batch["scenario_gpus"]
    cells = {
        "gpus": f"{row['gpus']:,}",
        "nodes": f"{row['nodes']:,}",
        "global_batch": f"{row['global_batch']:,}",
        "_mark": "the scenario's own size" if own else "",
    }
    if row["layout"] is None:
        return {**cells, "layout": f"no layout fits: {row['reason']}"}
    cells |= knob_cells(row, experts=row["ep"] > 1 or None)
    cells |= {
        "layout": row["layout"],
        "step": format_time(row["step_time_s"]),
        "memory": memory_cell(row),
        "tokens": f"{row['tokens_per_s']:,.0f}",
        "ideal": f"{row['ideal_tokens_per_s']:,.0f}",
        "efficiency": f"{100 * row['efficiency']:.1f}%",
        "speedup": f"{row['speedup']:.2f}×" if "speedup" in row else "",
        "mfu": f"{100 * row['mfu']:.1f}%",
        "tflops": f"{row['tflops_per_gpu']:.1f}",
    }
    return cells


def write_scale_outputs(result: ScaleResult, out: Path) -> list[Path]:
    """Write ``scale.csv``, ``scale.json`` and ``scale.html`` to ``out``."""
    rows = (CSV_FIELDS, result.rows, _csv_value)
    table = PageTable(
        PAGE_COLUMNS,
        [_page_row(result, row) for row in result.rows],
        "Each size charted above (scale.csv has the same rows in full precision); the "
        "highlighted row is the scenario's own size. A blank cell: the column does not "
        "apply to that row.",
    )
    return write_table_outputs(out, "scale", rows, result.to_json(), scale_figure(result), table)


def print_scale(result: ScaleResult, console: Console, outputs: Iterable[str] = ()) -> None:
    """The scaling table."""
    cluster = result.cluster
    how = "fastest layout per size" if result.best else "scenario's tp and pp, dp the rest"
    table = Table(
        title=escape(
            f"parasim scale · {result.scenario} · {result.model} on {cluster['name']} · "
            f"--batch {result.batch['policy']} ({how})"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name in (
        "GPUs",
        "layout",
        "batch",
        "step time",
        "tokens/s",
        "TFLOP/s/GPU",
        "MFU",
        "memory",
        "efficiency",
    ):
        table.add_column(name, justify="left" if name == "layout" else "right", no_wrap=True)
    for row in result.rows:
        if row["layout"] is None:
            table.add_row(str(row["gpus"]), Text("no layout fits"), str(row["global_batch"]))
            continue
        memory = f"{row['peak_bytes_per_gpu'] / 2**30:.1f}/{row['capacity_bytes'] / 2**30:.0f} GiB"
        table.add_row(
            str(row["gpus"]),
            Text(row["layout"]),
            str(row["global_batch"]),
            format_time(row["step_time_s"]),
            f"{row['tokens_per_s']:,.0f}",
            f"{row['tflops_per_gpu']:.1f}",
            f"{100 * row['mfu']:.1f}%",
            Text(memory + (" OOM" if row["oom"] else ""), style="bold red" if row["oom"] else ""),
            f"{100 * row['efficiency']:.1f}%",
        )
    print_table(console, table, lead=2)
    console.print(escape(policy_text(result.batch)))
    for row in result.rows:
        if row["layout"] is None:
            console.print(Text(f"{row['gpus']} GPUs: {row['reason']}", style="yellow"))
        elif row["oom"]:
            console.print(Text(f"{row['gpus']} GPUs: does not fit in GPU memory", style="bold red"))
    if outputs:
        console.print("wrote " + ", ".join(escape(str(p)) for p in outputs))
