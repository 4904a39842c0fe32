"""Command-line options that several ``parasim`` commands share, written once.

``--set`` overrides scenario fields, ``--fidelity`` picks the simulation fidelity,
``--workers`` the processes of a search, ``--batch`` how a search at another size sets
the global batch and ``--force`` runs what the size guard would refuse; each command
passes its own help where the wording differs. :func:`output_folder` and
:func:`write_whole` give every command the same output folder rules
(:mod:`simulator.common.folders`): parasim writes only its own files, and refuses a
folder where a name it writes is the user's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection
from pathlib import Path

from simulator.common.folders import check_folder, default_folder, staged_folder
from simulator.common.vocabulary import BATCH_POLICIES, FIDELITIES

__all__ = [
    "add_set_option",
    "add_fidelity_option",
    "add_workers_option",
    "add_batch_option",
    "add_force_option",
    "add_outputs_option",
    "output_folder",
    "write_whole",
]


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
    parser: argparse.ArgumentParser, default: str | None = "analytic", help: str | None = None
) -> None:
    """``--fidelity analytic|flow``."""
    parser.add_argument(
        "--fidelity",
        choices=list(FIDELITIES),
        default=default,
        help=help or f"simulation fidelity (default {default})",
    )


def add_workers_option(parser: argparse.ArgumentParser) -> None:
    """``--workers N``: processes of a search (default: every core; at most 4 a core
    and 256, :func:`simulator.tools.sweep.resolve_workers`)."""
    parser.add_argument(
        "--workers", type=int, help="processes (default: every core; at most 4 a core, 256)"
    )


def add_batch_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--batch per-gpu|fixed|tokens``: how ``what`` (the GPU counts of a search) sets
    the global batch (:func:`simulator.tools.sweep.scaled_batch`); None when not given,
    which is ``per-gpu``."""
    parser.add_argument(
        "--batch",
        choices=BATCH_POLICIES,
        help=f"the global batch at {what}: per-gpu keeps each GPU's share of the "
        "scenario's, so it grows with the GPUs (default); fixed keeps the scenario's; "
        "tokens keeps each GPU's share to the nearest whole sequence",
    )


def add_force_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--force``: run what the size guard would refuse."""
    parser.add_argument("--force", action="store_true", help=help)


#: What ``--outputs`` can name (:data:`simulator.report.outputs.OUTPUTS`, which the
#: report modules define; repeated here so that building the parser imports no plotly).
OUTPUT_NAMES = ("result", "trace", "timeline", "report")


def parse_outputs(text: str) -> tuple[str, ...]:
    """``result,trace,...``: the outputs named, each known, in the order written."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in OUTPUT_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(OUTPUT_NAMES)} (got {text!r})"
        )
    return tuple(name for name in OUTPUT_NAMES if name in names)


def add_outputs_option(parser: argparse.ArgumentParser) -> None:
    """``--outputs result,trace,timeline,report`` (default all), in ``args.outputs``."""
    parser.add_argument(
        "--outputs",
        type=parse_outputs,
        default=OUTPUT_NAMES,
        metavar="LIST",
        help="the files to write, comma-separated from "
        f"{','.join(OUTPUT_NAMES)} (default all of them)",
    )


def output_folder(args: argparse.Namespace, suffix: str = "", names: Collection[str] = ()) -> Path:
    """``--out``, or the default folder of the scenario's name (``out/<name><suffix>``,
    with a hash of the ``--set`` overrides), checked before any work is done: it can be
    written, and none of ``names`` (what the command writes there) is the user's."""
    if args.out is not None:
        return check_folder(args.out, names=names)
    from simulator.request.scenario import apply_overrides, read_scenario_file

    raw = apply_overrides(read_scenario_file(args.scenario), args.overrides)
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not name:
        name = Path(args.scenario).stem
    return check_folder(default_folder(name, suffix, args.overrides), names=names)


def write_whole(
    out: Path, write: Callable[[Path], list[Path]], command: str, names: Collection[str] = ()
) -> list[Path]:
    """Call ``write(folder)`` on a fresh staging folder whose files then move into
    ``out``, beside whatever else is there (:func:`simulator.common.folders.staged_folder`);
    the paths as written to ``out``."""
    with staged_folder(out, command, names) as stage:
        written = write(stage)
    return [out / path.relative_to(stage) for path in written]
