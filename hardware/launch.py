"""Launch N local ranks on this machine, reachable only through its loopback interface.

``parasim replay --nproc N`` and ``parasim calibrate --nproc N`` call
:func:`launch_local`, which starts ``python -m hardware.rank <module> <args>`` N times
with torchrun's environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``), waits, and turns a failure into one line naming the ranks: a
rank that died (with its signal or exit code), what the others reported (from
``$PARASIM_RUN_DIR/rank<r>.error``), and the ranks the launcher then stopped.

Nothing listens on the network. The ranks meet through a file store in a private
temporary folder (``PARASIM_STORE``, a :class:`torch.distributed.FileStore`), not a TCP
store (torch's binds every interface), and gloo and NCCL open their connections on the
loopback interface (``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``). Each rank
is killed by the kernel as its launcher dies (:mod:`hardware.rank`). The temporary
folder is named after the launcher's process id: one left by a launcher killed with
SIGKILL is removed by the next launch (:func:`remove_stale_run_dirs`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulator.common.machine import machine_memory

from .runtime import HardwareError, machine_cores

__all__ = ["launch_local", "loopback_interface", "rank_cpus", "remove_stale_run_dirs"]

#: How long the launcher waits, after a rank fails, for the others to report before it
#: stops them: a rank that stopped responding is found by its own watchdog about when
#: its peers time out waiting for it, and its report says so.
REPORT_GRACE_S = 3.0
#: How long a rank may take to end after SIGTERM before it is killed.
STOP_GRACE_S = 5.0
#: How often the launcher looks at its ranks.
POLL_S = 0.05


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on
    macOS), or None when it has none by that name."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


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


#: The start of a run folder's name in the temporary directory; the launcher's process
#: id and a dash follow.
RUN_DIR_PREFIX = "parasim-run-"


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie, ended but not yet
    reaped by its parent, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc: os.kill's answer stands
        return True


def remove_stale_run_dirs(temp_dir: str | None = None) -> list[Path]:
    """Remove the run folders (this user's, in ``temp_dir``, by default the temporary
    directory) whose launcher has ended: a launcher killed with SIGKILL cannot remove
    its own. Folders of live launchers, and any other name, are left alone. Returns the
    folders removed."""
    removed = []
    for folder in Path(temp_dir or tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = folder.name[len(RUN_DIR_PREFIX) :].split("-", 1)[0]
        try:
            info = folder.lstat()
        except OSError:  # removed meanwhile, by another launcher
            continue
        owned = info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode)  # not a link
        if not pid.isdigit() or not owned or _process_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def launch_local(module: str, args: list[str], nproc: int, backend: str, timeout_s: float) -> None:
    """Run ``python -m module args`` on ``nproc`` local ranks; raise HardwareError on
    failure, KeyboardInterrupt when interrupted (the ranks are stopped first)."""
    check_ranks(nproc, backend)
    remove_stale_run_dirs()
    prefix = f"{RUN_DIR_PREFIX}{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix) as run_dir:
        env = dict(
            os.environ,
            PARASIM_BACKEND=backend,
            PARASIM_TIMEOUT=str(timeout_s),
            PARASIM_RUN_DIR=run_dir,
            PARASIM_STORE=str(Path(run_dir) / "store"),
            PARASIM_LAUNCHER_PID=str(os.getpid()),
            OMP_NUM_THREADS="1",
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
        )
        env.pop("MASTER_PORT", None)
        loopback = loopback_interface()
        if loopback is not None:
            env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
        try:
            env["PARASIM_LOAD_1M"] = f"{os.getloadavg()[0]:.3f}"  # before the ranks add theirs
        except OSError:
            pass
        runnable = other_runnable()
        if runnable is not None:
            env["PARASIM_RUNNABLE"] = f"{runnable:.2f}"
        cpus = rank_cpus(nproc)
        env["PARASIM_CORES"] = str(machine_cores())  # before pinning narrows the ranks' view
        command = [sys.executable, "-m", "hardware.rank", module, *args]
        ranks: list[subprocess.Popen] = []
        try:
            for rank in range(nproc):
                own = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
                if cpus:
                    own["PARASIM_CPUS"] = ",".join(map(str, cpus[rank]))
                ranks.append(subprocess.Popen(command, env=own))
            stopped = _wait(ranks)
        finally:
            _stop([proc for proc in ranks if proc.poll() is None])
        if any(proc.returncode != 0 for proc in ranks):
            raise HardwareError(_failure_message(ranks, stopped, Path(run_dir)))


def other_runnable(samples: int = 10, interval_s: float = 0.02) -> float | None:
    """Processes that want a core right now besides this one: the mean of ``samples``
    readings of ``/proc/stat``'s ``procs_running``, less the reader itself. Unlike the
    load average, it does not remember the runs just before (None off Linux)."""
    readings = []
    for _ in range(samples):
        try:
            with open("/proc/stat") as stat:
                line = next(x for x in stat if x.startswith("procs_running"))
        except (OSError, StopIteration):
            return None
        readings.append(int(line.split()[1]) - 1)
        time.sleep(interval_s)
    return max(0.0, sum(readings) / len(readings))


#: The most cores one rank is pinned to: its compute thread and the backend's
#: communication threads.
MAX_CORES_PER_RANK = 2


def rank_cpus(nproc: int) -> list[list[int]]:
    """The cores each of ``nproc`` local ranks is pinned to: disjoint sets of one or
    two of the cores this process may use, or none (no pinning) where there are fewer
    cores than ranks or the platform cannot pin."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    cores = sorted(os.sched_getaffinity(0))
    per = min(MAX_CORES_PER_RANK, len(cores) // nproc)
    if per < 1:
        return []
    return [cores[rank * per : (rank + 1) * per] for rank in range(nproc)]


def _wait(ranks: list[subprocess.Popen]) -> set[int]:
    """Wait for every rank to end. Once one fails, give the others ``REPORT_GRACE_S``
    to end or report, then stop them; return the ranks stopped that way."""
    failed_at: float | None = None
    while True:
        codes = [proc.poll() for proc in ranks]
        if all(code is not None for code in codes):
            return set()
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > REPORT_GRACE_S:
            running = [rank for rank, code in enumerate(codes) if code is None]
            _stop([ranks[rank] for rank in running])
            return set(running)
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL for any rank still running after ``STOP_GRACE_S``."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _failure_message(ranks: list[subprocess.Popen], stopped: set[int], run_dir: Path) -> str:
    reports = {
        int(path.stem[4:]): path.read_text().strip() for path in sorted(run_dir.glob("rank*.error"))
    }
    died = [
        f"rank {rank} {_describe_exit(proc.returncode)}"
        for rank, proc in enumerate(ranks)
        if proc.returncode != 0 and rank not in reports and rank not in stopped
    ]
    parts = died + [reports[rank] for rank in sorted(reports)]
    quiet = sorted(stopped - set(reports))
    if quiet:
        names = ", ".join(str(r) for r in quiet)
        verb = "were" if len(quiet) > 1 else "was"
        parts.append(
            f"rank{'s' if len(quiet) > 1 else ''} {names} had not finished and {verb} "
            "stopped by the launcher"
        )
    return "run failed: " + "; ".join(parts) if parts else "run failed"
