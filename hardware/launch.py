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

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from simulator.common.machine import machine_memory

from .runtime import HardwareError

__all__ = ["launch_local"]


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


#: Local ranks a gloo run may start per CPU core, and the memory each rank's process
#: takes with torch loaded (about 350 MB RSS measured for a CPU rank of torch 2.x): a
#: run beyond either would crawl or thrash and then time out in its rendezvous.
RANKS_PER_CORE = 4
BYTES_PER_RANK = 400e6


def check_ranks(nproc: int, backend: str) -> None:
    """Refuse a local run this machine cannot hold, with the numbers."""
    if nproc < 1:
        raise HardwareError(f"--nproc: must be at least 1 (got {nproc})")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise HardwareError(
                f"{nproc} ranks on nccl need {nproc} GPUs, and this machine has {gpus}; "
                "shrink the scenario (e.g. --set cluster.nodes=1) or use --backend gloo"
            )
        return
    cores = os.cpu_count() or 1
    memory = machine_memory()
    limit = RANKS_PER_CORE * cores
    if memory is not None:
        limit = min(limit, int(memory / BYTES_PER_RANK))
    if nproc > limit:
        raise HardwareError(
            f"{nproc} ranks are more than this machine runs on gloo ({limit}: {cores} cores, "
            f"{RANKS_PER_CORE} ranks per core at most"
            + (f", {memory / 2**30:.0f} GiB at about 0.4 GB per rank" if memory else "")
            + "); shrink the scenario (e.g. --set cluster.nodes=1 with fewer GPUs per node) "
            "so that tp * cp * pp * dp is at most that"
        )


def launch_local(module: str, args: list[str], nproc: int, backend: str, timeout_s: float) -> None:
    """Run ``python -m module args`` on ``nproc`` local ranks; raise HardwareError on
    failure, KeyboardInterrupt when interrupted (the ranks are stopped first)."""
    check_ranks(nproc, backend)
    # torch's elastic modules give each of their loggers its own level: quiet them all
    # (parasim reports a failure or an interruption in one line of its own)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
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
            elastic_launch(config, sys.executable)("-m", "hardware.rank", module, *args)
        except ChildFailedError as exc:
            raise HardwareError(_failure_message(exc, Path(run_dir))) from None
        except SignalException:
            # the elastic agent has stopped every rank: an interruption, not a failure
            raise KeyboardInterrupt from None


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
