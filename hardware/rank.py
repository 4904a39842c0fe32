"""The entry point of one rank that ``parasim replay`` or ``parasim calibrate`` starts on
this machine: ``python -m hardware.rank MODULE ARGS...``.

A Ctrl-C reaches the ranks with the command (SIGINT to the whole foreground group), and
the launcher stops them with SIGTERM when another rank failed. A rank stopped while it
imports torch would print a traceback beside parasim's one line, and one stopped by an
exception while gloo's threads run would abort in C++ ("terminate called without an
active exception"). So here SIGINT and SIGTERM end a rank at once and quietly
(``os._exit``, status 128 + signal: its results go to a staging folder the interrupted
command discards). A launcher killed outright (SIGKILL) stops nothing, so each rank
asks the kernel to kill it as its launcher (``PARASIM_LAUNCHER_PID``) ends, the moment
it starts and before it imports torch (:func:`simulator.common.forked.end_with_parent`;
off Linux, a thread looks for the launcher every 0.1 s): a killed command leaves no
rank behind. Then ``MODULE`` runs as ``python -m MODULE`` would.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

from simulator.common.forked import end_with_parent

__all__: list[str] = []


def _stop(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    launcher = os.environ.get("PARASIM_LAUNCHER_PID")
    if launcher:
        # the launcher's thread that started this rank waits in launch_local until every
        # rank has ended, so its death is the launcher's
        end_with_parent(int(launcher), by_kernel=True)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
