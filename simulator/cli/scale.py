"""``parasim scale``: scaling curves of a scenario over GPU counts."""

from __future__ import annotations

import argparse
from typing import Any

from simulator.cli.options import (
    add_batch_option,
    add_fidelity_option,
    add_force_option,
    add_set_option,
    add_workers_option,
    output_folder,
    write_whole,
)
from simulator.common.errors import ParasimError
from simulator.common.folders import folder_argument
from simulator.common.vocabulary import SCALE_MODES

__all__ = ["add_parser", "command"]


def _gpus_argument(text: str) -> list[int]:
    """``--gpus`` for argparse, which reports a bad value as a usage error (exit 2)."""
    from simulator.tools.scale import parse_gpus

    try:
        return parse_gpus(text)
    except ParasimError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--gpus {text}: ")) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim scale`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "scale",
        help="scaling curves: the scenario at several GPU counts",
        description=(
            "Simulate the scenario at each GPU count (whole nodes), keeping its tp and pp "
            "(dp the rest) or, with --best, the fastest layout at each size; report "
            "throughput and scaling efficiency; write scale.csv, scale.json and "
            "scale.html."
        ),
    )
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument(
        "--gpus",
        required=True,
        type=_gpus_argument,
        help="GPU counts, e.g. 8,16,32 or 8,16,...,4096 (doubling)",
    )
    add_batch_option(parser, "each size")
    parser.add_argument(  # the older name of --batch, kept for command lines that use it
        "--mode", choices=SCALE_MODES, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--best", action="store_true", help="sweep tp and pp at each size and keep the fastest"
    )
    parser.add_argument("--max-tp", type=int, help="with --best: largest tp to try")
    parser.add_argument(
        "--out", type=folder_argument, help="output folder (default: out/<scenario>-scale)"
    )
    add_fidelity_option(parser, help="simulation fidelity (default analytic: fast, folded)")
    add_workers_option(parser)
    add_set_option(parser, "override a scenario field first (repeatable)")
    add_force_option(parser, "scale even when the curve is estimated too large for this machine")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim scale``: print the table and write the outputs."""
    from simulator.report.progress import ProgressBar, interactive
    from simulator.report.scale_report import print_scale, write_scale_outputs
    from simulator.report.sweep_report import table_output_names, wide_console
    from simulator.tools.scale import POLICY_OF_MODE, run_scale

    batch = args.batch
    if args.mode is not None:
        older = POLICY_OF_MODE[args.mode]
        if batch is not None and batch != older:
            raise ParasimError(
                f"--mode {args.mode} is --batch {older}, which contradicts --batch {batch}"
            )
        batch = older
    out = output_folder(args, "-scale", table_output_names("scale"))
    result = run_scale(
        args.scenario,
        args.gpus,
        batch=batch,
        best=args.best,
        overrides=args.overrides,
        fidelity=args.fidelity,
        workers=args.workers,
        progress=ProgressBar(interactive()),
        max_tp=args.max_tp,
        force=args.force,
    )
    if result.reference_gpus is None:
        raise ParasimError(f"no layout fits at any size: {result.rows[0]['reason']}")
    paths = write_whole(
        out,
        lambda folder: write_scale_outputs(result, folder),
        "parasim scale",
        table_output_names("scale"),
    )
    print_scale(result, wide_console(), [str(p) for p in paths])
    return 0
