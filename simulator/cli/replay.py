"""``parasim replay``: run a scenario's training step for real with torch.distributed
on local processes, measure it and write the same files as ``parasim run``; needs
torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from simulator.cli.launch import add_launch_options, backend, launcher
from simulator.cli.options import add_set_option
from simulator.common.errors import ParasimError
from simulator.request.scenario import load_scenario

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim replay`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "replay", help="run a scenario's step for real with torch.distributed and measure it"
    )
    parser.add_argument("scenario", help="scenario YAML file")
    add_set_option(parser)
    add_launch_options(parser)
    parser.add_argument("--out", type=Path, help="output folder (default: out/<scenario>-measured)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="warm-up steps (the first checks results)"
    )
    parser.add_argument(
        "--steps", type=int, default=3, help="measured steps (the median is reported)"
    )
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim replay``: start :mod:`hardware.replay` on one rank per GPU of the
    scenario's layout."""
    scenario = load_scenario(args.scenario, args.overrides)  # bad input fails here, at once
    world = scenario.layout.world
    if args.nproc is not None and args.nproc != world:
        raise ParasimError(
            f"--nproc: scenario {scenario.name} needs {world} ranks "
            f"({scenario.layout.describe()}), not {args.nproc}"
        )
    launch = launcher()
    out = args.out if args.out is not None else Path("out") / f"{scenario.name}-measured"
    forwarded = [str(Path(args.scenario).resolve()), "--out", str(out.resolve())]
    forwarded += [f"--set={o}" for o in args.overrides]
    forwarded += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    launch("hardware.replay", forwarded, world, backend(args), args.timeout)
    return 0
