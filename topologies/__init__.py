"""Cluster presets and the network graph parasim simulates on.

``load_cluster_spec({"preset": "dgx-a100", "nodes": 16})`` reads a preset from
``topologies/presets/``, merges a scenario's overrides and validates it;
``build_cluster(spec)`` turns it into a :class:`Cluster`: a networkx graph of GPUs,
NVSwitches or PCIe switches, NICs and a rail-optimised fat tree (leaves and a spine
per pod, a core between pods) whose links carry bandwidth and latency, with
:meth:`Cluster.route` giving the links between any two GPUs. A ``topology`` key
replaces the preset with a custom fabric read from YAML, given per dimension or as
an explicit graph (:mod:`topologies.custom`). The units parser that every scenario
field goes through lives here too.
"""

from __future__ import annotations

from .build import build_cluster, load_cluster_spec, load_preset, preset_names
from .cluster import Cluster, Link, Route
from .custom import read_topology
from .dimensions import DimensionCluster
from .errors import TopologyError
from .fattree import FatTreeCluster
from .graph import GraphCluster
from .spec import (
    ClusterSpec,
    DeviceSpec,
    DimensionSpec,
    GPUSpec,
    GraphLinkSpec,
    NetworkSpec,
    NICSpec,
    NVSwitchSpec,
    PCIeSpec,
    TopologySpec,
)
from .units import (
    Bandwidth,
    Bytes,
    FlopRate,
    Seconds,
    UnitError,
    format_bandwidth,
    format_bytes,
    format_flops,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
)

__all__ = [
    "Cluster",
    "Link",
    "Route",
    "FatTreeCluster",
    "DimensionCluster",
    "GraphCluster",
    "ClusterSpec",
    "GPUSpec",
    "NVSwitchSpec",
    "PCIeSpec",
    "NICSpec",
    "NetworkSpec",
    "TopologySpec",
    "DimensionSpec",
    "DeviceSpec",
    "GraphLinkSpec",
    "TopologyError",
    "build_cluster",
    "read_topology",
    "load_cluster_spec",
    "load_preset",
    "preset_names",
    "UnitError",
    "parse_bytes",
    "parse_bandwidth",
    "parse_time",
    "parse_flops",
    "Bytes",
    "Bandwidth",
    "Seconds",
    "FlopRate",
    "format_bytes",
    "format_bandwidth",
    "format_time",
    "format_flops",
]
