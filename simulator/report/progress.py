"""What a long command shows while it works, on stderr: a rich progress bar for the
searches (``parasim sweep``, ``scale``), in the shape
:class:`simulator.tools.progress.Progress` asks for, and a status line with a spinner
for the single long steps (simulating a large run, writing its files, diagnosing,
the ranks of a replay or a calibration at work). Neither shows when stdout is not a
terminal (piped, redirected) or the command prints JSON (:func:`interactive`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.report.console import open_console

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["ProgressBar", "Status", "interactive"]


def interactive(json_output: bool = False) -> bool:
    """Whether to show progress: stdout is a terminal and the command prints no JSON."""
    return sys.stdout.isatty() and not json_output


def _plain(message: str) -> Text:
    """``message`` as a rich Text, printed as written: a status line's text is rich
    markup otherwise, and a scenario's name or a file's path may hold ``[``. rich is
    imported here, by a status line that shows, not with this module."""
    from rich.text import Text

    return Text(message)


class Status:
    """A status line with a spinner on stderr (:meth:`rich.console.Console.status`),
    whose message :meth:`update` changes; prints nothing when disabled."""

    def __init__(self, message: str, enabled: bool = True, refresh_per_second: float = 12.5):
        self.status = (
            open_console(stderr=True).status(_plain(message), refresh_per_second=refresh_per_second)
            if enabled
            else None
        )

    def __enter__(self) -> Status:
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.status is not None:
            self.status.stop()

    def update(self, message: str) -> None:
        if self.status is not None:
            self.status.update(_plain(message))


class ProgressBar:
    """A rich progress bar on stderr that refreshes only when told (no thread), and
    prints nothing when disabled."""

    def __init__(self, enabled: bool = True):
        # rich's progress module is imported by the searches that draw a bar, not by
        # every command that shows a status line
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=open_console(stderr=True),
            auto_refresh=False,
            transient=True,
            disable=not enabled,
        )

    def __enter__(self) -> ProgressBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def stage(self, description: str, total: int) -> Callable[[int], None]:
        task = self.progress.add_task(description, total=total)
        self.progress.refresh()

        def advance(n: int) -> None:
            self.progress.update(task, advance=n, refresh=True)

        return advance
