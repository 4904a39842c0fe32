"""``parasim query RUN --rank N``: one rank's figures from a run's ``result.json``.

A folded run lists one row per class of ranks (``per_rank``, each with how many ranks
it stands for and the coordinates they share), so a cluster of 131,072 GPUs writes a
result of a few kilobytes; this reads any rank's figures back from its class's row,
under its own rank, node and coordinates."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim query`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "query",
        help="one rank's figures from a run's result.json",
        description=(
            "Print one rank's figures (its time by category, exposed communication by "
            "axis, compute by phase, when it finished) from the result.json of a run "
            "folder: in a folded run, those of the class of ranks it belongs to, which "
            "result.json lists once with a count."
        ),
    )
    parser.add_argument(
        "run", type=Path, help="folder written by parasim run or replay, or its result.json"
    )
    parser.add_argument("--rank", type=int, required=True, help="the rank (GPU index)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim query``: read the result, find the rank's row, print it."""
    from rich.markup import escape
    from rich.table import Table

    from simulator.common.errors import ParasimError
    from simulator.report.compare_report import read_result_file
    from simulator.report.console import open_console

    path = args.run / "result.json" if args.run.is_dir() else args.run
    if not path.is_file():
        raise ParasimError(f"{args.run}: no result.json (a folder parasim run or replay wrote)")
    result = read_result_file(path)
    try:
        row = result.rank_figures(args.rank)
    except ValueError as exc:
        raise ParasimError(f"--rank: {exc}") from None
    figures = dataclasses.asdict(row)
    if figures["cp"] is None:
        del figures["cp"]
    if args.json:
        print(json.dumps(figures, indent=1, sort_keys=True))
        return 0
    shared = ", ".join(f"{axis} {value}" for axis, value in row.class_coords.items())
    table = Table(title=f"rank {row.rank} of {escape(result.scenario)}", title_justify="left")
    table.add_column("figure")
    table.add_column("seconds", justify="right")
    for group in ("breakdown", "exposed_comm_by_axis", "compute_by_phase"):
        for name, seconds in figures[group].items():
            table.add_row(escape(f"{group}.{name}"), f"{seconds:.6g}")
    table.add_row("end_s", f"{row.end_s:.6g}")
    console = open_console()
    console.print(
        f"node {row.node}, tp {row.tp} dp {row.dp} pp {row.pp}"
        + (f" cp {row.cp}" if row.cp is not None else "")
        + (f"; one of {row.ranks} ranks with the same figures ({shared})" if shared else "")
    )
    console.print(table)
    return 0
