"""The human summary of a run: its facts (cluster, model, layout, step time, memory),
where the step time goes, its warnings and the files written.

The summary is described once (:class:`Summary`, plain strings, from
:func:`summarise`) and drawn by one of two writers, as :func:`show_summary` picks for
the stream: on a terminal, rich tables (:func:`draw_summary`); on a pipe or a file,
plain aligned text (:func:`write_summary`). Piped, nothing wraps: a fact is one line
however long (rich lays a table out at 80 columns where no terminal says how wide, so
that ``grep memory`` would find half a value), no box is drawn, and rich is not
imported at all: its import and first table are about a tenth of a one-configuration
run. Every text in the summary is shown as written: a path or name holding ``[/]`` is
no rich markup, and control characters in a path are quoted
(:func:`~simulator.common.visible.visible`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple, TextIO

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import StepResult
from simulator.common.visible import visible
from simulator.report.console import is_terminal, open_console
from topologies.units import format_bytes, format_flops, format_time

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Summary",
    "summarise",
    "show_summary",
    "draw_summary",
    "write_summary",
    "out_of_memory_line",
    "routing_line",
    "trust_line",
]

#: What the memory fact ends with when the step does not fit, drawn in bold red.
OUT_OF_MEMORY = "OUT OF MEMORY"


class Summary(NamedTuple):
    """A run's summary as text: ``facts`` are (name, value) rows under ``title``;
    ``breakdown`` rows (category, critical rank's time, mean over ranks) under
    ``columns``; ``out_of_memory`` (the verdict's line, or None) leads; ``plan`` is the
    whole run's phases (a scenario's ``run:``), one line each."""

    title: str
    facts: tuple[tuple[str, str], ...]
    columns: tuple[str, str, str]
    breakdown: tuple[tuple[str, str, str], ...]
    out_of_memory: str | None
    warnings: tuple[str, ...]
    written: tuple[str, ...]
    plan: tuple[str, ...] = ()


def _parameters(count: float) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole > 0 else "-"


def out_of_memory_line(result: StepResult) -> str | None:
    """One line saying that the step does not fit in the GPUs' memory, or None."""
    memory = result.memory
    if not memory.oom:
        return None
    return (
        f"the step does not fit in memory: {format_bytes(memory.peak_bytes_per_gpu)} of "
        f"{format_bytes(memory.capacity_bytes)} per GPU (stage {memory.peak_stage}, mostly "
        f"{memory.dominant_term}); its times are what it would take with enough memory"
    )


def routing_line(result: StepResult) -> str | None:
    """One line on an MoE step's token routing: the router, how much more than the mean
    the busiest expert (or EP rank, when a rank holds several) receives, on average over
    the step's MoE layers and micro-batches and at worst, how long the ranks wait for it
    (``imbalance_stall``, the mean over ranks: the busiest rank itself waits least), and
    the share of assignments dropped over capacity; None for a dense model."""
    moe = result.moe
    if moe is None:
        return None
    holder = "expert" if moe.experts == moe.ep else "EP rank"
    stall = result.breakdown.mean["imbalance_stall"]
    share = _share(stall, result.step_time_s).strip()
    return (
        f"{moe.routing} router, {moe.experts} experts top-{moe.top_k} over ep {moe.ep}: the "
        f"busiest {holder} takes {moe.imbalance_mean:.2f}× the mean load (at worst "
        f"{moe.imbalance_max:.2f}×); ranks wait {format_time(stall)} for it on average "
        f"({share} of the step); {100 * moe.dropped_fraction:.1f}% of assignments dropped"
    )


def trust_line(interval: dict) -> str:
    """Where a result's interval comes from, in one line."""
    line = f"the cross-validated errors of {interval['basis']}"
    if interval.get("outside"):
        line += f"; outside what was validated: {interval['outside']}, so widened"
    return line


def _facts(result: StepResult, oom: bool) -> list[tuple[str, str]]:
    """The summary's (name, value) rows."""
    layout, cluster, step = result.layout, result.cluster, result.step_time_s
    limit = "" if cluster.power_limit_w is None else f" · power limit {cluster.power_limit_w:g} W"
    gpus = f"{cluster.gpus} × {cluster.gpu}"
    facts = [
        ("cluster", f"{cluster.nodes} × {cluster.name} ({gpus}){limit}"),
        ("model", f"{result.model.name} ({_parameters(result.model.parameters)} parameters)"),
        (
            "layout",
            layout.recipe
            or (
                f"tp={layout.tp} pp={layout.pp} dp={layout.dp} · {layout.schedule} · "
                f"{layout.microbatches} × micro-batch {layout.micro_batch} · "
                f"recompute {layout.recompute}"
            ),
        ),
    ]
    interval = result.interval
    if interval is None:
        facts.append(("step time", format_time(step)))
        facts.append(("throughput", f"{result.tokens_per_s:,.0f} tokens/s"))
    else:
        low, high = interval["low"], interval["high"]
        band = f"{interval['level']:.0%}: "
        times = f"{band}{format_time(step * low)}–{format_time(step * high)}"
        facts.append(("step time", f"{format_time(step)} ({times})"))
        rate = result.tokens_per_s
        facts.append(
            ("throughput", f"{rate:,.0f} tokens/s ({band}{rate / high:,.0f}–{rate / low:,.0f})")
        )
        facts.append(("trusted as", trust_line(interval)))
    facts.append(
        (
            "per GPU",
            f"{format_flops(result.tflops_per_gpu * 1e12)} (model FLOPs) · "
            f"MFU {100 * result.mfu:.1f}%" + (" (if it fit)" if oom else ""),
        )
    )
    memory = result.memory
    facts.append(
        (
            "memory",
            f"{format_bytes(memory.peak_bytes_per_gpu)} of {format_bytes(memory.capacity_bytes)} "
            f"per GPU (stage {memory.peak_stage}, mostly {memory.dominant_term}) — "
            + (OUT_OF_MEMORY if memory.oom else "fits"),
        )
    )
    routing = routing_line(result)
    if routing is not None:
        facts.append(("routing", routing))
    return facts


def summarise(result: StepResult, written: list[str], plan: list[str] | None = None) -> Summary:
    """The summary of ``result``, whose files are ``written`` (paths), with the whole
    run's ``plan`` lines where the scenario has a ``run:``."""
    oom = out_of_memory_line(result)
    step, breakdown = result.step_time_s, result.breakdown
    rows = []
    for category in CATEGORIES:
        crit, mean = breakdown.critical[category], breakdown.mean[category]
        rows.append(
            (
                category,
                f"{format_time(crit)}  {_share(crit, step)}",
                f"{format_time(mean)}  {_share(mean, step)}",
            )
        )
    return Summary(
        title=f"parasim · {result.scenario}",
        facts=tuple(_facts(result, oom is not None)),
        columns=("category", f"critical rank {breakdown.critical_rank}", "mean over ranks"),
        breakdown=tuple(rows),
        out_of_memory=oom,
        warnings=tuple(result.warnings),
        written=tuple(visible(path) for path in written),
        plan=tuple(plan or ()),
    )


def _warning_style(warning: str) -> str:
    return "bold red" if warning.startswith("out of memory") else "yellow"


_BREAKDOWN_TITLE = "where the step time goes"
_PLAN_TITLE = "the whole run (run:, parasim plan for its phases):"


def draw_summary(summary: Summary, console: Console) -> None:
    """``summary`` as rich tables on ``console``; every text is printed as it is (no
    markup read from it)."""
    from rich.table import Table
    from rich.text import Text

    if summary.out_of_memory is not None:  # first: no number below holds for a real run
        console.print(Text.assemble((OUT_OF_MEMORY, "bold red"), ": ", summary.out_of_memory))
    head = Table(title=Text(summary.title), show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    for name, value in summary.facts:
        text = Text(value)
        if name == "memory" and value.endswith(OUT_OF_MEMORY):
            text.stylize("bold red", len(value) - len(OUT_OF_MEMORY))
        head.add_row(Text(name), text)
    console.print(head)
    table = Table(title=_BREAKDOWN_TITLE, title_justify="left")
    table.add_column(Text(summary.columns[0]))
    for column in summary.columns[1:]:
        table.add_column(Text(column), justify="right")
    for row in summary.breakdown:
        table.add_row(*map(Text, row))
    console.print(table)
    for warning in summary.warnings:
        console.print(Text.assemble(("warning:", _warning_style(warning)), " ", warning))
    if summary.written:
        console.print(Text("wrote " + ", ".join(summary.written)))
    if summary.plan:
        console.print(Text(_PLAN_TITLE))
        for line in summary.plan:
            console.print(Text(f"  {line}"))


def _aligned(rows: list[tuple[str, ...]], right: tuple[bool, ...]) -> list[str]:
    """``rows`` as lines of columns two spaces apart, each padded to its widest cell
    (right-aligned where ``right`` says), indented by two."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(right))]
    return [
        "  "
        + "  ".join(
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def write_summary(summary: Summary, stream: TextIO) -> None:
    """``summary`` as plain text on ``stream``: a fact per line, the breakdown in
    aligned columns, no line wrapped."""
    lines = []
    if summary.out_of_memory is not None:
        lines.append(f"{OUT_OF_MEMORY}: {summary.out_of_memory}")
    lines.append(summary.title)
    lines += _aligned(list(summary.facts), (False, False))
    lines.append(_BREAKDOWN_TITLE)
    lines += _aligned([summary.columns, *summary.breakdown], (False, True, True))
    lines += [f"warning: {warning}" for warning in summary.warnings]
    if summary.written:
        lines.append("wrote " + ", ".join(summary.written))
    if summary.plan:
        lines.append(_PLAN_TITLE)
        lines += [f"  {line}" for line in summary.plan]
    stream.write("\n".join(lines) + "\n")


def show_summary(summary: Summary) -> None:
    """``summary`` on stdout: drawn as rich tables where it is a terminal
    (:func:`~simulator.report.console.is_terminal`), else written as plain text."""
    if is_terminal(sys.stdout):
        draw_summary(summary, open_console())
    else:
        write_summary(summary, sys.stdout)
