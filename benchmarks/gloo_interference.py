"""Benchmark: what a gloo all-reduce and a GEMM cost each other on one shared core.

Two processes, each pinned to a core of its own (where there are two), time a 256×256
GEMM loop alone, an all-reduce of ``SIZE`` bytes alone, and then both at once in one
process (the all-reduce on a thread, as the replay's executor runs it), for each size.
They print how much slower each ran beside the other, and the share of the
all-reduce's time alone that it spent on the core, ``ρ = (wall − GEMM work) / all-reduce
work``. The rest is waiting for the peer, which compute can overlap. This is the
mechanism behind ``gpu.comm_on_compute_cores``, measured. Usage::

    python -m benchmarks.gloo_interference [--sizes 65536,1048576,4194304] [--count 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

GEMM = 256


def _rank(rank: int, store: str, sizes: list[int], count: int) -> None:
    import torch
    import torch.distributed as dist

    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    a = torch.randn(GEMM, GEMM)
    out = torch.empty_like(a)
    for size in sizes:
        buffer = torch.ones(size // 4)
        dist.barrier()
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < 2.0:
            torch.mm(a, a, out=out)
            done += 1
        gemm_alone = (time.perf_counter() - started) / done
        dist.barrier()
        started = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(buffer)
        reduce_alone = (time.perf_counter() - started) / count
        dist.barrier()
        thread = threading.Thread(
            target=lambda b=buffer: [dist.all_reduce(b) for _ in range(count)]
        )
        started, done = time.perf_counter(), 0
        thread.start()
        while thread.is_alive():
            torch.mm(a, a, out=out)
            done += 1
        wall = time.perf_counter() - started
        gemm_work = done * gemm_alone
        reduce_work = count * reduce_alone
        if rank == 0:
            print(
                f"| {size:,} B | {gemm_alone * 1e6:.0f} us | x{wall / done / gemm_alone:.2f} | "
                f"{reduce_alone * 1e3:.3f} ms | x{wall / count / reduce_alone:.2f} | "
                f"{(wall - gemm_work) / reduce_work:.2f} |",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,1048576,4194304", help="all-reduce bytes")
    parser.add_argument("--count", type=int, default=200, help="all-reduces per size")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.rank is not None:
        _rank(args.rank, args.store, sizes, args.count)
        return 0
    print(
        "| all-reduce | GEMM alone | GEMM beside it | all-reduce alone | beside the GEMMs "
        "| ρ (its CPU share) |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        command = [sys.executable, "-m", "benchmarks.gloo_interference", *sys.argv[1:]]
        ranks = [subprocess.Popen([*command, "--rank", str(r), "--store", store]) for r in (0, 1)]
        return max(rank.wait() for rank in ranks)


if __name__ == "__main__":
    raise SystemExit(main())
