"""The teaching walkthrough, ``docs/teaching.md``, and its chart page,
``docs/teaching/charts.html``, from the teaching pairs.

Each pair in ``scenarios/teaching/`` is a layout mistake and its fix, one per failure mode
of the parallel axes: data parallelism running out of memory, tensor parallelism across
nodes, pipeline bubbles from too few micro-batches, sequence parallelism for activation
memory, routing imbalance in a mixture of experts, and layering the axes backwards.
:func:`collect` runs ``parasim explain`` (:func:`simulator.tools.explain.diagnose`) on
both files of every pair; :func:`render_markdown` writes the walkthrough with the
simulator's numbers, and :func:`render_charts` one chart page holding every pair's time
breakdown and memory (plotly.js embedded, so it opens offline).

``python -m benchmarks.make_teaching`` writes both (``--check`` compares the page). The
page is kept in the repository and ``tests/test_explain.py`` fails when it is stale; the
chart page is built, not kept. The output is deterministic (analytic fidelity, the
scenarios' fixed seeds, no dates).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.analysis.metrics import CATEGORIES
from simulator.report.explain_report import (
    cost_text,
    describe_layout,
    describe_memory,
    set_apart_text,
)
from simulator.report.style import BREAKDOWN_COLORS, MEMORY_COLORS
from simulator.tools.explain import Explanation, Finding, diagnose
from simulator.tools.mistakes import MISTAKES
from topologies.units import format_time

__all__ = [
    "Pair",
    "PairResult",
    "PAIRS",
    "collect",
    "render_markdown",
    "render_charts",
    "write",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]  # the repository: simulator/report/ is two below
TEACHING_DIR = ROOT / "scenarios" / "teaching"  # the repository's, beside the package
DOCS_DIR = ROOT / "docs"
PAGE = "teaching.md"
CHARTS = Path("teaching") / "charts.html"
COMMAND = "python -m benchmarks.make_teaching"
# charts.html holds plotly.js between these two markers; everything else is compared
PLOTLY_BEGIN = "<!-- plotly.js begins -->"
PLOTLY_END = "<!-- plotly.js ends -->"


@dataclass(frozen=True)
class Pair:
    """A teaching pair: ``<key>-mistake.yaml`` and ``<key>-fix.yaml``."""

    key: str
    title: str
    finding: str  # the id parasim explain reports on the mistake
    failure_mode: str
    lesson: str

    @property
    def mistake_path(self) -> Path:
        return TEACHING_DIR / f"{self.key}-mistake.yaml"

    @property
    def fix_path(self) -> Path:
        return TEACHING_DIR / f"{self.key}-fix.yaml"


@dataclass
class PairResult:
    pair: Pair
    mistake: Explanation
    fix: Explanation

    @property
    def finding(self) -> Finding:
        """The mistake's finding this pair teaches."""
        return next(f for f in self.mistake.findings if self.pair.finding in f.ids)


PAIRS: tuple[Pair, ...] = (
    Pair(
        "dp-oom",
        "Data parallelism alone runs out of memory",
        "dp-only-oom",
        "every data-parallel replica holds the full model, its gradients and its optimizer "
        "state, so one GPU's memory caps the model size: adding GPUs adds throughput, not "
        "headroom.",
        "Data parallelism splits the batch and copies the model. With mixed precision and "
        "Adam every parameter costs 16 bytes on every replica (2 for the bf16 weight, 2 for "
        "its gradient, 12 for the fp32 master weight and the two moments), before a single "
        "activation is stored. GPT-3 13B needs that on each of the 8 GPUs, and 8 GPUs have no "
        "more room each than one. What helps is partitioning the model itself: tensor "
        "parallelism inside the node splits every layer's weights, gradients and optimizer "
        "state across the TP group. `parasim explain` tries the smallest TP degree first, "
        "then adds pipeline stages, checking memory before it simulates anything, and says "
        "whether ZeRO-1 (the Adam state split across the replicas) alone would be enough.",
    ),
    Pair(
        "tp-across-nodes",
        "Tensor parallelism across nodes",
        "tp-across-nodes",
        "tensor parallelism communicates inside every layer's forward and backward pass and "
        "needs NVLink-class bandwidth; spread across nodes, network latency and bandwidth sit "
        "in the hot path of every layer.",
        "Megatron-style tensor parallelism all-reduces a micro-batch's activations twice per "
        "layer in the forward pass and twice in the backward, and the next operation waits "
        "for each one. Inside a node those all-reduces run over NVSwitch; a TP group larger "
        "than the node sends every one of them through the NICs. `parasim explain` reports "
        "this as `tp-beyond-nvlink` (a TP degree larger than the NVLink domain, one cause of "
        "`tp-across-nodes`), keeps TP at the node's 8 GPUs and lets the pipeline absorb the "
        "remaining factor of 2, because data parallelism would need a full replica per pair "
        "of nodes and does not fit. Only the stage boundary's activations then cross the "
        "network, once per micro-batch, at the price of a small pipeline bubble.",
    ),
    Pair(
        "pipeline-bubble",
        "Pipeline bubbles from too few micro-batches",
        "too-few-microbatches",
        "a pipeline stage idles while the first micro-batch reaches it and after the last one "
        "leaves; micro-batching shrinks that bubble but never removes it.",
        "With p stages and m micro-batches, GPipe and 1F1B leave every stage idle for "
        "(p−1)/(m+p−1) of the step while the pipeline fills and drains (interleaving v model "
        "chunks per GPU makes it (p−1)/(v·m+p−1)). A global batch of 16 cut into two "
        "micro-batches of 8 gives 1/3; explain asks for at least 9(p−1) micro-batches, which "
        "brings that reference bubble to 10% or less, and gets them by making the micro-batch "
        "smaller at the same global batch (failing that, it proposes interleaved 1F1B or a "
        "larger global batch). Smaller micro-batches run smaller GEMMs, so compute and TP "
        "communication grow a little; the bubble shrinks by far more.",
    ),
    Pair(
        "sp-memory",
        "Sequence parallelism for activation memory",
        "sp-off-activation-bound",
        "tensor parallelism leaves some activations fully replicated on every rank; sequence "
        "parallelism partitions them along the sequence and cuts the activation memory tensor "
        "parallelism alone does not address.",
        "Tensor parallelism splits the attention and MLP GEMMs, but the layer norms, dropouts "
        "and residual adds between them run on the whole sequence on every TP rank. With "
        "selective recompute a layer keeps s·b·h·(10 + 24/t) bytes per micro-batch "
        "(Korthikanti et al. 2022), and the 10 does not shrink with t. Sequence parallelism "
        "splits those operations along the sequence, so the layer keeps (s·b·h/t)·34 bytes: "
        "at t = 8 about a third. Its communication is a reduce-scatter and an all-gather in "
        "place of each all-reduce, the same bytes, so the step time hardly moves while the "
        "memory falls below the GPU's capacity.",
    ),
    Pair(
        "moe-imbalance",
        "MoE routing imbalance",
        "routing-skew",
        "if tokens do not spread evenly across experts, some GPUs sit idle while others queue "
        "up, and the whole step can stall behind the busiest expert.",
        "Expert parallelism places the experts on different GPUs and sends every token to "
        "the GPU holding its expert with an all-to-all, and sends the results back with a "
        "second. When the router favours a few experts (here popularity falls as 1/rank), "
        "the GPU holding a layer's hottest expert processes several times the average, and "
        "every other GPU waits for it at the combine all-to-all: parasim counts that wait as "
        "`imbalance_stall`. A capacity factor bounds each expert's load at f·k·T/E "
        "assignments and drops the overflow (the token skips that expert through the "
        "residual connection). The stall shrinks, but the dropped assignments (the routing "
        "row below) cost model quality: a router trained with a load-balancing loss is the "
        "real cure, and the capacity factor is its guard rail.",
    ),
    Pair(
        "ep-routing",
        "Expert all-to-all spread over more nodes than routing needs",
        "ep-routing-spread",
        "when expert parallelism spans nodes, a router free to pick any expert sends each of "
        "a token's assignments through the network on its own, to as many nodes as its "
        "experts happen to live on; the all-to-alls then carry several copies of every token "
        "where one per node would do.",
        "A fine-grained mixture of experts sends every token to 8 of 128 experts. The "
        "experts' weights and Adam state need 32-way expert parallelism, four nodes (8-way, "
        "one node, does not fit), so about 6 of each token's 8 assignments land on another "
        "node, and each crosses the network as its own copy: the dispatch and combine "
        "all-to-alls take most of the step. DeepSeek-V3 bounds this with node-limited "
        "routing: a token's experts are chosen among at most M nodes (4 of 8 there), the "
        "token crosses once to each, and the receiving node forwards it to its experts over "
        "NVLink (as DeepEP dispatches). With M = 2 here the network carries about a quarter "
        "of the bytes. The router's choice is constrained, which DeepSeek-V3 reports costs "
        "no measurable quality; parasim keeps the unrestricted router's expert loads.",
    ),
    Pair(
        "fsdp-across-nodes",
        "Full sharding across nodes",
        "fsdp-across-nodes",
        "FSDP gathers every layer's weights twice and reduce-scatters its gradients over the "
        "whole data-parallel group; across nodes with little network bandwidth, that traffic "
        "outruns the layers it should hide behind.",
        "Fully sharded data parallelism keeps 1/dp of every weight on each GPU and gathers a "
        "layer's weights just before it runs, in its forward and again in its backward, then "
        "reduce-scatters its gradients: per step about 1.5 times the bytes plain data "
        "parallelism moves. FSDP prefetches the next layer's gather while the current one "
        "computes, which hides it when the links are fast. Here the 64 GPUs sit on 8 nodes "
        "with two 400 Gb/s NICs each, so every gather of the 64-way group squeezes through "
        "a quarter of a DGX's network and a third of the step is exposed communication. "
        "HSDP shards inside each node instead (the gathers and reduce-scatters run over "
        "NVLink) and replicates across the nodes, so only each GPU's 1/8 shard of the "
        "gradients crosses the network, once per step. It costs memory: each GPU now holds "
        "1/8 of the model, not 1/64. And it needs network bandwidth per GPU: the 8 replicate "
        "groups of a node all-reduce at the same moment, and with a single NIC per node "
        "they queue behind it and every HSDP layout is slower than FSDP (try `--set "
        "cluster.nic.per_node=1`: explain then finds no faster fix).",
    ),
    Pair(
        "cp-across-nodes",
        "Context parallelism across nodes",
        "cp-across-nodes",
        "a context-parallel ring passes every attention block's keys and values to the next "
        "rank; across nodes that transfer can take longer than the block it should hide "
        "behind, and attention waits on the network.",
        "Context parallelism splits each sequence over the ranks of a ring: each rank "
        "computes attention for its own queries against one rank's keys and values at a "
        "time while it passes the block it holds on to the next rank. The transfer hides "
        "when a block's attention takes longer than sending its K/V, which NVLink easily "
        "allows; a model with full multi-head attention (32 key/value heads here) at 32K "
        "tokens split 16 ways sends 128 MB blocks, and over one 400 Gb/s NIC per GPU the "
        "ring that spans two nodes waits on every one of them. Keeping the ring inside the "
        "node (cp 8) and using the second node as a data-parallel replica removes the "
        "wait; Ulysses (two all-to-alls per attention) or fewer key/value heads would also "
        "shrink it.",
    ),
    Pair(
        "layering",
        "Layering backwards",
        "layering-backwards",
        "tensor parallel within a node, pipeline parallel across a few nodes, data parallel "
        "across everything else; getting the layering backwards (tensor parallel across "
        "nodes) is one of the most common causes of multi-node training scaling far worse "
        "than expected.",
        "The placement order says which axis gets consecutive ranks, and consecutive ranks "
        "share a node. `[pp, dp, tp]` gives the node to the pipeline and data-parallel peers, "
        "which need it least, and stretches every TP group over all four nodes. The degrees "
        "are the same in both files; only the order changes. With TP innermost its "
        "all-reduces stay on NVLink, the pipeline's hand-offs cross the network only at the "
        "stage boundary, and the data-parallel all-reduce, issued bucket by bucket during "
        "the backward pass, overlaps what compute is left. explain simulates both orders "
        "with TP innermost, `[tp, pp, dp]` (the page's order) and `[tp, dp, pp]` "
        "(Megatron-LM's default), and proposes the faster, the page's order on a tie.",
    ),
)


def collect(fidelity: str = "analytic") -> list[PairResult]:
    """Run ``parasim explain`` on both files of every teaching pair."""
    return [
        PairResult(
            pair,
            diagnose(pair.mistake_path, fidelity=fidelity),
            diagnose(pair.fix_path, fidelity=fidelity),
        )
        for pair in PAIRS
    ]


# ------------------------------------------------------------------------- markdown


def _share(seconds: float, step: float) -> str:
    return f"{format_time(seconds)} ({100 * seconds / step:.1f}%)"


def _exposed(snap: dict[str, Any]) -> str:
    step = snap["step_time_s"]
    text = _share(snap["breakdown"]["critical"]["exposed_comm"], step)
    axes = [
        f"{axis} {format_time(v)}"
        for axis, v in snap["exposed_comm_by_axis"]["critical"].items()
        if v > 0.01 * step
    ]
    return text + (f": {', '.join(axes)}" if axes else "")


def _table(mistake: dict[str, Any], fix: dict[str, Any]) -> list[str]:
    rows = [
        "| | mistake | fix |",
        "|---|---|---|",
        f"| layout | {describe_layout(mistake['layout'])} | {describe_layout(fix['layout'])} |",
        f"| step time | {format_time(mistake['step_time_s'])} | "
        f"{format_time(fix['step_time_s'])} |",
        f"| tokens/s | {mistake['tokens_per_s']:,.0f} | {fix['tokens_per_s']:,.0f} |",
        f"| MFU | {100 * mistake['mfu']:.1f}% | {100 * fix['mfu']:.1f}% |",
    ]
    for category in CATEGORIES:
        if category == "exposed_comm":
            cells = [_exposed(mistake), _exposed(fix)]
        else:
            cells = [
                _share(s["breakdown"]["critical"][category], s["step_time_s"])
                for s in (mistake, fix)
            ]
        rows.append(f"| {category} (critical rank) | {cells[0]} | {cells[1]} |")
    rows.append(
        f"| memory per GPU | {describe_memory(mistake['memory'])} | "
        f"{describe_memory(fix['memory'])} |"
    )
    if mistake["moe"] and fix["moe"]:
        cells = [
            f"busiest expert {s['moe']['imbalance_mean']:.2f}× the mean, "
            f"{100 * s['moe']['dropped_fraction']:.1f}% of assignments dropped"
            for s in (mistake, fix)
        ]
        rows.append(f"| routing | {cells[0]} | {cells[1]} |")
    return rows


def _finding_lines(finding: Finding) -> list[str]:
    also = f" (an instance of `{'`, `'.join(finding.also)}`)" if finding.also else ""
    lines = [f"- **`{finding.id}`**{also}: {finding.problem}"]
    if finding.fix:
        sets = " ".join(f"--set {arg}" for arg in finding.set_args)
        lines.append(f"- fix: `{sets}`: {finding.fix_summary}.")
    lines.append(f"- cost: {cost_text(finding)}.")
    if finding.moved:
        lines.append("- moved: " + "; ".join(m["text"] for m in finding.moved) + ".")
    for alternative in finding.alternatives:
        lines.append(
            f"- also possible: `{' '.join(alternative['fix_set'])}` ({alternative['summary']}): "
            f"{format_time(alternative['step_time_s'])} per step."
        )
    for entry in finding.set_apart:
        lines.append(f"- set apart: {set_apart_text(entry, finding.before)}.")
    for note in finding.notes:
        lines.append(f"- note: {note}.")
    return lines


def _count(n: int) -> str:
    words = "zero one two three four five six seven eight nine ten eleven twelve".split()
    return words[n] if n < len(words) else str(n)


def render_markdown(results: list[PairResult]) -> str:
    """The walkthrough page."""
    out = [
        f"# Teaching pairs: {_count(len(results))} ways to lay out a training job badly, "
        "and their fixes",
        "",
        f"<!-- Generated by `{COMMAND}` from scenarios/teaching/. Do not edit by hand: "
        "tests/test_explain.py regenerates this page and fails when it differs. -->",
        "",
        f"This page is generated by `{COMMAND}` (run it from the repository root after "
        "changing a teaching scenario or the simulator; `--check` only compares). Every "
        "number on it comes from parasim in analytic fidelity: each pair in "
        "[`scenarios/teaching/`](../scenarios/teaching/) is a mistake and its fix, "
        "`parasim explain` finds the mistake in the first file and nothing in the second, "
        "and the fix file is exactly the change explain proposes. The bar charts of every "
        "pair (time breakdown of the critical rank, and memory per GPU by term) are on one "
        "page, [teaching/charts.html](teaching/charts.html), which opens offline; the same "
        "command builds it (it is not kept in the repository).",
        "",
        f"The lesson behind all {_count(len(results))}: tensor parallelism inside a node over "
        "NVLink, pipeline parallelism across a few nodes, data parallelism across "
        "everything else, enough micro-batches to hide the pipeline's fill and drain, "
        "sequence parallelism when activations fill the GPU, a router that spreads tokens "
        "evenly and over few nodes, and the traffic that sharding and context parallelism "
        "add kept on NVLink.",
        "",
        "| pair | explain reports | mistake | fix | what the mistake costs |",
        "|---|---|---|---|---|",
    ]
    for index, result in enumerate(results, start=1):
        finding = result.finding
        before, after = result.mistake.result, result.fix.result
        if finding.cost_s is None:
            cost = f"does not fit ({describe_memory(before['memory']).split(' (')[0]})"
        else:
            cost = f"{format_time(finding.cost_s)} per step ({finding.cost_pct:.1f}%)"
        out.append(
            f"| [{index}. {result.pair.title}](#{index}-{_anchor(result.pair.title)}) | "
            f"`{finding.id}` | {format_time(before['step_time_s'])} | "
            f"{format_time(after['step_time_s'])} | {cost} |"
        )
    out += [
        "",
        "Try any pair yourself:",
        "",
        "```bash",
        "parasim explain scenarios/teaching/layering-mistake.yaml         # exit status 1: found",
        "parasim explain scenarios/teaching/layering-fix.yaml             # exit status 0: clean",
        "parasim run scenarios/teaching/layering-mistake.yaml --out out/layering-mistake",
        "parasim explain scenarios/teaching/layering-mistake.yaml --json  # the findings as JSON",
        "```",
        "",
        "The step times, breakdowns and memory below are those of `parasim run` on each file "
        "(the teaching scenarios ask for analytic fidelity themselves). The breakdown is the "
        "critical rank's (the rank that finishes last); its categories add up to the step "
        "time.",
    ]
    for index, result in enumerate(results, start=1):
        pair = result.pair
        mistake, fix = result.mistake.result, result.fix.result
        out += [
            "",
            f"## {index}. {pair.title}",
            "",
            f"The failure mode: {pair.failure_mode}",
            "",
            f"Files: [`{pair.key}-mistake.yaml`](../scenarios/teaching/{pair.key}-mistake.yaml)"
            f" and [`{pair.key}-fix.yaml`](../scenarios/teaching/{pair.key}-fix.yaml) · "
            f"[chart](teaching/charts.html#{pair.key})",
            "",
            pair.lesson,
            "",
            *_table(mistake, fix),
            "",
            f"`parasim explain scenarios/teaching/{pair.key}-mistake.yaml` exits with status 1 "
            f"and reports {len(result.mistake.findings)} "
            f"finding{'s' if len(result.mistake.findings) != 1 else ''}:",
            "",
        ]
        for finding in result.mistake.findings:
            out += _finding_lines(finding)
        verdict = "nothing" if result.fix.ok else f"{len(result.fix.findings)} findings"
        out += [
            "",
            f"On `{pair.key}-fix.yaml` it finds {verdict} (exit status "
            f"{0 if result.fix.ok else 1}).",
        ]
    out += [
        "",
        "## What explain looks for",
        "",
        "`parasim explain SCENARIO [--set key.path=value ...] [--json] [--fidelity "
        "analytic|flow]` simulates the scenario (analytic fidelity unless asked), checks "
        "it for the mistakes below, and simulates the fix of each; it exits with status 0 "
        "when it finds nothing, 1 when it finds something, 2 on bad input.",
        "",
        "| finding | when |",
        "|---|---|",
        *(f"| `{mistake.id}` | {mistake.when} |" for mistake in MISTAKES),
        "",
        "Each finding states the problem with its numbers, the fix as `--set` overrides, the "
        "step time before and after, what the mistake costs (seconds and share of the step; "
        "for a layout that does not fit, only whether the fix fits), and which categories "
        "moved. A fix changes how the run is laid out, never what it trains: a candidate "
        "that changes the recipe (the model, the sequence length, the global batch, the "
        "number format) and one that does not fit in memory are never proposed, but shown "
        "apart with their numbers.",
        "",
    ]
    return "\n".join(out)


def _anchor(title: str) -> str:
    """GitHub's heading anchor for ``title`` (lower case, spaces to dashes)."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return kept.replace(" ", "-")


# --------------------------------------------------------------------------- charts

_CATEGORY_COLORS = BREAKDOWN_COLORS  # the colours of every parasim chart
_TERM_COLORS = MEMORY_COLORS


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _figure(result: PairResult) -> dict[str, Any]:
    """One pair's figure: the critical rank's breakdown and memory by term, stacked bars."""
    snaps = {"mistake": result.mistake.result, "fix": result.fix.result}
    rows = list(snaps)
    data: list[dict[str, Any]] = []
    for category in CATEGORIES:
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": category,
                "legendgroup": "time",
                "y": rows,
                "x": [_round(s["breakdown"]["critical"][category]) for s in snaps.values()],
                "marker": {"color": _CATEGORY_COLORS[category]},
                "xaxis": "x",
                "yaxis": "y",
                "hovertemplate": f"{category}: %{{x:.4g}} s<extra>%{{y}}</extra>",
            }
        )
    for term, color in _TERM_COLORS.items():
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": term.replace("_", " "),
                "legendgroup": "memory",
                "y": rows,
                "x": [
                    _round(s["memory"]["terms_bytes"].get(term, 0.0) / 2**30)
                    for s in snaps.values()
                ],
                "marker": {"color": color, "pattern": {"shape": "/"}},
                "xaxis": "x2",
                "yaxis": "y2",
                "hovertemplate": f"{term}: %{{x:.3g}} GiB<extra>%{{y}}</extra>",
            }
        )
    capacity = _round(result.mistake.result["memory"]["capacity_bytes"] / 2**30)
    return {
        "data": data,
        "layout": {
            "barmode": "stack",
            "height": 330,
            "margin": {"l": 70, "r": 20, "t": 30, "b": 110},
            "legend": {"orientation": "h", "y": -0.42, "yanchor": "top", "traceorder": "normal"},
            "xaxis": {"domain": [0, 0.52], "title": {"text": "seconds per step (critical rank)"}},
            "yaxis": {"autorange": "reversed"},
            "xaxis2": {"domain": [0.62, 1], "anchor": "y2", "title": {"text": "GiB per GPU"}},
            "yaxis2": {"anchor": "x2", "autorange": "reversed"},
            "shapes": [
                {
                    "type": "line",
                    "xref": "x2",
                    "yref": "y2 domain",
                    "x0": capacity,
                    "x1": capacity,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "black", "dash": "dash", "width": 1.5},
                }
            ],
            "annotations": [
                {
                    "xref": "x2",
                    "yref": "y2 domain",
                    "x": capacity,
                    "y": 1.08,
                    "text": f"capacity {capacity:.3g} GiB",
                    "showarrow": False,
                    "font": {"size": 11},
                }
            ],
        },
    }


def render_charts(results: list[PairResult], plotly_js: str | None = None) -> str:
    """The chart page: one figure per pair, plotly.js embedded between markers."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs

        plotly_js = get_plotlyjs()
    sections, figures = [], {}
    for index, result in enumerate(results, start=1):
        pair = result.pair
        sections.append(
            f'<h2 id="{pair.key}">{index}. {pair.title}</h2>\n'
            f"<p><code>{pair.key}-mistake.yaml</code> against <code>{pair.key}-fix.yaml</code>"
            f" · explain: <code>{result.finding.id}</code></p>\n"
            f'<div id="chart-{pair.key}" class="chart"></div>'
        )
        figures[f"chart-{pair.key}"] = _figure(result)
    payload = json.dumps(figures, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            "<title>parasim teaching pairs: charts</title>",
            "<style>body{font-family:Inter,'Helvetica Neue',Helvetica,Arial,sans-serif;"
            "max-width:1100px;margin:2em auto;padding:0 1em}.chart{height:330px}</style>",
            PLOTLY_BEGIN,
            f'<script type="text/javascript">{plotly_js}</script>',
            PLOTLY_END,
            "</head>",
            "<body>",
            "<h1>parasim teaching pairs</h1>",
            "<p>Where the step goes on the critical rank, and memory per GPU by term, for each "
            "mistake and its fix (analytic fidelity). The walkthrough is "
            f'<a href="../teaching.md">teaching.md</a>; generated by <code>{COMMAND}</code>.'
            "</p>",
            *sections,
            "<script>",
            f"const figures = {payload};",
            "for (const [id, figure] of Object.entries(figures)) {",
            "  Plotly.newPlot(id, figure.data, figure.layout,",
            "                 {responsive: true, displaylogo: false});",
            "}",
            "</script>",
            "</body>",
            "</html>",
            "",
        ]
    )


def strip_plotly(html: str) -> str:
    """The chart page without its embedded plotly.js (what the drift test compares)."""
    head, _, rest = html.partition(PLOTLY_BEGIN)
    _, _, tail = rest.partition(PLOTLY_END)
    return head + tail


# ---------------------------------------------------------------------------- files


def write(results: list[PairResult], docs_dir: Path = DOCS_DIR) -> list[Path]:
    """Write ``teaching.md`` and ``teaching/charts.html`` under ``docs_dir``."""
    page, charts = docs_dir / PAGE, docs_dir / CHARTS
    charts.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_markdown(results), encoding="utf-8")
    charts.write_text(render_charts(results), encoding="utf-8")
    return [page, charts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Write docs/teaching.md and its chart page."
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with the checked-in page, write nothing"
    )
    parser.add_argument("--docs", type=Path, default=DOCS_DIR, help="docs folder to write")
    args = parser.parse_args(argv)
    results = collect()
    if not args.check:
        for path in write(results, args.docs):
            print(f"wrote {path}")
        return 0
    page = args.docs / PAGE
    if not page.exists() or page.read_text(encoding="utf-8") != render_markdown(results):
        print(f"stale: {page} (run {COMMAND})", file=sys.stderr)
        return 1
    return 0
