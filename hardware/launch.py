"""Launch N local ranks through torch's own elastic launcher (what torchrun uses).

``parasim replay --nproc N`` and ``parasim calibrate --nproc N`` call
:func:`launch_local`, which starts ``python -m <module> <args>`` N times with
torchrun's environment (c10d rendezvous on localhost, no restarts), waits, and turns
a failure into one line naming the ranks: a rank that died (with its signal or exit
code) and what the others reported (from ``$PARASIM_RUN_DIR/rank<r>.error``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import uuid
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .runtime import HardwareError

__all__ = ["launch_local"]


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def launch_local(module: str, args: list[str], nproc: int, backend: str, timeout_s: float) -> None:
    """Run ``python -m module args`` on ``nproc`` local ranks; raise HardwareError on failure."""
    if nproc < 1:
        raise HardwareError(f"--nproc: must be at least 1 (got {nproc})")
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="parasim-run-") as run_dir:
        os.environ.update(
            PARASIM_BACKEND=backend,
            PARASIM_TIMEOUT=str(timeout_s),
            PARASIM_RUN_DIR=run_dir,
            OMP_NUM_THREADS="1",
        )
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=str(uuid.uuid4()),
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",
            max_restarts=0,
            monitor_interval=0.1,
        )
        try:
            elastic_launch(config, sys.executable)("-m", module, *args)
        except ChildFailedError as exc:
            raise HardwareError(_failure_message(exc, Path(run_dir))) from None


def _failure_message(exc: ChildFailedError, run_dir: Path) -> str:
    reports = {
        int(path.stem[4:]): path.read_text().strip() for path in sorted(run_dir.glob("rank*.error"))
    }
    died, stopped = [], []
    for rank, failure in sorted(exc.failures.items()):
        if rank in reports:
            continue
        if failure.exitcode == -signal.SIGTERM:
            stopped.append(rank)  # ended by the launcher once another rank had failed
        else:
            died.append(f"rank {rank} {_describe_exit(failure.exitcode)}")
    parts = died + [reports[rank] for rank in sorted(reports)]
    if stopped:
        names = ", ".join(str(r) for r in stopped)
        verb = "were" if len(stopped) > 1 else "was"
        parts.append(
            f"rank{'s' if len(stopped) > 1 else ''} {names} had not finished and {verb} "
            "stopped by the launcher"
        )
    return "run failed: " + "; ".join(parts) if parts else "run failed"
