"""What ``parasim explain`` shows and writes: the report, ``explain.json`` and ``explain.html``.

:func:`simulator.tools.explain.diagnose` finds the mistakes; this module draws its
:class:`~simulator.tools.explain.Explanation`. :func:`print_explanation` prints the
report to a rich console: the scenario's layout, step time and memory, then one panel per
finding with the problem, the fix as ``--set`` arguments, a table of the mistake beside
its fix, what the mistake costs and what moved, and apart from the fix the candidates
that would change the recipe or do not fit, with their numbers (:func:`set_apart_text`).
:func:`write_explain_outputs` writes the two files.

``explain.json`` is exactly what ``parasim explain --json`` prints. ``explain.html`` opens
in any browser without a network (plotly.js is inlined once, in the page's head) and
shows, for every finding, the mistake and its fix side by side: one sentence of what the
finding means and what it costs, a table of layout, step time and memory, and one chart
whose stacked bars split each step of the critical rank into the breakdown categories
(the colours of ``parasim sweep``), with the step time at the end of each bar. When
memory is the point of the finding (the scenario or its fix does not fit, or the finding
is about memory), a second panel stacks memory per GPU by term against the GPU's
capacity. Each chart is a ``<div id="finding-N">`` (N from 1, in the order of the
findings). A scenario without findings gets a page that says so, without charts.

Both files are written atomically; the same explanation gives the same bytes.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, cast

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from simulator.analysis.metrics import CATEGORIES
from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically, write_json
from simulator.report.plotly_bundle import PLOTLY_JS, SCRIPT_TAG, write_plotly_js
from simulator.report.style import MEMORY_COLORS, breakdown_bar
from simulator.tools.explain import MOVED_SHARE, Explanation, Finding
from simulator.tools.mistakes import MEMORY_FINDINGS, NO_FASTER_FIX
from topologies.units import format_bytes, format_time

__all__ = [
    "MEMORY_FINDINGS",
    "TERM_COLORS",
    "describe_layout",
    "describe_memory",
    "cost_text",
    "set_apart_text",
    "print_explanation",
    "chart_id",
    "memory_is_the_point",
    "finding_sentence",
    "finding_figure",
    "render_explain_html",
    "write_explain_outputs",
]

#: Colours of the memory terms (hatched, so they are not mistaken for time categories).
TERM_COLORS = MEMORY_COLORS  # memory terms, as in report.html
_GIB = 2.0**30
_STYLE = (
    "body{font-family:Inter,'Helvetica Neue',Helvetica,Arial,sans-serif;max-width:1100px;"
    "margin:2em auto;padding:0 1em;color:#222}"
    "h2{margin-top:2em;border-top:1px solid #ddd;padding-top:1em}"
    "code{background:#f4f4f4;padding:0 .2em}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{padding:.25em .8em;text-align:left;vertical-align:top;border-bottom:1px solid #eee}"
    ".sentence{font-size:1.1em}.bad{color:#b00020}.ok{color:#1b7f3b}.dim{color:#666}"
)


# ------------------------------------------------------------------------- the text


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def describe_layout(layout: dict[str, Any]) -> str:
    """One line for a snapshot's layout: ``tp=8 pp=2 dp=1 · placement tp,dp,pp · …``."""
    parts = [f"tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}"]
    if layout["ep"] > 1:
        parts[0] += f" ep={layout['ep']}"
    if layout["sp"]:
        parts[0] += " +sp"
    parts.append("placement " + ",".join(layout["placement"]))
    if layout["pp"] > 1:
        schedule = layout["schedule"]
        if layout["virtual_stages"] > 1:
            schedule += f" v={layout['virtual_stages']}"
        parts.append(schedule)
    parts.append(f"{layout['microbatches']} × micro-batch {layout['micro_batch']}")
    return " · ".join(parts)


def describe_memory(memory: dict[str, Any]) -> str:
    """One line for a snapshot's memory: peak of capacity, dominant term, verdict."""
    verdict = "OUT OF MEMORY" if memory["oom"] else "fits"
    return (
        f"{format_bytes(memory['peak_bytes_per_gpu'])} of {format_bytes(memory['capacity_bytes'])}"
        f" ({memory['dominant_term']}) · {verdict}"
    )


def _breakdown_cell(snap: dict[str, Any], category: str, focus: str = "critical") -> str:
    seconds = snap["breakdown"][focus][category]
    text = f"{format_time(seconds)}  {_pct(seconds, snap['step_time_s'])}"
    if category == "exposed_comm":
        axes = [
            f"{axis} {format_time(v)}"
            for axis, v in snap["exposed_comm_by_axis"][focus].items()
            if v > MOVED_SHARE * snap["step_time_s"]
        ]
        if axes:
            text += " (" + ", ".join(axes) + ")"
    return text


def _console_comparison(before: dict[str, Any], after: dict[str, Any] | None) -> Table:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("")
    table.add_column("now")
    if after is not None:
        table.add_column("with the fix")
    snaps = [before] if after is None else [before, after]
    table.add_row("layout", *[escape(describe_layout(s["layout"])) for s in snaps])
    table.add_row("step time", *[format_time(s["step_time_s"]) for s in snaps])
    table.add_row("critical rank:", *["" for _ in snaps])
    for category in CATEGORIES:
        table.add_row(f"  {category}", *[_breakdown_cell(s, category) for s in snaps])
    table.add_row("memory per GPU", *[escape(describe_memory(s["memory"])) for s in snaps])
    if before["moe"]:
        table.add_row(
            "MoE",
            *[
                f"busiest expert {s['moe']['imbalance_mean']:.2f}× mean · dropped "
                f"{100 * s['moe']['dropped_fraction']:.1f}%"
                for s in snaps
            ],
        )
    return table


def cost_text(finding: Finding) -> str:
    """The cost of a finding in one line."""
    if finding.after is None:
        if finding.fix_summary == NO_FASTER_FIX:
            return "nothing to gain by these fixes here (see the note)"
        if finding.set_apart:
            return "no change of layout that fits was found (the candidates set apart below)"
        return "no fix expressible as scenario overrides"
    after = format_time(finding.after["step_time_s"])
    if finding.cost_s is None:
        verdict = "fits" if not finding.after["memory"]["oom"] else "still does not fit"
        return f"the scenario does not fit memory; the fix {verdict}, at {after} per step"
    if finding.cost_s >= 0:
        return (
            f"the mistake costs {format_time(finding.cost_s)} per step "
            f"({finding.cost_pct:.1f}% of the step)"
        )
    cost_pct = cast(float, finding.cost_pct)  # None only with cost_s
    return (
        f"the fix is {format_time(-finding.cost_s)} per step slower "
        f"({-cost_pct:.1f}%), the price of what it buys"
    )


def set_apart_text(entry: dict[str, Any], before: dict[str, Any]) -> str:
    """One line for a candidate fix that is not proposed: why, the overrides, and its
    numbers (what it changes in the recipe and its time per the scenario's batch, or its
    memory against capacity)."""
    sets = " ".join(entry["fix_set"])
    memory = (
        f"{format_bytes(entry['peak_bytes_per_gpu'])} per GPU of "
        f"{format_bytes(entry['capacity_bytes'])}" + (" (does not fit)" if entry["oom"] else "")
    )
    if entry["reason"] == "changes the recipe":
        changed = ", ".join(
            f"{key.split('.')[-1]} {_recipe_value(before, key)} → {entry['fix'][key]}"
            for key in entry["changes"]
        )
        text = f"would change the recipe ({changed}): {sets} ({entry['summary']})"
        if entry["step_time_s"] is not None:
            text += f": {format_time(entry['step_time_s'])} per step"
            same = entry["same_work_step_s"]
            if abs(same - entry["step_time_s"]) > 1e-12 * entry["step_time_s"]:
                batch = before["layout"]["global_batch"]
                text += f", {format_time(same)} per {batch} sequences"
        return f"{text}, {memory}"
    return f"does not fit: {sets} ({entry['summary']}) needs {memory}"


def _recipe_value(before: dict[str, Any], key: str) -> Any:
    """The scenario's own value of a recipe field, where its snapshot holds it."""
    name = key.split(".")[-1]
    return before["layout"].get(name, "its value")


def print_explanation(explanation: Explanation, console: Console) -> None:
    """The human report: a header, then one panel per finding with before/after."""
    snap = explanation.result
    console.print(
        f"[bold]parasim explain · {escape(explanation.scenario)}[/] ({explanation.fidelity})"
    )
    console.print(f"  layout   {escape(describe_layout(snap['layout']))}")
    console.print(f"  step     {format_time(snap['step_time_s'])}")
    console.print(f"  memory   {escape(describe_memory(snap['memory']))}")
    if explanation.ok:
        console.print("[green]No layering mistakes found.[/]")
        return
    count = len(explanation.findings)
    console.print(f"[bold red]{count} problem{'s' if count != 1 else ''} found.[/]")
    for finding in explanation.findings:
        parts: list[Any] = [Text(finding.problem)]
        if finding.fix:
            fix = " ".join(f"--set {arg}" for arg in finding.set_args)
            parts.append(
                Text.assemble(("fix: ", "bold"), (fix, "cyan"), f"  ({finding.fix_summary})")
            )
        else:
            parts.append(Text.assemble(("fix: ", "bold"), finding.fix_summary))
        parts.append(_console_comparison(finding.before, finding.after))
        parts.append(Text.assemble(("cost: ", "bold"), cost_text(finding)))
        if finding.moved:
            parts.append(
                Text.assemble(("moved: ", "bold"), "; ".join(m["text"] for m in finding.moved))
            )
        for alternative in finding.alternatives:
            parts.append(
                Text(
                    f"also possible: {' '.join(alternative['fix_set'])} ({alternative['summary']})"
                    f": {format_time(alternative['step_time_s'])} per step, "
                    f"{format_bytes(alternative['peak_bytes_per_gpu'])} per GPU",
                    style="dim",
                )
            )
        for entry in finding.set_apart:
            parts.append(Text(f"set apart: {set_apart_text(entry, finding.before)}", style="dim"))
        for note in finding.notes:
            parts.append(Text(f"note: {note}", style="dim"))
        title = f"[bold]{escape(finding.id)}[/] · {escape(finding.title)}"
        console.print(Panel(Group(*parts), title=title, title_align="left", border_style="red"))


# ----------------------------------------------------------------------------- html


def _text(value: str) -> str:
    """``value`` as HTML text (quotes kept: nothing here goes into an attribute unquoted)."""
    return html.escape(value, quote=False)


def chart_id(index: int) -> str:
    """The id of the ``index``-th finding's chart (from 1)."""
    return f"finding-{index}"


def memory_is_the_point(finding: Finding) -> bool:
    """Whether the finding's chart shows memory: a memory finding, or either side OOM."""
    snaps = [finding.before] + ([finding.after] if finding.after is not None else [])
    return finding.id in MEMORY_FINDINGS or any(s["memory"]["oom"] for s in snaps)


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def finding_sentence(finding: Finding) -> str:
    """What the finding means and what it costs, in one sentence with its numbers."""
    title, before, after = _capitalized(finding.title), finding.before, finding.after
    if after is None:
        return f"{title}; {finding.fix_summary}."
    fix = f"the fix ({finding.fix_summary})"
    if finding.cost_s is None:  # the scenario does not fit: its step time means nothing
        mb, ma = before["memory"], after["memory"]
        verdict = "still does not fit" if ma["oom"] else "fits"
        return (
            f"{title}: {format_bytes(mb['peak_bytes_per_gpu'])} per GPU does not fit in "
            f"{format_bytes(mb['capacity_bytes'])}; {fix} needs "
            f"{format_bytes(ma['peak_bytes_per_gpu'])} and {verdict}, at "
            f"{format_time(after['step_time_s'])} per step."
        )
    step = before["step_time_s"]
    takes = f"the step takes {format_time(after['step_time_s'])}"
    if finding.cost_s >= 0:
        text = (
            f"{title}: the mistake costs {format_time(finding.cost_s)} of the "
            f"{format_time(step)} step ({finding.cost_pct:.1f}%); with {fix} {takes}"
        )
    else:
        text = f"{title}: {cost_text(finding)}; with {fix} {takes}"
    if memory_is_the_point(finding):
        text += (
            f", and memory per GPU goes from {format_bytes(before['memory']['peak_bytes_per_gpu'])}"
            f" to {format_bytes(after['memory']['peak_bytes_per_gpu'])} of "
            f"{format_bytes(after['memory']['capacity_bytes'])}"
        )
    return text + "."


def _sides(finding: Finding) -> list[tuple[str, dict[str, Any]]]:
    sides = [("mistake", finding.before)]
    if finding.after is not None:
        sides.append(("fix", finding.after))
    return sides


def finding_figure(finding: Finding):
    """The finding's chart: per category one bar for the mistake and one for the fix,
    stacked into each side's step (critical rank, seconds), and, when memory is the
    point, memory per GPU by term (GiB) against the capacity."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sides = _sides(finding)
    labels = [label for label, _ in sides]
    memory = memory_is_the_point(finding)
    if memory:
        fig = make_subplots(rows=1, cols=2, column_widths=[0.58, 0.42], horizontal_spacing=0.1)
    else:
        fig = go.Figure()
    where = {"row": 1, "col": 1} if memory else {}
    steps = [snap["step_time_s"] for _, snap in sides]
    for category in CATEGORIES:
        values = [snap["breakdown"]["critical"][category] for _, snap in sides]
        fig.add_trace(breakdown_bar(category, labels, values, steps, legendgroup="time"), **where)
    longest = max(snap["step_time_s"] for _, snap in sides)
    for label, snap in sides:
        fig.add_annotation(
            x=snap["step_time_s"],
            y=label,
            xref="x",
            yref="y",
            text=format_time(snap["step_time_s"]),
            xanchor="left",
            xshift=4,
            showarrow=False,
        )
    fig.update_xaxes(title_text="time per step, critical rank (s)", range=[0, 1.2 * longest])
    fig.update_yaxes(autorange="reversed")
    if memory:
        for term, color in TERM_COLORS.items():
            values = [snap["memory"]["terms_bytes"].get(term, 0.0) / _GIB for _, snap in sides]
            fig.add_trace(
                go.Bar(
                    name=term,
                    legendgroup="memory",
                    y=labels,
                    x=values,
                    orientation="h",
                    marker={"color": color, "pattern": {"shape": "/"}},
                    hovertemplate=f"%{{y}}<br>{term}: %{{x:.3g}} GiB<extra></extra>",
                ),
                row=1,
                col=2,
            )
        capacity = finding.before["memory"]["capacity_bytes"] / _GIB
        peak = max(snap["memory"]["peak_bytes_per_gpu"] for _, snap in sides) / _GIB
        fig.add_vline(
            x=capacity,
            line={"color": "black", "dash": "dash", "width": 1.5},
            annotation_text=f"capacity {format_bytes(capacity * _GIB)}",
            annotation_position="top",
            row=1,
            col=2,
        )
        fig.update_xaxes(
            title_text="memory per GPU, peak stage (GiB)",
            range=[0, 1.1 * max(capacity, peak)],
            row=1,
            col=2,
        )
    fig.update_layout(
        barmode="stack",
        height=340,
        margin={"l": 70, "r": 30, "t": 40, "b": 60},
        legend={"orientation": "h", "y": -0.3, "yanchor": "top", "traceorder": "normal"},
        template="plotly_white",
    )
    return fig


def _row(name: str, cells: list[str]) -> str:
    return f"<tr><th>{_text(name)}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _comparison(finding: Finding) -> str:
    sides = _sides(finding)
    snaps = [snap for _, snap in sides]
    head = "<tr><th></th>" + "".join(f"<th>{label}</th>" for label, _ in sides) + "</tr>"
    rows = [
        _row("layout", [_text(describe_layout(s["layout"])) for s in snaps]),
        _row("step time", [format_time(s["step_time_s"]) for s in snaps]),
        _row("tokens/s", [f"{s['tokens_per_s']:,.0f}" for s in snaps]),
        _row("MFU", [f"{100 * s['mfu']:.1f}%" for s in snaps]),
        _row(
            "memory per GPU",
            [
                f'<span class="{"bad" if s["memory"]["oom"] else "ok"}">'
                f"{_text(describe_memory(s['memory']))}</span>"
                for s in snaps
            ],
        ),
    ]
    return "<table>" + head + "".join(rows) + "</table>"


def _section(index: int, finding: Finding, chart: str) -> str:
    also = (
        f' <span class="dim">(an instance of {", ".join(_text(a) for a in finding.also)})</span>'
        if finding.also
        else ""
    )
    parts = [
        f"<h2>{index}. <code>{_text(finding.id)}</code> · {_text(finding.title)}{also}</h2>",
        f'<p class="sentence">{_text(finding_sentence(finding))}</p>',
        _comparison(finding),
        chart,
        f"<p>{_text(finding.problem)}</p>",
    ]
    if finding.fix:
        sets = " ".join(f"--set {arg}" for arg in finding.set_args)
        parts.append(
            f"<p><b>fix:</b> <code>{_text(sets)}</code> ({_text(finding.fix_summary)})</p>"
        )
    else:
        parts.append(f"<p><b>fix:</b> {_text(finding.fix_summary)}</p>")
    parts.append(f"<p><b>cost:</b> {_text(cost_text(finding))}</p>")
    items = [
        f"also possible: {' '.join(a['fix_set'])} ({a['summary']}): "
        f"{format_time(a['step_time_s'])} per step, "
        f"{format_bytes(a['peak_bytes_per_gpu'])} per GPU"
        for a in finding.alternatives
    ]
    items += [f"set apart: {set_apart_text(e, finding.before)}" for e in finding.set_apart]
    items += [f"note: {note}" for note in finding.notes]
    if finding.moved:
        parts.append(
            "<p><b>moved:</b> " + _text("; ".join(m["text"] for m in finding.moved)) + "</p>"
        )
    if items:
        parts.append('<ul class="dim">' + "".join(f"<li>{_text(i)}</li>" for i in items) + "</ul>")
    return f'<section class="finding" data-finding="{html.escape(finding.id)}">\n' + (
        "\n".join(parts) + "\n</section>"
    )


def render_explain_html(explanation: Explanation) -> str:
    """The page: the scenario, then one section and chart per finding (plotly.js loaded
    from ``plotly.min.js`` beside the page); none without findings."""
    snap = explanation.result
    count = len(explanation.findings)
    name = _text(explanation.scenario)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>parasim explain · {name}</title>",
        f"<style>{_STYLE}</style>",
    ]
    body = [
        "<body>",
        f"<h1>parasim explain · {name}</h1>",
        f'<p class="dim">{_text(explanation.fidelity)} fidelity</p>',
        "<table>",
        _row("layout", [_text(describe_layout(snap["layout"]))]),
        _row("step time", [format_time(snap["step_time_s"])]),
        _row("memory per GPU", [_text(describe_memory(snap["memory"]))]),
        "</table>",
    ]
    if explanation.ok:
        body.append(
            '<p class="sentence ok" id="no-findings">No layering mistakes found: none of '
            "explain's checks fired, so there is no fix to compare with.</p>"
        )
    else:
        head.append(SCRIPT_TAG)
        body.append(
            f'<p class="sentence bad">{count} problem{"s" if count != 1 else ""} found. '
            "Each chart splits the step of the critical rank (the rank that finishes last) "
            "into its categories, for the mistake and for its fix; the step time is at the "
            "end of each bar.</p>"
        )
        for index, finding in enumerate(explanation.findings, start=1):
            chart = finding_figure(finding).to_html(
                include_plotlyjs=False,
                full_html=False,
                div_id=chart_id(index),
                config={"displaylogo": False, "responsive": True},
            )
            body.append(_section(index, finding, chart))
    return "\n".join([*head, "</head>", *body, "</body>", "</html>", ""])


#: What explain writes in its folder (the page's plotly.js only with findings).
EXPLAIN_FILES = ("explain.json", "explain.html", PLOTLY_JS)


def write_explain_outputs(explanation: Explanation, out: Path) -> list[Path]:
    """Write ``explain.json`` (what ``--json`` prints) and ``explain.html`` to ``out``;
    their paths. A folder that cannot be written is bad input (:class:`ParasimError`)."""
    out = Path(out)
    paths = [out / name for name in EXPLAIN_FILES[:2]]
    page = render_explain_html(explanation)
    try:
        write_json(paths[0], explanation.to_dict())
        write_atomically(paths[1], lambda tmp: tmp.write_text(page, encoding="utf-8"))
        if explanation.findings:
            write_plotly_js(out)
    except OSError as exc:
        raise ParasimError(f"--out: cannot write to {out}: {exc.strerror or exc}") from exc
    return paths
