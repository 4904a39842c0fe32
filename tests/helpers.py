"""Helpers for building small clusters and hand-written schedules in tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.report.compare_report import load_run_dir
from topologies import Cluster, build_cluster, load_cluster_spec

FREE_NETWORK = {
    "nvswitch": {"latency": 0},
    "nic": {"latency": 0},
    "network": {"switch_latency": 0},
    "gpu": {"kernel_launch_overhead": 0},
    # sends and receives take next to no time: no NCCL latency, and the largest bandwidth
    # parasim reads (1 PB/s: a megabyte in a nanosecond)
    "calibration": {
        "comm": {
            "p2p": {
                "intra_node": {"alpha": 0, "bandwidth": 1e15},
                "inter_node": {"alpha": 0, "bandwidth": 1e15},
            }
        }
    },
}


#: A model small enough that gloo ranks on CPU replay its steps in a second or two.
TINY = [
    "model.layers=2",
    "model.hidden=64",
    "model.heads=2",
    "model.seq_len=32",
    "model.vocab=128",
    "training.global_batch=4",
    "training.micro_batch=1",
]


#: Text a user may write that rich would read as markup: ``[/]`` closes a style nobody
#: opened (rich raises MarkupError), ``[red]`` would vanish into a colour. A scenario's
#: name or a folder's path holding it prints as written.
MARKUP = "s[/]x[red]y"


def markup_args(tmp_path: Path, monkeypatch: Any) -> tuple[list[str], Path]:
    """``--set name=MARKUP --out <tmp_path>/MARKUP`` and that folder, for a command whose
    console must print both as written: on a console wide enough that no line wraps,
    with the progress a terminal would show (its status line or bar) drawn too."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(
        "simulator.report.progress.interactive", lambda json_output=False: not json_output
    )
    out = tmp_path / MARKUP
    return ["--set", f'name="{MARKUP}"', "--out", str(out)], out


def cluster(preset: str = "dgx-a100", nodes: int = 1, **overrides: Any) -> Cluster:
    return build_cluster(load_cluster_spec({"preset": preset, "nodes": nodes, **overrides}))


def seconds_to_flops(cluster: Cluster, seconds: float) -> float:
    """FLOPs of a GEMM that takes ``seconds`` on the cluster's GPU (no launch overhead)."""
    gpu = cluster.spec.gpu
    return seconds * sustained_peak(cluster.spec) * gpu.matmul_efficiency


def sustained_peak(spec) -> float:
    """The tensor-core rate the compute model runs GEMMs against: the datasheet peak at
    the power limit's clock, times the share of it training sustains."""
    gpu = spec.gpu
    return gpu.peak_flops * gpu.compute_clock_factor * gpu.sustained_fraction


def same_numbers(a: Any, b: Any, path: str = "result") -> list[str]:
    """Where two results differ beyond float rounding: every field equal, floats to one
    part in 10¹² (a block's ops are timed from the block's start, op by op from the
    step's: the same sums in another order). ``simulation.blocks`` (how many blocks
    ran) is how the step was written, not a number of the step, and is left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (a.keys() | b.keys()) - ({"blocks"} if path.endswith(".simulation") else set())
        return [d for k in sorted(keys) for d in same_numbers(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in same_numbers(x, y, f"{path}[{i}]")
        ]
    if isinstance(a, float) and isinstance(b, float):
        close = abs(a - b) <= 1e-12 * max(abs(a), abs(b)) + 1e-18
        return [] if close else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


#: A calibration profile of the format ``parasim calibrate`` writes, with an A100's
#: datasheet peak and a few measured-looking fits, for tests of how profiles are read.
A100_PROFILE: dict[str, Any] = {
    "format": "parasim-calibration",
    "version": 1,
    "created": "2026-01-01T00:00:00Z",
    "device": {"name": "A100", "type": "cuda", "count": 8, "per_node": 8, "nodes": 1},
    "software": {"torch": "2.13.0", "backend": "nccl"},
    "gpu": {
        "peak_flops": 3.12e14,
        "matmul_efficiency": 0.7,
        "attention_efficiency": 0.5,
        "kernel_launch_overhead": 5e-6,
        "hbm_bandwidth": 2e12,
        "gemm_table": [[4096, 4096, 4096, 0.78]],
    },
    "comm": {
        "all_reduce": {
            "intra_node": {"alpha": 2e-5, "bandwidth": 2e11, "rms_residual_s": 1e-6, "points": 8}
        }
    },
}


#: Kernel names of each compute kind, as a GPU run records them (write_traces).
TRACE_KERNELS = {
    "gemm": "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage3",
    "attention": "flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>",
    "elementwise": "void at::native::vectorized_elementwise_kernel<4, add_functor>",
    "optimizer": "void at::native::multi_tensor_apply_kernel<AdamFunctor>",
}
TRACE_NCCL = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
}


def _choice(result) -> tuple[str, str]:
    counts = result.simulation["collective_choices"]
    name = max(counts, key=lambda n: counts[n])
    _, algorithm, protocol = name.split("/")
    return algorithm.upper(), protocol.upper()


def write_traces(
    predicted: Path,
    folder: Path,
    slow_rank: int | None = None,
    slower: float = 1.0,
    algorithm: tuple[str, str] | None = None,
    longer: float = 1.0,
) -> Path:
    """One Kineto trace per rank of the predicted step, as a GPU run would record it:
    ``slow_rank``'s compute kernels ``slower`` times as long; with ``algorithm``, the
    all-reduces run as that (algorithm, protocol), ``longer`` times as long."""
    result, trace = load_run_dir(predicted)
    chosen = algorithm or _choice(result)
    folder.mkdir(parents=True)
    members = {}
    for record in trace.records:
        if record.group:
            members.setdefault(record.group, set()).add(record.rank)
    for rank in trace.ranks():
        events = [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "ProfilerStep#0",
                "pid": 1,
                "tid": 1,
                "ts": 0.0,
                "dur": trace.step_time * 1e6,
            },
        ]
        for record in trace.records:
            if record.rank != rank:
                continue
            start, duration = record.start * 1e6, (record.end - record.start) * 1e6
            if record.op == "compute":
                if rank == slow_rank:
                    duration *= slower
                name = TRACE_KERNELS.get(record.kind, TRACE_KERNELS["elementwise"])
                events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": name,
                        "pid": 0,
                        "tid": 7,
                        "ts": start,
                        "dur": duration,
                        "args": {},
                    }
                )
            elif record.op == "collective" and record.kind in TRACE_NCCL:
                ring, protocol = chosen if record.kind == "all_reduce" else _choice(result)
                if algorithm is not None and record.kind == "all_reduce":
                    duration *= longer
                ranks = sorted(members.get(record.group, {rank}))
                events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "pid": 0,
                        "tid": 13,
                        "ts": start,
                        "dur": duration,
                        "name": f"ncclDevKernel_{TRACE_NCCL[record.kind]}_Sum_bf16_"
                        f"{ring}_{protocol}(x)",
                        "args": {
                            "Collective name": record.kind.replace("_", ""),
                            "In msg nelems": int(record.bytes // 2),
                            "Out msg nelems": int(record.bytes // 2),
                            "Group size": len(ranks),
                            "dtype": "BFloat16",
                            "Process Group Name": record.group,
                            "Process Group Ranks": str(ranks),
                        },
                    }
                )
        document = {
            "schemaVersion": 1,
            "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": len(trace.ranks())},
            "traceEvents": events,
        }
        (folder / f"rank{rank}.json").write_text(json.dumps(document))
    return folder
