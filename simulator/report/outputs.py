"""The files of a run: ``result.json``, ``trace.json``, ``timeline.html``,
``report.html``, and on request per-rank trace files and static chart images, each
written atomically (:mod:`simulator.common.files`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from simulator.common.files import write_atomically, write_json
from simulator.report import write_chrome_trace, write_run_report, write_timeline_html
from simulator.report.chrome_trace import write_rank_traces
from simulator.report.images import export_figures
from simulator.report.run_report import (
    REPORT_MAX_BARS,
    breakdown_figure,
    link_heatmap,
    memory_figure,
)
from simulator.report.timeline import timeline_figure
from simulator.run.simulate import make_trace, trace_ranks

__all__ = ["write_run_outputs", "write_rank_folder", "write_run_images"]


def write_run_outputs(
    run: Any, out: Path, title: str, image_format: str | None = None, hta: bool = False
) -> list[Path]:
    """Write ``result.json``, ``trace.json``, ``timeline.html`` and ``report.html`` of a
    run to ``out``, each atomically, and return their paths in that order.

    ``run`` is a :class:`simulator.run.simulate.RunResult`, simulated or measured. Large runs
    keep representative ranks in the trace files and say so in the result's warnings;
    ``report.html`` draws its timeline from the same trace. With ``image_format``
    (``"png"`` or ``"svg"``) the report's charts are also written as static images
    (:func:`write_run_images`), after everything else, and their paths follow. With
    ``hta`` the folder ``hta/`` gets one trace file per rank for Holistic Trace Analysis
    (``TraceAnalysis(trace_dir=out / "hta")``), replacing any earlier one whole.
    """

    ranks, note = trace_ranks(run)
    if note and note not in run.result.warnings:
        run.result.warnings.append(note)
    trace = make_trace(run, ranks)
    paths = [out / "result.json", out / "trace.json", out / "timeline.html", out / "report.html"]
    write_json(paths[0], run.result.to_json())
    write_atomically(paths[1], lambda tmp: write_chrome_trace(trace, tmp))
    write_atomically(paths[2], lambda tmp: write_timeline_html(trace, tmp, title=title))
    write_atomically(paths[3], lambda tmp: write_run_report(run, tmp, title=title, trace=trace))
    if hta:
        paths.append(write_rank_folder(trace, out / "hta"))
    if image_format is not None:
        paths += write_run_images(run, trace, out, title, image_format)
    return paths


def write_rank_folder(trace: Any, folder: Path) -> Path:
    """Per-rank trace files (:func:`~simulator.report.chrome_trace.write_rank_traces`)
    written into a fresh folder beside ``folder``, which then replaces it whole."""

    folder.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        write_rank_traces(trace, fresh)
        if folder.exists():
            shutil.rmtree(folder)
        fresh.rename(folder)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return folder


def write_run_images(run: Any, trace: Any, out: Path, title: str, image_format: str) -> list[Path]:
    """The charts of ``report.html`` as ``<chart>.png`` or ``.svg`` files in ``out``
    (timeline, breakdown, memory, and link utilisation in flow fidelity), drawn by
    kaleido with the system Chromium (:mod:`simulator.report.images`)."""

    figures = [
        ("timeline", timeline_figure(trace, title, max_bars=REPORT_MAX_BARS)[0]),
        ("breakdown", breakdown_figure(run.result)),
        ("memory", memory_figure(run.result.memory)),
        ("links", link_heatmap(run)),
    ]
    jobs = [(fig, out / f"{name}.{image_format}") for name, fig in figures if fig is not None]
    return export_figures(jobs, image_format)
