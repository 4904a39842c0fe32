"""``parasim explain``: find a scenario's layering mistakes and price each against its fix."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simulator.cli.options import (
    add_fidelity_option,
    add_set_option,
    output_folder,
    write_whole,
)
from simulator.common.folders import folder_argument

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim explain`` to an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "explain",
        help="find layering mistakes, each quantified against its corrected layout",
        description="Simulate a scenario, find its parallel-layout mistakes and simulate "
        "the fix of each; print the report and write explain.json and explain.html (each "
        "mistake beside its fix) to --out. Exit status 0: nothing found; 1: problems found; "
        "2: bad input.",
    )
    parser.add_argument("scenario", help="scenario YAML file")
    add_set_option(parser, "override a scenario field, e.g. --set parallel.tp=16 (repeatable)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the findings as JSON (what explain.json holds) instead of the report",
    )
    parser.add_argument(
        "--out",
        type=folder_argument,
        metavar="DIR",
        help="output folder for explain.json and explain.html (default: out/<scenario>-explain)",
    )
    add_fidelity_option(
        parser, help="simulation fidelity of the scenario and its fixes (default: analytic)"
    )
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim explain``: 0 when nothing is wrong, 1 when problems were found.

    The report is printed (``--json``: the findings as JSON) and written to ``--out``,
    by default ``out/<scenario>-explain``, as the other commands do."""
    from rich.markup import escape

    from simulator.common.files import dumps_result
    from simulator.report.console import open_console
    from simulator.report.explain_report import (
        EXPLAIN_FILES,
        print_explanation,
        write_explain_outputs,
    )
    from simulator.report.progress import Status, interactive
    from simulator.tools.explain import diagnose

    out = output_folder(args, "-explain", EXPLAIN_FILES)
    message = f"checking {args.scenario} for layering mistakes and simulating their fixes"
    with Status(message, interactive(args.json)):
        explanation = diagnose(args.scenario, args.overrides, fidelity=args.fidelity)
    paths = write_whole(
        out,
        lambda folder: write_explain_outputs(explanation, folder),
        "parasim explain",
        EXPLAIN_FILES,
    )
    if args.json:
        sys.stdout.write(dumps_result(explanation.to_dict()))
    else:
        console = open_console()
        print_explanation(explanation, console)
        console.print(f"wrote {', '.join(escape(str(p)) for p in paths)}")
    return 0 if explanation.ok else 1
