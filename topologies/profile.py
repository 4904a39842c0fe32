"""Calibration profiles: measured parameters that replace a preset's.

``parasim calibrate`` (the ``hardware`` extra) measures matmul throughput, memory copy
bandwidth, collectives and point-to-point transfers, fits the model's parameters and
writes a *profile*: versioned JSON. A scenario names it with
``cluster: {preset: ..., profile: path}``; :func:`profile_overrides` turns it into
overrides that the preset is merged with before the scenario's own overrides, so an
explicit scenario value still wins.

Format (``format: parasim-calibration``, ``version: 1``)::

    {
      "format": "parasim-calibration", "version": 1, "created": "2026-11-29T10:00:00Z",
      "device": {"name": "...", "type": "cpu" | "cuda", "count": 2, "per_node": 2, "nodes": 1},
      "software": {"torch": "2.13.0", "backend": "gloo", "backend_version": "..."},
      "gpu": {"matmul_efficiency": 0.8, "attention_efficiency": 0.8,
              "kernel_launch_overhead": 5e-06, "hbm_bandwidth": 1.2e12, "peak_flops": 9.9e14,
              "gemm_table": [[4096, 4096, 4096, 0.78], ...]},   # optional
      "comm": {"all_reduce": {"intra_node": {"alpha": 2e-05, "bandwidth": 3e9,
                                              "rms_residual_s": 1e-06, "points": 8}}, ...},
      "matmul": [...], "memcopy": [...]          # the raw measurements
    }

A profile is read within the bounds of :func:`topologies.config_text.read_json` (its
nesting, values, strings and numbers; no ``NaN``, no key given twice) and its fields
are checked as strictly as a scenario's cluster: the same units, plausible ranges and
measured-table rows. A profile is refused, with one line saying why, when it is not a
JSON object, has another format or version, or lacks a field. One measured on nodes of
another size than the cluster's (``device.per_node != gpus_per_node``, e.g. one GPU of
an 8-GPU node) applies what it measured, and the result says what it could not
(:func:`profile_overrides`).

Calibrated at a scenario's shapes (``parasim calibrate --scenario``), ``gpu`` also holds
``op_table`` (each compute op's measured time, by kind, FLOPs, bytes, shape, batch and
FP8) and ``jitter`` (the ranks' spread of compute time), each communication fit a
``table`` of the calls measured in the scenario's own step (``ranks``, ``bytes``,
``seconds``), and ``executor`` the replay executor's own costs per op and per
collective, already added to the fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, ValidationError

from .config_text import ConfigTextError, read_json
from .errors import TopologyError
from .files import ConfigFileError, read_config_text
from .spec import (
    LARGEST_TABLE,
    CommKind,
    CommScope,
    Count,
    Fraction,
    GemmRow,
    MeasuredCall,
    MeasuredOp,
    PositiveBandwidth,
    PositiveFlopRate,
)
from .units import Seconds
from .validation import ConfigModel, Name, shown, validation_message

__all__ = ["PROFILE_FORMAT", "PROFILE_VERSION", "Profile", "load_profile", "profile_overrides"]

PROFILE_FORMAT = "parasim-calibration"
PROFILE_VERSION = 1


class _Open(ConfigModel):
    model_config = ConfigDict(extra="allow")  # over ConfigModel's rules, merged in


def _at_least_two(value: int) -> int:
    if value < 2:
        raise ValueError("a fit needs at least 2 points")
    return value


class ProfileDevice(_Open):
    name: Name
    type: Name
    count: Count
    per_node: Count
    nodes: Count


class ProfileSoftware(_Open):
    torch: Name
    backend: Name
    backend_version: Name = ""


class ProfileGPU(ConfigModel):
    """The device's fitted figures, in the types (units, ranges) of
    :class:`topologies.spec.GPUSpec`'s fields of the same names."""

    peak_flops: PositiveFlopRate
    matmul_efficiency: Fraction
    attention_efficiency: Fraction
    kernel_launch_overhead: Seconds
    hbm_bandwidth: PositiveBandwidth
    # measured GEMMs: (m, n, k, efficiency) rows the simulator's GEMM model anchors on
    gemm_table: list[GemmRow] = Field(default=[], max_length=LARGEST_TABLE)
    # measured compute ops at a scenario's shapes (calibrate --scenario), and the ranks'
    # spread of compute time (topologies.spec.GPUSpec's op_table and jitter)
    op_table: list[MeasuredOp] = Field(default=[], max_length=LARGEST_TABLE)
    jitter: float = Field(default=0.0, ge=0, le=0.5)


class ProfileFit(_Open):
    """One fit, in the types of :class:`topologies.spec.CommFit`."""

    alpha: Seconds
    bandwidth: PositiveBandwidth
    rms_residual_s: Seconds
    points: Annotated[Count, AfterValidator(_at_least_two)]
    # calls measured in a scenario's own step (calibrate --scenario)
    table: list[MeasuredCall] = Field(default=[], max_length=LARGEST_TABLE)


class Profile(_Open):
    format: str
    version: int
    created: Name
    device: ProfileDevice
    software: ProfileSoftware
    gpu: ProfileGPU
    comm: dict[CommKind, dict[CommScope, ProfileFit]] = {}


def load_profile(path: str | Path, prefix: str = "cluster.profile") -> Profile:
    """Read and check a profile; every problem is one :class:`TopologyError` line."""
    path = Path(path)
    where = f"{prefix} ({path.name})"
    try:
        payload: Any = read_json(read_config_text(path), where)
    except ConfigFileError as exc:
        raise TopologyError(f"{prefix}: cannot read {path} ({exc.reason})") from None
    except ConfigTextError as exc:
        raise TopologyError(str(exc)) from None
    if not isinstance(payload, dict):
        kind = "null" if payload is None else f"a JSON {type(payload).__name__}"
        raise TopologyError(
            f"{prefix}: {path} is not a parasim calibration profile ({kind}, not an object)"
        )
    if payload.get("format") != PROFILE_FORMAT:
        raise TopologyError(f"{prefix}: {path} is not a parasim calibration profile")
    if payload.get("version") != PROFILE_VERSION:
        raise TopologyError(
            f"{prefix}: {path} has profile version {shown(payload.get('version'))}; this "
            f"parasim reads version {PROFILE_VERSION}"
        )
    try:
        return Profile.model_validate(payload)
    except ValidationError as exc:
        raise TopologyError(validation_message(exc, Profile, where)) from None


def profile_overrides(
    profile: Profile, gpus_per_node: int | None, source: str, prefix: str = "cluster.profile"
) -> dict[str, Any]:
    """The cluster overrides a profile stands for. A profile measured on nodes of
    another size applies what it measured: its device (compute, memory, attention,
    launch costs) always, and its communication fits to the same kinds of links (a
    profile of one device per node measured none, so the preset's links stay); the
    calibration's ``note`` says so, and the result repeats it."""
    measured = profile.device.per_node
    if gpus_per_node is None:  # a cluster without a node size: validation names it later
        gpus_per_node = measured
    gpu = {**profile.gpu.model_dump(), "hbm_efficiency": 1.0}
    notes = []
    if measured != gpus_per_node:
        kept = (
            "NVLink, PCIe and the NICs keep the preset's figures"
            if measured == 1
            else f"its {measured}-device communication fits stand for these nodes' links"
        )
        notes.append(
            f"{prefix}: profile {source} was measured with {measured} device"
            f"{'s' if measured > 1 else ''} per node and the cluster has {gpus_per_node}: "
            f"its compute, memory, attention and launch costs apply, and {kept}"
        )
    cores = _cpu_cores(profile)
    if cores is not None:
        # gloo's threads share a rank's core unless each rank has two or more
        gpu["comm_on_compute_cores"] = cores / gpus_per_node < 2
        # CPU ranks beyond the machine's cores share them, as many as compute at once
        share = max(1.0, gpus_per_node / cores) / max(1.0, measured / cores)
        if share > 1:
            gpu["devices_per_core"] = share
            notes.append(
                f"{gpus_per_node} CPU ranks share the {cores} cores the profile measured: "
                f"those that compute at once share them, up to {share:.2g} times slower"
            )
    note = "; ".join(notes)
    comm = {
        kind: {
            scope: {
                "alpha": fit.alpha,
                "bandwidth": fit.bandwidth,
                "table": [call.model_dump() for call in fit.table],
            }
            for scope, fit in scopes.items()
        }
        for kind, scopes in profile.comm.items()
    }
    # the measured copy bandwidth is what streaming kernels reach: no further derating
    return {"gpu": gpu, "calibration": {"source": source, "comm": comm, "note": note}}


def _cpu_cores(profile: Profile) -> int | None:
    """The cores a CPU profile's ranks ran on (``device.cores``; None for a GPU
    profile, or one that does not say)."""
    cores = (profile.device.model_extra or {}).get("cores")
    if profile.device.type != "cpu" or not isinstance(cores, int) or cores < 1:
        return None
    return cores
