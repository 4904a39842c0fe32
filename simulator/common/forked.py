"""Run a piece of work in a forked child process while this one goes on.

A run's output files are independent once its trace is built: ``trace.json`` and
``report.html`` can each be written by a child process (which sees the trace through
the fork, copied only where written) while the parent draws the timeline, the three
sharing the cores. :func:`start_forked` forks only where that helps and is safe: on a
POSIX system with more than one usable core; elsewhere it runs the work at once, in
this process, so callers need no second path.

The child sends back the work's return value, or the exception it raised, through a
pipe, and leaves with ``os._exit`` (no ``atexit`` handlers, no second flush of the
parent's buffers). :meth:`Forked.result` waits for it and returns or raises as the work
did; an interrupted child (Ctrl-C reaches the whole process group) raises there too.
:func:`wait_all` waits for several, and stops the rest when interrupted.

A child never outlives its parent: killed with SIGKILL, the parent can stop nothing,
so the child asks Linux to kill it as the parent ends (``PR_SET_PDEATHSIG``), and
elsewhere watches its parent from a thread (:func:`end_with_parent`).
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Forked", "end_with_parent", "start_forked", "usable_cores", "wait_all"]

T = TypeVar("T")
K = TypeVar("K")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Forked(Generic[T]):
    """Work started by :func:`start_forked`: in a child process, or already done."""

    def __init__(self, pid: int | None, pipe: int | None, done: tuple[bool, Any]) -> None:
        self._pid, self._pipe, self._done = pid, pipe, done

    def result(self) -> T:
        """Wait for the work and return its value, or raise its exception. Interrupted
        while waiting (Ctrl-C), it stops the child before the interruption goes on, so
        that nothing writes into a folder its caller is about to remove."""
        if self._pid is not None:
            try:
                self._done = self._collect()
            except BaseException:
                self.stop()
                raise
        ok, value = self._done
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Kill the child, if it still runs, and reap it (its work is then lost)."""
        pid, self._pid = self._pid, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it had ended already
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already, by a wait that Ctrl-C cut short
            pass

    def _collect(self) -> tuple[bool, Any]:
        assert self._pid is not None and self._pipe is not None
        chunks = []
        read, self._pipe = self._pipe, None  # the file object below owns it from here
        with os.fdopen(read, "rb") as pipe:
            while chunk := pipe.read(1 << 16):
                chunks.append(chunk)
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001  (nothing, or a torn message: the child died)
            code = os.waitstatus_to_exitcode(status)
            return False, RuntimeError(f"a forked writer ended with status {code}")


#: ``prctl``'s option that names the signal a process gets when its parent ends
#: (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1
#: How often a child checks that its parent is alive where the kernel cannot tell it.
PARENT_CHECK_S = 0.1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` on Linux (looked up once, in the parent), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: a run that never forks does not pay its import

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def end_with_parent(parent: int, by_kernel: bool) -> None:
    """In a child process: end at once when ``parent`` does, whatever kills it. With
    ``by_kernel`` (the thread that started this process lives as long as the parent
    needs it: Linux signals the death of that *thread*, not of the whole parent), the
    kernel sends SIGKILL; otherwise, or where it cannot, a daemon thread looks every
    :data:`PARENT_CHECK_S` seconds. A parent that died before this ran is caught by the
    first look. Also called by each rank of a local launch (:mod:`hardware.rank`)."""
    prctl = _prctl() if by_kernel else None
    if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        if os.getppid() != parent:
            os._exit(128 + signal.SIGKILL)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(128 + signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def start_forked(work: Callable[[], T], fork: bool = True) -> Forked[T]:
    """Start ``work`` in a forked child and return at once; with ``fork`` false, on a
    single core or where the system cannot fork, run it here first. The child ends
    with this process, even one killed by SIGKILL (:func:`end_with_parent`)."""
    if not fork or not hasattr(os, "fork") or usable_cores() < 2:
        try:
            return Forked(None, None, (True, work()))
        except Exception as error:  # noqa: BLE001  (raised again by result())
            return Forked(None, None, (False, error))
    parent, by_kernel = os.getpid(), threading.current_thread() is threading.main_thread()
    if by_kernel:
        _prctl()  # looked up here, so that the child only calls it
    read, write = os.pipe()
    pid = os.fork()
    if pid:  # the parent
        os.close(write)
        return Forked(pid, read, (False, None))
    os.close(read)  # the child: do the work, say how it went, leave
    code = 0
    try:
        end_with_parent(parent, by_kernel)
        try:
            message = pickle.dumps((True, work()))
        except BaseException as error:  # noqa: BLE001  (the parent raises it)
            code = 1
            try:
                message = pickle.dumps((False, error))
            except Exception:  # noqa: BLE001  (an exception that does not pickle)
                message = pickle.dumps((False, RuntimeError(f"{type(error).__name__}: {error}")))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(message)
    finally:
        os._exit(code)


def wait_all(started: list[tuple[K, Forked[T]]]) -> dict[K, T]:
    """The values of several pieces of work, by name, once every one has ended; the
    first failure is raised then (so one failure leaves the others' work done), and an
    interruption while waiting stops the ones not yet waited for at once."""
    values: dict[K, T] = {}
    failure: Exception | None = None
    for i, (name, forked) in enumerate(started):
        try:
            values[name] = forked.result()
        except Exception as error:  # noqa: BLE001  (raised once all have ended)
            failure = failure or error
        except BaseException:
            for _, other in started[i + 1 :]:
                other.stop()
            raise
    if failure is not None:
        raise failure
    return values
