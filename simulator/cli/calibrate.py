"""``parasim calibrate``: measure this machine on local processes (torch.distributed)
and write a calibration profile of the model's parameters; needs torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from simulator.cli.launch import add_launch_options, backend, launcher

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim calibrate`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine and write a calibration profile (needs torch)",
        description=(
            "Run GEMM, memory and collective microbenchmarks on --nproc local ranks (NCCL "
            "on GPUs, gloo on CPUs) and, with --scenario, time the compute ops (GEMMs, "
            "attention, elementwise) and collective sizes that scenario runs; fit the "
            "model's parameters and write them as a profile that cluster.profile applies "
            "(docs/hardware.md)."
        ),
    )
    add_launch_options(parser)
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--quick", action="store_true", help="a short sweep (seconds)")
    parser.add_argument("--preset", help="preset whose peak FLOP/s efficiency is measured against")
    parser.add_argument("--peak-flops", help="peak FLOP/s of one device, e.g. '989 TFLOP/s'")
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        type=Path,
        help="also time every compute op and collective size this scenario runs, in "
        "program order, for the simulator to read back (repeatable; see docs/hardware.md)",
    )
    return parser


def _is_profile(path: Path) -> bool:
    """Whether ``path`` holds a calibration profile (which calibrate may write anew)."""
    from topologies.config_text import read_json
    from topologies.files import read_config_text
    from topologies.profile import PROFILE_FORMAT

    try:
        payload = read_json(read_config_text(path))
    except ValueError:  # not readable, not JSON, or past the bounds
        return False
    return isinstance(payload, dict) and payload.get("format") == PROFILE_FORMAT


def command(args: argparse.Namespace) -> int:
    """Run ``parasim calibrate``: start :mod:`hardware.calibrate` on ``--nproc`` ranks."""
    from simulator.common.folders import check_own_file
    from simulator.request.scenario import load_scenario

    launch = launcher("calibrating")
    check_own_file(args.out, "--out", _is_profile, "a parasim calibration profile")
    forwarded = ["--out", str(args.out.resolve())]
    if args.quick:
        forwarded.append("--quick")
    if args.preset:
        forwarded += ["--preset", args.preset]
    if args.peak_flops:
        forwarded += ["--peak-flops", args.peak_flops]
    for scenario in args.scenario:
        load_scenario(scenario)  # bad input fails here, before any rank starts
        forwarded += ["--scenario", str(scenario.resolve())]
    nproc = 1 if args.nproc is None else args.nproc
    launch("hardware.calibrate", forwarded, nproc, backend(args), args.timeout)
    return 0
