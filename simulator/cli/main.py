"""The ``parasim`` command line: the top-level parser, the dispatch and the errors.

* ``parasim run SCENARIO [--set key.path=value ...] [--out DIR] [--json] [--hta]
  [--image png|svg]`` simulates one training step, prints a summary, and writes
  ``result.json``, ``trace.json`` (Chrome / Perfetto trace events), ``timeline.html``
  and ``report.html`` (plotly) to DIR; ``--hta`` adds per-rank traces for Holistic
  Trace Analysis, ``--image`` the report's charts as images.
* ``parasim collbench --preset P`` prints an nccl-tests-style table of one collective.
* ``parasim sweep SCENARIO`` ranks every valid layout; ``parasim scale SCENARIO --gpus
  8,16,...`` draws scaling curves; ``parasim explain SCENARIO`` finds layering mistakes
  and quantifies each against its fix.
* ``parasim calibrate --nproc N --backend gloo|nccl --out profile.json`` measures this
  machine and fits the model's parameters (needs torch).
* ``parasim replay SCENARIO --nproc N --backend ...`` runs the same step for real.
* ``parasim compare PREDICTED_DIR MEASURED_DIR`` sets the two side by side.

Each command is a module of this package with ``add_parser(subparsers)`` and
``command(args) -> int``. Bad input ends with one line on stderr naming the field and
the numbers, and exit status 2; a failed distributed run says which rank failed and
how.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import ModuleType
from typing import Any

from simulator.cli import calibrate, collbench, compare, explain, replay, run, scale, sweep
from simulator.common.errors import ParasimError
from simulator.common.version import __version__
from topologies import TopologyError

__all__ = ["main"]

# each command's module, in the order ``parasim --help`` lists them
COMMANDS: dict[str, ModuleType] = {
    "run": run,
    "collbench": collbench,
    "sweep": sweep,
    "scale": scale,
    "explain": explain,
    "calibrate": calibrate,
    "replay": replay,
    "compare": compare,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parasim",
        description="Predict how a training job behaves when split across GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"parasim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C, so staged folders and temporary files are removed."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run its command; 2 with one line on stderr for bad input, 130
    with one line when interrupted (Ctrl-C, SIGTERM)."""
    args = _parser().parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return COMMANDS[args.command].command(args)
    except (ParasimError, TopologyError) as exc:
        print(f"parasim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parasim: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
