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
            "Set two run folders side by side (the overrides that made each, step time, "
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
        "b", metavar="B", type=Path, help="the other folder, written by either command"
    )
    parser.add_argument(
        "--out", type=folder_argument, help="where compare.json/.html go (default: B)"
    )
    parser.add_argument("--json", action="store_true", help="print compare.json on stdout")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim compare``: write the outputs, print the table (or the JSON)."""
    from rich.console import Console

    from simulator.cli.options import write_whole
    from simulator.common.files import dumps_result
    from simulator.common.folders import check_folder
    from simulator.report.compare_report import (
        COMPARE_FILES,
        load_run_dir,
        print_compare,
        write_compare_outputs,
    )
    from simulator.tools.compare import compare_runs

    _check_two_folders(args.a, args.b)
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
        print_compare(report, Console(), [str(p) for p in paths])
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
