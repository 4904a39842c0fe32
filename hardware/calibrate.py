"""Calibrate parasim's model on the machine it runs on, and write a profile.

Under torchrun::

    torchrun --nnodes N --nproc-per-node G -m hardware.calibrate --out profile.json

Every rank runs the microbenchmarks (:mod:`hardware.microbench`); rank 0 fits the
model's parameters by least squares and writes a versioned profile
(:mod:`topologies.profile`) atomically:

* matmul: ``t = t0 + flops / R`` over the GEMM sweep gives ``matmul_efficiency =
  R / peak_flops`` and ``kernel_launch_overhead = t0`` — exactly the roofline the
  simulator uses, so the efficiency is a function of size through ``t0``; each
  measured shape also becomes a ``gemm_table`` row (its own efficiency once ``t0`` is
  taken off), which the simulator's GEMM model anchors on;
* memory copy: ``t = t0 + bytes / BW`` gives ``hbm_bandwidth``;
* each collective kind, inside a node and across nodes (one rank per node):
  ``t = a + b·S`` gives ``α = a / steps`` and ``B = factor / b`` of the ring model
  (``steps`` and ``factor`` as in :mod:`simulator.engine.collectives`);
* send/recv ping-pong: ``α = a``, ``B = 1 / b``.

The peak FLOP rate the efficiency is measured against comes from ``--peak-flops`` or
a preset (``--preset``; by default the one matching the device).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypedDict

import torch
import torch.distributed as dist

from simulator.common import fitting
from simulator.common.files import write_json
from simulator.engine.collectives import algorithm_steps, bus_factor
from simulator.request.scenario import load_scenario
from simulator.schedule.ir import Compute
from simulator.traces.calibration import op_table_rows
from topologies import load_cluster_spec, parse_flops
from topologies.devices import CPU_PRESET, preset_of_device
from topologies.profile import PROFILE_FORMAT, PROFILE_VERSION

from .executor import ComputeKernels, make_buffers
from .microbench import (
    collective_sweep,
    matmul_sweep,
    memcopy_sweep,
    p2p_sweep,
    speed_probe,
    uneven_all_to_all_sweep,
)
from .opbench import (
    distinct_programs,
    executor_overheads,
    measured_calls,
    op_key,
    scenario_collective_sizes,
    scenario_schedules,
    scenario_uneven_all_to_alls,
    time_scenario_ops,
    time_scenario_steps,
)
from .runtime import HardwareError, Runtime, init_runtime, machine_cores, run_rank

__all__ = ["fit_line", "fit_profile", "main"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


# Sweeps: a full one for clusters, a quick one for CPU checks and CI.
class Sweep(TypedDict):
    """One sweep's sizes: GEMM sides, copy bytes, collective bytes, timed iterations."""

    matmul: list[int]
    memcopy: list[int]
    comm: list[int]
    iters: int


SWEEPS: dict[str, Sweep] = {
    "cuda": {
        "matmul": [512, 1024, 2048, 4096, 8192],
        # from 256 MiB up: an H100's or H200's L2 (50-60 MB) must not hold the copy
        "memcopy": [2**28, 2**29, 2**30, 2**31],
        "comm": [2**p for p in range(10, 31, 2)],
        "iters": 20,
    },
    # CPU copies start at 16 MiB so that they stream from DRAM, not from the caches
    "cpu": {
        "matmul": [64, 128, 256, 384, 512],
        "memcopy": [2**24, 2**26, 2**27],
        "comm": [2**p for p in range(12, 25, 2)],
        "iters": 15,
    },
    "quick": {
        "matmul": [64, 128, 256],
        "memcopy": [2**24, 2**26],
        "comm": [2**12, 2**16, 2**20, 2**22],
        "iters": 7,
    },
}


def fit_line(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """:func:`simulator.common.fitting.fit_line`, its refusal a :class:`HardwareError`."""
    try:
        return fitting.fit_line(x, y)
    except fitting.FitError as exc:
        raise HardwareError(str(exc)) from None


def _peak_flops(args: argparse.Namespace, runtime: Runtime) -> tuple[float, str]:
    if args.peak_flops:
        return parse_flops(args.peak_flops), f"--peak-flops {args.peak_flops}"
    preset = args.preset
    if preset is None:
        if not runtime.is_cuda:
            preset = CPU_PRESET
        else:
            name = runtime.device_name()
            preset = preset_of_device(name)
            if preset is None:
                raise HardwareError(
                    f"no preset matches device {name!r}: give --preset or --peak-flops"
                )
    spec = load_cluster_spec({"preset": preset, "nodes": 1})
    return spec.gpu.peak_flops, f"preset {preset}"


def gemm_table(rows: list[dict], t0: float, peak: float) -> list[list[float]]:
    """``(m, n, k, efficiency)`` of each measured GEMM, its launch overhead ``t0`` off."""
    table = []
    for r in rows:
        seconds = max(r["seconds"] - t0, 1e-12)
        efficiency = min(1.0, r["flops"] / seconds / peak)
        table.append([r["m"], r["n"], r["k"], efficiency])
    return table


def fit_profile(raw: dict, runtime: Runtime, peak: float, peak_source: str) -> dict:
    """The profile (a JSON-ready dict) from the gathered measurements."""
    matmul = raw["matmul"]
    t0, per_flop, matmul_rms = fit_line(
        [r["flops"] for r in matmul], [r["seconds"] for r in matmul]
    )
    efficiency = min(1.0, 1.0 / per_flop / peak)
    _, per_byte, copy_rms = fit_line(
        [r["bytes"] for r in raw["memcopy"]], [r["seconds"] for r in raw["memcopy"]]
    )
    overheads = raw.get("overheads") or {"compute_op_s": 0.0, "collective_s": 0.0}
    comm: dict[str, dict[str, dict]] = {}
    for (kind, scope), rows in sorted(raw["comm"].items()):
        n = rows[0]["ranks"]
        a, b, rms = fit_line([r["bytes"] for r in rows], [r["seconds"] for r in rows])
        steps = algorithm_steps(kind, n)
        factor = bus_factor(kind, n)
        comm.setdefault(kind, {})[scope] = {
            # the executor's own cost per collective joins the fixed cost it is fitted with
            "alpha": (a + overheads["collective_s"]) / steps,
            "bandwidth": factor / b,
            "rms_residual_s": rms,
            "points": len(rows),
            "ranks": n,
            # the calls measured in the scenarios' own steps take their measured time
            "table": [
                {"ranks": c["ranks"], "bytes": c["bytes"], "seconds": c["seconds"]}
                for c in raw.get("calls", [])
                if c["kind"] == kind and c["scope"] == scope
            ],
        }
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": {
            "name": runtime.device_name(),
            "type": runtime.device.type,
            "count": runtime.world,
            "per_node": runtime.local_world,
            "nodes": runtime.nodes,
            # the cores the ranks ran on: CPU ranks beyond them share cores
            "cores": machine_cores(),
            # microbench.speed_probe on rank 0: a replay compares its own with this one
            "probe_s": raw.get("probe_s"),
        },
        "software": {
            "torch": torch.__version__,
            "backend": runtime.backend,
            "backend_version": (
                ".".join(str(v) for v in torch.cuda.nccl.version())
                if runtime.backend == "nccl"
                else "gloo"
            ),
        },
        "gpu": {
            "peak_flops": peak,
            "matmul_efficiency": efficiency,
            # parasim's executor runs the attention core as a GEMM of the same FLOPs, so
            # the matmul fit stands for it until a fused-attention benchmark is added.
            "attention_efficiency": efficiency,
            # the replay executor's per-op cost runs in series with each op on a CPU
            "kernel_launch_overhead": t0 + overheads["compute_op_s"],
            "hbm_bandwidth": 1.0 / per_byte,
            "gemm_table": gemm_table(matmul, t0, peak),
            "op_table": raw.get("op_table", []),
            "jitter": raw.get("jitter", 0.0),
        },
        "executor": overheads,
        "comm": comm,
        "fits": {
            "peak_flops_source": peak_source,
            "matmul_rms_residual_s": matmul_rms,
            "memcopy_rms_residual_s": copy_rms,
        },
        "matmul": matmul,
        "memcopy": raw["memcopy"],
        "comm_rows": {f"{k}/{s}": rows for (k, s), rows in sorted(raw["comm"].items())},
    }


#: How many times a collective's sweep is measured before a sweep that does not fit the
#: ring model's line is an error.
SWEEP_ATTEMPTS = 3


def _collective_rows(
    runtime: Runtime,
    kind: str,
    group: object,
    members: list[int],
    sizes: list[int],
    uneven: list,
    iters: int,
) -> list[dict]:
    """A collective's sweep on one group, and its uneven cases (all-to-alls) after."""
    rows = collective_sweep(runtime, kind, group, members, sizes, iters)
    if uneven:
        rows += uneven_all_to_all_sweep(runtime, group, members, uneven, iters)
    return rows


def _until_it_fits(
    measure: Callable[[], list[dict]],
    what: str,
    agree: Callable[[bool], bool] = bool,
    size: str = "bytes",
) -> list[dict]:
    """The rows of ``measure()``, measured again (up to :data:`SWEEP_ATTEMPTS` times in
    all) while their times give no positive slope with their ``size`` field: on a busy
    machine descheduled runs can make the small sizes' mean slower than the large ones'.

    Every rank that measures must take the same decision: a collective's rows are the
    same on every member (each is the slowest member's time), so ``agree`` is the
    identity there; a ping-pong's two ranks take the initiator's (:func:`_initiators`),
    and every rank takes rank 0's for the GEMM and copy sweeps it fits
    (:func:`_rank_zeros`)."""
    error: HardwareError | None = None
    for attempt in range(1, SWEEP_ATTEMPTS + 1):
        rows = measure()
        try:
            fit_line([r[size] for r in rows], [r["seconds"] for r in rows])
            error = None
        except HardwareError as failed:
            error = failed
        if agree(error is None):
            return rows
        if error is not None and attempt < SWEEP_ATTEMPTS:
            print(f"parasim: {what}: {error}; measuring again", file=sys.stderr, flush=True)
    raise HardwareError(f"{what}: {error or 'the deciding rank could not fit its sweep'}")


def _rank_zeros(runtime: Runtime, fits: bool) -> bool:
    """Rank 0's ``fits``, on every rank."""
    flag = torch.tensor([1.0 if fits else 0.0], device=runtime.device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _initiators(runtime: Runtime, peer: int, initiator: bool, fits: bool) -> bool:
    """The ping-pong initiator's ``fits``, on both ranks of the pair."""
    flag = torch.tensor([1.0 if fits else 0.0], device=runtime.device)
    if initiator:
        dist.send(flag, peer)
    else:
        dist.recv(flag, peer)
    return bool(flag.item())


def _scope_groups(runtime: Runtime) -> dict[str, tuple[object, list[int]]]:
    """The groups this rank benchmarks in: its node, and one rank per node."""
    scopes: dict[str, tuple[object, list[int]]] = {}
    per_node = runtime.local_world
    for node in range(runtime.nodes):  # every rank creates every group, in order
        members = list(range(node * per_node, (node + 1) * per_node))
        group = dist.new_group(members)
        if runtime.node == node and len(members) > 1:
            scopes["intra_node"] = (group, members)
    if runtime.nodes > 1:
        members = list(range(0, runtime.world, per_node))
        group = dist.new_group(members)
        if runtime.rank in members:
            scopes["inter_node"] = (group, members)
    return scopes


def calibrate(args: argparse.Namespace) -> int:
    runtime = init_runtime(ifname=args.ifname)
    peak, peak_source = _peak_flops(args, runtime)
    sweep = SWEEPS["quick" if args.quick else runtime.device.type]
    schedules = scenario_schedules(args.scenario, []) if args.scenario else []
    raw: dict = {
        "probe_s": speed_probe(runtime),
        # rank 0's GEMM and copy rows are the ones fitted
        "matmul": _until_it_fits(
            partial(matmul_sweep, runtime, sweep["matmul"], sweep["iters"]),
            "matmul",
            partial(_rank_zeros, runtime),
            size="flops",
        ),
        "memcopy": _until_it_fits(
            partial(memcopy_sweep, runtime, sweep["memcopy"], sweep["iters"]),
            "memory copy",
            partial(_rank_zeros, runtime),
        ),
        "comm": {},
    }
    scopes = _scope_groups(runtime)
    for scope, (group, members) in scopes.items():
        # the scenarios' own sizes join the sweep where their groups are this size
        extra = scenario_collective_sizes(schedules, len(members)) if scope == "intra_node" else {}
        # the scenarios' uneven all-to-alls (MoE dispatch), with their own splits, join
        # the all-to-all fit at the size the simulator prices them at
        uneven = (
            scenario_uneven_all_to_alls(schedules, len(members))
            if scope == "intra_node" and schedules
            else []
        )
        for kind in KINDS:
            sizes = sorted({*sweep["comm"], *(int(b) for b in extra.get(kind, ()))})
            measure = partial(
                _collective_rows,
                runtime,
                kind,
                group,
                members,
                sizes,
                uneven if kind == "all_to_all" else [],
                sweep["iters"],
            )
            raw["comm"][(kind, scope)] = _until_it_fits(measure, f"{kind} on {len(members)} ranks")
    pairs = {
        "intra_node": (0, 1) if runtime.local_world > 1 else None,
        "inter_node": (0, runtime.local_world) if runtime.nodes > 1 else None,
    }
    for scope, pair in pairs.items():
        dist.barrier()
        if pair is not None and runtime.rank in pair:
            peer = pair[1] if runtime.rank == pair[0] else pair[0]
            initiator = runtime.rank == pair[0]
            rows = _until_it_fits(
                partial(p2p_sweep, runtime, peer, sweep["comm"], sweep["iters"], initiator),
                f"send/recv between ranks {pair[0]} and {pair[1]}",
                partial(_initiators, runtime, peer, initiator),
            )
            for row in rows:
                row["ranks"] = 2
            raw["comm"][("p2p", scope)] = rows
    dist.barrier()
    raw["overheads"] = executor_overheads(runtime)
    timed_ops = None
    if schedules:
        timed_ops = _time_scenarios(runtime, args.scenario, schedules)
    if runtime.rank == 0:
        if timed_ops is not None:
            raw["op_table"], raw["jitter"], raw["calls"] = _op_table(
                timed_ops, raw["overheads"], schedules, runtime.local_world
            )
        profile = fit_profile(raw, runtime, peak, peak_source)
        write_json(args.out, profile)
        gpu = profile["gpu"]
        print(
            f"parasim: wrote {args.out}: matmul efficiency {gpu['matmul_efficiency']:.3f} of "
            f"{peak:.4g} FLOP/s, launch overhead {gpu['kernel_launch_overhead'] * 1e6:.1f} us, "
            f"memory {gpu['hbm_bandwidth'] / 1e9:.1f} GB/s, "
            f"{sum(len(v) for v in profile['comm'].values())} communication fits"
        )
    return 0


def _time_scenarios(runtime: Runtime, paths: list[str], schedules: list) -> list | None:
    """Every rank times the scenarios' compute ops, each rank running every distinct
    program (like for like), then runs the step of each scenario that has as many ranks
    as were started, communication included (:func:`time_scenario_steps`). Rank 0 gets
    every rank's ``(samples, totals, steps)``, ``steps`` one entry per scenario (None
    where the step was not run); None on the other ranks."""
    gpu = load_scenario(paths[0]).cluster_spec.gpu
    peak, bandwidth = gpu.peak_flops * gpu.matmul_efficiency, gpu.hbm_bandwidth
    buffers, element = make_buffers(runtime.device)
    kernels = ComputeKernels(buffers, element, peak, bandwidth)
    samples, totals = time_scenario_ops(runtime, kernels, distinct_programs(schedules))
    steps = [
        time_scenario_steps(runtime, schedule, peak, bandwidth)
        if set(schedule.programs) == set(range(runtime.world))
        else None
        for schedule in schedules
    ]
    gathered: list | None = [None] * runtime.world if runtime.rank == 0 else None
    dist.gather_object((samples, totals, steps), gathered, dst=0)
    return gathered


def _in_step(gathered: list, schedules: list, per_node: int) -> tuple[dict, list[float], list]:
    """From the scenarios' own steps: each compute op's times, the ranks' relative spread
    of compute per pass among ranks that run the same program, and the communication
    calls measured in place (:func:`measured_calls`)."""
    samples: dict[tuple, list[float]] = {}
    spreads: list[float] = []
    calls: list[dict] = []
    for index, schedule in enumerate(schedules):
        steps = {rank: entry[2][index] for rank, entry in enumerate(gathered)}
        if any(step is None for step in steps.values()):
            continue
        for step_samples, _, _ in steps.values():
            for key, values in step_samples.items():
                samples.setdefault(key, []).extend(values)
        alike: dict[tuple, list[int]] = {}
        for rank, program in schedule.programs.items():
            key = tuple(op_key(op) for op in program.ops if type(op) is Compute)
            alike.setdefault(key, []).append(rank)
        for ranks in alike.values():
            if len(ranks) > 1:
                spreads += _spreads([steps[rank][1] for rank in ranks])
        calls += measured_calls(schedule, {rank: step[2] for rank, step in steps.items()}, per_node)
    return samples, spreads, calls


def _spreads(totals: list[list[float]]) -> list[float]:
    """Per pass, the relative spread (standard deviation over mean, corrected for the
    few ranks it is taken over) of the ranks' ``totals[rank][pass]``."""
    n = len(totals)
    out = []
    for index in range(min(len(t) for t in totals)):
        values = [t[index] for t in totals]
        # a population deviation of n samples underestimates the spread by n/(n-1)
        out.append(statistics.pstdev(values) / statistics.fmean(values) * (n / (n - 1)) ** 0.5)
    return out


def _op_table(
    gathered: list, overheads: dict[str, float], schedules: list, per_node: int
) -> tuple[list[dict], float, list[dict]]:
    """The profile's measured ops (the mean over ranks and passes, the executor's
    per-op cost added; an op timed in its scenario's own step takes that time), the
    jitter (the median over passes of the ranks' relative spread of their compute, in
    the scenarios' own steps where ranks run the same program, otherwise running every
    program each) and the communication calls measured in the scenarios' steps."""
    merged: dict[tuple, list[float]] = {}
    for samples, _, _ in gathered:
        for key, values in samples.items():
            merged.setdefault(key, []).extend(values)
    in_step, spreads, calls = _in_step(gathered, schedules, per_node)
    merged.update(in_step)
    if not spreads and len(gathered) > 1:
        spreads = _spreads([totals for _, totals, _ in gathered])
    jitter = min(0.5, statistics.median(spreads)) if spreads else 0.0
    rows = op_table_rows(merged, overheads["compute_op_s"])
    return rows, jitter, calls


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hardware.calibrate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--quick", action="store_true", help="a short sweep (seconds, for checks and CI)"
    )
    parser.add_argument(
        "--preset", help="cluster preset whose peak FLOP/s the efficiency is measured against"
    )
    parser.add_argument("--peak-flops", help="peak FLOP/s of one device, e.g. '989 TFLOP/s'")
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        help="also time the compute ops and collective sizes this scenario runs (repeatable)",
    )
    parser.add_argument(
        "--ifname",
        help="network interface the ranks connect over between nodes (sets "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME), e.g. ib0",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    run_rank(lambda: calibrate(args))


if __name__ == "__main__":
    main()
