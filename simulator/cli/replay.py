"""``parasim replay``: run a scenario's training step for real with torch.distributed
on local processes, measure it and write the same files as ``parasim run``; needs
torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from simulator.cli.launch import add_launch_options, backend, launcher
from simulator.cli.options import add_set_option, output_folder
from simulator.common.errors import ParasimError
from simulator.common.folders import folder_argument

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim replay`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "replay",
        help="run a scenario's step for real with torch.distributed and measure it",
        description=(
            "Run the scenario's step for real, op by op, on one local rank per GPU of its "
            "layout with torch.distributed, check the collectives' results, and write the "
            "measured step as parasim run writes a predicted one."
        ),
    )
    parser.add_argument("scenario", help="scenario YAML file")
    add_set_option(parser)
    add_launch_options(parser)
    parser.add_argument(
        "--out", type=folder_argument, help="output folder (default: out/<scenario>-measured)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="warm-up steps, the first checking results (default 2)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also record the measured steps with torch.profiler, one trace per rank in "
        "kineto/ (for parasim calibrate --from-trace and parasim compare)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="measured steps, each opened by a barrier; the median is reported, with "
        "the spread (default 10)",
    )
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim replay``: start :mod:`hardware.replay` on one rank per GPU of the
    scenario's layout."""
    from simulator.common.folders import staged_folder
    from simulator.report.outputs import OUTPUTS, run_output_names
    from simulator.request.scenario import load_scenario
    from simulator.traces.kineto import REPLAY_FOLDER

    scenario = load_scenario(args.scenario, args.overrides)  # bad input fails here, at once
    world = scenario.layout.world
    if args.nproc is not None and args.nproc != world:
        raise ParasimError(
            f"--nproc: scenario {scenario.name} needs {world} ranks "
            f"({scenario.layout.describe()}), not {args.nproc}"
        )
    launch = launcher(f"replaying {scenario.name}")
    names = run_output_names(OUTPUTS) + ([REPLAY_FOLDER] if args.profile else [])
    out = output_folder(args, "-measured", names)
    # the ranks write into a staging folder whose files move into --out once they all
    # finished: a launcher killed midway leaves --out as it was, whatever its workers do
    with staged_folder(out, "parasim replay", names) as stage:
        forwarded = [str(Path(args.scenario).resolve()), "--out", str(stage.resolve())]
        forwarded += [f"--set={o}" for o in args.overrides]
        forwarded += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
        forwarded += ["--profile"] if args.profile else []
        launch("hardware.replay", forwarded, world, backend(args), args.timeout)
    print(f"parasim: wrote {out}")
    return 0
