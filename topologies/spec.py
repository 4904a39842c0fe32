"""Validated description of a cluster: the numbers a ``Cluster`` is built from.

A :class:`ClusterSpec` is what a scenario's ``cluster:`` block becomes once its
preset is merged with the overrides (see :mod:`topologies.build`). It has four
groups whose names are part of parasim's file format:

- ``gpu`` — peak dense bf16 rate, HBM bandwidth and capacity, the fractions of
  peak that large GEMMs and fused attention reach, and the kernel launch overhead;
- ``nvswitch`` — per-GPU NVLink bandwidth per direction and GPU-to-GPU latency;
- ``nic`` — NICs per node, their line rate, adapter latency and the PCIe bandwidth
  between a GPU and its NIC;
- ``network`` — switch port-to-port latency and the leaf oversubscription.

Fields take human units (``"450 GB/s"``) and hold SI floats. Unknown keys are
errors, and so is a bandwidth, capacity or FLOP rate that is zero or negative.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from .errors import TopologyError
from .units import Bandwidth, Bytes, FlopRate, Seconds

__all__ = [
    "GPUSpec",
    "NVSwitchSpec",
    "NICSpec",
    "NetworkSpec",
    "ClusterSpec",
    "CommFit",
    "ScopedFits",
    "CalibrationSpec",
    "check_cluster_spec",
]


def _positive(value: float) -> float:
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _fraction(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError("must be a fraction of peak in (0, 1]")
    return value


def _not_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true/false")
    return value


def _at_least_one(value: int) -> int:
    if value < 1:
        raise ValueError("must be >= 1")
    return value


PositiveBandwidth = Annotated[Bandwidth, AfterValidator(_positive)]
PositiveBytes = Annotated[Bytes, AfterValidator(_positive)]
PositiveFlopRate = Annotated[FlopRate, AfterValidator(_positive)]
Fraction = Annotated[float, AfterValidator(_fraction)]
Count = Annotated[int, BeforeValidator(_not_bool), AfterValidator(_at_least_one)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GPUSpec(_Spec):
    """One GPU: compute roofline and memory."""

    name: str
    peak_flops: PositiveFlopRate
    """Dense bf16 tensor-core peak, FLOP/s."""
    hbm_bandwidth: PositiveBandwidth
    """HBM bandwidth, bytes/s."""
    hbm_capacity: PositiveBytes
    """HBM capacity, bytes."""
    matmul_efficiency: Fraction
    """Fraction of ``peak_flops`` that large bf16 GEMMs reach."""
    attention_efficiency: Fraction
    """Fraction of ``peak_flops`` that the fused attention kernel reaches."""
    kernel_launch_overhead: Seconds
    """Time added to every kernel, seconds."""


class NVSwitchSpec(_Spec):
    """The NVLink switch fabric inside one node."""

    bandwidth: PositiveBandwidth
    """NVLink bandwidth of one GPU into the switch, per direction, bytes/s."""
    latency: Seconds
    """One-way GPU-to-GPU latency through the switch, seconds."""
    link_efficiency: Fraction = 1.0
    """Fraction of ``bandwidth`` that carries data (packet headers take the rest)."""
    nvls: bool = False
    """Whether the switch reduces in-network (NVLink SHARP), enabling NCCL's NVLS."""


class NICSpec(_Spec):
    """The scale-out network adapters of one node."""

    per_node: Count
    """NICs per node; each serves ``gpus_per_node / per_node`` GPUs (a rail each)."""
    bandwidth: PositiveBandwidth
    """Line rate per direction, bytes/s."""
    latency: Seconds
    """Latency of one adapter (paid once sending, once receiving), seconds."""
    pcie_bandwidth: PositiveBandwidth
    """GPU <-> NIC PCIe bandwidth per direction, bytes/s."""


class NetworkSpec(_Spec):
    """The rail-optimised leaf/spine fabric between nodes."""

    switch_latency: Seconds
    """Port-to-port latency of one switch, seconds."""
    oversubscription: Annotated[float, AfterValidator(_positive)]
    """Leaf downlink : uplink bandwidth; 1 is non-blocking, 2 halves the uplinks."""


class CommFit(_Spec):
    """A measured latency–bandwidth fit ``t = steps·alpha + factor·S / bandwidth``."""

    alpha: Seconds
    """Latency per algorithm step, seconds."""
    bandwidth: PositiveBandwidth
    """Effective (bus) bandwidth per link, bytes/s."""


class ScopedFits(_Spec):
    """Fits of one communication kind inside a node and across nodes."""

    intra_node: CommFit | None = None
    inter_node: CommFit | None = None


class CalibrationSpec(_Spec):
    """Measured communication parameters that replace the links' line rates.

    ``comm`` maps a collective kind (``all_reduce``, ``all_gather``, ...) or ``p2p`` to
    its fits; a kind or scope without a fit keeps the modelled links.
    """

    source: str = ""
    comm: dict[str, ScopedFits] = {}


class ClusterSpec(_Spec):
    """A whole cluster: ``nodes`` identical nodes of ``gpus_per_node`` GPUs."""

    name: str
    gpus_per_node: Count
    nodes: Count
    gpu: GPUSpec
    nvswitch: NVSwitchSpec
    nic: NICSpec
    network: NetworkSpec
    calibration: CalibrationSpec | None = None


def check_cluster_spec(spec: ClusterSpec, prefix: str = "cluster") -> None:
    """Checks across groups that field validation cannot make; raises :class:`TopologyError`."""
    nics, gpus = spec.nic.per_node, spec.gpus_per_node
    if nics > gpus or gpus % nics:
        raise TopologyError(
            f"{prefix}.nic.per_node: per_node({nics}) must divide gpus_per_node({gpus}) "
            f"so that every NIC serves the same number of GPUs"
        )
