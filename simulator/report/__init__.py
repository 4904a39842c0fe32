"""Reports of a run: a Chrome/Perfetto trace file, an HTML timeline and the run report.

:func:`write_chrome_trace` writes ``trace.json`` for https://ui.perfetto.dev or
chrome://tracing; :func:`write_timeline_html` writes ``timeline.html``, a Gantt chart
that opens offline in any browser. Both read only the Trace, so a predicted and a
measured step are drawn the same way. :func:`write_run_report` writes ``report.html``:
the headline numbers, time breakdown, memory, link utilisation and timeline of a run
on one offline page.

Each name is imported when first used (the pages need plotly), so a run that writes
only ``result.json`` imports none of it.
"""

from __future__ import annotations

from topologies.exports import lazy_exports

_EXPORTS = {
    "chrome_trace_events": "simulator.report.chrome_trace",
    "write_chrome_trace": "simulator.report.chrome_trace",
    "timeline_figure": "simulator.report.timeline",
    "write_timeline_html": "simulator.report.timeline",
    "run_report_html": "simulator.report.run_report",
    "write_run_report": "simulator.report.run_report",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
