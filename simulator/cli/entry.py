"""The ``parasim`` console script. It catches Ctrl-C and SIGTERM from its first line,
so an interruption while the command line's modules are still being imported (plotly,
numpy, the model) ends with the same one line and exit status 130 as one during a
command, never a Python traceback. A Ctrl-C that lands inside a callback Python cannot
raise from (a weak reference's callback in the import system, a finaliser) would
otherwise be printed as "Exception ignored" with a traceback and then lost: the
console script's unraisable hook raises it again a moment later instead (a 20 ms
``SIGALRM``, so that it lands outside the callback), where it ends the command like
any other. A read or write the system refuses that nothing caught before (stdout on a
full disk) is one line and exit status 1, never a traceback either.

When the command is done, every object left is frozen out of the garbage collector
(``gc.freeze``): the interpreter's last collection at exit would walk them all (a
step's schedule, times and trace, and plotly's modules) only for the operating system
to reclaim the memory anyway: seconds after a large run (benchmarks/RESULTS.md, "The
console script leaves what a command made to the system at exit"). For the same
reason the process then ends without tearing the interpreter down (freeing every
module and object one by one: 16 ms after a one-configuration run of 131,072 GPUs,
0.1 s after a flow run that wrote every output): its exit handlers run, the standard
streams are flushed and ``os._exit`` ends it, unless a thread other than the main one
still runs, which Python's own exit then waits for. Files are closed by then. For the
same reason, writing a run's files leaves the collector at its slower pace rather than
walk, at the block's end, all that the step made
(:func:`simulator.common.collector.end_with_command`).

The console script runs with no pydantic plugins (``PYDANTIC_DISABLE_PLUGINS``, unless
the environment already says which): parasim validates only its own files, a plugin
installed for another application has no business observing them, and finding plugins
reads every installed distribution's entry points (5 ms with 140 packages installed,
about a fiftieth of a one-configuration run)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["main"]


#: Whether an interruption (SIGINT, SIGTERM) has reached this process.
_INTERRUPTED = False


def _interrupt(signum: int, frame: Any) -> None:
    """Every interruption unwinds as Ctrl-C does, and is remembered: an extension that
    catches it deep inside (pydantic-core building a schema) may raise its own error in
    its place, which then ends the command as the interruption it was."""
    global _INTERRUPTED
    _INTERRUPTED = True
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
    try:
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        if hasattr(signal, "SIGALRM"):  # POSIX: what the unraisable hook redelivers with
            signal.signal(signal.SIGALRM, _interrupt)
            sys.unraisablehook = _pass_on_interrupts
        from simulator.cli.main import main as parasim
        from simulator.common.collector import end_with_command

        end_with_command()
        code = parasim()
        gc.freeze()  # nothing left needs collecting: the process ends here
        _end_process(code)
        return code  # another thread still runs: Python's exit waits for it
    except KeyboardInterrupt:  # before the command's own handling took over
        return _interrupted()
    except OSError as exc:  # the system refused a write nothing caught: a full disk
        return _interrupted() if _INTERRUPTED else _refused_by_system(exc)
    except Exception:
        # an interruption that something caught and raised again as its own error (Ctrl-C
        # inside a class body's __set_name__ becomes a RuntimeError, inside pydantic-core
        # building a serializer a SchemaError) ends the command as the interruption
        if not _INTERRUPTED:
            raise
        return _interrupted()


def _end_process(code: int) -> None:
    """End the process with ``code`` once its exit handlers have run and the standard
    streams are flushed, without tearing the interpreter down (a Ctrl-C from then on
    changes nothing); return where a thread other than the main one still runs."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        return
    _stop_redelivery()  # the command is done: an interruption has nothing left to stop
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader has gone: nothing more to tell it
            pass
        except (OSError, ValueError):  # a full disk, a closed stream: Python's exit says so
            return
    os._exit(code)


def _refused_by_system(exc: OSError) -> int:
    """One line and exit status 1 for a read or write the system refused that nothing
    caught before (stdout on a full disk, a closed pipe), never a traceback; what stdout
    still holds is let go (the last flush would fail again)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if not isinstance(exc, BrokenPipeError):  # a reader that left wants nothing more
        where = f": {exc.filename}" if exc.filename else ""
        with contextlib.suppress(OSError, ValueError):
            print(f"parasim: error: {exc.strerror or exc}{where}", file=sys.stderr)
    return 1


def _interrupted() -> int:
    _stop_redelivery()  # one line, however many Ctrl-Cs
    print("parasim: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
