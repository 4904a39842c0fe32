"""``parasim plan``: the whole run, not one step: time to train, GPU-hours, goodput
under failures and checkpoints, cost and energy."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simulator.cli.options import add_fidelity_option, add_set_option, output_folder, write_whole
from simulator.common.folders import folder_argument

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim plan`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "plan",
        help="the whole run: time to train, goodput, cost and energy (the scenario's run:)",
        description=(
            "Simulate one step per phase of the scenario's run: section and plan the whole "
            "run: each phase's steps and tokens per second, its checkpoint (its size and "
            "write time from the layout's sharding; its interval, or Young and Daly's "
            "optimum), its wall-clock time under failures (a seeded Monte Carlo of "
            "interruptions, lost work and restarts), GPU-hours, cost and energy; write "
            "plan.csv, plan.json and plan.html (docs/guide.md, 'The whole run')."
        ),
    )
    parser.add_argument("scenario", help="scenario YAML file with a run: section")
    parser.add_argument(
        "--out", type=folder_argument, help="output folder (default: out/<scenario>-plan)"
    )
    parser.add_argument("--json", action="store_true", help="print plan.json on stdout")
    add_fidelity_option(
        parser, help="simulation fidelity of each phase's step (default analytic: fast, folded)"
    )
    add_set_option(parser, "override a scenario field first, for every phase (repeatable)")
    return parser


def command(args: argparse.Namespace) -> int:
    """Run ``parasim plan``: plan the run, write the outputs, print the summary."""
    from simulator.common.files import dumps_result
    from simulator.report.plan_report import PLAN_FILES, print_plan, write_plan_outputs
    from simulator.report.sweep_report import wide_console
    from simulator.tools.plan import plan_run

    overrides = list(args.overrides)
    if args.fidelity is not None:
        overrides.append(f"simulation.fidelity={args.fidelity}")
    out = output_folder(args, "-plan", PLAN_FILES)
    plan = plan_run(args.scenario, overrides)
    paths = write_whole(
        out, lambda folder: write_plan_outputs(plan, folder), "parasim plan", PLAN_FILES
    )
    if args.json:
        sys.stdout.write(dumps_result(plan.to_json()))
    else:
        print_plan(plan, wide_console(), [str(p) for p in paths])
    return 0
