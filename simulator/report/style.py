"""The look that parasim's HTML reports share: font, colours, plotly layout and page CSS.

Every chart of a category draws it the same way: the time-breakdown categories are
defined here (:data:`BREAKDOWN_COLORS`, also the sweep's ``BAR_COLORS``),
communication per axis comes from the timeline
(:data:`simulator.report.timeline.CATEGORY_COLORS`, ``comm:tp`` and so on), and
memory terms are :data:`MEMORY_COLORS`. :func:`breakdown_bar` is the one horizontal
bar of a breakdown category that the sweep and explain charts stack. Charts use
plotly's ``plotly_white`` template and the timeline's font; :data:`PAGE_CSS` styles
the HTML around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from simulator.common.vocabulary import COMM_AXES
from simulator.report.timeline import _FONT, CATEGORY_COLORS, TEMPLATE, template_json

__all__ = [
    "FONT",
    "BREAKDOWN_COLORS",
    "AXIS_COLORS",
    "MEMORY_COLORS",
    "OTHER_COLOR",
    "PLOT_CONFIG",
    "PAGE_CSS",
    "TEMPLATE",
    "base_layout",
    "breakdown_bar",
    "page_figure",
]

#: The timeline's font, for every chart and the page around them.
FONT: str = _FONT

#: Colour of each time-breakdown category, in :data:`simulator.analysis.metrics.CATEGORIES` order.
BREAKDOWN_COLORS: dict[str, str] = {
    "compute": "#4C78A8",
    "exposed_comm": "#E45756",
    "bubble": "#EECA3B",
    "imbalance_stall": "#B279A2",
    "other": "#BAB0AC",
}

#: Colour of the communication of each parallel axis, as the timeline draws it.
AXIS_COLORS: dict[str, str] = {axis: CATEGORY_COLORS[f"comm:{axis}"] for axis in COMM_AXES}

#: Colour of each memory term of :func:`simulator.analysis.memory.memory_per_rank`, as the memory
#: panels of ``explain.html`` draw them.
MEMORY_COLORS: dict[str, str] = {
    "weights": "#4C78A8",
    "gradients": "#72B7B2",
    "optimizer_state": "#54A24B",
    "activations": "#F58518",
    "transient": "#FF9DA6",
    "communication_buffers": "#9D755D",
}

#: Colour of anything without one of its own.
OTHER_COLOR: str = CATEGORY_COLORS["other"]

#: The plotly config of every chart: no logo, no lasso, resizes with the window.
PLOT_CONFIG: dict[str, Any] = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
}


def base_layout(with_template: bool = True, **overrides: Any) -> dict[str, Any]:
    """The plotly layout every report chart starts from, updated with ``overrides``.
    Without ``with_template`` the layout holds an empty template, and plotly builds no
    template object: a page then draws the chart with :data:`TEMPLATE`'s JSON in its
    place (:func:`page_figure`)."""
    layout: dict[str, Any] = {
        "template": TEMPLATE if with_template else {},
        "font": {"family": FONT, "size": 12, "color": "#222"},
        "hoverlabel": {"font": {"family": FONT, "size": 12}, "align": "left"},
        "margin": {"l": 150, "r": 40, "t": 30, "b": 50},
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"},
    }
    layout.update(overrides)
    return layout


def page_figure(figure: go.Figure | dict[str, Any]) -> dict[str, Any]:
    """A chart as the plain dict a page draws (``plotly.io.to_html(..., validate=False)``),
    with :data:`TEMPLATE`'s JSON as its template: a figure built without a template
    object (``base_layout(with_template=False)``) then draws as one built with it."""
    spec = figure if isinstance(figure, dict) else figure.to_dict()
    spec.setdefault("layout", {})["template"] = template_json(TEMPLATE)
    return spec


PAGE_CSS = f"""
body {{ margin: 0; background: #F6F7F9; color: #222; font-family: {FONT}; font-size: 14px; }}
main {{ max-width: 1280px; margin: 0 auto; padding: 24px 28px 40px; }}
h1 {{ font-size: 24px; margin: 0 0 4px; }}
h2 {{ font-size: 18px; margin: 0 0 6px; }}
.sub {{ color: #555; margin: 0 0 18px; }}
section {{ background: white; border: 1px solid #E3E6EA; border-radius: 8px;
  padding: 18px 20px; margin: 0 0 20px; }}
.caption {{ color: #444; margin: 0 0 10px; max-width: 900px; line-height: 1.45; }}
.note {{ color: #555; font-style: italic; margin: 6px 0 0; }}
.cards {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
  gap: 12px; margin: 0 0 16px; }}
.card {{ border: 1px solid #E3E6EA; border-radius: 6px; padding: 10px 12px; }}
.card .label {{ color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }}
.card .value {{ font-size: 20px; font-weight: 600; margin: 2px 0; }}
.card .detail {{ color: #666; font-size: 12px; }}
.card.bad {{ border-color: #E45756; background: #FDECEC; }}
.card.bad .value {{ color: #B3261E; }}
.warnings {{ list-style: none; padding: 0; margin: 0 0 16px; }}
.warnings li {{ background: #FFF4E0; border: 1px solid #E0A040; color: #8A4B00;
  border-radius: 6px; padding: 8px 12px; margin: 0 0 6px; }}
.warnings li.oom {{ background: #FDECEC; border-color: #E45756; color: #B3261E;
  font-weight: 600; }}
table.setup {{ border-collapse: collapse; }}
table.setup th {{ text-align: left; color: #666; font-weight: 500; padding: 3px 18px 3px 0;
  vertical-align: top; white-space: nowrap; }}
table.setup td {{ padding: 3px 0; }}
footer {{ color: #777; font-size: 12px; }}
code {{ background: #F1F3F6; border-radius: 3px; padding: 0 4px; }}
"""


def breakdown_bar(
    category: str,
    labels: Sequence[str],
    seconds: Sequence[float],
    step_times: Sequence[float],
    **options: Any,
) -> go.Bar:
    """The horizontal bar of one breakdown ``category`` for rows ``labels``: its
    ``seconds`` per row, hovering with its share of each row's step time."""
    shares = [
        100 * s / step if step > 0 else 0.0 for s, step in zip(seconds, step_times, strict=True)
    ]
    return go.Bar(
        name=category,
        y=list(labels),
        x=list(seconds),
        orientation="h",
        marker_color=BREAKDOWN_COLORS[category],
        customdata=shares,
        hovertemplate=(
            f"%{{y}}<br>{category}: %{{x:.4g}} s (%{{customdata:.1f}}% of the step)<extra></extra>"
        ),
        **options,
    )
