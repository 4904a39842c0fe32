"""``parasim calibrate``: measure this machine on local processes (torch.distributed)
and write a calibration profile of the model's parameters; needs torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from simulator.cli.launch import add_launch_options, backend, launcher
from simulator.common.errors import ParasimError
from simulator.common.visible import visible

__all__ = ["add_parser", "command"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``parasim calibrate`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine and write a calibration profile (needs torch)",
        description=(
            "Run GEMM, memory and collective microbenchmarks on --nproc local ranks (NCCL "
            "on GPUs, gloo on CPUs) and, with --scenario, time the compute ops (GEMMs, "
            "attention, elementwise) and collective sizes that scenario runs; or, with "
            "--from-trace, read what a real run measured from its PyTorch profiler traces "
            "(one per rank) and start nothing. Fit the model's parameters and write them "
            "as a profile that cluster.profile applies (docs/hardware.md)."
        ),
    )
    parser.add_argument(
        "--from-trace",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="PyTorch profiler traces of a real run (.json or .json.gz, one per rank, or "
        "folders of them, as export_chrome_trace or tensorboard_trace_handler writes "
        "them): calibrate from them instead of running benchmarks",
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

    check_own_file(args.out, "--out", _is_profile, "a parasim calibration profile")
    if args.from_trace:
        return _from_trace(args)
    launch = launcher("calibrating")
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


def _from_trace(args: argparse.Namespace) -> int:
    """Write the profile of the run whose traces ``--from-trace`` names, and say what it
    holds and which kernels it could not classify."""
    from simulator.common.files import write_json
    from simulator.traces.calibration import calibrate_from_traces

    if args.scenario or args.quick:
        flag = "--scenario" if args.scenario else "--quick"
        raise ParasimError(f"{flag}: not with --from-trace (the traces are the measurement)")
    profile, measurements, passed_over = calibrate_from_traces(
        args.from_trace, args.preset, args.peak_flops
    )
    write_json(args.out, profile)
    gpu, trace = profile["gpu"], profile["trace"]
    calls = sum(len(fit["table"]) for scopes in profile["comm"].values() for fit in scopes.values())
    print(
        f"parasim: wrote {args.out} from {len(measurements.ranks)} rank trace"
        f"{'s' if len(measurements.ranks) != 1 else ''}: {len(gpu['op_table'])} measured ops, "
        f"{len(gpu['gemm_table'])} GEMM shapes, matmul efficiency "
        f"{gpu['matmul_efficiency']:.3f} of {gpu['peak_flops']:.4g} FLOP/s, "
        f"{calls} measured call sizes in {sum(len(v) for v in profile['comm'].values())} "
        f"communication fits, jitter {gpu['jitter']:.1%}"
    )
    for entry in trace["unknown"][:UNKNOWN_SHOWN]:
        print(
            f"parasim: unclassified kernel {visible(entry['name'])[:120]}: "
            f"{entry['kernels']} runs, {entry['seconds'] * 1e3:.3f} ms"
        )
    if len(trace["unknown"]) > UNKNOWN_SHOWN:
        print(
            f"parasim: ... and {len(trace['unknown']) - UNKNOWN_SHOWN} more "
            "(the profile's trace.unknown)"
        )
    if passed_over:
        shown = ", ".join(p.name for p in passed_over[:5])
        print(
            f"parasim: passed over {len(passed_over)} file(s) that are not profiler traces: {shown}"
        )
    return 0


#: Unclassified kernels the command names (the profile's ``trace.unknown`` has them all).
UNKNOWN_SHOWN = 10
