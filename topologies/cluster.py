"""The network of a GPU cluster as a graph, with a route between any two GPUs.

A :class:`Cluster` is built from a :class:`~topologies.spec.ClusterSpec` for any
number of nodes. GPUs are numbered ``0 .. num_gpus-1`` node-major: GPU ``g`` is
local GPU ``g % gpus_per_node`` of node ``g // gpus_per_node``.

:func:`topologies.build.build_cluster` builds the fabric the spec describes as an
instance of the matching subclass:

- :class:`~topologies.fattree.FatTreeCluster` — nodes with an NVSwitch (``nvswitch``)
  or PCIe switches only (``pcie``), NICs on rails, a rail-optimised leaf/spine fat
  tree per pod and a core between pods (``nic``, ``network``);
- :class:`~topologies.dimensions.DimensionCluster` — a custom topology given per
  dimension (``topology.dimensions``);
- :class:`~topologies.graph.GraphCluster` — a custom topology given as an explicit
  graph (``topology.devices`` and ``topology.links``).

What every cluster offers, and the simulator relies on: :attr:`Cluster.graph` (a
``networkx.DiGraph`` whose vertices carry ``kind``, GPUs also their index ``gpu``
and ``node``), :attr:`Cluster.links` (one :class:`Link` per direction of every
physical link, ``id`` its index in the list, the same as the edge's ``link_id``),
and :meth:`Cluster.route`, the links from one GPU to another in path order with
their summed latency. Routes are computed on first use and cached, never all
pairs up front, so that a cluster of thousands of GPUs builds at once.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from .errors import TopologyError
from .spec import ClusterSpec, check_cluster_spec
from .units import format_bandwidth, format_bytes, format_flops

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Cluster", "FileTopologyCluster", "Link", "Route"]

# NCCL src/graph/tuning.cc (nvlsEfficiency): NVLS reaches 0.85 of the NVLink bandwidth
# on Hopper (0.74 on Blackwell).
NVLS_EFFICIENCY = 0.85


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
    """GPUs, switches and links of a cluster, and the route between any two GPUs.

    The base class holds what every fabric shares: numbering, the graph, the link
    list and the route cache. Subclasses build the vertices and links
    (:meth:`_build`) and name the vertices of a route (:meth:`_path`).
    """

    def __init__(self, spec: ClusterSpec) -> None:
        check_cluster_spec(spec)
        self.spec = spec
        self.gpus_per_node: int = spec.gpus_per_node
        self.num_nodes: int = spec.nodes
        self.num_gpus: int = spec.nodes * spec.gpus_per_node
        self.nics_per_node: int = spec.nic.per_node if spec.nic is not None else 0
        """NICs per node (0 for a custom topology, which has no rail NICs)."""
        self.num_pods: int = 1
        """Pods of the fat tree (1 for every other fabric)."""
        self._devices: list[tuple[str, str, dict[str, int]]] = []
        self._link_list: list[Link] = []
        self.links: Sequence[Link] = self._link_list
        self._link_ids: dict[tuple[str, str], int] = {}
        self._device_latency: dict[str, float] = {}
        self._routes: dict[tuple[int, int], Route] = {}
        self.plan_cache: dict[tuple, object] = {}
        """Communication plans on this cluster, memoised by the simulator's planner."""
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
        """The rail GPU ``gpu`` uses to leave its node (here: its local index)."""
        return self.local_index(gpu)

    def rails_of(self, gpus: np.ndarray) -> np.ndarray:
        """:meth:`rail_of` of every GPU in an array of GPU indices (checked by the caller)."""
        return gpus % self.gpus_per_node

    def pod_of(self, gpu: int) -> int:
        """The pod of GPU ``gpu`` (always 0 outside a fat tree with several pods)."""
        self._index(gpu, f"pod_of({gpu!r})")
        return 0

    def symmetric_shift(self, lowest_gpu: int) -> int:
        """How many GPUs toward GPU 0 a set of GPUs, the lowest ``lowest_gpu``, can be
        moved, every GPU by the same count, with the network the same to it: the
        routes between the moved GPUs cross links of the same bandwidths and
        latencies, shared alike, so calls on them cost the same. 0 here (a custom
        topology's links are its own); a fabric of alike nodes says more."""
        self._index(lowest_gpu, f"symmetric_shift({lowest_gpu!r})")
        return 0

    def gpu_name(self, gpu: int) -> str:
        """The graph vertex of GPU ``gpu``, e.g. ``'n1.gpu3'``."""
        return f"n{self.node_of(gpu)}.gpu{self.local_index(gpu)}"

    @functools.cached_property
    def _links_by_gpu(self) -> dict[str, frozenset[int]]:
        """Each GPU's links (both ends), by the GPU's vertex name."""
        gpus = {self.gpu_name(gpu) for gpu in range(self.num_gpus)}
        found: dict[str, set[int]] = {}
        for link in self.links:
            for end in (link.src, link.dst):
                if end in gpus:
                    found.setdefault(end, set()).add(link.id)
        return {name: frozenset(links) for name, links in found.items()}

    @functools.cached_property
    def _gpu_link_ids(self) -> frozenset[int]:
        return frozenset(link for links in self._links_by_gpu.values() for link in links)

    def is_gpu_link(self, link_id: int) -> bool:
        """Whether a GPU is at one end of link ``link_id``: only that GPU's transfers
        cross such a link."""
        return link_id in self._gpu_link_ids

    def links_of_gpu(self, gpu: int) -> frozenset[int]:
        """The links with GPU ``gpu`` at one end."""
        return self._links_by_gpu.get(self.gpu_name(gpu), frozenset())

    @functools.cached_property
    def bandwidths(self) -> np.ndarray:
        """Every link's bandwidth (bytes/s), by id."""
        return np.array([link.bandwidth for link in self.links], dtype=float)

    # -- what joins the GPUs of a node -----------------------------------------------

    @property
    def intra_node_link(self) -> str:
        """``'nvlink'`` or ``'pci'``: the link type of NCCL's intra-node latency table."""
        raise NotImplementedError

    @property
    def has_nvls(self) -> bool:
        """Whether a node's switch reduces in-network, so NCCL may run NVLS."""
        raise NotImplementedError

    @property
    def nvls_efficiency(self) -> float:
        """The fraction of NVLink bandwidth NCCL's NVLS reaches (``nvswitch``'s, else
        NCCL's Hopper value)."""
        nvswitch = getattr(self.spec, "nvswitch", None)
        return nvswitch.nvls_efficiency if nvswitch is not None else NVLS_EFFICIENCY

    # -- construction ----------------------------------------------------------------

    def _build(self) -> None:
        raise NotImplementedError

    def _add_device(self, name: str, kind: str, latency: float = 0.0, **attrs: int) -> None:
        """A vertex; ``latency`` is what the device charges a transfer passing through it."""
        self._devices.append((name, kind, attrs))
        self._device_latency[name] = latency

    def _add_link(
        self,
        a: str,
        b: str,
        bandwidth: float,
        latency: float | None = None,
        bidirectional: bool = True,
    ) -> None:
        """A physical link: two directed edges (one if not ``bidirectional``).

        Without ``latency`` the link takes half the latency of each of its two ends,
        so that a route's latency is the sum of the devices it passes through.
        """
        if latency is None:
            latency = (self._device_latency[a] + self._device_latency[b]) / 2
        for src, dst in ((a, b), (b, a)) if bidirectional else ((a, b),):
            link = Link(len(self.links), src, dst, bandwidth, latency)
            self._link_list.append(link)
            self._link_ids[(src, dst)] = link.id

    def _device_rows(self) -> Iterator[tuple[str, str, dict[str, int]]]:
        """Every vertex: its name, kind and attributes."""
        return iter(self._devices)

    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """The devices and links as a ``networkx.DiGraph`` (vertices with their ``kind``,
        GPUs also ``gpu`` and ``node``; edges with ``bandwidth``, ``latency`` and
        ``link_id``), built when first asked for: routes and the simulator read the link
        table, and a 131,072-GPU cluster's graph takes seconds to build."""
        import networkx as nx  # only a graph asked for needs it (a tenth of a second)

        graph = nx.DiGraph()
        for name, kind, attrs in self._device_rows():
            graph.add_node(name, kind=kind, **attrs)
        for link in self.links:
            graph.add_edge(
                link.src, link.dst, bandwidth=link.bandwidth, latency=link.latency, link_id=link.id
            )
        return graph

    # -- routing ---------------------------------------------------------------------

    def _path(self, src_gpu: int, dst_gpu: int) -> list[str]:
        """Vertices from ``src_gpu`` to ``dst_gpu`` (two distinct, checked indices)."""
        raise NotImplementedError

    def _route_ids(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """The link ids of :meth:`_path` in order (a topology may find them faster)."""
        return tuple(self._link_ids[hop] for hop in pairwise(self._path(src_gpu, dst_gpu)))

    def route_links(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """:meth:`route`'s links, found without keeping the route: for the many one-off
        routes of a run's symmetric images (a route kept is a few hundred bytes, and
        131,072 GPUs' images ask for half a million)."""
        cached = self._routes.get((src_gpu, dst_gpu))
        if cached is not None:
            return cached.links
        where = f"route_links({src_gpu!r}, {dst_gpu!r})"
        src_gpu, dst_gpu = self._index(src_gpu, where), self._index(dst_gpu, where)
        if src_gpu == dst_gpu:
            raise TopologyError(f"{where}: source and destination are the same GPU")
        return self._route_ids(src_gpu, dst_gpu)

    def route_arrays(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The routes of many pairs at once, as two arrays of equal length: for every
        link a route crosses (in path order, the pairs in their order), the index of the
        pair in ``src``/``dst`` and the link's id."""
        pairs: list[int] = []
        links: list[int] = []
        for index, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            route = self.route_links(a, b)
            pairs += [index] * len(route)
            links += route
        return np.array(pairs, dtype=np.int64), np.array(links, dtype=np.int64)

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
        ids = self._route_ids(src_gpu, dst_gpu)
        route = Route(ids, sum(self.links[i].latency for i in ids))
        self._routes[key] = route
        return route

    # -- summary ---------------------------------------------------------------------

    def describe(self) -> str:
        """One paragraph for humans: size, devices and link rates."""
        raise NotImplementedError

    def _describe_size(self) -> str:
        spec, gpu = self.spec, self.spec.gpu
        return (
            f"{spec.name}: {_count(self.num_nodes, 'node')} x "
            f"{_count(self.gpus_per_node, 'GPU')} = "
            f"{self.num_gpus} GPUs ({gpu.name}: {format_flops(gpu.peak_flops)} bf16, "
            f"{format_bytes(gpu.hbm_capacity, binary=False)} HBM at "
            f"{format_bandwidth(gpu.hbm_bandwidth)})."
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.spec.name!r}, nodes={self.num_nodes}, "
            f"gpus_per_node={self.gpus_per_node}, num_gpus={self.num_gpus})"
        )


class FileTopologyCluster(Cluster):
    """A cluster described by a custom topology file: its ``topology`` group says what
    joins a node's GPUs and whether the switch reduces in-network."""

    @property
    def intra_node_link(self) -> str:
        """``topology.intra_node_link`` (``'nvlink'`` unless the file says ``'pci'``)."""
        assert self.spec.topology is not None
        return self.spec.topology.intra_node_link

    @property
    def has_nvls(self) -> bool:
        """``topology.nvls``."""
        assert self.spec.topology is not None
        return self.spec.topology.nvls
