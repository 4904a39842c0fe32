"""The files of a run: ``result.json``, ``trace.json``, ``timeline.html``,
``report.html``, and on request per-rank trace files and static chart images, each
written atomically (:mod:`simulator.common.files`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from simulator.common.collector import fewer_collections
from simulator.common.files import write_atomically, write_json
from simulator.common.forked import start_forked, wait_all
from simulator.report.chrome_trace import write_chrome_trace, write_rank_traces
from simulator.report.images import export_figures
from simulator.report.plotly_bundle import PLOTLY_JS
from simulator.run.simulate import make_trace, trace_ranks

# the pages' writers (and plotly behind them) are imported where a page is written: a
# run that writes result.json alone imports none of them

if TYPE_CHECKING:
    from simulator.analysis.trace import Trace

__all__ = [
    "OUTPUTS",
    "TRACE_GZIP_BYTES",
    "write_run_outputs",
    "write_trace",
    "write_rank_folder",
    "write_run_images",
    "run_output_names",
    "names_ops",
]

#: The files of a run, by the names ``--outputs`` takes, in the order they are written.
OUTPUTS: dict[str, str] = {
    "result": "result.json",
    "trace": "trace.json",
    "timeline": "timeline.html",
    "report": "report.html",
}


@fewer_collections(last=True)
def write_run_outputs(
    run: Any,
    out: Path,
    title: str,
    image_format: str | None = None,
    hta: bool = False,
    outputs: Collection[str] = tuple(OUTPUTS),
    full_trace: bool = False,
) -> list[Path]:
    """Write ``result.json``, ``trace.json``, ``timeline.html`` and ``report.html`` of a
    run to ``out`` (those of them ``outputs`` names, by their :data:`OUTPUTS` names),
    each atomically, and return their paths in that order; the pages load plotly.js
    from one ``plotly.min.js`` beside them.

    ``run`` is a :class:`simulator.run.simulate.RunResult`, simulated or measured. Large runs
    keep representative ranks in the trace files and say so in the result's warnings;
    ``report.html`` draws its timeline from the same trace. With ``image_format``
    (``"png"`` or ``"svg"``) the report's charts are also written as static images
    (:func:`write_run_images`), after everything else, and their paths follow. With
    ``hta`` the folder ``hta/`` gets one trace file per rank for Holistic Trace Analysis
    (``TraceAnalysis(trace_dir=out / "hta")``). The
    trace keeps the ranks :func:`~simulator.run.simulate.trace_ranks` picks; with
    ``full_trace``, every simulated rank.
    """

    wanted = set(outputs)
    traced = wanted - {"result"} or hta or image_format is not None
    trace = None
    if traced:
        ranks, note = trace_ranks(run, full=full_trace)
        if note and note not in run.result.warnings:
            run.result.warnings.append(note)
        trace = make_trace(run, ranks)

    def page(write: Callable[[Path], Any]) -> Callable[[Path], Path]:
        """A writer of a page at ``path``, by way of a temporary file; returns ``path``."""

        def written(path: Path) -> Path:
            write_atomically(path, write)
            return path

        return written

    def result(path: Path) -> Path:
        write_json(path, run.result.to_json())
        return path

    def timeline(tmp: Path) -> None:
        from simulator.report.timeline import write_timeline_html

        write_timeline_html(cast("Trace", trace), tmp, title=title)

    def report(tmp: Path) -> None:
        from simulator.report.run_report import write_run_report

        write_run_report(run, tmp, title=title, trace=trace)

    writers: dict[str, Callable[[Path], Path]] = {
        "result": result,
        "trace": lambda path: write_trace(trace, path),  # .gz when large
        # a timeline is wanted only where there is a trace (traced)
        "timeline": page(timeline),
        "report": page(report),
    }
    # some files are written by processes of their own, on other cores, while this
    # one writes the rest (:func:`_aside`); start_forked writes them here first where it
    # cannot fork
    large = trace is not None and len(trace.records) >= FORK_TRACE_RECORDS
    aside_names = _aside(wanted, large)
    if wanted & {"timeline", "report"}:
        # every page is written by plotly.io's JSON writer, whose first import takes a
        # few tenths of a second: taken here once, before the forks, not in each process
        import plotly.io.json  # noqa: F401

        import simulator.report.run_report
        import simulator.report.timeline  # noqa: F401
    fork = large or (trace is not None and "timeline" in wanted)
    asides = [
        (name, start_forked(functools.partial(writers[name], out / OUTPUTS[name]), fork=fork))
        for name in aside_names
    ]
    written: dict[str, Path] = {}
    try:
        for name, file_name in OUTPUTS.items():
            if name in wanted and name not in aside_names:
                written[name] = writers[name](out / file_name)
    finally:  # the files aside are waited for even when another file failed
        written.update(wait_all(asides))
    paths = [written[name] for name in OUTPUTS if name in wanted]
    if wanted & {"timeline", "report"}:
        paths.append(out / PLOTLY_JS)
    if hta:
        paths.append(write_rank_folder(trace, out / "hta"))
    if image_format is not None:
        paths += write_run_images(run, trace, out, title, image_format)
    return paths


#: A trace of at least this many op records is written in a forked process beside the
#: other files (a smaller one is written here, and the report aside instead).
FORK_TRACE_RECORDS = 20_000


def _aside(wanted: set[str], large: bool) -> list[str]:
    """The files written by processes of their own, each in one: a large trace (the
    longest to write, about 8 µs an op) and, beside it, the report, while this process
    draws the timeline (each page spends most of its time drawing at most 30,000 or
    8,000 bars, whatever the trace's size; on two cores the three share them, so that
    neither core waits for the other at the end); a small trace when there is no
    report; else the report, the slower page."""
    if "trace" in wanted and (large or "report" not in wanted):
        both_pages = {"timeline", "report"} <= wanted
        return ["trace", "report"] if large and both_pages else ["trace"]
    return ["report"] if "report" in wanted else []


#: A trace file larger than this is written gzipped (``trace.json.gz``, which Perfetto
#: and chrome://tracing open as it is): 20 MB, so that no output is larger by default.
TRACE_GZIP_BYTES = 20_000_000


def write_trace(trace: Any, path: Path) -> Path:
    """Write the Chrome trace of ``trace`` at ``path``, atomically; when it is larger
    than :data:`TRACE_GZIP_BYTES`, as ``<path>.gz`` instead, compressed as it is
    written. Returns the path written. (An earlier run's file under the other name is
    removed when the files move into the output folder, if it is still parasim's.)"""
    zipped = path.with_name(path.name + ".gz")
    return write_atomically(
        path,
        lambda tmp: zipped if write_chrome_trace(trace, tmp, gzip_over=TRACE_GZIP_BYTES) else path,
        final=lambda chosen: chosen,
    )


def write_rank_folder(trace: Any, folder: Path) -> Path:
    """Per-rank trace files (:func:`~simulator.report.chrome_trace.write_rank_traces`)
    written into ``folder``, a new folder of the command's staging folder (whose files
    then move into the output folder: :mod:`simulator.common.folders`)."""
    folder.mkdir(parents=True, exist_ok=True)  # normal permissions, as the umask says
    write_rank_traces(trace, folder)
    return folder


#: The charts ``--image`` draws, by file stem (:func:`write_run_images`).
IMAGE_CHARTS = ("timeline", "breakdown", "memory", "links")


def names_ops(outputs: Collection[str], hta: bool = False, image_format: str | None = None) -> bool:
    """Whether ``parasim run``'s outputs with these options show the step's ops by name
    (a trace, a timeline, a report and its charts, HTA's traces): a run whose only
    output is ``result.json`` builds its step unlabelled (same numbers, byte for byte;
    :func:`simulator.run.simulate.build_schedule`)."""
    return bool(set(outputs) - {"result"}) or hta or image_format is not None


def run_output_names(
    outputs: Collection[str], hta: bool = False, image_format: str | None = None
) -> list[str]:
    """The names ``parasim run`` may write in its folder with these options (the trace
    under either of its two names), for the folder to be checked before simulating."""
    names = [OUTPUTS[name] for name in OUTPUTS if name in outputs]
    if "trace" in outputs:
        names.append(OUTPUTS["trace"] + ".gz")
    if {"timeline", "report"} & set(outputs):
        names.append(PLOTLY_JS)
    if hta:
        names.append("hta")
    if image_format is not None:
        names += [f"{chart}.{image_format}" for chart in IMAGE_CHARTS]
    return names


def write_run_images(run: Any, trace: Any, out: Path, title: str, image_format: str) -> list[Path]:
    """The charts of ``report.html`` as ``<chart>.png`` or ``.svg`` files in ``out``
    (timeline, breakdown, memory, and link utilisation in flow fidelity), drawn by
    kaleido with the system Chromium (:mod:`simulator.report.images`)."""
    from simulator.report.run_report import (
        REPORT_MAX_BARS,
        breakdown_figure,
        link_heatmap,
        memory_figure,
    )
    from simulator.report.timeline import timeline_figure

    figures = {
        "timeline": timeline_figure(trace, title, max_bars=REPORT_MAX_BARS)[0],
        "breakdown": breakdown_figure(run.result),
        "memory": memory_figure(run.result.memory),
        "links": link_heatmap(run),
    }
    jobs = [
        (figures[name], out / f"{name}.{image_format}")
        for name in IMAGE_CHARTS
        if figures[name] is not None
    ]
    return export_figures(jobs, image_format)
