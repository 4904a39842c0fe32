"""The rich console that every command prints its summary, tables and progress through.

Every console parasim opens is made here, so that what a user wrote (a scenario's
name, a file's path, a kernel's name) prints as written: a default rich console turns
text such as ``:fire:`` into an emoji, and reads its table of emoji codes at its first
print to do so."""

from __future__ import annotations

from rich.console import Console

__all__ = ["open_console"]


def open_console(stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or ``stderr``), ``width`` columns wide where given (else the
    terminal's), that replaces no ``:emoji:`` codes. Where it shows no colours (piped,
    redirected, ``NO_COLOR``) it highlights nothing either: the highlighter's patterns
    would compile at its first print (4 ms) for colours nobody sees."""
    console = Console(stderr=stderr, width=width, emoji=False)
    if console.color_system is None:
        console = Console(stderr=stderr, width=width, emoji=False, highlight=False)
    return console
