"""The rich console that every command prints its summary, tables and progress through,
and whether a stream is a terminal that rich would draw on.

Every console parasim opens is made here, so that what a user wrote (a scenario's
name, a file's path, a kernel's name) prints as written: a default rich console turns
text such as ``:fire:`` into an emoji, and reads its table of emoji codes at its first
print to do so. rich itself is imported when a console is first opened, not with this
module: a run whose summary goes to a pipe never opens one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["open_console", "is_terminal"]


def is_terminal(stream: TextIO) -> bool:
    """Whether rich would treat ``stream`` as a terminal: ``TTY_COMPATIBLE=0`` or ``1``
    says so where set, then a set ``FORCE_COLOR`` (yes unless empty), else the stream's
    own ``isatty`` (https://force-color.org/; rich's ``Console.is_terminal``)."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a stream closed already
        return False


def open_console(stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or ``stderr``), ``width`` columns wide where given (else the
    terminal's), that replaces no ``:emoji:`` codes. Where it shows no colours (piped,
    redirected, ``NO_COLOR``) it highlights nothing either: the highlighter's patterns
    would compile at its first print (4 ms) for colours nobody sees."""
    from rich.console import Console

    console = Console(stderr=stderr, width=width, emoji=False)
    if console.color_system is None:
        console = Console(stderr=stderr, width=width, emoji=False, highlight=False)
    return console
