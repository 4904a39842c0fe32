"""Reports of a run: a Chrome/Perfetto trace file, an HTML timeline and the run report.

:func:`write_chrome_trace` writes ``trace.json`` for https://ui.perfetto.dev or
chrome://tracing; :func:`write_timeline_html` writes ``timeline.html``, a Gantt chart
that opens offline in any browser. Both read only the Trace, so a predicted and a
measured step are drawn the same way. :func:`write_run_report` writes ``report.html``:
the headline numbers, time breakdown, memory, link utilisation and timeline of a run
on one offline page.
"""

from __future__ import annotations

from simulator.report.chrome_trace import chrome_trace_events, write_chrome_trace
from simulator.report.run_report import run_report_html, write_run_report
from simulator.report.timeline import timeline_figure, write_timeline_html

__all__ = [
    "chrome_trace_events",
    "write_chrome_trace",
    "timeline_figure",
    "write_timeline_html",
    "run_report_html",
    "write_run_report",
]
