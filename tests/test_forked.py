"""``start_forked``: work in a forked child, its value or its exception returned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from simulator.common.forked import start_forked, usable_cores, wait_all

from .conftest import ROOT


def _pid() -> int:
    return os.getpid()


@pytest.mark.skipif(not hasattr(os, "fork") or usable_cores() < 2, reason="needs fork, 2 cores")
def test_forked_work_runs_in_a_child_and_returns_its_value():
    assert start_forked(_pid).result() != os.getpid()
    assert start_forked(lambda: {"answer": [42]}).result() == {"answer": [42]}


def test_unforked_work_runs_here():
    assert start_forked(_pid, fork=False).result() == os.getpid()


@pytest.mark.parametrize("fork", [True, False])
def test_the_work_s_exception_is_raised_by_result(fork):
    def fails():
        raise ValueError("bad field: x = 3")

    handle = start_forked(fails, fork=fork)
    with pytest.raises(ValueError, match="bad field: x = 3"):
        handle.result()


def test_an_exception_that_does_not_pickle_still_says_what_it_was():
    class Local(Exception):  # a local class: pickle cannot find it by name
        pass

    def fails():
        raise Local("lost in transit")

    with pytest.raises(Exception, match="lost in transit"):
        start_forked(fails).result()


def test_a_child_that_dies_is_reported():
    def dies():
        os._exit(3)

    if not hasattr(os, "fork") or usable_cores() < 2:
        pytest.skip("needs fork, 2 cores")
    with pytest.raises(RuntimeError, match="status 3"):
        start_forked(dies).result()


def _started_writer(folder: Path, name: str):
    """Work that says it started (its pid in ``folder/<name>.pid``), then would write
    ``folder/<name>`` after a million seconds: only a stopped child never does."""

    def write() -> None:
        (folder / f"{name}.tmp").write_text(str(os.getpid()))
        os.replace(folder / f"{name}.tmp", folder / f"{name}.pid")
        time.sleep(10**6)
        (folder / name).write_text("written after the parent gave up")

    return write


def _pid_when_started(folder: Path, name: str) -> int:
    path = folder / f"{name}.pid"
    while not path.exists():
        time.sleep(0.01)
    return int(path.read_text())


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _interrupted_after(seconds: float, wait: Callable[[], object]) -> None:
    """Call ``wait`` and interrupt it, as Ctrl-C would, after ``seconds``; it must raise
    KeyboardInterrupt."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        with pytest.raises(KeyboardInterrupt):
            wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_interrupted_wait_stops_the_child_before_the_interruption_goes_on(tmp_path):
    """Ctrl-C while the parent waits: the child is stopped (killed and reaped) before
    the interruption reaches the caller, so it writes nothing into a folder the
    parent's cleanup is about to remove (it would make the folder again)."""
    if not hasattr(os, "fork") or usable_cores() < 2:
        pytest.skip("no second core to fork onto")
    forked = start_forked(_started_writer(tmp_path, "late"))
    child = _pid_when_started(tmp_path, "late")
    try:
        _interrupted_after(0.1, forked.result)
        assert _gone(child)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_stopping_a_child_that_an_interrupted_wait_already_reaped_is_quiet():
    """Ctrl-C can land just after ``waitpid`` reaped the child and before it returned:
    the status is lost, and stopping the child then must not turn the interruption
    into an OSError ("No child processes") that reads as an unwritable folder."""
    if not hasattr(os, "fork") or usable_cores() < 2:
        pytest.skip("no second core to fork onto")
    forked = start_forked(lambda: 1)
    os.waitpid(forked._pid, 0)  # reaped behind its back, as the cut-short wait did
    forked.stop()  # raised ChildProcessError before
    forked.stop()  # and stays quiet once stopped


def test_an_interrupted_wait_for_several_writers_stops_every_one(tmp_path):
    """The run's files aside are written by a process each: Ctrl-C while the first is
    waited for stops the others too, before the interruption goes on."""
    if not hasattr(os, "fork") or usable_cores() < 2:
        pytest.skip("no second core to fork onto")
    asides = [(name, start_forked(_started_writer(tmp_path, name))) for name in ("a", "b")]
    children = [_pid_when_started(tmp_path, name) for name in ("a", "b")]
    try:
        _interrupted_after(0.1, lambda: wait_all(asides))
        assert all(_gone(child) for child in children)
    finally:
        for child in children:
            if not _gone(child):
                os.kill(child, signal.SIGKILL)


def test_every_writer_aside_is_waited_for_and_the_first_failure_raised(tmp_path):
    def fails():
        raise OSError("disk full")

    def writes():
        time.sleep(0.3)
        path = tmp_path / "b.txt"
        path.write_text("b")
        return path

    with pytest.raises(OSError, match="disk full"):
        wait_all([("a", start_forked(fails)), ("b", start_forked(writes))])
    assert (tmp_path / "b.txt").read_text() == "b"  # the other finished first
    assert wait_all([("b", start_forked(writes))]) == {"b": tmp_path / "b.txt"}


#: A parent process for the tests below: it starts a child that writes its pid to
#: argv[1] and then works for good, from the main thread or from a thread of its own,
#: and waits for the child's result.
PARENT = """
import os, sys, threading, time
from simulator.common.forked import start_forked

def work():
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(10**6)

def start_and_wait():
    start_forked(work).result()

if sys.argv[2] == "main":
    start_and_wait()
else:
    threading.Thread(target=start_and_wait).start()
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/stat").exists() or usable_cores() < 2, reason="needs /proc, 2 cores"
)
@pytest.mark.parametrize("forked_from", ["main", "thread"])
def test_a_child_ends_when_its_parent_is_killed_with_sigkill(tmp_path, forked_from):
    """SIGKILL gives the parent no chance to stop its child: the child ends by itself
    (the kernel kills it, or its watch of the parent sees it gone), long before the
    work it was given (a million seconds) would have ended."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pid_file), forked_from], cwd=ROOT)
    try:
        while not pid_file.exists():
            assert parent.poll() is None, "the parent ended before its child started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    # a generous bound: the child would work for good; ending takes a kernel signal or
    # one look of its watch, 0.1 s apart
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the forked child outlived its parent"


def test_a_child_forked_from_a_thread_outlives_that_thread(tmp_path):
    """Linux's parent-death signal follows the forking *thread*: a child forked from a
    thread that ends while the process goes on must keep working."""
    if not hasattr(os, "fork") or usable_cores() < 2:
        pytest.skip("no second core to fork onto")

    def work() -> str:
        time.sleep(0.5)  # the thread that forked has ended by then
        return "done"

    started = []
    thread = threading.Thread(target=lambda: started.append(start_forked(work)))
    thread.start()
    thread.join()
    assert started[0].result() == "done"
