"""The entry point of one rank that ``parasim replay`` or ``parasim calibrate`` starts on
this machine: ``python -m hardware.rank MODULE ARGS...``.

A Ctrl-C reaches the ranks with the command (SIGINT to the whole foreground group), and
the launcher stops them with SIGTERM when another rank failed. A rank stopped while it
imports torch would print a traceback beside parasim's one line, and one stopped by an
exception while gloo's threads run would abort in C++ ("terminate called without an
active exception"). So here SIGINT and SIGTERM end a rank at once and quietly
(``os._exit``, status 128 + signal: its results go to a staging folder the interrupted
command discards). A thread ends the rank the same way within half a second of its
launcher's death (``PARASIM_LAUNCHER_PID`` is no longer its parent), so a killed
command leaves no rank behind. Then ``MODULE`` runs as ``python -m MODULE`` would.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from typing import Any

__all__: list[str] = []


#: How often a rank checks that its launcher is alive.
LAUNCHER_CHECK_S = 0.5


def _stop(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


def _watch_launcher(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(LAUNCHER_CHECK_S)
    os._exit(128 + signal.SIGHUP)  # orphaned: the command that started this rank is gone


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    launcher = os.environ.get("PARASIM_LAUNCHER_PID")
    if launcher:
        threading.Thread(target=_watch_launcher, args=(int(launcher),), daemon=True).start()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
