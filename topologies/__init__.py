"""Cluster presets and the network graph parasim simulates on.

``load_cluster_spec({"preset": "dgx-a100", "nodes": 16})`` reads a preset from
``topologies/presets/``, merges a scenario's overrides and validates it;
``build_cluster(spec)`` turns it into a :class:`Cluster`: a networkx graph of GPUs,
NVSwitches, NICs and rail-optimised leaf/spine switches whose links carry bandwidth
and latency, with :meth:`Cluster.route` giving the links between any two GPUs.
The units parser that every scenario field goes through lives here too.
"""

from __future__ import annotations

from .build import build_cluster, load_cluster_spec, load_preset, preset_names
from .cluster import Cluster, Link, Route
from .errors import TopologyError
from .spec import ClusterSpec, GPUSpec, NetworkSpec, NICSpec, NVSwitchSpec
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
    "ClusterSpec",
    "GPUSpec",
    "NVSwitchSpec",
    "NICSpec",
    "NetworkSpec",
    "TopologyError",
    "build_cluster",
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
