"""A rich progress bar on stderr for the long commands (``parasim sweep``, ``scale``),
in the shape :class:`simulator.tools.progress.Progress` asks for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["ProgressBar"]


class ProgressBar:
    """A rich progress bar on stderr that refreshes only when told (no thread), and
    prints nothing when disabled."""

    def __init__(self, enabled: bool = True):
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
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
