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

from .cluster import Cluster, _count
from .units import format_bandwidth, format_time

__all__ = ["FatTreeCluster"]


class FatTreeCluster(Cluster):
    """NVSwitch or PCIe nodes, NICs on rails, leaves and a spine per pod, a core."""

    def _build(self) -> None:
        spec = self.spec
        nic, net = spec.nic, spec.network
        assert nic is not None and net is not None
        self._gpus_per_rail = spec.gpus_per_node // nic.per_node
        self.pod_size: int = min(net.pod_size or self.num_nodes, self.num_nodes)
        """Nodes per pod (the last pod may have fewer)."""
        self.num_pods = -(-self.num_nodes // self.pod_size)
        self._pods = self.num_pods > 1
        switch_latency = net.switch_latency

        for node in range(self.num_nodes):
            pod = node // self.pod_size
            for i in range(self.gpus_per_node):
                gpu = node * self.gpus_per_node + i
                self._add_device(f"n{node}.gpu{i}", "gpu", node=node, gpu=gpu, pod=pod)
            if spec.nvswitch is not None:
                self._add_device(f"n{node}.nvswitch", "nvswitch", spec.nvswitch.latency, node=node)
            else:
                assert spec.pcie is not None
                for s in range(self.gpus_per_node // spec.pcie.gpus_per_switch):
                    self._add_device(
                        f"n{node}.pcie{s}", "pcie_switch", spec.pcie.latency, node=node
                    )
                self._add_device(f"n{node}.cpu", "cpu", spec.pcie.bridge_latency, node=node)
            for r in range(self.nics_per_node):
                self._add_device(f"n{node}.nic{r}", "nic", nic.latency, node=node, rail=r, pod=pod)
        for pod in range(self.num_pods):
            for r in range(self.nics_per_node):
                self._add_device(self._leaf(pod, r), "leaf", switch_latency, rail=r, pod=pod)
            self._add_device(self._spine(pod), "spine", switch_latency, pod=pod)
        if self._pods:
            self._add_device("core", "core", switch_latency)

        # each hop's link id, upward (the reverse direction's is the next id), by the
        # integers that name its lower end: a GPU; a node's rail; a pod's rail; a pod
        self._gpu_up: list[int] = []
        self._nic_up: list[int] = []
        self._leaf_up: list[int] = []
        self._spine_up: list[int] = []
        for node in range(self.num_nodes):
            self._build_node(node)
            for i in range(self.gpus_per_node):
                rail = i // self._gpus_per_rail
                self._gpu_up.append(len(self.links))
                self._add_link(f"n{node}.gpu{i}", f"n{node}.nic{rail}", nic.pcie_bandwidth)
            pod = node // self.pod_size
            for r in range(self.nics_per_node):
                self._nic_up.append(len(self.links))
                self._add_link(f"n{node}.nic{r}", self._leaf(pod, r), nic.bandwidth)
        for pod in range(self.num_pods):
            uplink = self.nodes_in_pod(pod) * nic.bandwidth / net.oversubscription
            for r in range(self.nics_per_node):
                self._leaf_up.append(len(self.links))
                self._add_link(self._leaf(pod, r), self._spine(pod), uplink)
        if self._pods:
            for pod in range(self.num_pods):
                pod_uplink = self.nics_per_node * self.nodes_in_pod(pod) * nic.bandwidth
                core_link = pod_uplink / net.oversubscription / net.core_oversubscription
                self._spine_up.append(len(self.links))
                self._add_link(self._spine(pod), "core", core_link)

    def _build_node(self, node: int) -> None:
        spec = self.spec
        if spec.nvswitch is not None:
            nvlink = spec.nvswitch.bandwidth * spec.nvswitch.link_efficiency
            for i in range(self.gpus_per_node):
                self._add_link(f"n{node}.gpu{i}", f"n{node}.nvswitch", nvlink)
            return
        pcie = spec.pcie
        assert pcie is not None
        for i in range(self.gpus_per_node):
            self._add_link(f"n{node}.gpu{i}", self._pcie_switch(node, i), pcie.bandwidth)
        for s in range(self.gpus_per_node // pcie.gpus_per_switch):
            self._add_link(f"n{node}.pcie{s}", f"n{node}.cpu", pcie.uplink_bandwidth)

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

    def pod_of(self, gpu: int) -> int:
        """The pod of GPU ``gpu``: ``node_of(gpu) // pod_size``."""
        return self.node_of(gpu) // self.pod_size

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
        """:meth:`_path`'s link ids, between nodes with NVSwitches from the hop tables
        :meth:`_build` filled (an upward hop's id; the downward one is the next), with
        no vertex name formatted: a run may ask for every image's route, 131,072 GPUs'
        worth, once each."""
        per_node = self.gpus_per_node
        src_node, dst_node = src_gpu // per_node, dst_gpu // per_node
        if src_node == dst_node or self.spec.nvswitch is None:
            return super()._route_ids(src_gpu, dst_gpu)
        per_rail, nics = self._gpus_per_rail, self.nics_per_node
        src_rail, dst_rail = src_gpu % per_node // per_rail, dst_gpu % per_node // per_rail
        src_pod, dst_pod = src_node // self.pod_size, dst_node // self.pod_size
        nic_up, leaf_up = self._nic_up, self._leaf_up
        first = (self._gpu_up[src_gpu], nic_up[src_node * nics + src_rail])
        last = (nic_up[dst_node * nics + dst_rail] + 1, self._gpu_up[dst_gpu] + 1)
        if src_pod != dst_pod:
            spine_up = self._spine_up
            middle: tuple[int, ...] = (
                leaf_up[src_pod * nics + src_rail],
                spine_up[src_pod],
                spine_up[dst_pod] + 1,
                leaf_up[dst_pod * nics + dst_rail] + 1,
            )
        elif src_rail != dst_rail:
            middle = (leaf_up[src_pod * nics + src_rail], leaf_up[dst_pod * nics + dst_rail] + 1)
        else:
            middle = ()
        return (*first, *middle, *last)

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
