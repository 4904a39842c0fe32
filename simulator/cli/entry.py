"""The ``parasim`` console script. It catches Ctrl-C and SIGTERM from its first line,
so an interruption while the command line's modules are still being imported (plotly,
numpy, the model) ends with the same one line and exit status 130 as one during a
command, never a Python traceback."""

from __future__ import annotations

import signal
import sys
from typing import Any

__all__ = ["main"]


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    """Import the command line and run it (:func:`simulator.cli.main.main`)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        from simulator.cli.main import main as parasim

        return parasim()
    except KeyboardInterrupt:  # before the command's own handling took over
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one line, however many Ctrl-Cs
        print("parasim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
