"""The ``parasim`` console script. It catches Ctrl-C and SIGTERM from its first line,
so an interruption while the command line's modules are still being imported (plotly,
numpy, the model) ends with the same one line and exit status 130 as one during a
command, never a Python traceback. A Ctrl-C that lands inside a callback Python cannot
raise from (a weak reference's callback in the import system, a finaliser) would
otherwise be printed as "Exception ignored" with a traceback and then lost: the
console script's unraisable hook raises it again a moment later instead (a 20 ms
``SIGALRM``, so that it lands outside the callback), where it ends the command like
any other.

When the command is done, every object left is frozen out of the garbage collector
(``gc.freeze``): the interpreter's last collection at exit would walk them all (a
step's schedule, times and trace, and plotly's modules) only for the operating system
to reclaim the memory anyway: seconds after a large run (benchmarks/RESULTS.md, "The
console script leaves what a command made to the system at exit"). Files are closed by
then, and exit handlers still run. For the same reason, writing a run's
files leaves the collector at its slower pace rather than walk, at the block's end,
all that the step made (:func:`simulator.common.collector.end_with_command`).

The console script runs with no pydantic plugins (``PYDANTIC_DISABLE_PLUGINS``, unless
the environment already says which): parasim validates only its own files, a plugin
installed for another application has no business observing them, and finding plugins
reads every installed distribution's entry points (5 ms with 140 packages installed,
about a fiftieth of a one-configuration run)."""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any

__all__ = ["main"]


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# long enough for the hook and the callback that failed to have returned
_REDELIVERY_DELAY_S = 0.02


def _pass_on_interrupts(unraisable: Any) -> None:
    """``sys.unraisablehook``: an interruption raised where it could not propagate is
    raised again by a ``SIGALRM`` once the code that swallowed it has returned (a
    signal handled at once, as ``_thread.interrupt_main`` is, would land in this hook
    itself); anything else is reported as Python would."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        signal.setitimer(signal.ITIMER_REAL, _REDELIVERY_DELAY_S)
        return
    sys.__unraisablehook__(unraisable)


def _stop_redelivery() -> None:
    """After the one line is printed, no interruption still on its way may follow."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGALRM"):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)


def main() -> int:
    """Import the command line and run it (:func:`simulator.cli.main.main`)."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        signal.signal(signal.SIGTERM, _terminate)
        if hasattr(signal, "SIGALRM"):  # POSIX: what the unraisable hook redelivers with
            signal.signal(signal.SIGALRM, _terminate)
            sys.unraisablehook = _pass_on_interrupts
        from simulator.cli.main import main as parasim
        from simulator.common.collector import end_with_command

        end_with_command()
        code = parasim()
        gc.freeze()  # nothing left needs collecting: the process ends here
        return code
    except KeyboardInterrupt:  # before the command's own handling took over
        return _interrupted()
    except RuntimeError as exc:
        # Ctrl-C inside a class body's __set_name__ (a dataclass defined while a module
        # imports) reaches here wrapped: Python raises RuntimeError from it
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        return _interrupted()


def _interrupted() -> int:
    _stop_redelivery()  # one line, however many Ctrl-Cs
    print("parasim: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
