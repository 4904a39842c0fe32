"""Errors parasim raises for bad input and for schedules that cannot finish.

Every error a user can cause derives from :class:`ParasimError`. The command line
prints its message as one line and exits with status 2, so messages must name the
field and the numbers involved (``parallel.tp: tp(8) * pp(4) * dp(3) = 96 != world(64)``).
"""

from __future__ import annotations

__all__ = ["ParasimError", "ScenarioError", "DeadlockError"]


class ParasimError(Exception):
    """Base class of every error caused by the user's input."""


class ScenarioError(ParasimError):
    """A scenario, preset or override is malformed or describes an impossible layout."""


class DeadlockError(ParasimError):
    """A schedule cannot finish: some ops wait for events that never happen."""
