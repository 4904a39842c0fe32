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
how. That line goes through :func:`error_line`, so a scenario can never write control
characters to the terminal (retitle it, clear it, turn its text around) nor flood it
with a megabyte value.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from types import ModuleType
from typing import Any, NoReturn

from simulator.cli import (
    calibrate,
    collbench,
    compare,
    explain,
    plan,
    query,
    replay,
    run,
    scale,
    sweep,
)
from simulator.common.collector import ends_with_command
from simulator.common.errors import ParasimError
from simulator.common.version import __version__
from simulator.common.visible import visible
from topologies import TopologyError

__all__ = ["main", "error_line", "LONGEST_ERROR_LINE"]

#: The most characters an error line holds after ``parasim: error: ``: enough for the
#: field, the numbers and the start of a value, short enough for one terminal line or
#: two.
LONGEST_ERROR_LINE = 480
#: The longest run of characters without a space an error line keeps whole: a key path
#: or a quoted value; a longer one (a 1 MB value) is cut in its middle.
LONGEST_RUN = 160

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
    "query": query,
    "plan": plan,
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line like every other bad input (the
    usage is one ``--help`` away), with the user's text quoted as :func:`error_line`
    quotes it."""

    def error(self, message: str) -> NoReturn:
        line = error_line(ValueError(message))
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: with ``command``'s subparser alone where a command is
    named, every command's otherwise (``parasim --help`` lists them all, an unknown
    command is told which there are). Declaring every command's options takes 6 ms,
    about a fiftieth of a one-configuration run, for options the command never reads."""
    parser = _Parser(
        prog="parasim",
        description="Predict how a training job behaves when split across GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"parasim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if command is None or name == command:
            module.add_parser(commands)
    return parser


def _named(argv: list[str]) -> str | None:
    """The command ``argv`` starts with, if it is one (the options of ``parasim``
    itself, ``--help`` and ``--version``, come before a command: then None)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


_RUN = re.compile(rf"\S{{{LONGEST_RUN + 1},}}")


def _cut(text: str, keep: int) -> str:
    """``text`` cut to at most ``keep`` characters: its start and end, and between them
    an ellipsis with the count of characters left out."""
    room = keep - len(f"……[{len(text)} characters left out]")
    head, tail = room * 3 // 4, room // 4
    left = len(text) - head - tail
    return f"{text[:head]}…[{left} characters left out]…{text[len(text) - tail :]}"


def error_line(exc: BaseException) -> str:
    r"""The message of ``exc`` as ``parasim`` prints it after ``parasim: error: ``: one
    line, every control or invisible character quoted (``\x1b``, ``\u202e``), each
    over-long run without a space cut in its middle, and the whole at most
    :data:`LONGEST_ERROR_LINE` characters."""
    text = visible(str(exc))
    text = _RUN.sub(lambda match: _cut(match.group(), LONGEST_RUN), text)
    if len(text) > LONGEST_ERROR_LINE:
        text = _cut(text, LONGEST_ERROR_LINE)
    return text


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C, so staged folders and temporary files are removed."""
    raise KeyboardInterrupt


def _exit_now(code: int) -> NoReturn:
    """End the console script at once. An interruption has unwound the command (its
    staged folders and temporary files are gone); what it built would still take
    seconds to free on the way out (a million ranks' groups, a cluster's graph: SIGTERM
    took over 10 s to end ``explain`` at a million GPUs), while nothing is left to do."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run its command; 2 with one line on stderr for bad input, 130
    with one line when interrupted (Ctrl-C, SIGTERM)."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(_named(argv)).parse_args(argv)
    previous = None
    # SIGTERM unwinds as Ctrl-C does, unless someone (the console script) already said
    # what it does
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    ):
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return COMMANDS[args.command].command(args)
    except (ParasimError, TopologyError) as exc:
        print(f"parasim: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parasim: interrupted", file=sys.stderr)
        if ends_with_command():
            _exit_now(130)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
