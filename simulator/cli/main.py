"""The ``parasim`` command line.

* ``parasim run SCENARIO [--set key.path=value ...] [--out DIR] [--json] [--hta]
  [--image png|svg]`` simulates one training step, prints a summary, and writes
  ``result.json``, ``trace.json`` (Chrome / Perfetto trace events), ``timeline.html``
  and ``report.html`` (plotly) to DIR; ``--hta`` adds per-rank traces for Holistic
  Trace Analysis, ``--image`` the report's charts as images.
* ``parasim sweep SCENARIO`` ranks every valid layout; ``parasim scale SCENARIO --gpus
  8,16,...`` draws scaling curves; ``parasim explain SCENARIO`` finds layering mistakes
  and quantifies each against its fix.
* ``parasim calibrate --nproc N --backend gloo|nccl --out profile.json`` measures this
  machine and fits the model's parameters (needs torch).
* ``parasim replay SCENARIO --nproc N --backend ...`` runs the same step for real.
* ``parasim compare PREDICTED_DIR MEASURED_DIR`` sets the two side by side.

Bad input ends with one line on stderr naming the field and the numbers, and exit
status 2; a failed distributed run says which rank failed and how.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from simulator.cli import explain, scale, sweep
from simulator.cli.options import add_fidelity_option, add_set_option
from simulator.common.errors import ParasimError
from simulator.common.files import dumps_result, write_atomically, write_json
from simulator.common.version import __version__
from simulator.report.images import check_requirements
from simulator.report.outputs import write_run_outputs
from simulator.report.summary import print_summary
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools.collbench import collbench_cluster, collbench_rows, parse_sizes
from simulator.tools.compare import compare_runs, load_run_dir, write_overlay
from topologies import TopologyError
from topologies.units import format_time

COLLBENCH_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "sendrecv",
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parasim",
        description="Predict how a training job behaves when split across GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"parasim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="simulate one training step of a scenario")
    run.add_argument("scenario", help="scenario YAML file")
    add_set_option(run)
    run.add_argument("--out", type=Path, help="output folder (default: out/<scenario name>)")
    run.add_argument(
        "--json", action="store_true", help="print result.json on stdout instead of the summary"
    )
    run.add_argument(
        "--hta",
        action="store_true",
        help="also write hta/, one trace file per rank for Holistic Trace Analysis",
    )
    run.add_argument(
        "--image",
        choices=["png", "svg"],
        help="also write the report's charts as static images (needs kaleido and Chromium; "
        "BROWSER_PATH picks the browser)",
    )
    collbench = commands.add_parser(
        "collbench", help="nccl-tests-style table of one collective, from the model"
    )
    collbench.add_argument("--preset", required=True, help="cluster preset, e.g. dgx-h100")
    collbench.add_argument("--nodes", type=int, default=1)
    collbench.add_argument("--gpus-per-node", type=int, help="override the preset's")
    collbench.add_argument("--op", default="all_reduce", choices=COLLBENCH_OPS)
    collbench.add_argument("--sizes", default="8B-8GiB", help="8B-8GiB (doubling) or a list")
    collbench.add_argument(
        "--algo",
        choices=["ring", "tree", "nvls", "direct", "hierarchical"],
        help="pin NCCL's algorithm",
    )
    collbench.add_argument("--proto", choices=["LL", "LL128", "Simple"], help="pin NCCL's protocol")
    add_fidelity_option(collbench, default="flow")
    collbench.add_argument("--profile", help="calibration profile to apply to the preset")
    collbench.add_argument("--json", action="store_true", help="print the rows as JSON")

    sweep.add_parser(commands)
    scale.add_parser(commands)
    explain.add_parser(commands)

    calibrate = commands.add_parser(
        "calibrate", help="measure this machine and write a calibration profile (needs torch)"
    )
    _launch_options(calibrate)
    calibrate.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    calibrate.add_argument("--quick", action="store_true", help="a short sweep (seconds)")
    calibrate.add_argument(
        "--preset", help="preset whose peak FLOP/s efficiency is measured against"
    )
    calibrate.add_argument("--peak-flops", help="peak FLOP/s of one device, e.g. '989 TFLOP/s'")

    replay = commands.add_parser(
        "replay", help="run a scenario's step for real with torch.distributed and measure it"
    )
    replay.add_argument("scenario", help="scenario YAML file")
    add_set_option(replay)
    _launch_options(replay)
    replay.add_argument("--out", type=Path, help="output folder (default: out/<scenario>-measured)")
    replay.add_argument(
        "--warmup", type=int, default=1, help="warm-up steps (the first checks results)"
    )
    replay.add_argument(
        "--steps", type=int, default=3, help="measured steps (the median is reported)"
    )

    compare = commands.add_parser("compare", help="compare a predicted run with a measured one")
    compare.add_argument("predicted", type=Path, help="folder written by parasim run")
    compare.add_argument("measured", type=Path, help="folder written by parasim replay")
    compare.add_argument("--out", type=Path, help="where compare.json/.html go (default: MEASURED)")
    compare.add_argument("--json", action="store_true", help="print compare.json on stdout")
    return parser


def _launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, help="processes (ranks) to start on this machine")
    parser.add_argument(
        "--backend", choices=["gloo", "nccl"], help="default: nccl with GPUs, gloo without"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds a rank may wait before the run fails"
    )


def _launcher():
    try:
        from hardware.launch import launch_local
    except ImportError as exc:
        raise ParasimError(
            f"this command needs torch ({exc}); install it with: pip install 'parasim[hardware]'"
        ) from None
    return launch_local


def _backend(args: argparse.Namespace) -> str:
    if args.backend:
        return args.backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _command_calibrate(args: argparse.Namespace) -> int:
    launch = _launcher()
    forwarded = ["--out", str(args.out.resolve())]
    if args.quick:
        forwarded.append("--quick")
    if args.preset:
        forwarded += ["--preset", args.preset]
    if args.peak_flops:
        forwarded += ["--peak-flops", args.peak_flops]
    launch("hardware.calibrate", forwarded, args.nproc or 1, _backend(args), args.timeout)
    return 0


def _command_replay(args: argparse.Namespace) -> int:

    scenario = load_scenario(args.scenario, args.overrides)  # bad input fails here, at once
    world = scenario.layout.world
    if args.nproc is not None and args.nproc != world:
        raise ParasimError(
            f"--nproc: scenario {scenario.name} needs {world} ranks "
            f"({scenario.layout.describe()}), not {args.nproc}"
        )
    launch = _launcher()
    out = args.out if args.out is not None else Path("out") / f"{scenario.name}-measured"
    forwarded = [str(Path(args.scenario).resolve()), "--out", str(out.resolve())]
    forwarded += [f"--set={o}" for o in args.overrides]
    forwarded += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    launch("hardware.replay", forwarded, world, _backend(args), args.timeout)
    return 0


def _command_compare(args: argparse.Namespace) -> int:
    from rich.table import Table

    predicted, measured = load_run_dir(args.predicted), load_run_dir(args.measured)
    report = compare_runs(predicted, measured)
    out = args.out if args.out is not None else args.measured
    write_json(out / "compare.json", report)
    write_atomically(
        out / "compare.html", lambda tmp: write_overlay(predicted[1], measured[1], tmp)
    )
    if args.json:
        sys.stdout.write(dumps_result(report))
        return 0
    console = Console()

    def pct(error: float | None) -> str:
        return "-" if error is None else f"{100 * error:+.1f}%"

    step = report["step_time"]
    console.print(
        f"step time: predicted {format_time(step['predicted_s'])}, measured "
        f"{format_time(step['measured_s'])}, error {pct(step['error'])}"
    )
    table = Table(title="time per rank by op class (ranks in both runs)", title_justify="left")
    for column in ("op class", "predicted", "measured", "error"):
        table.add_column(column, justify="left" if column == "op class" else "right")
    for row in report["op_classes"]:
        table.add_row(
            row["class"],
            format_time(row["predicted_s"]),
            format_time(row["measured_s"]),
            pct(row["error"]),
        )
    console.print(table)
    console.print(f"wrote {out / 'compare.json'}, {out / 'compare.html'}")
    return 0


def _command_collbench(args: argparse.Namespace) -> int:
    import json

    cluster = collbench_cluster(args.preset, args.nodes, args.gpus_per_node, args.profile)
    sizes = parse_sizes(args.sizes)
    rows = collbench_rows(cluster, args.op, sizes, args.algo, args.proto, args.fidelity)
    if args.json:
        keys = ("bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol")
        sys.stdout.write(json.dumps([{k: row[k] for k in keys} for row in rows], indent=2) + "\n")
        return 0
    out = sys.stdout
    out.write(
        f"# parasim collbench: {args.op} on {cluster.num_gpus} GPUs "
        f"({cluster.num_nodes} x {cluster.spec.name}), {args.fidelity} fidelity\n"
    )
    out.write(
        f"#{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>7} "
        f"{'busbw':>7}  algorithm/protocol\n"
    )
    out.write(
        f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'(us)':>10} "
        f"{'(GB/s)':>7} {'(GB/s)':>7}\n"
    )
    for row in rows:
        out.write(
            f" {row['bytes']:>12.0f} {row['count']:>12} {row['type']:>6} {row['redop']:>6} "
            f"{row['time_s'] * 1e6:>10.2f} {row['algbw_GBps']:>7.2f} {row['busbw_GBps']:>7.2f}  "
            f"{row['algorithm']}/{row['protocol']}\n"
        )
    average = sum(row["busbw_GBps"] for row in rows) / len(rows)
    out.write(f"# Avg bus bandwidth    : {average:.3f}\n")
    return 0


def _command_run(args: argparse.Namespace) -> int:

    if args.image:
        check_requirements()  # before the simulation, not after it
    scenario = load_scenario(args.scenario, args.overrides)
    run = run_scenario(scenario)
    out = args.out if args.out is not None else Path("out") / scenario.name
    paths = write_run_outputs(
        run,
        out,
        title=f"{scenario.name}: one training step",
        image_format=args.image,
        hta=args.hta,
    )
    if args.json:
        sys.stdout.write(dumps_result(run.result))
    else:
        print_summary(run.result, Console(), [str(p) for p in paths])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        handler = {
            "run": _command_run,
            "collbench": _command_collbench,
            "sweep": sweep.command,
            "scale": scale.command,
            "explain": explain.command,
            "calibrate": _command_calibrate,
            "replay": _command_replay,
            "compare": _command_compare,
        }[args.command]
        return handler(args)
    except (ParasimError, TopologyError) as exc:
        print(f"parasim: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
