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

from .exports import lazy_exports

# Each public name and the module it lives in, imported on first use: so importing
# one light module (``topologies.units``, ``topologies.errors``) or starting the
# ``parasim`` command does not build networkx and the presets' models.
_EXPORTS = {
    "build_cluster": "topologies.build",
    "load_cluster_spec": "topologies.build",
    "load_preset": "topologies.build",
    "preset_names": "topologies.build",
    "Cluster": "topologies.cluster",
    "Link": "topologies.cluster",
    "Route": "topologies.cluster",
    "read_topology": "topologies.custom",
    "DimensionCluster": "topologies.dimensions",
    "TopologyError": "topologies.errors",
    "FatTreeCluster": "topologies.fattree",
    "GraphCluster": "topologies.graph",
    "ClusterSpec": "topologies.spec",
    "DeviceSpec": "topologies.spec",
    "DimensionSpec": "topologies.spec",
    "GPUSpec": "topologies.spec",
    "GraphLinkSpec": "topologies.spec",
    "NetworkSpec": "topologies.spec",
    "NICSpec": "topologies.spec",
    "NVSwitchSpec": "topologies.spec",
    "PCIeSpec": "topologies.spec",
    "TopologySpec": "topologies.spec",
    "Bandwidth": "topologies.units",
    "Bytes": "topologies.units",
    "FlopRate": "topologies.units",
    "Seconds": "topologies.units",
    "UnitError": "topologies.units",
    "format_bandwidth": "topologies.units",
    "format_bytes": "topologies.units",
    "format_flops": "topologies.units",
    "format_time": "topologies.units",
    "parse_bandwidth": "topologies.units",
    "parse_bytes": "topologies.units",
    "parse_flops": "topologies.units",
    "parse_time": "topologies.units",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
