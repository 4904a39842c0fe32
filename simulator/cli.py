"""The ``parasim`` command line.

``parasim run SCENARIO [--set key.path=value ...] [--out DIR] [--json]`` simulates one
training step, prints a summary, and writes ``result.json``, ``trace.json`` (Chrome /
Perfetto trace events) and ``timeline.html`` (plotly) to DIR. Bad input ends with one
line on stderr naming the field and the numbers, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from topologies import TopologyError

from . import __version__
from .errors import ParasimError
from .outputs import dumps_result, write_atomically, write_json

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
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a scenario field, e.g. --set parallel.tp=4 (repeatable)",
    )
    run.add_argument("--out", type=Path, help="output folder (default: out/<scenario name>)")
    run.add_argument(
        "--json", action="store_true", help="print result.json on stdout instead of the summary"
    )
    return parser


def _command_run(args: argparse.Namespace) -> int:
    from .report import write_chrome_trace, write_timeline_html
    from .run import make_trace, run_scenario, trace_ranks
    from .scenario import load_scenario
    from .summary import print_summary

    scenario = load_scenario(args.scenario, args.overrides)
    run = run_scenario(scenario)
    ranks, note = trace_ranks(run)
    if note:
        run.result["warnings"].append(note)
    out = args.out if args.out is not None else Path("out") / scenario.name
    trace = make_trace(run, ranks)
    write_json(out / "result.json", run.result)
    write_atomically(out / "trace.json", lambda tmp: write_chrome_trace(trace, tmp))
    title = f"{scenario.name}: one training step"
    write_atomically(
        out / "timeline.html", lambda tmp: write_timeline_html(trace, tmp, title=title)
    )
    if args.json:
        sys.stdout.write(dumps_result(run.result))
    else:
        outputs = [str(out / name) for name in ("result.json", "trace.json", "timeline.html")]
        print_summary(run.result, Console(), outputs)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _command_run(args)
    except (ParasimError, TopologyError) as exc:
        print(f"parasim: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
