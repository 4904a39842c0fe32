"""Fewer garbage collections while parasim builds and walks large object graphs.

A step's schedule, its times and its trace are hundreds of thousands of small objects
that live until the command ends, so walking them finds nothing to free. CPython's
collector, left at its default thresholds, passes over the youngest objects every 700
net allocations and over every live object every hundredth such pass: building the
trace of the 1T-parameter step (197,000 op records on 64 ranks, 3,072 GPUs) and
writing its files spent about a quarter of ``parasim run``'s wall time in it (8.75 s
against 6.51 s for the whole command, 2-core VM; peak memory the same, 358 MB).
Inside :func:`fewer_collections` the youngest objects are collected every 100,000 net
allocations instead: cycles are still found, only later, and the previous thresholds
return on exit. It works as a ``with`` block or as a decorator, and is used around the
work of one step (simulating it, building its trace, writing its files; ``parasim run``
from its first import, where CPython's default pace walked the young objects of the
modules being imported 115 times, 32 ms of a one-configuration run), not around a
whole search: a sweep's pool workers run faster collecting each candidate's leftovers
at the usual pace between candidates (benchmarks/RESULTS.md, the third round of
"What the user waits for"). A search's block holds a whole candidate,
to the point where its schedule and times are dropped: ended while they are still
alive, a block leaves them all to the next collection of the generation its young
collections moved them to (a sixth of a sweep's CPU, measured in the same place).

Returning to the usual pace costs one walk of everything the block made: the young
collections it did let through moved their survivors a generation up, and the next
collection of that generation walks them all (0.26 s after writing the 1T step's
files). In a process that ends when its command returns (the console script, which
says so with :func:`end_with_command`), a block marked ``last`` (writing a run's
files, the last heavy work of a command) keeps the slower pace instead, since the
memory goes back to the system at exit anyway.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["YOUNG_THRESHOLD", "end_with_command", "ends_with_command", "fewer_collections"]

#: Net allocations between two collections of the youngest generation (CPython: 700).
YOUNG_THRESHOLD = 100_000


#: The process that ends when its command returns (:func:`end_with_command`), if any.
_ENDS_WITH_COMMAND: int | None = None


def end_with_command() -> None:
    """Say that this process ends when its command returns: blocks marked ``last``
    then leave the collector at their slower pace. A process forked from this one
    (a pool worker) is not concerned."""
    global _ENDS_WITH_COMMAND
    _ENDS_WITH_COMMAND = os.getpid()


def ends_with_command() -> bool:
    """Whether this process ends when its command returns (:func:`end_with_command`)."""
    return _ENDS_WITH_COMMAND == os.getpid()


@contextmanager
def fewer_collections(young: int = YOUNG_THRESHOLD, last: bool = False) -> Iterator[None]:
    """Collect the youngest generation every ``young`` net allocations, at most as
    often as before, until the block ends; with ``last``, in a process that ends with
    its command (:func:`end_with_command`), until the process ends."""
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= young:  # collection off, or already as rare
        yield
        return
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        if not (last and _ENDS_WITH_COMMAND == os.getpid()):
            gc.set_threshold(*before)
