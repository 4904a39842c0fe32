"""``parasim compare A B``: set two run folders side by side — a prediction beside a
measurement, or two runs of one kind (a what-if) — and write ``compare.json`` and
``compare.html``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from simulator.common.folders import folder_argument

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim compare`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "compare",
        help="compare a predicted run with a measured one, or two runs (a what-if)",
        description=(
            "Set a prediction against a real run's PyTorch profiler traces (B a folder of "
            "them): the step's categories and each op kind predicted against measured, "
            "and the largest differences named with their likely mechanism and the "
            "profile field that would absorb each. Or set two run folders side by side "
            "(the overrides that made each, step time, "
            "peak memory per GPU, breakdown, op classes) and write compare.json and "
            "compare.html, the two timelines overlaid: a prediction against a measurement "
            "(the prediction's error, in either order), or two predictions or two "
            "measurements (a what-if, A against B). Each folder holds result.json and "
            "trace.json or trace.json.gz."
        ),
    )
    parser.add_argument(
        "a", metavar="A", type=Path, help="folder written by parasim run or parasim replay"
    )
    parser.add_argument(
        "b",
        metavar="B",
        type=Path,
        help="the other folder, written by either command; or a folder of a real run's "
        "PyTorch profiler traces (one per rank; a replay --profile folder's kineto/), "
        "which A, a prediction, is then set against",
    )
    parser.add_argument(
        "--out",
        type=folder_argument,
        help="where compare.json/.html go (default: B; against traces, A)",
    )
    parser.add_argument("--json", action="store_true", help="print compare.json on stdout")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim compare``: write the outputs, print the table (or the JSON)."""
    from simulator.cli.options import write_whole
    from simulator.common.files import dumps_result
    from simulator.common.folders import check_folder
    from simulator.report.compare_report import (
        COMPARE_FILES,
        load_run_dir,
        print_compare,
        write_compare_outputs,
    )
    from simulator.report.console import open_console
    from simulator.tools.compare import compare_runs

    _check_two_folders(args.a, args.b)
    if _holds_traces(args.b):
        return _against_traces(args)
    if args.out is not None or args.b.is_dir():
        check_folder(args.out if args.out is not None else args.b, names=COMPARE_FILES)
    first, second = load_run_dir(args.a), load_run_dir(args.b)
    report = compare_runs(first, second, (str(args.a), str(args.b)))
    traces = (second[1], first[1]) if report.swapped else (first[1], second[1])
    out = args.out if args.out is not None else args.b
    paths = write_whole(
        out,
        lambda folder: write_compare_outputs(report, *traces, folder),
        "parasim compare",
        COMPARE_FILES,
    )
    if args.json:
        sys.stdout.write(dumps_result(report.to_json()))
    else:
        print_compare(report, open_console(), [str(p) for p in paths])
    return 0


def _check_two_folders(a: Path, b: Path) -> None:
    """Refuse the same folder given twice (under two names, too): nothing to compare."""
    from simulator.common.errors import ParasimError

    try:
        same = a.is_dir() and b.is_dir() and a.samefile(b)
    except OSError:
        same = False
    if same:
        raise ParasimError(f"A and B are the same folder ({a}): compare needs two runs")


def _holds_traces(path: Path) -> bool:
    """Whether ``path`` is a folder of profiler traces (and no run folder: a replay's
    own folder is compared as a run, its ``kineto/`` as traces), or a trace file."""
    from simulator.traces.kineto import TraceError, find_traces, looks_like_trace

    if path.is_file():
        return looks_like_trace(path)
    if not path.is_dir() or (path / "result.json").exists():
        return False
    try:
        find_traces([path])
    except TraceError:
        return False
    return True


def _against_traces(args: argparse.Namespace) -> int:
    """A prediction (A) against the traces of a real run (B)."""
    from simulator.cli.options import write_whole
    from simulator.common.files import dumps_result
    from simulator.common.folders import check_folder
    from simulator.report.compare_report import COMPARE_FILES, load_run_dir
    from simulator.report.console import open_console
    from simulator.report.trace_compare_report import (
        print_trace_compare,
        write_trace_compare_outputs,
    )
    from simulator.traces.compare import compare_with_traces
    from simulator.traces.kineto import read_traces

    out = args.out if args.out is not None else args.a
    predicted = load_run_dir(args.a)
    check_folder(out, names=COMPARE_FILES)
    traces, _ = read_traces([args.b])
    report, measured = compare_with_traces(predicted, traces, (str(args.a), str(args.b)))
    paths = write_whole(
        out,
        lambda folder: write_trace_compare_outputs(report, predicted[1], measured, folder),
        "parasim compare",
        COMPARE_FILES,
    )
    if args.json:
        sys.stdout.write(dumps_result(report.to_json()))
    else:
        print_trace_compare(report, open_console(), [str(p) for p in paths])
    return 0
