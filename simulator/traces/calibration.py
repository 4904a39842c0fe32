"""A calibration profile from what a run's traces measured (``parasim calibrate
--from-trace``): the same format ``parasim calibrate`` writes, so ``cluster.profile``
applies it to ``run`` and ``sweep`` alike.

What each field is made of:

- ``gpu.op_table``: every compute op the traces name a key for, its mean time (on a
  CPU run with the host's gap between two ops added, as the replay's executor spends
  it): a labelled replay's every op; a real run's GEMMs by their recorded shapes,
  keyed as parasim lowers a GEMM of that shape, so a prediction of the same model
  and layout takes their measured times;
- ``gpu.matmul_efficiency`` and ``gpu.kernel_launch_overhead``: the line
  ``t = t0 + flops / R`` through the GEMMs (:func:`~simulator.common.fitting.fit_line`),
  ``R`` over the peak; ``gpu.gemm_table``: each measured shape's own efficiency once
  ``t0`` is taken off, which the GEMM model anchors on for shapes not measured;
- ``gpu.attention_efficiency``: the median share of peak of the attention kernels
  whose shapes were recorded (the matmul efficiency where none was);
- ``gpu.hbm_bandwidth``: the median rate of the memory-bound ops of a megabyte or more
  (the preset's where none was);
- ``gpu.jitter``: the ranks' spread of compute per step (:mod:`simulator.traces.measure`);
- ``comm``: per collective and scope, the line through the calls' sizes and times as
  the ring model reads it (``alpha`` per step, bus ``bandwidth``), and their ``table``:
  each size's mean time after its last member arrived, which a prediction of the same
  calls takes as measured.

A field the traces cannot measure keeps the preset's value (its peak FLOP/s is the
reference of every efficiency); ``trace`` says what the profile was made from, the
kernels it could not classify among it.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.common.fitting import FitError, fit_line
from simulator.engine.collectives import algorithm_steps, bus_factor
from topologies import load_cluster_spec, parse_flops
from topologies.devices import CPU_PRESET, preset_of_device
from topologies.profile import PROFILE_FORMAT, PROFILE_VERSION
from topologies.spec import LONGEST_MEASURED, SHORTEST_MEASURED, GPUSpec

from .kernels import ATTENTION_FAMILY, FAMILIES, GEMM_FAMILY
from .kineto import TraceError, read_traces
from .measure import OpSample, TraceMeasurements, measure_traces

__all__ = ["MEMORY_BOUND_BYTES", "calibrate_from_traces", "op_table_rows", "profile_from_traces"]

#: Below this many bytes a memory-bound op's time is mostly its launch: not a rate.
MEMORY_BOUND_BYTES = 1 << 20
_MEMORY_FAMILIES = ("elementwise", "norm", "optimizer", "copy")
#: A fit's residual below a picosecond is its arithmetic's rounding: written as 0.
SHORTEST_RESIDUAL = 1e-12


def _measured(seconds: float) -> float:
    return min(LONGEST_MEASURED, max(SHORTEST_MEASURED, seconds))


def _gemm_fit(gemms: list[OpSample], peak: float, preset: GPUSpec) -> tuple[float, float, float]:
    """``(efficiency, t0, rms)`` of the GEMMs' line; the preset's where the GEMMs give
    no line (one size, or times that do not grow)."""
    if gemms:
        try:
            t0, per_flop, rms = fit_line([g.flops for g in gemms], [g.seconds for g in gemms])
            return min(1.0, 1.0 / per_flop / peak), t0, rms
        except FitError:
            rate = statistics.median(g.flops / g.seconds for g in gemms)
            return min(1.0, rate / peak), 0.0, 0.0
    return preset.matmul_efficiency, preset.kernel_launch_overhead, 0.0


def _gemm_table(gemms: list[OpSample], t0: float, peak: float) -> list[list[float]]:
    """``(m, n, k, efficiency)`` of each measured shape (batch 1), its mean time less
    ``t0``."""
    by_shape: dict[tuple[int, int, int], list[OpSample]] = {}
    for sample in gemms:
        if sample.shape is not None and sample.batch == 1:
            by_shape.setdefault(sample.shape, []).append(sample)
    table = []
    for (m, n, k), samples in sorted(by_shape.items()):
        seconds = max(statistics.fmean(s.seconds for s in samples) - t0, 1e-12)
        efficiency = min(1.0, 2.0 * m * n * k / seconds / peak)
        if efficiency > 0:
            table.append([m, n, k, efficiency])
    return table


def _op_table(ops: list[OpSample], host_gap: float) -> list[dict[str, Any]]:
    """Each keyed op's mean time, the host's gap added."""
    by_key: dict[tuple, list[float]] = {}
    for sample in ops:
        if sample.key is not None:
            by_key.setdefault(sample.key, []).append(sample.seconds)
    return op_table_rows(by_key, host_gap)


def op_table_rows(samples: dict[tuple, list[float]], added: float) -> list[dict[str, Any]]:
    """A profile's ``gpu.op_table``: per op key (kind, FLOPs, bytes, shape, batch,
    FP8), the mean of its measured times with ``added`` seconds (the host's own cost
    per op). The mean, not the median: a step is a sum of many such ops, so an op's
    occasional slow runs (a tick, a preemption) count in proportion."""
    return [
        {
            "kind": kind,
            "flops": flops,
            "bytes": size,
            "shape": list(shape) if shape is not None else None,
            "batch": batch,
            "fp8": fp8,
            "seconds": _measured(statistics.fmean(values) + added),
        }
        for (kind, flops, size, shape, batch, fp8), values in samples.items()
    ]


def _comm(measurements: TraceMeasurements) -> dict[str, dict[str, dict[str, Any]]]:
    """Per kind and scope, the ring model's fit through the calls and their table."""
    grouped: dict[tuple[str, str], list] = {}
    for call in measurements.calls:
        if call.ranks > 1 and call.bytes > 0 and call.seconds > 0:
            grouped.setdefault((call.kind, call.scope), []).append(call)
    comm: dict[str, dict[str, dict[str, Any]]] = {}
    for (kind, scope), calls in sorted(grouped.items()):
        if len(calls) < 2:
            continue
        ranks = statistics.mode(c.ranks for c in calls)
        alike = [c for c in calls if c.ranks == ranks]
        sizes = [c.bytes for c in alike]
        times = [c.seconds for c in alike]
        try:
            a, b, rms = fit_line(sizes, times) if len(set(sizes)) > 1 else (0.0, 0.0, 0.0)
        except FitError:
            a, b, rms = 0.0, 0.0, 0.0
        if b <= 0:  # one size, or sizes whose times do not grow: through the origin
            b = statistics.fmean(t / s for t, s in zip(times, sizes, strict=True))
            rms = statistics.pstdev(times)
        rms = rms if rms >= SHORTEST_RESIDUAL else 0.0  # a perfect fit's rounding
        steps = max(1, algorithm_steps(kind, ranks)) if kind != "p2p" else 1
        factor = bus_factor(kind, ranks) if kind != "p2p" else 1.0
        table: dict[tuple[int, float], list[float]] = {}
        for call in calls:
            table.setdefault((call.ranks, call.bytes), []).append(call.seconds)
        algorithms: dict[str, int] = {}
        for call in calls:
            if call.algorithm or call.protocol:
                name = f"{call.algorithm or '?'}/{call.protocol or '?'}"
                algorithms[name] = algorithms.get(name, 0) + 1
        comm.setdefault(kind, {})[scope] = {
            "alpha": a / steps,
            "bandwidth": factor / b,
            "rms_residual_s": rms,
            "points": len(alike),
            "ranks": ranks,
            "table": [
                {"ranks": n, "bytes": size, "seconds": _measured(statistics.fmean(values))}
                for (n, size), values in sorted(table.items())
            ],
            "algorithms": algorithms,
        }
    return comm


def _memory_bandwidth(ops: list[OpSample], t0: float, preset: GPUSpec) -> float:
    rates = [
        s.bytes / (s.seconds - t0)
        for s in ops
        if s.family in _MEMORY_FAMILIES and s.bytes >= MEMORY_BOUND_BYTES and s.seconds > t0
    ]
    return statistics.median(rates) if rates else preset.hbm_bandwidth


def profile_from_traces(
    measurements: TraceMeasurements,
    peak_flops: float,
    peak_source: str,
    preset: GPUSpec,
    sources: Sequence[str],
) -> dict[str, Any]:
    """The profile (a JSON-ready dict) of what ``measurements`` measured, efficiencies
    against ``peak_flops``, unmeasured fields the ``preset``'s."""
    m = measurements
    host_gap = m.host_gap
    gemms = [s for s in m.ops if s.family == GEMM_FAMILY and s.flops > 0 and s.seconds > 0]
    efficiency, t0, gemm_rms = _gemm_fit(gemms, peak_flops, preset)
    gemm_rms = gemm_rms if gemm_rms >= SHORTEST_RESIDUAL else 0.0
    attention = [
        s.flops / s.seconds / peak_flops
        for s in m.ops
        if s.family == ATTENTION_FAMILY and s.flops > 0 and s.seconds > 0
    ]
    metadata = m.metadata
    device_name = (m.devices[0] if m.devices else None) or metadata.get("device") or "cpu"
    per_node = max(1, m.per_node)
    device: dict[str, Any] = {
        "name": str(device_name)[:100],
        "type": "cuda" if m.on_gpu else "cpu",
        "count": len(m.ranks),
        "per_node": per_node,
        "nodes": max(1, -(-len(m.ranks) // per_node)),
    }
    if isinstance(metadata.get("cores"), int) and not m.on_gpu:
        device["cores"] = metadata["cores"]
    families = {
        family: {"ops": int(m.families[family][0]), "seconds": m.families[family][1]}
        for family in FAMILIES
        if family in m.families
    }
    unknown = sorted(m.unknown.items(), key=lambda item: -item[1][1])
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "software": {
            "torch": str(metadata.get("torch") or "unknown"),
            "backend": m.backend or ("nccl" if m.on_gpu else "gloo"),
            "backend_version": "from the traces",
        },
        "gpu": {
            "peak_flops": peak_flops,
            "matmul_efficiency": efficiency,
            "attention_efficiency": min(1.0, statistics.median(attention))
            if attention
            else efficiency,
            "kernel_launch_overhead": t0 + host_gap,
            "hbm_bandwidth": _memory_bandwidth(m.ops, t0, preset),
            "gemm_table": _gemm_table(gemms, t0, peak_flops),
            "op_table": _op_table(m.ops, host_gap),
            "jitter": m.jitter,
        },
        "comm": _comm(m),
        "fits": {
            "peak_flops_source": peak_source,
            "matmul_rms_residual_s": gemm_rms,
            "gemms": len(gemms),
        },
        "trace": {
            "files": list(sources),
            "ranks": m.ranks,
            "labelled": m.labelled,
            "host_gap_s": host_gap,
            "families": families,
            "unknown": [
                {"name": name[:300], "kernels": int(count), "seconds": seconds}
                for name, (count, seconds) in unknown
            ],
            "median_step_s": {
                str(rank): statistics.median(steps) for rank, steps in m.steps.items() if steps
            },
        },
    }


def calibrate_from_traces(
    paths: Sequence[Path], preset: str | None = None, peak_flops: str | None = None
) -> tuple[dict[str, Any], TraceMeasurements, list[Path]]:
    """The profile of the run whose traces ``paths`` name (files or folders), with the
    measurements it was made from and the folder files passed over. The peak FLOP/s
    efficiencies are taken against: ``peak_flops``, else ``preset``'s, else the preset
    of the traces' device (a CPU run's: ``cpu-localhost``)."""
    traces, passed_over = read_traces(paths)
    measurements = measure_traces(traces)
    name = preset
    if name is None:
        if not measurements.on_gpu:
            name = CPU_PRESET
        else:
            device = measurements.devices[0] if measurements.devices else ""
            name = preset_of_device(device)
            if name is None and peak_flops is None:
                shown = f"device {device!r}" if device else "a GPU the traces do not name"
                raise TraceError(
                    f"--from-trace: no preset matches {shown}: give --preset or --peak-flops"
                )
    gpu = load_cluster_spec({"preset": name or CPU_PRESET, "nodes": 1}).gpu
    if peak_flops is not None:
        peak, source = parse_flops(peak_flops), f"--peak-flops {peak_flops}"
    else:
        peak, source = gpu.peak_flops, f"preset {name}"
    files = [str(trace.path) for trace in traces]
    return profile_from_traces(measurements, peak, source, gpu, files), measurements, passed_over
