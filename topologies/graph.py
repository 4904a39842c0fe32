"""A custom fabric given as an explicit graph of devices and links.

The ``topology.devices`` and ``topology.links`` lists (see :mod:`topologies.custom`)
become the graph as written: each device a vertex named as in the file (``kind``
``gpu``, ``switch`` or ``nic``), each link two directed edges (one if
``bidirectional: false``) with its ``bandwidth`` per direction and its
``latency``. GPUs are numbered in the order the devices list them; GPU ``g`` is on
node ``g // gpus_per_node``, and its rail is its local index.

Routes are shortest paths by latency, found with networkx's Dijkstra from a GPU
the first time a route from it is asked for, and cached. A path may pass through
any device, GPUs included. Ties in latency go to the path with fewer hops (each
hop adds 1e-18 s to the search weight only, far below any latency written in a
file); among paths equal in both, to the one Dijkstra settles first, an order that
depends only on the file (graph insertion order), so the same file always gives
the same routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cluster import FileTopologyCluster, _count
from .units import format_time

if TYPE_CHECKING:
    pass

__all__ = ["GraphCluster"]

HOP_TIE_BREAK = 1e-18
"""Seconds added per hop to the search weight so that equal latencies prefer fewer hops."""


def _weight(_u: str, _v: str, edge: dict[str, Any]) -> float:
    return edge["latency"] + HOP_TIE_BREAK


class GraphCluster(FileTopologyCluster):
    """Devices and links exactly as a topology file lists them."""

    def _build(self) -> None:
        topology = self.spec.topology
        assert topology is not None and topology.devices is not None
        assert topology.links is not None
        self._gpu_names = [d.name for d in topology.devices if d.kind == "gpu"]
        index = {name: g for g, name in enumerate(self._gpu_names)}
        for device in topology.devices:
            if device.kind == "gpu":
                g = index[device.name]
                self._add_device(device.name, "gpu", node=g // self.gpus_per_node, gpu=g)
            else:
                self._add_device(device.name, device.kind)
        for link in topology.links:
            self._add_link(link.a, link.b, link.bandwidth, link.latency, link.bidirectional)
        self._paths: dict[int, dict[str, list[str]]] = {}

    def gpu_name(self, gpu: int) -> str:
        """The device name of GPU ``gpu`` as the topology file lists it."""
        return self._gpu_names[self._index(gpu, f"gpu_name({gpu!r})")]

    def _path(self, src_gpu: int, dst_gpu: int) -> list[str]:
        paths = self._paths.get(src_gpu)
        if paths is None:
            import networkx as nx  # routes by least latency: a graph search

            found = nx.single_source_dijkstra_path(
                self.graph, self._gpu_names[src_gpu], weight=_weight
            )
            paths = {name: found[name] for name in self._gpu_names if name in found}
            self._paths[src_gpu] = paths
        return paths[self._gpu_names[dst_gpu]]

    def describe(self) -> str:
        """One paragraph for humans: size and device counts."""
        kinds = [kind for _, kind in self.graph.nodes(data="kind")]
        latencies = [link.latency for link in self.links]
        return (
            f"{self._describe_size()} Custom topology given as a graph: "
            f"{_count(kinds.count('switch'), 'switch', 'switches')}, "
            f"{_count(kinds.count('nic'), 'NIC')}, "
            f"{len(self.links)} directed links ({format_time(min(latencies, default=0.0))} "
            f"to {format_time(max(latencies, default=0.0))} each), routed by least latency."
        )
