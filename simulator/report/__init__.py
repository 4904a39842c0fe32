"""Reports written from a Trace: a Chrome/Perfetto trace file and an HTML timeline.

:func:`write_chrome_trace` writes ``trace.json`` for https://ui.perfetto.dev or
chrome://tracing; :func:`write_timeline_html` writes ``timeline.html``, a Gantt chart
that opens offline in any browser. Both read only the Trace, so a predicted and a
measured step are drawn the same way.
"""

from __future__ import annotations

from simulator.report.chrome_trace import chrome_trace_events, write_chrome_trace
from simulator.report.timeline import timeline_figure, write_timeline_html

__all__ = [
    "chrome_trace_events",
    "write_chrome_trace",
    "timeline_figure",
    "write_timeline_html",
]
