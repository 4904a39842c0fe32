"""The human summary of a run, as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simulator.analysis.metrics import CATEGORIES
from simulator.analysis.result import StepResult
from topologies.units import format_bytes, format_flops, format_time

__all__ = ["print_summary", "out_of_memory_line", "routing_line"]


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


def print_summary(result: StepResult, console: Console, outputs: list[str]) -> None:
    layout = result.layout
    cluster = result.cluster
    step = result.step_time_s
    oom = out_of_memory_line(result)
    if oom is not None:  # before anything else: no number below holds for a real run
        console.print(f"[bold red]OUT OF MEMORY[/]: {escape(oom)}")
    head = Table(title=f"parasim · {result.scenario}", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    limit = "" if cluster.power_limit_w is None else f" · power limit {cluster.power_limit_w:g} W"
    gpus = f"{cluster.gpus} × {cluster.gpu}"
    head.add_row("cluster", f"{cluster.nodes} × {cluster.name} ({gpus}){limit}")
    head.add_row(
        "model",
        f"{result.model.name} ({_parameters(result.model.parameters)} parameters)",
    )
    head.add_row(
        "layout",
        escape(layout.recipe)
        or (
            f"tp={layout.tp} pp={layout.pp} dp={layout.dp} · {layout.schedule} · "
            f"{layout.microbatches} × micro-batch {layout.micro_batch} · "
            f"recompute {layout.recompute}"
        ),
    )
    interval = result.interval
    if interval is None:
        head.add_row("step time", format_time(step))
        head.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s")
    else:
        low, high, level = interval["low"], interval["high"], interval["level"]
        band = f"{level:.0%}: "
        head.add_row(
            "step time",
            f"{format_time(step)} ({band}{format_time(step * low)}–{format_time(step * high)})",
        )
        head.add_row(
            "throughput",
            f"{result.tokens_per_s:,.0f} tokens/s ({band}{result.tokens_per_s / high:,.0f}–"
            f"{result.tokens_per_s / low:,.0f})",
        )
        head.add_row("trusted as", escape(trust_line(interval)))
    head.add_row(
        "per GPU",
        f"{format_flops(result.tflops_per_gpu * 1e12)} (model FLOPs) · MFU {100 * result.mfu:.1f}%"
        + (" (if it fit)" if oom is not None else ""),
    )
    memory = result.memory
    verdict = "[bold red]OUT OF MEMORY[/]" if memory.oom else "fits"
    head.add_row(
        "memory",
        f"{format_bytes(memory.peak_bytes_per_gpu)} of {format_bytes(memory.capacity_bytes)} "
        f"per GPU (stage {memory.peak_stage}, mostly {memory.dominant_term}) — {verdict}",
    )
    routing = routing_line(result)
    if routing is not None:
        head.add_row("routing", escape(routing))
    console.print(head)

    breakdown = result.breakdown
    table = Table(title="where the step time goes", title_justify="left")
    table.add_column("category")
    table.add_column(f"critical rank {breakdown.critical_rank}", justify="right")
    table.add_column("mean over ranks", justify="right")
    for category in CATEGORIES:
        crit, mean = breakdown.critical[category], breakdown.mean[category]
        table.add_row(
            category,
            f"{format_time(crit)}  {_share(crit, step)}",
            f"{format_time(mean)}  {_share(mean, step)}",
        )
    console.print(table)
    for warning in result.warnings:
        style = "bold red" if warning.startswith("out of memory") else "yellow"
        console.print(f"[{style}]warning:[/] {warning}")
    if outputs:
        console.print("wrote " + ", ".join(outputs))
