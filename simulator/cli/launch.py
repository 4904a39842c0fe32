"""What ``parasim calibrate`` and ``parasim replay`` share: the options that start
processes on this machine (``--nproc``, ``--backend``, ``--timeout``), the launcher of
:mod:`hardware.launch` (which needs torch, so it is imported only when a command runs)
and the default backend."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from simulator.common.errors import ParasimError

__all__ = ["add_launch_options", "launcher", "backend"]


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """``--nproc``, ``--backend gloo|nccl`` and ``--timeout``."""
    parser.add_argument("--nproc", type=int, help="processes (ranks) to start on this machine")
    parser.add_argument(
        "--backend", choices=["gloo", "nccl"], help="default: nccl with GPUs, gloo without"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a rank may wait before the run fails (default 120)",
    )


def launcher(doing: str) -> Callable[..., Any]:
    """:func:`hardware.launch.launch_local`, or a one-line error when torch is missing.

    On a terminal (:func:`~simulator.report.progress.interactive`) the launch shows a
    status line, ``<doing> on <n> ranks (<backend>)``, while the ranks work; its
    spinner redraws twice a second, so that it takes next to nothing from the ranks it
    runs beside, whose timing a replay and a calibration measure."""
    try:
        from hardware.launch import launch_local
    except ImportError as exc:
        raise ParasimError(
            f"this command needs torch ({exc}); install it with: pip install 'parasim[hardware]'"
        ) from None
    from simulator.report.progress import Status, interactive

    def launch(module: str, args: list[str], nproc: int, backend: str, timeout_s: float) -> None:
        message = f"{doing} on {nproc} rank{'s' if nproc != 1 else ''} ({backend})"
        with Status(message, interactive(), refresh_per_second=2):
            launch_local(module, args, nproc, backend, timeout_s)

    return launch


def backend(args: argparse.Namespace) -> str:
    """``--backend``, or by default nccl when CUDA is available and gloo otherwise."""
    if args.backend:
        return args.backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
