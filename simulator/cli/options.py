"""Command-line options that several ``parasim`` commands share, written once.

``--set`` overrides scenario fields, ``--fidelity`` picks the simulation fidelity and
``--workers`` the processes of a search; each command passes its own help where the
wording differs.
"""

from __future__ import annotations

import argparse

from simulator.common.vocabulary import FIDELITIES

__all__ = ["add_set_option", "add_fidelity_option", "add_workers_option"]


def add_set_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--set KEY.PATH=VALUE`` (repeatable), collected in ``args.overrides``."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help=help or "override a scenario field, e.g. --set parallel.tp=4 (repeatable)",
    )


def add_fidelity_option(
    parser: argparse.ArgumentParser, default: str = "analytic", help: str | None = None
) -> None:
    """``--fidelity analytic|flow``."""
    parser.add_argument(
        "--fidelity",
        choices=list(FIDELITIES),
        default=default,
        help=help or f"simulation fidelity (default {default})",
    )


def add_workers_option(parser: argparse.ArgumentParser) -> None:
    """``--workers N``: processes of a search (default: every core)."""
    parser.add_argument("--workers", type=int, help="processes (default: every core)")
