"""How a long tool run reports progress, without drawing anything itself.

A search (sweep, scale) announces each stage with its number of steps and advances it
as work completes. It is handed an object with that shape (:class:`Progress`): the
command line passes a rich progress bar from :mod:`simulator.report.progress`, Python
callers pass nothing and get :class:`Silent`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Progress", "Silent"]


class Progress(Protocol):
    """A context manager whose :meth:`stage` starts a stage of ``total`` steps and returns
    the function that advances it by ``n``."""

    def __enter__(self) -> Progress: ...

    def __exit__(self, *exc: Any) -> None: ...

    def stage(self, description: str, total: int) -> Callable[[int], None]: ...


class Silent:
    """Progress that shows nothing."""

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def stage(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None
