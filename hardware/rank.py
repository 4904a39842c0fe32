"""The entry point of one rank that ``parasim replay`` or ``parasim calibrate`` starts on
this machine: ``python -m hardware.rank MODULE ARGS...``.

When the command is interrupted, its elastic agent stops the ranks with the signal it
received (SIGINT for a Ctrl-C). A rank stopped while it imports torch would print a
traceback beside parasim's one line, and one stopped by an exception while gloo's
threads run would abort in C++ ("terminate called without an active exception"). So
here SIGINT and SIGTERM end a rank at once and quietly (``os._exit``, status 128 +
signal: its results go to a staging folder the interrupted command discards), and then
``MODULE`` runs as ``python -m MODULE`` would.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

__all__: list[str] = []


def _stop(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
