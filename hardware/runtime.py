"""One rank's distributed runtime: process group, device, fault handling.

Every entry point (``hardware.replay``, ``hardware.calibrate``) starts with
:func:`init_runtime`, which reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), picks NCCL on a GPU and gloo otherwise, and
initialises the default process group with a timeout, so a collective whose peer is
gone raises instead of blocking forever.

Faults end in one line, never a wall of stack traces: :func:`run_rank` catches a
rank's error, writes it to ``$PARASIM_RUN_DIR/rank<r>.error`` (the launcher collects
these) and exits non-zero. A watchdog thread ends a rank that makes no progress for
the timeout. ``PARASIM_FAULT=rank:op:kill|hang`` injects a fault before an op, so the
fault handling can be tested for real.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from simulator.common.errors import ParasimError

__all__ = ["Runtime", "init_runtime", "run_rank", "Watchdog", "inject_fault", "HardwareError"]

DEFAULT_TIMEOUT_S = 60.0


class HardwareError(ParasimError):
    """A failure of a distributed run, described in one line."""


@dataclass
class Runtime:
    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str
    device: torch.device
    timeout_s: float

    @property
    def node(self) -> int:
        return self.rank // self.local_world

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def device_name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.device)
        return f"cpu ({torch.get_num_threads()} threads per process)"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def machine_cores() -> int:
    """The cores this job's ranks share on this machine: what the launcher saw
    (``PARASIM_CORES``, before it pinned the ranks), else what this process may use."""
    given = os.environ.get("PARASIM_CORES")
    if given:
        return int(given)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


#: The rendezvous port of a job started by plain ``srun`` (torchrun's default).
SLURM_PORT = 29500


def adopt_slurm_environment(env: MutableMapping[str, str]) -> None:
    """Under plain ``srun`` (one task per GPU, no torchrun), set torchrun's variables
    from SLURM's: ``RANK`` from ``SLURM_PROCID``, ``WORLD_SIZE`` from ``SLURM_NTASKS``,
    ``LOCAL_RANK`` from ``SLURM_LOCALID``, ``LOCAL_WORLD_SIZE`` from
    ``SLURM_NTASKS_PER_NODE`` (else the tasks over ``SLURM_NNODES``), and the rendezvous
    at ``SLURM_LAUNCH_NODE_IPADDR`` (the node srun ran on) port ``SLURM_PORT`` unless
    ``MASTER_ADDR``/``MASTER_PORT`` say otherwise. A launcher's own variables win."""
    if "RANK" in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return
    world = int(env["SLURM_NTASKS"])
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if not per_node.isdigit():
        per_node = str(max(1, world // max(1, int(env.get("SLURM_NNODES", "1")))))
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = str(world)
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["LOCAL_WORLD_SIZE"] = per_node
    env.setdefault("MASTER_ADDR", env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
    env.setdefault("MASTER_PORT", str(SLURM_PORT))


def use_interface(ifname: str) -> None:
    """Make gloo and NCCL connect over network interface ``ifname`` (torchrun's own
    rendezvous store is torchrun's: it listens on ``--rdzv-endpoint``'s port)."""
    names = [name for _, name in socket.if_nameindex()]
    if ifname not in names:
        raise HardwareError(
            f"--ifname: this host ({socket.gethostname()}) has no interface {ifname!r}; "
            f"it has {', '.join(names)}"
        )
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    os.environ["NCCL_SOCKET_IFNAME"] = ifname


def init_runtime(
    backend: str | None = None, timeout_s: float | None = None, ifname: str | None = None
) -> Runtime:
    """Join the job torchrun (or the parasim launcher) started; with ``ifname``, over
    that network interface."""
    if ifname:
        use_interface(ifname)
    backend = (
        backend
        or os.environ.get("PARASIM_BACKEND")
        or ("nccl" if torch.cuda.is_available() else "gloo")
    )
    timeout_s = float(timeout_s or os.environ.get("PARASIM_TIMEOUT") or DEFAULT_TIMEOUT_S)
    adopt_slurm_environment(os.environ)
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise HardwareError("backend nccl needs a CUDA GPU, and torch sees none")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # One compute thread per process, as the cpu-localhost preset describes a
        # "device": the ranks do not fight over cores, and N processes measure N cores.
        torch.set_num_threads(1)
    cpus = os.environ.get("PARASIM_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):  # the launcher gave this rank its cores
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    timeout = timedelta(seconds=timeout_s)
    store_path = os.environ.get("PARASIM_STORE")
    if store_path:  # parasim's local launcher: a file store, no port opened
        store = dist.FileStore(store_path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        return Runtime(rank, world, local_rank, local_world, backend, device, timeout_s)
    if "MASTER_ADDR" not in os.environ:  # a lone process outside any launcher
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return Runtime(rank, world, local_rank, local_world, backend, device, timeout_s)


#: Barrier-and-read rounds that estimate a node's clock offset (the median is kept).
CLOCK_ROUNDS = 7


def clock_offset(runtime: Runtime) -> float:
    """This rank's ``time.perf_counter`` minus rank 0's, in seconds: 0 on one machine
    (its ranks share one monotonic clock); across nodes, the median over
    ``CLOCK_ROUNDS`` of the difference of the readings the ranks take as a barrier
    releases them (good to the barrier's skew, microseconds on a cluster network)."""
    if runtime.nodes == 1:
        return 0.0
    device = runtime.device if runtime.is_cuda else torch.device("cpu")
    samples = []
    for _ in range(CLOCK_ROUNDS):
        dist.barrier()
        now = torch.tensor([time.perf_counter()], dtype=torch.float64, device=device)
        readings = [torch.zeros_like(now) for _ in range(runtime.world)]
        dist.all_gather(readings, now)
        samples.append(float(now.item()) - float(readings[0].item()))
    return statistics.median(samples)


class Watchdog:
    """Ends the process if :meth:`progress` is not called for ``timeout_s`` seconds."""

    def __init__(self, rank: int, timeout_s: float, describe: Callable[[], str]):
        self.rank = rank
        self.timeout_s = timeout_s
        self.describe = describe
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def progress(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                _report(
                    self.rank,
                    f"stopped responding {self.describe()}: no progress for {idle:.0f} s "
                    f"(timeout {self.timeout_s:g} s)",
                )
                os._exit(3)


def inject_fault(rank: int, op_index: int) -> None:
    """Honour ``PARASIM_FAULT=rank:op:kill|hang`` before op ``op_index`` of ``rank``."""
    spec = os.environ.get("PARASIM_FAULT")
    if not spec:
        return
    fault_rank, fault_op, action = spec.split(":")
    if int(fault_rank) != rank or int(fault_op) != op_index:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        time.sleep(10**6)


def _report(rank: int, message: str) -> None:
    line = f"rank {rank}: {message}"
    run_dir = os.environ.get("PARASIM_RUN_DIR")
    if run_dir:
        path = Path(run_dir) / f"rank{rank}.error"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(line + "\n")
        os.replace(tmp, path)
    print(f"parasim: {line}", file=sys.stderr, flush=True)


def run_rank(main: Callable[[], int]) -> None:
    """Run one rank's ``main``; any error becomes one line and a non-zero exit."""
    rank = _env_int("RANK", 0)
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # every failure of a rank is reported, in one line
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        _report(
            rank,
            f"{type(exc).__name__}: {message}" if not isinstance(exc, HardwareError) else message,
        )
        code = 1
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    os._exit(code)
