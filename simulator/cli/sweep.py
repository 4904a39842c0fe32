"""``parasim sweep``: rank every valid layout of a scenario's model on its cluster."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
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
from simulator.common.vocabulary import OBJECTIVES
from simulator.request.knobs import SEARCHED, SWEEP_FIX_KEYS

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim sweep`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "sweep",
        help="every valid layout of a scenario's model on its cluster, ranked",
        description=(
            "Try every layout of the scenario's model on its cluster; drop the invalid "
            "ones and those that do not fit in memory, simulate the rest and rank them by "
            "step time; write sweep.csv (every layout), sweep.json and sweep.html (the "
            "top layouts)."
        ),
        epilog="the knobs searched, and how:\n"
        + "\n".join(
            textwrap.fill(
                knob.searched_how,
                width=78,
                initial_indent=f"  {knob.name:<23}",
                subsequent_indent=" " * 25,
            )
            for knob in SEARCHED
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--gpus", type=int, help="resize the cluster to N GPUs (whole nodes)")
    add_batch_option(parser, "--gpus")
    parser.add_argument(
        "--top",
        type=int,
        default=10,
        help=(
            "layouts to show and rank exactly (default 10): only layouts whose lower bound "
            "can still place them among these are simulated"
        ),
    )
    parser.add_argument(
        "--out", type=folder_argument, help="output folder (default: out/<scenario>-sweep)"
    )
    parser.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"pin a dimension, e.g. --fix tp=8 (repeatable; keys: {', '.join(SWEEP_FIX_KEYS)})",
    )
    parser.add_argument(
        "--max-tp",
        type=int,
        help="largest tp to try (default: GPUs per node; larger values let TP span nodes)",
    )
    add_fidelity_option(parser, help="simulation fidelity (default analytic: fast, folded)")
    add_workers_option(parser)
    add_set_option(parser, "override a scenario field before sweeping (repeatable)")
    add_force_option(parser, "sweep even when the sweep is estimated too large for this machine")
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="step",
        help="rank on the step time (default), or on the scenario's whole run (its run: "
        "section) trained at each layout: its expected time to train under failures and "
        "checkpoints, its cost, its energy",
    )
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help=(
            "simulate every layout that fits: also those a lighter recompute of the same "
            "layout beats, ZeRO-2 where ZeRO-1 fits, and those whose lower bound already "
            "exceeds the --top fastest"
        ),
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the layouts on a Dask cluster: its scheduler's address "
        "(tcp://host:8786), or 'local' for a LocalCluster of --workers processes "
        "(default: $PARASIM_DASK_SCHEDULER, else this machine's process pool; needs "
        "parasim[cluster])",
    )
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="keep each layout's outcome here and reuse it on a rerun (default: "
        ".parasim-cache beside the output folder)",
    )
    cache.add_argument(
        "--no-cache", action="store_true", help="check and simulate every layout afresh"
    )
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim sweep``: print the ranking and write the outputs."""
    from simulator.report.progress import ProgressBar, interactive
    from simulator.report.sweep_report import (
        print_sweep,
        table_output_names,
        wide_console,
        write_sweep_outputs,
    )
    from simulator.tools.cache import DEFAULT_CACHE_NAME, ResultCache
    from simulator.tools.scheduler import scheduler_address
    from simulator.tools.sweep import no_layout_message, parse_fixes, run_sweep

    if args.top < 1:
        raise ParasimError(f"--top: expected a positive number (got {args.top})")
    if args.batch is not None and args.gpus is None:
        raise ParasimError(
            f"--batch {args.batch}: only with --gpus (the size it sets the batch for)"
        )
    out = output_folder(args, "-sweep", table_output_names("sweep"))
    folder = None if args.no_cache else (args.cache or out.parent / DEFAULT_CACHE_NAME)
    cache = ResultCache(folder)
    cache.check()
    result = run_sweep(
        args.scenario,
        overrides=args.overrides,
        gpus=args.gpus,
        fixed=parse_fixes(args.fix),
        max_tp=args.max_tp,
        fidelity=args.fidelity,
        workers=args.workers,
        progress=ProgressBar(interactive()),
        exhaustive=args.exhaustive,
        cache=cache,
        scheduler=scheduler_address(args.scheduler),
        batch=args.batch,
        force=args.force,
        keep=args.top,
        objective=args.objective,
    )
    if not result.rows:
        raise ParasimError(no_layout_message(result))
    paths = write_whole(
        out,
        lambda folder: write_sweep_outputs(result, folder, top=args.top),
        "parasim sweep",
        table_output_names("sweep"),
    )
    print_sweep(result, wide_console(), args.top, [str(p) for p in paths])
    return 0
