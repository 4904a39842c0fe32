"""``parasim compare``: set a predicted run beside a measured one (step time, breakdown,
op classes) and write ``compare.json`` and ``compare.html``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim compare`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "compare",
        help="compare a predicted run with a measured one",
        description=(
            "Set two run folders side by side (step time, breakdown, op classes) and write "
            "compare.json and compare.html, the two timelines overlaid: a prediction "
            "against a measurement (error), or two predictions or two measurements (a "
            "what-if, A against B)."
        ),
    )
    parser.add_argument(
        "predicted", type=Path, help="folder written by parasim run (A in a what-if)"
    )
    parser.add_argument(
        "measured", type=Path, help="folder written by parasim replay (B in a what-if)"
    )
    parser.add_argument("--out", type=Path, help="where compare.json/.html go (default: MEASURED)")
    parser.add_argument("--json", action="store_true", help="print compare.json on stdout")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim compare``: write the outputs, print the table (or the JSON)."""
    from rich.console import Console

    from simulator.common.files import dumps_result
    from simulator.report.compare_report import load_run_dir, print_compare, write_compare_outputs
    from simulator.tools.compare import compare_runs

    predicted, measured = load_run_dir(args.predicted), load_run_dir(args.measured)
    report = compare_runs(predicted, measured)
    out = args.out if args.out is not None else args.measured
    paths = write_compare_outputs(report, predicted[1], measured[1], out)
    if args.json:
        sys.stdout.write(dumps_result(report.to_json()))
    else:
        sources = (str(args.predicted), str(args.measured))
        print_compare(report, Console(), [str(p) for p in paths], sources)
    return 0
