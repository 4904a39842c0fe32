"""Microbenchmarks in the style of nccl-tests, run on every rank of a job.

* :func:`matmul_sweep` — ``torch.mm`` throughput over a range of square shapes;
* :func:`memcopy_sweep` — device memory copy bandwidth (bytes read + written);
* :func:`collective_sweep` — a collective over a size sweep on one group: time (the
  slowest rank's median), algbw = size / time, busbw = algbw × the nccl-tests factor,
  and a check of the result;
* :func:`p2p_sweep` — ping-pong between two ranks: one-way time = half a round trip.

Every function returns plain rows (dicts) in SI units.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from simulator.engine.collectives import bus_factor, even_equivalent

from .compat import all_gather_single, reduce_scatter_single
from .runtime import HardwareError, Runtime

__all__ = [
    "matmul_sweep",
    "memcopy_sweep",
    "collective_sweep",
    "uneven_all_to_all_sweep",
    "p2p_sweep",
    "speed_probe",
    "timed",
]


def timed(runtime: Runtime, fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Mean seconds of ``fn`` over ``iters`` runs, after ``warmup`` runs.

    The mean, as nccl-tests reports it: a step's time is a sum of many such ops, so
    occasional slow runs (a descheduled process) count in proportion."""
    for _ in range(warmup):
        fn()
    samples = []
    if runtime.is_cuda:
        stream = torch.cuda.current_stream(runtime.device)
        for _ in range(iters):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.fmean(samples)


#: The speed probe: this many GEMMs of this size, timed on every rank at once.
PROBE_GEMMS, PROBE_SIZE = 40, 256


def speed_probe(runtime: Runtime) -> float:
    """Seconds of one fixed GEMM on this device, the median of ``PROBE_GEMMS``, taken
    on every rank at once: the calibration records it, and each replay records it
    again, so a machine that runs slower than when it was calibrated (other tenants,
    a throttled CPU) shows in the numbers instead of passing for a model error."""
    a = torch.randn(PROBE_SIZE, PROBE_SIZE, device=runtime.device, dtype=_dtype(runtime))
    out = torch.empty_like(a)
    dist.barrier()
    samples = [
        timed(runtime, partial(torch.mm, a, a, out=out), 1, warmup=1 if i == 0 else 0)
        for i in range(PROBE_GEMMS)
    ]
    return statistics.median(samples)


def _dtype(runtime: Runtime) -> torch.dtype:
    return torch.bfloat16 if runtime.is_cuda else torch.float32


def matmul_sweep(runtime: Runtime, sizes: list[int], iters: int) -> list[dict]:
    """Time an ``n×n @ n×n`` GEMM for each ``n`` (on every rank at once)."""
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device=runtime.device, dtype=_dtype(runtime))
        b = torch.randn(n, n, device=runtime.device, dtype=_dtype(runtime))
        out = torch.empty(n, n, device=runtime.device, dtype=_dtype(runtime))
        dist.barrier()
        seconds = timed(runtime, partial(torch.mm, a, b, out=out), iters)
        rows.append({"m": n, "n": n, "k": n, "flops": 2.0 * n**3, "seconds": seconds})
    return rows


def memcopy_sweep(runtime: Runtime, sizes: list[int], iters: int) -> list[dict]:
    """Copy ``size`` bytes from one buffer to another; traffic is ``2·size``."""
    rows = []
    element = torch.tensor([], dtype=_dtype(runtime)).element_size()
    for size in sizes:
        src = torch.ones(size // element, device=runtime.device, dtype=_dtype(runtime))
        dst = torch.empty_like(src)
        dist.barrier()
        seconds = timed(runtime, partial(dst.copy_, src), iters)
        rows.append({"bytes": 2.0 * size, "seconds": seconds})
    return rows


def _slowest(runtime: Runtime, seconds: float, group) -> float:
    """The largest of every member's time (nccl-tests reports the slowest rank)."""
    device = runtime.device if runtime.is_cuda else torch.device("cpu")
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())


def _chunks_hold(out: torch.Tensor, members: list[int]) -> bool:
    """Chunk ``i`` of ``out`` holds member ``i``'s value (``rank + 1``)."""
    chunk = out.numel() // len(members)
    return all(
        bool((out[i * chunk : (i + 1) * chunk] == m + 1).all()) for i, m in enumerate(members)
    )


def _collective_case(
    runtime: Runtime, kind: str, group, members: list[int], numel: int
) -> tuple[Callable[[], object], Callable[[], bool]]:
    """``(run, check)`` for one collective of ``numel`` elements on ``group``."""
    n, dtype, device = len(members), _dtype(runtime), runtime.device
    value = float(runtime.rank + 1)
    total = float(sum(m + 1 for m in members))
    if kind in ("all_reduce", "broadcast"):
        buf = torch.full((numel,), value, device=device, dtype=dtype)
        if kind == "all_reduce":
            run = partial(dist.all_reduce, buf, group=group)
            expected = total
        else:
            run = partial(dist.broadcast, buf, src=members[0], group=group)
            expected = members[0] + 1.0

        def check() -> bool:
            buf.fill_(value)
            run()
            return bool((buf == expected).all())

        return run, check
    if kind == "all_gather":
        inp = torch.full((numel // n,), value, device=device, dtype=dtype)
        out = torch.empty(numel, device=device, dtype=dtype)
        run = partial(all_gather_single, out, inp, group=group)
        return run, lambda: (run(), _chunks_hold(out, members))[1]
    if kind == "reduce_scatter":
        inp = torch.full((numel,), value, device=device, dtype=dtype)
        out = torch.empty(numel // n, device=device, dtype=dtype)
        run = partial(reduce_scatter_single, out, inp, group=group)
        return run, lambda: (run(), bool((out == total).all()))[1]
    if kind == "all_to_all":
        inp = torch.full((numel,), value, device=device, dtype=dtype)
        out = torch.empty(numel, device=device, dtype=dtype)
        run = partial(dist.all_to_all_single, out, inp, group=group)
        return run, lambda: (run(), _chunks_hold(out, members))[1]
    raise HardwareError(f"collective_sweep: unknown kind {kind!r}")


def collective_sweep(
    runtime: Runtime, kind: str, group, members: list[int], sizes: list[int], iters: int
) -> list[dict]:
    """nccl-tests-style rows for ``kind`` on ``group`` (call on its members only)."""
    n = len(members)
    element = torch.tensor([], dtype=_dtype(runtime)).element_size()
    rows = []
    for size in sizes:
        numel = max(n, (size // element) // n * n)
        run, check = _collective_case(runtime, kind, group, members, numel)
        if not check():
            raise HardwareError(
                f"{kind} of {numel * element} bytes on ranks {members} gave a wrong result "
                f"on rank {runtime.rank}"
            )
        # small messages are latency-bound and noisy: average over more of them
        repeats = iters * (4 if numel * element < 2**20 else 1)
        seconds = _slowest(runtime, timed(runtime, run, repeats), group)
        algbw = numel * element / seconds
        rows.append(
            {
                "kind": kind,
                "ranks": n,
                "bytes": float(numel * element),
                "seconds": seconds,
                "algbw": algbw,
                "busbw": algbw * bus_factor(kind, n),
                "correct": True,
            }
        )
    return rows


def uneven_all_to_all_sweep(
    runtime: Runtime,
    group,
    members: list[int],
    cases: list[tuple[tuple[float, ...], ...]],
    iters: int,
) -> list[dict]:
    """Time each uneven all-to-all of ``cases`` (``case[i][j]``: the bytes member ``i``
    sends member ``j``), as the replay runs it; each row stands at the size of the even
    all-to-all its busiest member matches (:func:`~simulator.engine.collectives.
    even_equivalent`), the size the simulator prices it at."""
    me = members.index(runtime.rank)
    element = torch.tensor([], dtype=_dtype(runtime)).element_size()
    rows = []
    for case in cases:
        send = [max(0, int(b // element)) for b in case[me]]
        receive = [max(0, int(case[j][me] // element)) for j in range(len(members))]
        inp = torch.ones(max(1, sum(send)), device=runtime.device, dtype=_dtype(runtime))
        out = torch.empty(max(1, sum(receive)), device=runtime.device, dtype=_dtype(runtime))
        run = partial(
            dist.all_to_all_single,
            out[: sum(receive)],
            inp[: sum(send)],
            receive,
            send,
            group=group,
        )
        seconds = _slowest(runtime, timed(runtime, run, iters), group)
        size = even_equivalent(dict(enumerate(case)), list(range(len(members))))
        rows.append(
            {
                "kind": "all_to_all",
                "ranks": len(members),
                "bytes": float(size),
                "seconds": seconds,
                "uneven": True,
            }
        )
    return rows


def _round_trip(buf: torch.Tensor, peer: int, initiator: bool) -> None:
    if initiator:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)


def p2p_sweep(
    runtime: Runtime, peer: int, sizes: list[int], iters: int, initiator: bool
) -> list[dict]:
    """Ping-pong with ``peer``; rows hold the one-way time (half a round trip)."""
    dtype = _dtype(runtime)
    element = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for size in sizes:
        buf = torch.full(
            (max(1, size // element),), float(runtime.rank), device=runtime.device, dtype=dtype
        )

        repeats = iters * (4 if size < 2**20 else 1)
        seconds = timed(runtime, partial(_round_trip, buf, peer, initiator), repeats) / 2
        rows.append({"bytes": float(buf.numel() * element), "seconds": seconds})
    return rows
