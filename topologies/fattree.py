"""Nodes on a rail-optimised fat tree: the fabric of every preset.

Vertices of the graph (attribute ``kind``):

- ``n{node}.gpu{i}`` — every GPU (``kind="gpu"``, with its global index ``gpu``);
- inside a node with ``nvswitch``: ``n{node}.nvswitch``, the NVSwitch fabric seen as
  one switch;
- inside a node with ``pcie`` (no NVLink): ``n{node}.pcie{s}``, PCIe switch ``s``
  serving local GPUs ``s*gpus_per_switch .. (s+1)*gpus_per_switch - 1``
  (``kind="pcie_switch"``), and ``n{node}.cpu``, the host bridge (the CPU's root
  complex) every switch hangs from (``kind="cpu"``);
- ``n{node}.nic{r}`` — each NIC; NIC ``r`` serves the GPUs of rail ``r``
  (local GPU ``i`` is on rail ``i // (gpus_per_node / nic.per_node)``; with one NIC
  per GPU, as in a DGX, GPU ``i`` uses NIC ``i``);
- per pod ``p``: a leaf per rail, ``pod{p}.leaf{r}`` — NIC ``r`` of every node of the
  pod plugs into it — and one spine, ``pod{p}.spine``, joining the pod's leaves;
- ``core`` — joins the pods' spines.

With a single pod (the default: ``network.pod_size`` unset or at least ``nodes``)
there is no core and the leaves and spine keep their plain names ``leaf{r}`` and
``spine``. Pods follow the NVIDIA DGX SuperPOD reference architecture, which builds
a cluster from scalable units of 32 DGX systems, each with its own rail-aligned
leaf switches and spine, joined by core switches. A spine or the core is modelled
as one switch whose links carry the whole layer's bandwidth.

Every physical link is two directed edges, one per direction, each carrying
``bandwidth`` (bytes/s in that direction), ``latency`` (seconds) and ``link_id``,
its index in :attr:`Cluster.links`. Bandwidths:

- GPU–NVSwitch ``nvswitch.bandwidth × nvswitch.link_efficiency`` (the data rate
  NVLink packets leave);
- GPU–PCIe switch ``pcie.bandwidth``; PCIe switch–host bridge ``pcie.host_bandwidth``
  (default ``pcie.bandwidth``);
- GPU–NIC ``nic.pcie_bandwidth`` (the GPU's own PCIe path to its rail's NIC, in
  PCIe nodes too); NIC–leaf ``nic.bandwidth``;
- leaf–spine of pod ``p``: ``nodes_in_pod(p) × nic.bandwidth / network.oversubscription``
  (non-blocking at 1);
- spine–core of pod ``p``: the pod's leaf uplinks together,
  ``nic.per_node × nodes_in_pod(p) × nic.bandwidth / network.oversubscription``,
  divided by ``network.core_oversubscription``.

Latency rule: each device on a path charges its own latency once — the NVSwitch
``nvswitch.latency``, a PCIe switch ``pcie.latency``, the host bridge
``pcie.host_latency`` (default ``pcie.latency``), a NIC ``nic.latency``, a leaf,
spine or the core ``network.switch_latency``, a GPU nothing — split in two halves,
one on the link that enters it and one on the link that leaves it. A route's
latency is therefore the sum over the devices it passes through:

- same node, NVSwitch: ``nvswitch.latency``, exactly;
- same node, PCIe, same switch: ``pcie.latency``; other switch:
  ``2 * pcie.latency + host_latency``;
- same pod, same rail: ``2 * nic.latency + switch_latency`` (one leaf);
- same pod, different rails: ``2 * nic.latency + 3 * switch_latency`` (leaf, spine, leaf);
- different pods: ``2 * nic.latency + 5 * switch_latency`` (leaf, spine, core,
  spine, leaf).

Routes follow a fixed rule, not a graph search: GPU -> NVSwitch -> GPU, or GPU ->
PCIe switch [-> host bridge -> PCIe switch] -> GPU, inside a node; GPU -> NIC ->
leaf [-> spine [-> core -> spine] -> leaf] -> NIC -> GPU across nodes. NCCL's PXN,
which first moves the data over NVLink to the local GPU on the destination's rail so
that it stays off the spine, is not modelled yet.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from .cluster import Cluster, Link, _count
from .errors import TopologyError
from .units import format_bandwidth, format_time

__all__ = ["FatTreeCluster"]


class FatTreeCluster(Cluster):
    """NVSwitch or PCIe nodes, NICs on rails, leaves and a spine per pod, a core.

    Nothing is built per GPU: a link's id says where it is (:class:`_FatTreeLinks`), so
    a cluster of 131,072 GPUs costs no more to set up than one of eight, and routes,
    link tables and a GPU's own links are arithmetic on the ids."""

    def _build(self) -> None:
        spec = self.spec
        nic, net = spec.nic, spec.network
        assert nic is not None and net is not None
        self._gpus_per_rail = spec.gpus_per_node // nic.per_node
        self.pod_size: int = min(net.pod_size or self.num_nodes, self.num_nodes)
        """Nodes per pod (the last pod may have fewer)."""
        self.num_pods = -(-self.num_nodes // self.pod_size)
        self._pods = self.num_pods > 1
        g, nics = self.gpus_per_node, self.nics_per_node
        # the link ids, in the order of the physical links (each an upward id, the
        # downward one next): per node its GPUs' links to the NVSwitch (or to their PCIe
        # switch, then each PCIe switch's to the host bridge), its GPUs' links to their
        # NICs and its NICs' links to their leaves; then each pod's leaves' links to its
        # spine, rail by rail; then each pod's spine's link to the core
        self._switches = 0 if spec.nvswitch is not None else g // self._pcie().gpus_per_switch
        self._nic_offset = 2 * (g + self._switches)
        self._leaf_offset = self._nic_offset + 2 * g
        self._per_node = self._leaf_offset + 2 * nics
        self._fabric = self.num_nodes * self._per_node
        self._core = self._fabric + 2 * self.num_pods * nics
        total = self._core + (2 * self.num_pods if self._pods else 0)
        self.links = _FatTreeLinks(self, total)

    def _pcie(self):
        assert self.spec.pcie is not None
        return self.spec.pcie

    # -- link ids ----------------------------------------------------------------------

    def _gpu_up(self, gpu: int) -> int:
        """GPU ``gpu``'s link to its NVSwitch (or PCIe switch), upward."""
        node, local = divmod(gpu, self.gpus_per_node)
        return node * self._per_node + 2 * local

    def _bridge_up(self, node: int, switch: int) -> int:
        """PCIe switch ``switch`` of ``node`` to the host bridge, upward."""
        return node * self._per_node + 2 * (self.gpus_per_node + switch)

    def _gpu_nic_up(self, gpu: int) -> int:
        """GPU ``gpu``'s link to its rail's NIC, upward."""
        node, local = divmod(gpu, self.gpus_per_node)
        return node * self._per_node + self._nic_offset + 2 * local

    def _nic_up(self, node: int, rail: int) -> int:
        """NIC ``rail`` of ``node`` to its leaf, upward."""
        return node * self._per_node + self._leaf_offset + 2 * rail

    def _leaf_up(self, pod: int, rail: int) -> int:
        """Leaf ``rail`` of ``pod`` to the pod's spine, upward."""
        return self._fabric + 2 * (pod * self.nics_per_node + rail)

    def _spine_up(self, pod: int) -> int:
        """The spine of ``pod`` to the core, upward."""
        return self._core + 2 * pod

    def _link(self, link_id: int) -> Link:
        """The :class:`Link` with id ``link_id`` (in range), from where its id puts it."""
        spec = self.spec
        nic, net = spec.nic, spec.network
        assert nic is not None and net is not None
        upward, half = link_id % 2 == 0, link_id // 2
        g = self.gpus_per_node
        if link_id < self._fabric:
            node, j = divmod(half, self._per_node // 2)
            pod = node // self.pod_size
            if j < g and spec.nvswitch is not None:
                nvlink = spec.nvswitch.bandwidth * spec.nvswitch.link_efficiency
                ends = (f"n{node}.gpu{j}", f"n{node}.nvswitch", nvlink)
                latency = (0.0 + spec.nvswitch.latency) / 2
            elif j < g:
                pcie = self._pcie()
                ends = (f"n{node}.gpu{j}", self._pcie_switch(node, j), pcie.bandwidth)
                latency = (0.0 + pcie.latency) / 2
            elif j < g + self._switches:
                pcie, s = self._pcie(), j - g
                ends = (f"n{node}.pcie{s}", f"n{node}.cpu", pcie.uplink_bandwidth)
                latency = (pcie.latency + pcie.bridge_latency) / 2
            elif j < g + self._switches + g:
                local = j - g - self._switches
                rail = local // self._gpus_per_rail
                ends = (f"n{node}.gpu{local}", f"n{node}.nic{rail}", nic.pcie_bandwidth)
                latency = (0.0 + nic.latency) / 2
            else:
                rail = j - 2 * g - self._switches
                ends = (f"n{node}.nic{rail}", self._leaf(pod, rail), nic.bandwidth)
                latency = (nic.latency + net.switch_latency) / 2
        elif link_id < self._core:
            pod, rail = divmod(half - self._fabric // 2, self.nics_per_node)
            uplink = self.nodes_in_pod(pod) * nic.bandwidth / net.oversubscription
            ends = (self._leaf(pod, rail), self._spine(pod), uplink)
            latency = (net.switch_latency + net.switch_latency) / 2
        else:
            pod = half - self._core // 2
            pod_uplink = self.nics_per_node * self.nodes_in_pod(pod) * nic.bandwidth
            core_link = pod_uplink / net.oversubscription / net.core_oversubscription
            ends = (self._spine(pod), "core", core_link)
            latency = (net.switch_latency + net.switch_latency) / 2
        low, high, bandwidth = ends
        src, dst = (low, high) if upward else (high, low)
        return Link(link_id, src, dst, bandwidth, latency)

    @functools.cached_property
    def bandwidths(self) -> np.ndarray:
        """Every link's bandwidth by id, from the few rates of the fabric."""
        rates = np.empty(len(self.links))
        sample = self.links
        per_node = self._per_node
        block = np.array([sample[i].bandwidth for i in range(per_node)])
        rates[: self._fabric] = np.tile(block, self.num_nodes)
        for link_id in range(self._fabric, len(rates), 2):
            rates[link_id : link_id + 2] = sample[link_id].bandwidth
        return rates

    def is_gpu_link(self, link_id: int) -> bool:
        """Whether a GPU is at one end of link ``link_id``: its link to the NVSwitch (or
        PCIe switch) and to its NIC."""
        if not 0 <= link_id < self._fabric:
            return False
        j = link_id % self._per_node // 2
        g = self.gpus_per_node
        return j < g or g + self._switches <= j < 2 * g + self._switches

    def links_of_gpu(self, gpu: int) -> frozenset[int]:
        """The links with GPU ``gpu`` at one end, both directions."""
        gpu = self._index(gpu, f"links_of_gpu({gpu!r})")
        up, nic_up = self._gpu_up(gpu), self._gpu_nic_up(gpu)
        return frozenset((up, up + 1, nic_up, nic_up + 1))

    def _device_rows(self) -> Iterator[tuple[str, str, dict[str, int]]]:
        spec = self.spec
        for node in range(self.num_nodes):
            pod = node // self.pod_size
            for i in range(self.gpus_per_node):
                gpu = node * self.gpus_per_node + i
                yield f"n{node}.gpu{i}", "gpu", {"node": node, "gpu": gpu, "pod": pod}
            if spec.nvswitch is not None:
                yield f"n{node}.nvswitch", "nvswitch", {"node": node}
            else:
                for s in range(self._switches):
                    yield f"n{node}.pcie{s}", "pcie_switch", {"node": node}
                yield f"n{node}.cpu", "cpu", {"node": node}
            for r in range(self.nics_per_node):
                yield f"n{node}.nic{r}", "nic", {"node": node, "rail": r, "pod": pod}
        for pod in range(self.num_pods):
            for r in range(self.nics_per_node):
                yield self._leaf(pod, r), "leaf", {"rail": r, "pod": pod}
            yield self._spine(pod), "spine", {"pod": pod}
        if self._pods:
            yield "core", "core", {}

    # -- names -----------------------------------------------------------------------

    def _leaf(self, pod: int, rail: int) -> str:
        return f"pod{pod}.leaf{rail}" if self._pods else f"leaf{rail}"

    def _spine(self, pod: int) -> str:
        return f"pod{pod}.spine" if self._pods else "spine"

    def _pcie_switch(self, node: int, local: int) -> str:
        assert self.spec.pcie is not None
        return f"n{node}.pcie{local // self.spec.pcie.gpus_per_switch}"

    # -- numbering -------------------------------------------------------------------

    def rail_of(self, gpu: int) -> int:
        """The rail (index of the NIC and of the leaf switch) GPU ``gpu`` uses."""
        return self.local_index(gpu) // self._gpus_per_rail

    def rails_of(self, gpus: np.ndarray) -> np.ndarray:
        """:meth:`rail_of` of every GPU in an array of GPU indices."""
        return gpus % self.gpus_per_node // self._gpus_per_rail

    def pod_of(self, gpu: int) -> int:
        """The pod of GPU ``gpu``: ``node_of(gpu) // pod_size``."""
        return self.node_of(gpu) // self.pod_size

    def symmetric_shift(self, lowest_gpu: int) -> int:
        """Whole nodes in one pod, whole pods where the pods are alike (none where the
        last pod is smaller: its spine's links are slower): the nodes are alike and
        their routes depend only on whether two GPUs share a node, a rail and a pod."""
        node = self.node_of(lowest_gpu)
        if self.num_pods == 1:
            return node * self.gpus_per_node
        if self.num_nodes % self.pod_size:
            return 0
        return node // self.pod_size * self.pod_size * self.gpus_per_node

    def nodes_in_pod(self, pod: int) -> int:
        """Nodes of pod ``pod`` (``pod_size``, or fewer in the last pod)."""
        return min(self.pod_size, self.num_nodes - pod * self.pod_size)

    @property
    def intra_node_link(self) -> str:
        """``'nvlink'`` for nodes with an NVSwitch, ``'pci'`` for PCIe-only nodes."""
        return "nvlink" if self.spec.nvswitch is not None else "pci"

    @property
    def has_nvls(self) -> bool:
        """``nvswitch.nvls``; False for PCIe-only nodes."""
        return self.spec.nvswitch is not None and self.spec.nvswitch.nvls

    # -- routing ---------------------------------------------------------------------

    def _path(self, src_gpu: int, dst_gpu: int) -> list[str]:
        src_node, dst_node = src_gpu // self.gpus_per_node, dst_gpu // self.gpus_per_node
        src, dst = self.gpu_name(src_gpu), self.gpu_name(dst_gpu)
        if src_node == dst_node:
            if self.spec.nvswitch is not None:
                return [src, f"n{src_node}.nvswitch", dst]
            up = self._pcie_switch(src_node, src_gpu % self.gpus_per_node)
            down = self._pcie_switch(dst_node, dst_gpu % self.gpus_per_node)
            return [src, up, dst] if up == down else [src, up, f"n{src_node}.cpu", down, dst]
        src_rail, dst_rail = self.rail_of(src_gpu), self.rail_of(dst_gpu)
        src_pod, dst_pod = src_node // self.pod_size, dst_node // self.pod_size
        path = [src, f"n{src_node}.nic{src_rail}", self._leaf(src_pod, src_rail)]
        if src_pod != dst_pod:
            path += [self._spine(src_pod), "core", self._spine(dst_pod)]
            path.append(self._leaf(dst_pod, dst_rail))
        elif src_rail != dst_rail:
            path += [self._spine(src_pod), self._leaf(dst_pod, dst_rail)]
        path += [f"n{dst_node}.nic{dst_rail}", dst]
        return path

    def _route_ids(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """:meth:`_path`'s link ids from where the ids put each hop (an upward hop's id;
        the downward one is the next), with no vertex name formatted: a run may ask for
        every image's route, 131,072 GPUs' worth, once each."""
        per_node = self.gpus_per_node
        src_node, dst_node = src_gpu // per_node, dst_gpu // per_node
        if src_node == dst_node:
            if self.spec.nvswitch is not None:
                return (self._gpu_up(src_gpu), self._gpu_up(dst_gpu) + 1)
            per_switch = self._pcie().gpus_per_switch
            up, down = src_gpu % per_node // per_switch, dst_gpu % per_node // per_switch
            if up == down:
                return (self._gpu_up(src_gpu), self._gpu_up(dst_gpu) + 1)
            return (
                self._gpu_up(src_gpu),
                self._bridge_up(src_node, up),
                self._bridge_up(dst_node, down) + 1,
                self._gpu_up(dst_gpu) + 1,
            )
        per_rail = self._gpus_per_rail
        src_rail, dst_rail = src_gpu % per_node // per_rail, dst_gpu % per_node // per_rail
        src_pod, dst_pod = src_node // self.pod_size, dst_node // self.pod_size
        first = (self._gpu_nic_up(src_gpu), self._nic_up(src_node, src_rail))
        last = (self._nic_up(dst_node, dst_rail) + 1, self._gpu_nic_up(dst_gpu) + 1)
        if src_pod != dst_pod:
            middle: tuple[int, ...] = (
                self._leaf_up(src_pod, src_rail),
                self._spine_up(src_pod),
                self._spine_up(dst_pod) + 1,
                self._leaf_up(dst_pod, dst_rail) + 1,
            )
        elif src_rail != dst_rail:
            middle = (self._leaf_up(src_pod, src_rail), self._leaf_up(dst_pod, dst_rail) + 1)
        else:
            middle = ()
        return (*first, *middle, *last)

    def route_arrays(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Cluster.route_arrays` from where the ids put each hop, for all pairs at
        once (nodes with NVSwitches; PCIe nodes take the pairs one by one)."""
        if self.spec.nvswitch is None:
            return super().route_arrays(src, dst)
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        for name, gpus in (("source", src), ("destination", dst)):
            if len(gpus) and not (0 <= gpus.min() and gpus.max() < self.num_gpus):
                raise TopologyError(
                    f"route_arrays: a {name} GPU is out of range 0..{self.num_gpus - 1}"
                )
        if np.any(src == dst):
            raise TopologyError("route_arrays: a source and its destination are the same GPU")
        g, per_rail = self.gpus_per_node, self._gpus_per_rail
        src_node, src_local = np.divmod(src, g)
        dst_node, dst_local = np.divmod(dst, g)
        src_rail, dst_rail = src_local // per_rail, dst_local // per_rail
        src_pod, dst_pod = src_node // self.pod_size, dst_node // self.pod_size
        per, nics = self._per_node, self.nics_per_node
        inside = src_node == dst_node
        out = ~inside
        cross_pod = out & (src_pod != dst_pod)
        cross_rail = out & ~cross_pod & (src_rail != dst_rail)
        # every hop a route may take, one column each in path order (inside a node: the
        # first two; across nodes: the other eight), and which of them each route takes
        columns = [
            (inside, src_node * per + 2 * src_local),
            (inside, dst_node * per + 2 * dst_local + 1),
            (out, src_node * per + self._nic_offset + 2 * src_local),
            (out, src_node * per + self._leaf_offset + 2 * src_rail),
            (cross_pod | cross_rail, self._fabric + 2 * (src_pod * nics + src_rail)),
            (cross_pod, self._core + 2 * src_pod),
            (cross_pod, self._core + 2 * dst_pod + 1),
            (cross_pod | cross_rail, self._fabric + 2 * (dst_pod * nics + dst_rail) + 1),
            (out, dst_node * per + self._leaf_offset + 2 * dst_rail + 1),
            (out, dst_node * per + self._nic_offset + 2 * dst_local + 1),
        ]
        taken = np.stack([where for where, _ in columns], axis=1)
        hops = np.stack([ids for _, ids in columns], axis=1)
        pair = np.repeat(np.arange(len(src)), taken.sum(axis=1))
        return pair, hops[taken]

    # -- summary ---------------------------------------------------------------------

    def describe(self) -> str:
        """One paragraph for humans: size, devices and link rates."""
        spec = self.spec
        nic, net = spec.nic, spec.network
        assert nic is not None and net is not None
        blocking = (
            "non-blocking"
            if net.oversubscription == 1
            else f"{net.oversubscription:g}:1 oversubscribed"
        )
        if spec.nvswitch is not None:
            inside = (
                f"Inside a node every GPU reaches the NVSwitch at "
                f"{format_bandwidth(spec.nvswitch.bandwidth)} per direction "
                f"({format_time(spec.nvswitch.latency)} GPU to GPU)."
            )
        else:
            assert spec.pcie is not None
            pcie = spec.pcie
            inside = (
                f"Inside a node there is no NVLink: "
                f"{_count(pcie.gpus_per_switch, 'GPU')} share each PCIe switch at "
                f"{format_bandwidth(pcie.bandwidth)} per direction "
                f"({format_time(pcie.latency)} GPU to GPU), and the switches meet at the "
                f"host bridge ({format_bandwidth(pcie.uplink_bandwidth)} per uplink, "
                f"{format_time(pcie.bridge_latency)})."
            )
        if self._pods:
            core = (
                "non-blocking"
                if net.core_oversubscription == 1
                else f"{net.core_oversubscription:g}:1 oversubscribed"
            )
            fabric = (
                f"NIC r of every node of a pod plugs into the pod's leaf switch r; the "
                f"{_count(self.num_pods, 'pod')} of up to {_count(self.pod_size, 'node')} "
                f"each have their own spine ({blocking}) and meet at one core ({core}), "
                f"{format_time(net.switch_latency)} per switch."
            )
        else:
            fabric = (
                f"NIC r of every node plugs into leaf switch r, and the "
                f"{_count(nic.per_node, 'leaf', 'leaves')} meet at one spine ({blocking}, "
                f"{format_time(net.switch_latency)} per switch)."
            )
        return (
            f"{self._describe_size()} {inside} Each node has "
            f"{_count(nic.per_node, 'NIC')} of {format_bandwidth(nic.bandwidth, bits=True)} "
            f"({format_bandwidth(nic.bandwidth)}) behind "
            f"{format_bandwidth(nic.pcie_bandwidth)} of PCIe, {format_time(nic.latency)} "
            f"per adapter; {fabric} {len(self.links)} directed links."
        )


class _FatTreeLinks(Sequence[Link]):
    """:attr:`FatTreeCluster.links`: every link by id, each made when first asked for
    (from where its id puts it) and kept."""

    def __init__(self, cluster: FatTreeCluster, count: int) -> None:
        self._cluster = cluster
        self._count = count
        self._made: dict[int, Link] = {}

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Link: ...

    @overload
    def __getitem__(self, index: slice) -> list[Link]: ...

    def __getitem__(self, index: int | slice) -> Link | list[Link]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        link = self._made.get(index)
        if link is None:
            position = index + self._count if index < 0 else index
            if not 0 <= position < self._count:
                raise IndexError(f"link {index} out of range 0..{self._count - 1}")
            link = self._made[index] = self._cluster._link(position)
        return link

    def __iter__(self) -> Iterator[Link]:
        return (self[i] for i in range(self._count))
