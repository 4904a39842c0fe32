"""The network of a GPU cluster as a graph, with routing by rule.

A :class:`Cluster` is built from a :class:`~topologies.spec.ClusterSpec` for any
number of nodes. GPUs are numbered ``0 .. num_gpus-1`` node-major: GPU ``g`` is
local GPU ``g % gpus_per_node`` of node ``g // gpus_per_node``.

Vertices of :attr:`Cluster.graph` (a ``networkx.DiGraph``; attribute ``kind``):

- ``n{node}.gpu{i}`` — every GPU (``kind="gpu"``, with its global index ``gpu``);
- ``n{node}.nvswitch`` — the NVSwitch fabric of each node, seen as one switch;
- ``n{node}.nic{r}`` — each NIC; NIC ``r`` serves the GPUs of rail ``r``
  (local GPU ``i`` is on rail ``i // (gpus_per_node / nic.per_node)``; with one NIC
  per GPU, as in a DGX, GPU ``i`` uses NIC ``i``);
- ``leaf{r}`` — one leaf switch per rail: NIC ``r`` of every node plugs into it;
- ``spine`` — one spine joining the leaves.

Every physical link is two directed edges, one per direction, each carrying
``bandwidth`` (bytes/s in that direction), ``latency`` (seconds) and ``link_id``,
its index in :attr:`Cluster.links`. Bandwidths: GPU–NVSwitch ``nvswitch.bandwidth ×
nvswitch.link_efficiency`` (the data rate NVLink packets leave);
GPU–NIC ``nic.pcie_bandwidth``; NIC–leaf ``nic.bandwidth``; leaf–spine
``nodes * nic.bandwidth / network.oversubscription`` (non-blocking at 1).

Latency rule: each device on a path charges its own latency once — the NVSwitch
``nvswitch.latency``, a NIC ``nic.latency``, a leaf or the spine
``network.switch_latency``, a GPU nothing — split in two halves, one on the link
that enters it and one on the link that leaves it. A link's latency is therefore
half the latency of each of its two ends, and a route's latency is the sum over
the devices it passes through:

- same node: ``nvswitch.latency``, exactly;
- same rail, different nodes: ``2 * nic.latency + switch_latency`` (one leaf);
- different rails: ``2 * nic.latency + 3 * switch_latency`` (leaf, spine, leaf).

Routes follow a fixed rule, not a graph search, and are cached on first use:
GPU -> NVSwitch -> GPU inside a node; GPU -> NIC -> leaf -> NIC -> GPU across
nodes on one rail; GPU -> NIC -> leaf -> spine -> leaf -> NIC -> GPU across rails.
NCCL's PXN, which first moves the data over NVLink to the local GPU on the
destination's rail so that it stays off the spine, is not modelled yet.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import pairwise

import networkx as nx

from .errors import TopologyError
from .spec import ClusterSpec, check_cluster_spec
from .units import format_bandwidth, format_bytes, format_flops, format_time

__all__ = ["Cluster", "Link", "Route"]


@dataclass(frozen=True)
class Link:
    """One direction of one physical link; ``id`` is its index in :attr:`Cluster.links`."""

    id: int
    src: str
    dst: str
    bandwidth: float
    """Bytes/s in this direction."""
    latency: float
    """Seconds."""


@dataclass(frozen=True)
class Route:
    """The links a transfer crosses, in path order, and their summed latency (seconds)."""

    links: tuple[int, ...]
    latency: float


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


class Cluster:
    """GPUs, switches and NICs of a cluster, its links, and the route between any two GPUs."""

    def __init__(self, spec: ClusterSpec) -> None:
        check_cluster_spec(spec)
        self.spec = spec
        self.gpus_per_node: int = spec.gpus_per_node
        self.num_nodes: int = spec.nodes
        self.num_gpus: int = spec.nodes * spec.gpus_per_node
        self.nics_per_node: int = spec.nic.per_node
        self._gpus_per_rail = spec.gpus_per_node // spec.nic.per_node
        self.graph = nx.DiGraph()
        self.links: list[Link] = []
        self._link_ids: dict[tuple[str, str], int] = {}
        self._device_latency: dict[str, float] = {}
        self._routes: dict[tuple[int, int], Route] = {}
        self._build()

    # -- numbering -------------------------------------------------------------------

    def _index(self, gpu: int, where: str) -> int:
        """``gpu`` as a plain int (numpy integers welcome), checked against the range."""
        try:
            index = -1 if isinstance(gpu, bool) else operator.index(gpu)
        except TypeError:
            index = -1
        if not 0 <= index < self.num_gpus:
            raise TopologyError(
                f"{where}: GPU {gpu!r} is out of range 0..{self.num_gpus - 1} "
                f"({self.num_nodes} nodes x {self.gpus_per_node} GPUs)"
            )
        return index

    def node_of(self, gpu: int) -> int:
        """The node GPU ``gpu`` sits on."""
        return self._index(gpu, f"node_of({gpu!r})") // self.gpus_per_node

    def local_index(self, gpu: int) -> int:
        """The index of GPU ``gpu`` inside its node."""
        return self._index(gpu, f"local_index({gpu!r})") % self.gpus_per_node

    def rail_of(self, gpu: int) -> int:
        """The rail (index of the NIC and of the leaf switch) GPU ``gpu`` uses."""
        return self.local_index(gpu) // self._gpus_per_rail

    def gpu_name(self, gpu: int) -> str:
        """The graph vertex of GPU ``gpu``, e.g. ``'n1.gpu3'``."""
        return f"n{self.node_of(gpu)}.gpu{self.local_index(gpu)}"

    # -- construction ----------------------------------------------------------------

    def _add_device(self, name: str, kind: str, latency: float, **attrs: int) -> None:
        self.graph.add_node(name, kind=kind, **attrs)
        self._device_latency[name] = latency

    def _add_link(self, a: str, b: str, bandwidth: float) -> None:
        latency = (self._device_latency[a] + self._device_latency[b]) / 2
        for src, dst in ((a, b), (b, a)):
            link = Link(len(self.links), src, dst, bandwidth, latency)
            self.links.append(link)
            self._link_ids[(src, dst)] = link.id
            self.graph.add_edge(src, dst, bandwidth=bandwidth, latency=latency, link_id=link.id)

    def _build(self) -> None:
        spec = self.spec
        switch_latency = spec.network.switch_latency
        for node in range(self.num_nodes):
            for i in range(self.gpus_per_node):
                gpu = node * self.gpus_per_node + i
                self._add_device(f"n{node}.gpu{i}", "gpu", 0.0, node=node, gpu=gpu)
            self._add_device(f"n{node}.nvswitch", "nvswitch", spec.nvswitch.latency, node=node)
            for r in range(self.nics_per_node):
                self._add_device(f"n{node}.nic{r}", "nic", spec.nic.latency, node=node, rail=r)
        for r in range(self.nics_per_node):
            self._add_device(f"leaf{r}", "leaf", switch_latency, rail=r)
        self._add_device("spine", "spine", switch_latency)

        for node in range(self.num_nodes):
            for i in range(self.gpus_per_node):
                nvlink = spec.nvswitch.bandwidth * spec.nvswitch.link_efficiency
                self._add_link(f"n{node}.gpu{i}", f"n{node}.nvswitch", nvlink)
            for i in range(self.gpus_per_node):
                rail = i // self._gpus_per_rail
                self._add_link(f"n{node}.gpu{i}", f"n{node}.nic{rail}", spec.nic.pcie_bandwidth)
            for r in range(self.nics_per_node):
                self._add_link(f"n{node}.nic{r}", f"leaf{r}", spec.nic.bandwidth)
        uplink = self.num_nodes * spec.nic.bandwidth / spec.network.oversubscription
        for r in range(self.nics_per_node):
            self._add_link(f"leaf{r}", "spine", uplink)

    # -- routing ---------------------------------------------------------------------

    def route(self, src_gpu: int, dst_gpu: int) -> Route:
        """Links from ``src_gpu`` to ``dst_gpu`` in path order, with their total latency."""
        key = (src_gpu, dst_gpu)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        where = f"route({src_gpu!r}, {dst_gpu!r})"
        src_gpu, dst_gpu = self._index(src_gpu, where), self._index(dst_gpu, where)
        if src_gpu == dst_gpu:
            raise TopologyError(f"{where}: source and destination are the same GPU")
        src_node, dst_node = self.node_of(src_gpu), self.node_of(dst_gpu)
        src_rail, dst_rail = self.rail_of(src_gpu), self.rail_of(dst_gpu)
        path = [self.gpu_name(src_gpu)]
        if src_node == dst_node:
            path.append(f"n{src_node}.nvswitch")
        else:
            path += [f"n{src_node}.nic{src_rail}", f"leaf{src_rail}"]
            if src_rail != dst_rail:
                path += ["spine", f"leaf{dst_rail}"]
            path.append(f"n{dst_node}.nic{dst_rail}")
        path.append(self.gpu_name(dst_gpu))
        ids = tuple(self._link_ids[hop] for hop in pairwise(path))
        route = Route(ids, sum(self.links[i].latency for i in ids))
        self._routes[key] = route
        return route

    # -- summary ---------------------------------------------------------------------

    def describe(self) -> str:
        """One paragraph for humans: size, devices and link rates."""
        spec = self.spec
        gpu, nic, net = spec.gpu, spec.nic, spec.network
        blocking = (
            "non-blocking"
            if net.oversubscription == 1
            else f"{net.oversubscription:g}:1 oversubscribed"
        )
        return (
            f"{spec.name}: {_count(self.num_nodes, 'node')} x "
            f"{_count(self.gpus_per_node, 'GPU')} = "
            f"{self.num_gpus} GPUs ({gpu.name}: {format_flops(gpu.peak_flops)} bf16, "
            f"{format_bytes(gpu.hbm_capacity, binary=False)} HBM at "
            f"{format_bandwidth(gpu.hbm_bandwidth)}). Inside a node every GPU reaches the "
            f"NVSwitch at {format_bandwidth(spec.nvswitch.bandwidth)} per direction "
            f"({format_time(spec.nvswitch.latency)} GPU to GPU). Each node has "
            f"{_count(nic.per_node, 'NIC')} of {format_bandwidth(nic.bandwidth, bits=True)} "
            f"({format_bandwidth(nic.bandwidth)}) behind "
            f"{format_bandwidth(nic.pcie_bandwidth)} of PCIe, {format_time(nic.latency)} "
            f"per adapter; NIC r of every node plugs into leaf switch r, and the "
            f"{_count(nic.per_node, 'leaf', 'leaves')} meet at one spine ({blocking}, "
            f"{format_time(net.switch_latency)} per switch). "
            f"{len(self.links)} directed links."
        )

    def __repr__(self) -> str:
        return (
            f"Cluster({self.spec.name!r}, nodes={self.num_nodes}, "
            f"gpus_per_node={self.gpus_per_node}, num_gpus={self.num_gpus})"
        )
