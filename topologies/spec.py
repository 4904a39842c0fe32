"""Validated description of a cluster: the numbers a ``Cluster`` is built from.

A :class:`ClusterSpec` is what a scenario's ``cluster:`` block becomes once its
preset is merged with the overrides (see :mod:`topologies.build`). Its groups'
names are part of parasim's file format:

- ``gpu`` — peak dense bf16 rate, HBM bandwidth and capacity, the fractions of
  peak that large GEMMs and fused attention reach, the kernel launch overhead, and the
  board's power limit, TDP and clocks (:mod:`topologies.clocks`);
- ``nvswitch`` — per-GPU NVLink bandwidth per direction and GPU-to-GPU latency, for
  nodes whose GPUs meet at an NVLink switch;
- ``pcie`` — for nodes without NVLink: the GPUs' PCIe links, their PCIe switches
  (``gpus_per_switch`` GPUs each) and the host bridge that joins the switches;
- ``nic`` — NICs per node, their line rate, adapter latency and the PCIe bandwidth
  between a GPU and its NIC;
- ``network`` — switch port-to-port latency, the leaf oversubscription, and the
  pods (``pod_size`` nodes each) joined by a core;
- ``topology`` — instead of ``nvswitch``/``pcie``, ``nic`` and ``network``: a custom
  fabric, either per dimension (``dimensions``) or as an explicit graph
  (``devices`` and ``links``); see :mod:`topologies.custom` for the file format.

A cluster built from groups gives ``nic``, ``network`` and exactly one of
``nvswitch`` or ``pcie``; a cluster with a ``topology`` gives none of those four.
:func:`check_cluster_spec` enforces this and the other checks that span groups.

Fields take human units (``"450 GB/s"``) and hold SI floats. Unknown keys are
errors, and so is a bandwidth, capacity or FLOP rate that is zero or negative or beyond
what a device has (:data:`~topologies.units.PLAUSIBLE`). The measured tables a
calibration profile brings (``gemm_table``, ``op_table``, a fit's ``table``) hold at most
:data:`LARGEST_TABLE` rows of whole, positive dimensions, efficiencies in (0, 1] and
times a device can take.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from .clocks import check_power_limit, compute_clock_factor
from .errors import TopologyError
from .units import Bandwidth, Bytes, FlopRate, Hertz, Seconds, Watts
from .validation import LARGEST_COUNT, ConfigModel, Name, nearest_key_hint, shown

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "GPUSpec",
    "MeasuredOp",
    "NVSwitchSpec",
    "PCIeSpec",
    "NICSpec",
    "NetworkSpec",
    "DimensionSpec",
    "DeviceSpec",
    "GraphLinkSpec",
    "TopologySpec",
    "ClusterSpec",
    "CommFit",
    "MeasuredCall",
    "ScopedFits",
    "CalibrationSpec",
    "check_cluster_spec",
    "check_topology",
    "COMM_KINDS",
    "COMM_SCOPES",
    "LARGEST_TABLE",
    "GemmRow",
]

#: The most rows a measured table holds (``gemm_table``, ``op_table``, a fit's
#: ``table``): a calibration measures hundreds to a few thousand shapes or calls.
LARGEST_TABLE = 10_000
#: The most FLOPs one measured op may count: the largest GEMM of a trillion-parameter
#: model's step is about 1e16 FLOPs, so this is far above any real op.
LARGEST_OP_FLOPS = 1e21
#: The most bytes one measured op or call may move: an EiB, as the largest size.
LARGEST_OP_BYTES = 2.0**60
#: The range of a measured op's or call's time, seconds: a nanosecond (nothing a
#: device runs completes sooner) to an hour (a CPU's slowest op takes seconds).
SHORTEST_MEASURED, LONGEST_MEASURED = 1e-9, 3600.0
#: The smallest fraction of peak an efficiency may be: a millionth, below any kernel or
#: link (the smallest GEMMs a calibration times reach about 1e-4 of a GPU's peak).
SMALLEST_FRACTION = 1e-6
#: The largest oversubscription, either way: a 1024:1 leaf has never been built.
LARGEST_RATIO = 1024.0
#: The largest GEMM prologue and epilogue, in elements of ``k``: a few hundred in
#: practice (the default 256), 65,536 (a whole hidden size) far beyond.
LARGEST_K_OVERHEAD = 65_536.0
#: The communication kinds a calibration fits: the collectives the Schedule IR names
#: (``simulator.common.vocabulary.COLLECTIVE_KINDS``, which ``topologies`` may not
#: import; a test keeps the two equal) and point-to-point transfers.
CommKind = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "barrier",
    "p2p",
]
COMM_KINDS: tuple[str, ...] = get_args(CommKind)
#: The scopes a fit is measured in.
CommScope = Literal["intra_node", "inter_node"]
COMM_SCOPES: tuple[str, ...] = get_args(CommScope)


def _positive(value: float) -> float:
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _fraction(value: float) -> float:
    if not SMALLEST_FRACTION <= value <= 1:
        raise ValueError(f"must be a fraction of peak in [{SMALLEST_FRACTION:g}, 1]")
    return value


def _ratio(value: float) -> float:
    _positive(value)
    if not 1 / LARGEST_RATIO <= value <= LARGEST_RATIO:
        raise ValueError(f"must be a ratio from 1/{LARGEST_RATIO:g} to {LARGEST_RATIO:g}")
    return value


def _not_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true/false")
    return value


def _at_least_one(value: int) -> int:
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _gemm_dimension(value: float) -> float:
    if not (value.is_integer() and 1 <= value <= LARGEST_COUNT):
        raise ValueError(f"a GEMM dimension is a whole number from 1 to {LARGEST_COUNT}")
    return value


PositiveBandwidth = Annotated[Bandwidth, AfterValidator(_positive)]
PositiveBytes = Annotated[Bytes, AfterValidator(_positive)]
PositiveFlopRate = Annotated[FlopRate, AfterValidator(_positive)]
PositiveWatts = Annotated[Watts, AfterValidator(_positive)]
PositiveHertz = Annotated[Hertz, AfterValidator(_positive)]
Ratio = Annotated[float, AfterValidator(_ratio)]
Fraction = Annotated[float, AfterValidator(_fraction)]
Count = Annotated[int, BeforeValidator(_not_bool), AfterValidator(_at_least_one)]
GemmDimension = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_gemm_dimension)]
GemmRow = tuple[GemmDimension, GemmDimension, GemmDimension, Fraction]
"""A measured GEMM: ``(m, n, k, efficiency)``, whole positive dimensions and the
fraction of peak it reached."""
MeasuredSeconds = Annotated[float, Field(ge=SHORTEST_MEASURED, le=LONGEST_MEASURED)]


class _Spec(ConfigModel):
    model_config = ConfigDict(frozen=True)  # and ConfigModel's rules, merged in


class MeasuredOp(_Spec):
    """A compute op's measured time (``parasim calibrate --scenario``), keyed by what
    decides an op's time in the model: its kind, FLOPs, bytes, shape, batch and FP8."""

    kind: str = Field(min_length=1, max_length=64)
    flops: float = Field(ge=0, le=LARGEST_OP_FLOPS)
    bytes: float = Field(ge=0, le=LARGEST_OP_BYTES)
    shape: tuple[Count, Count, Count] | None = None
    batch: Count = 1
    fp8: bool = False
    seconds: MeasuredSeconds
    """Its median time on the calibrated device, seconds, per-op costs included."""

    @property
    def key(self) -> tuple:
        return (self.kind, self.flops, self.bytes, self.shape, self.batch, self.fp8)


class GPUSpec(_Spec):
    """One GPU: compute roofline and memory."""

    name: Name
    peak_flops: PositiveFlopRate
    """Dense bf16 tensor-core peak, FLOP/s."""
    fp8_peak_flops: PositiveFlopRate | None = None
    """Dense FP8 tensor-core peak, FLOP/s (None: the GPU has no FP8 tensor cores)."""
    hbm_bandwidth: PositiveBandwidth
    """HBM bandwidth, bytes/s."""
    hbm_capacity: PositiveBytes
    """HBM capacity, bytes."""
    matmul_efficiency: Fraction
    """Fraction of ``peak_flops`` that large bf16 GEMMs reach."""
    fp8_matmul_efficiency: Fraction | None = None
    """Fraction of ``fp8_peak_flops`` that large FP8 GEMMs reach (None: as bf16's,
    ``matmul_efficiency``); the GEMM shape model applies to both."""
    attention_efficiency: Fraction | None = None
    """Fraction of ``peak_flops`` that the fused attention kernel reaches, the causal
    mask's skipped blocks aside (None: from the kernel's published benchmarks on this
    kind of GPU, ``simulator.engine.attention_kernels``; a profile's measurement or a
    value given here replaces them)."""
    sustained_fraction: Fraction = 1.0
    """Share of the tensor-core rate that microbenchmarks reach (``matmul_efficiency``,
    ``attention_efficiency``) which a training step sustains between its other kernels;
    one value for every GPU preset, fitted on the open validation suite
    (``python -m benchmarks.validate --cross-validate``)."""
    kernel_launch_overhead: Seconds
    """Time added to every kernel, seconds."""
    hbm_efficiency: Fraction = 1.0
    """Fraction of ``hbm_bandwidth`` that streaming (elementwise) kernels reach."""
    sm_count: Count | None = None
    """Streaming multiprocessors: the GEMM model's wave size (None: no shape model)."""
    gemm_tile: tuple[Count, Count] | None = None
    """The largest CTA tile ``(m, n)`` cuBLAS runs bf16 GEMMs with on this GPU."""
    gemm_k_overhead: float = Field(default=256.0, gt=0, le=LARGEST_K_OVERHEAD)
    """A GEMM tile's prologue and epilogue, in elements of ``k`` (the short-k penalty)."""
    gemm_table: tuple[GemmRow, ...] = Field(default=(), max_length=LARGEST_TABLE)
    """Measured GEMM efficiencies by shape, ``(m, n, k, efficiency)`` rows (a profile's)."""
    host_overhead: Seconds = 0.0
    """Host time to issue one op (framework, autograd, kernel launches), seconds."""
    comm_on_compute_cores: bool = False
    """Whether collectives run on the cores that compute runs on, so that the two take
    turns instead of overlapping: gloo's threads on a CPU rank's own core (true in the
    cpu-localhost preset; a profile sets it from the cores each rank had). A GPU's
    collectives run on SMs beside compute (see the interference of overlapped ops)."""
    op_table: tuple[MeasuredOp, ...] = Field(default=(), max_length=LARGEST_TABLE)
    """Measured compute ops (a profile calibrated at a scenario's shapes): an op that
    matches one takes its measured time instead of the model's."""
    jitter: float = Field(default=0.0, ge=0, le=0.5)
    """Rank-to-rank spread of compute time within a step, as a relative standard
    deviation: each rank's compute runs ``1 + jitter·z`` times as long, ``z`` drawn per
    rank from the scenario's seed. 0 in the datasheet presets; fitted by calibration."""
    devices_per_core: float = Field(default=1.0, ge=1.0, le=1024.0)
    """CPU devices only: how many of a node's ranks share one core (4 ranks on 2 cores:
    2). The ranks that compute at once share the node's cores: with ``k`` of them
    computing, each runs ``max(1, k / cores)`` times slower. 1 (a core or more each) in
    the presets; a profile sets it from the cores it measured."""
    tdp_w: PositiveWatts | None = None
    """The board's TDP, watts: its default and largest power limit (datasheet)."""
    power_limit_w: PositiveWatts | None = None
    """The power limit the GPUs run at (``nvidia-smi -pl``), watts; None: the TDP. Below
    the TDP, compute-bound kernels run at the lower sustained clock the limit leaves
    (:mod:`topologies.clocks`); needs ``tdp_w`` and ``static_power_w``."""
    min_power_limit_w: PositiveWatts | None = None
    """The lowest limit the board enforces (nvidia-smi's *Min Power Limit*), watts."""
    static_power_w: PositiveWatts | None = None
    """The board's power that does not follow the SM clock (HBM, I/O, leakage), watts:
    the ``P_static`` of ``P = P_static + k·f³``."""
    boost_clock_hz: PositiveHertz | None = None
    """The SM clock the datasheet peaks assume, hertz."""
    sustained_clock_hz: PositiveHertz | None = None
    """The SM clock a sustained bf16 GEMM load holds at the TDP, hertz: what
    ``matmul_efficiency`` already includes."""

    @property
    def compute_clock_factor(self) -> float:
        """What the compute peaks are multiplied by at ``power_limit_w``: 1.0 at the TDP
        (the default), ``f(limit) / f(TDP)`` below it (:mod:`topologies.clocks`)."""
        return compute_clock_factor(self)


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
    nvls_efficiency: Fraction = 0.85
    """Fraction of the NVLink bandwidth NVLS reaches (NCCL's nvlsEfficiency)."""


class PCIeSpec(_Spec):
    """A node without NVLink: GPUs on PCIe switches joined by the host bridge.

    GPU ``i`` of a node sits on switch ``i // gpus_per_switch``. Two GPUs on one
    switch talk through it; two on different switches go up to the host bridge
    (the CPU's root complex) and down again.
    """

    bandwidth: PositiveBandwidth
    """Data rate of a GPU's PCIe link into its switch, per direction, bytes/s."""
    latency: Seconds
    """One-way GPU-to-GPU latency through one PCIe switch, seconds."""
    gpus_per_switch: Count
    """GPUs below each PCIe switch; must divide ``gpus_per_node``."""
    host_bandwidth: PositiveBandwidth | None = None
    """Data rate of each switch's uplink to the host bridge, per direction, bytes/s.
    Default: ``bandwidth`` (an uplink as wide as one GPU's link, e.g. both x16)."""
    host_latency: Seconds | None = None
    """Latency the host bridge adds when a transfer crosses it, seconds. Default:
    ``latency``. NCCL's tuner (src/graph/tuning.cc, hwLat) prices every PCIe hop
    alike, whether the path crosses a switch or the host bridge."""

    @property
    def uplink_bandwidth(self) -> float:
        """Switch-to-host bandwidth per direction, bytes/s (``host_bandwidth`` or ``bandwidth``)."""
        return self.bandwidth if self.host_bandwidth is None else self.host_bandwidth

    @property
    def bridge_latency(self) -> float:
        """Latency of the host bridge, seconds (``host_latency`` or ``latency``)."""
        return self.latency if self.host_latency is None else self.host_latency


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
    """The rail-optimised fat tree between nodes: leaves and a spine per pod, a core.

    Nodes are grouped into pods of ``pod_size`` consecutive nodes (the last pod may
    be smaller), as the NVIDIA DGX SuperPOD reference architecture groups DGX
    systems into scalable units (32 DGX H100 systems per SU), each with its own
    rail-aligned leaves and spine, the SUs joined by core switches.
    """

    switch_latency: Seconds
    """Port-to-port latency of one switch (leaf, spine or core), seconds."""
    oversubscription: Ratio
    """Leaf downlink : uplink bandwidth; 1 is non-blocking, 2 halves the uplinks."""
    pod_size: Count | None = None
    """Nodes per pod; default: every node in one pod (no core)."""
    core_oversubscription: Ratio = 1.0
    """A pod's leaf uplinks : its spine's uplink to the core; 1 is non-blocking."""


class DimensionSpec(_Spec):
    """One dimension of a per-dimension custom topology (innermost first)."""

    kind: Literal["switch", "ring"]
    """``switch``: the GPUs along the dimension share one switch; ``ring``: each
    GPU links to its two neighbours along the dimension (wrapping around)."""
    size: Count
    """GPUs along the dimension."""
    bandwidth: PositiveBandwidth
    """Per direction, bytes/s: of each GPU's link into the switch, or of each ring hop."""
    latency: Seconds
    """Seconds: GPU to GPU through the switch, or one ring hop."""


class DeviceSpec(_Spec):
    """One vertex of an explicit-graph custom topology."""

    name: Name
    kind: Literal["gpu", "switch", "nic"]


class GraphLinkSpec(_Spec):
    """One link of an explicit-graph custom topology."""

    a: Name
    b: Name
    bandwidth: PositiveBandwidth
    """Per direction, bytes/s."""
    latency: Seconds
    """One way, seconds."""
    bidirectional: bool = True
    """``false``: only ``a -> b`` exists."""


class TopologySpec(_Spec):
    """A custom fabric: ``dimensions``, or ``devices`` and ``links`` (one form only)."""

    dimensions: tuple[DimensionSpec, ...] | None = None
    devices: tuple[DeviceSpec, ...] | None = None
    links: tuple[GraphLinkSpec, ...] | None = None
    intra_node_link: Literal["nvlink", "pci"] = "nvlink"
    """What joins the GPUs of a node, for NCCL's intra-node latency table."""
    nvls: bool = False
    """Whether the node's switch reduces in-network (NCCL's NVLS algorithm)."""
    source: str = ""
    """The file the topology was read from ('' when given inline)."""

    @property
    def form(self) -> str:
        """``'dimensions'`` or ``'graph'``."""
        return "dimensions" if self.dimensions is not None else "graph"

    @property
    def num_gpus(self) -> int:
        """GPUs of the fabric: product of the sizes, or devices of kind ``gpu``."""
        if self.dimensions is not None:
            return math.prod(d.size for d in self.dimensions)
        return sum(1 for d in self.devices or () if d.kind == "gpu")


class MeasuredCall(_Spec):
    """One communication call's measured time inside a scenario's own step
    (``parasim calibrate --scenario``): from when its last member issued it to when it
    completed, at ``ranks`` members and ``bytes`` (an uneven all-to-all: the size of the
    even one its busiest member stands for)."""

    ranks: Count
    bytes: float = Field(ge=0, le=LARGEST_OP_BYTES)
    seconds: MeasuredSeconds


class CommFit(_Spec):
    """A measured latency–bandwidth fit ``t = steps·alpha + factor·S / bandwidth``, and
    the calls measured at their own sizes, which take their measured time instead."""

    alpha: Seconds
    """Latency per algorithm step, seconds."""
    bandwidth: PositiveBandwidth
    """Effective (bus) bandwidth per link, bytes/s."""
    table: tuple[MeasuredCall, ...] = Field(default=(), max_length=LARGEST_TABLE)
    """Calls measured in a scenario's step; a call of the same members and bytes takes
    the measured time."""

    def measured(self, ranks: int, size: float) -> float | None:
        """The measured time of a call of ``ranks`` members and ``size`` bytes, if any."""
        for call in self.table:
            if call.ranks == ranks and call.bytes == size:
                return call.seconds
        return None


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
    comm: dict[CommKind, ScopedFits] = {}
    note: str = ""
    """What the profile could not measure for this cluster (said in the result)."""


class ClusterSpec(_Spec):
    """A whole cluster: ``nodes`` identical nodes of ``gpus_per_node`` GPUs."""

    name: Name
    gpus_per_node: Count
    nodes: Count
    gpu: GPUSpec
    nvswitch: NVSwitchSpec | None = None
    pcie: PCIeSpec | None = None
    nic: NICSpec | None = None
    network: NetworkSpec | None = None
    topology: TopologySpec | None = None
    calibration: CalibrationSpec | None = None

    @property
    def num_gpus(self) -> int:
        """``nodes * gpus_per_node``."""
        return self.nodes * self.gpus_per_node


def check_cluster_spec(spec: ClusterSpec, prefix: str = "cluster") -> None:
    """Checks across groups that field validation cannot make; raises :class:`TopologyError`."""
    check_power_limit(spec.gpu, f"{prefix}.gpu")
    if spec.topology is not None:
        for group in ("nvswitch", "pcie", "nic", "network"):
            if getattr(spec, group) is not None:
                raise TopologyError(
                    f"{prefix}.{group}: not used with a custom topology ({prefix}.topology "
                    f"gives every link); remove it"
                )
        check_topology(spec.topology, spec.gpus_per_node, spec.nodes, f"{prefix}.topology")
        return
    if spec.nvswitch is not None and spec.pcie is not None:
        raise TopologyError(
            f"{prefix}.pcie: give exactly one of nvswitch (NVLink switch in every node) or "
            f"pcie (PCIe switches only), not both; set nvswitch: null to drop a preset's"
        )
    if spec.nvswitch is None and spec.pcie is None:
        raise TopologyError(
            f"{prefix}.nvswitch: required field is missing (give exactly one of nvswitch, "
            f"for NVLink nodes, or pcie, for PCIe-only nodes)"
        )
    for group in ("nic", "network"):
        if getattr(spec, group) is None:
            raise TopologyError(f"{prefix}.{group}: required field is missing")
    assert spec.nic is not None
    nics, gpus = spec.nic.per_node, spec.gpus_per_node
    if nics > gpus or gpus % nics:
        raise TopologyError(
            f"{prefix}.nic.per_node: per_node({nics}) must divide gpus_per_node({gpus}) "
            f"so that every NIC serves the same number of GPUs"
        )
    if spec.pcie is not None:
        per_switch = spec.pcie.gpus_per_switch
        if per_switch > gpus or gpus % per_switch:
            raise TopologyError(
                f"{prefix}.pcie.gpus_per_switch: gpus_per_switch({per_switch}) must divide "
                f"gpus_per_node({gpus}) so that every PCIe switch serves the same number of GPUs"
            )


def _sizes(dimensions: tuple[DimensionSpec, ...]) -> str:
    return " x ".join(str(d.size) for d in dimensions)


def check_topology(
    topology: TopologySpec, gpus_per_node: int, nodes: int, prefix: str = "cluster.topology"
) -> None:
    """A custom topology against the node size and count; raises :class:`TopologyError`.

    Checks that exactly one form is given, that the GPU count is ``nodes *
    gpus_per_node`` (per dimension: the innermost size is ``gpus_per_node``), that
    device names are unique and links name known devices, and that every GPU has a
    route to every other.
    """
    gpus = nodes * gpus_per_node
    graph_form = topology.devices is not None or topology.links is not None
    if topology.dimensions is not None and graph_form:
        raise TopologyError(
            f"{prefix}: give either dimensions (per-dimension form) or devices and links "
            f"(explicit graph), not both"
        )
    if topology.dimensions is not None:
        dims = topology.dimensions
        if not dims:
            raise TopologyError(f"{prefix}.dimensions: must list at least one dimension")
        if dims[0].size != gpus_per_node:
            raise TopologyError(
                f"{prefix}.dimensions[0].size: the innermost dimension is a node, but "
                f"size({dims[0].size}) != gpus_per_node({gpus_per_node})"
            )
        if topology.num_gpus != gpus:
            raise TopologyError(
                f"{prefix}.dimensions: sizes {_sizes(dims)} = {topology.num_gpus} GPUs, but "
                f"nodes({nodes}) x gpus_per_node({gpus_per_node}) = {gpus}"
            )
        return
    if topology.devices is None:
        raise TopologyError(
            f"{prefix}: required field is missing: dimensions, or devices and links"
        )
    if topology.links is None:
        raise TopologyError(
            f"{prefix}.links: required field is missing (an explicit graph needs devices and links)"
        )
    _check_graph(topology.devices, topology.links, gpus_per_node, nodes, prefix)


def _check_graph(
    devices: tuple[DeviceSpec, ...],
    links: tuple[GraphLinkSpec, ...],
    gpus_per_node: int,
    nodes: int,
    prefix: str,
) -> None:
    first: dict[str, int] = {}
    for i, device in enumerate(devices):
        if device.name in first:
            raise TopologyError(
                f"{prefix}.devices[{i}].name: duplicate device name {shown(device.name)} "
                f"(first at devices[{first[device.name]}])"
            )
        first[device.name] = i
    gpu_names = [d.name for d in devices if d.kind == "gpu"]
    gpus = nodes * gpus_per_node
    if len(gpu_names) != gpus:
        raise TopologyError(
            f"{prefix}.devices: {len(gpu_names)} devices of kind gpu, but nodes({nodes}) x "
            f"gpus_per_node({gpus_per_node}) = {gpus}"
        )
    import networkx as nx  # only a topology given as a graph needs it

    graph = nx.DiGraph()
    graph.add_nodes_from(first)
    seen: dict[tuple[str, str], int] = {}
    for i, link in enumerate(links):
        for end in ("a", "b"):
            name = getattr(link, end)
            if name not in first:
                hint = nearest_key_hint(name, list(first))
                raise TopologyError(
                    f"{prefix}.links[{i}].{end}: unknown device {shown(name)}{hint} "
                    f"(link {link.a} <-> {link.b})"
                )
        if link.a == link.b:
            raise TopologyError(f"{prefix}.links[{i}]: link from {shown(link.a)} to itself")
        pairs = [(link.a, link.b), (link.b, link.a)] if link.bidirectional else [(link.a, link.b)]
        for pair in pairs:
            if pair in seen:
                raise TopologyError(
                    f"{prefix}.links[{i}]: duplicate link {pair[0]} -> {pair[1]} "
                    f"(also in links[{seen[pair]}])"
                )
            seen[pair] = i
            graph.add_edge(*pair)
    _check_connected(graph, gpu_names, prefix)


def _check_connected(graph: nx.DiGraph, gpu_names: list[str], prefix: str) -> None:
    """Every GPU reaches every other: all GPUs lie in one strongly connected component."""
    import networkx as nx

    if len(gpu_names) < 2:
        return
    component = {
        name: i for i, c in enumerate(nx.strongly_connected_components(graph)) for name in c
    }
    home = component[gpu_names[0]]
    for index, name in enumerate(gpu_names[1:], start=1):
        if component[name] == home:
            continue
        src, dst = (0, index) if not nx.has_path(graph, gpu_names[0], name) else (index, 0)
        raise TopologyError(
            f"{prefix}.links: no route from GPU {src} ({shown(gpu_names[src])}) to GPU {dst} "
            f"({shown(gpu_names[dst])}); every GPU must reach every other"
        )
