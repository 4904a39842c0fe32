"""A custom fabric given per dimension, as in ASTRA-sim's network files.

The ``topology.dimensions`` list (see :mod:`topologies.custom`) names, innermost
first, how the GPUs are joined along each dimension::

    dimensions:
      - {kind: switch, size: 8, bandwidth: 450 GB/s, latency: 0.6 us}   # a node
      - {kind: ring,   size: 4, bandwidth: 50 GB/s,  latency: 1 us}     # 4 nodes in a ring

There are ``prod(size)`` GPUs. GPU ``g`` has one coordinate per dimension:
``c_k = (g // prod(size_0..size_{k-1})) % size_k``, so consecutive GPUs differ in
the innermost coordinate. The innermost dimension is a node: ``gpus_per_node =
size_0`` and ``node_of(g) = g // size_0``; a GPU's rail is its local index, the
line of GPUs it reaches along the outer dimensions.

Vertices: GPUs ``n{node}.gpu{i}``; for a ``switch`` dimension ``k``, one switch per
line of GPUs that differ only in ``c_k``, named ``dim{k}.switch{j}`` (``kind
"switch"``), where ``j`` numbers the lines (for ``k = 0``, ``j`` is the node).
Links: a ``switch`` dimension links every GPU to its switch at ``bandwidth``; the
switch charges ``latency`` (half on each of its links), so GPU to GPU through it
takes ``latency``. A ``ring`` dimension links each GPU to its next neighbour along
the dimension, wrapping around (a ring of two is one link), at ``bandwidth`` and
``latency`` per hop. A dimension of size 1 has no links.

Routes are dimension-ordered, innermost first: for each dimension whose
coordinates differ, a ``switch`` dimension goes up to the switch and down to the
GPU with the destination's coordinate; a ``ring`` dimension hops along the shorter
direction (the ascending one on a tie). Computed on demand and cached.
"""

from __future__ import annotations

import math

from .cluster import FileTopologyCluster, _count
from .spec import DimensionSpec
from .units import format_bandwidth, format_time

__all__ = ["DimensionCluster"]


class DimensionCluster(FileTopologyCluster):
    """GPUs on a grid of switch and ring dimensions."""

    def _build(self) -> None:
        topology = self.spec.topology
        assert topology is not None and topology.dimensions is not None
        self.dimensions: tuple[DimensionSpec, ...] = topology.dimensions
        sizes = [d.size for d in self.dimensions]
        self._strides = [math.prod(sizes[:k]) for k in range(len(sizes))]
        for g in range(self.num_gpus):
            node = g // self.gpus_per_node
            self._add_device(self.gpu_name(g), "gpu", node=node, gpu=g)
        for k, dim in enumerate(self.dimensions):
            if dim.kind == "switch" and dim.size > 1:
                for j in range(self.num_gpus // dim.size):
                    self._add_device(f"dim{k}.switch{j}", "switch", dim.latency, dim=k)
        for k, dim in enumerate(self.dimensions):
            if dim.size == 1:
                continue
            for g in range(self.num_gpus):
                if dim.kind == "switch":
                    self._add_link(self.gpu_name(g), self._switch(k, g), dim.bandwidth)
                elif dim.size > 2 or self.coordinate(g, k) == 0:
                    nxt = self._step(g, k, +1)
                    self._add_link(self.gpu_name(g), self.gpu_name(nxt), dim.bandwidth, dim.latency)

    # -- coordinates -----------------------------------------------------------------

    def coordinate(self, gpu: int, dim: int) -> int:
        """Coordinate of GPU ``gpu`` along dimension ``dim`` (0 = innermost)."""
        return (gpu // self._strides[dim]) % self.dimensions[dim].size

    def coordinates(self, gpu: int) -> tuple[int, ...]:
        """All coordinates of GPU ``gpu``, innermost first."""
        gpu = self._index(gpu, f"coordinates({gpu!r})")
        return tuple(self.coordinate(gpu, k) for k in range(len(self.dimensions)))

    def _step(self, gpu: int, dim: int, delta: int) -> int:
        """The GPU ``delta`` places along dimension ``dim`` (wrapping around)."""
        size, stride = self.dimensions[dim].size, self._strides[dim]
        c = self.coordinate(gpu, dim)
        return gpu + (((c + delta) % size) - c) * stride

    def _switch(self, dim: int, gpu: int) -> str:
        size, stride = self.dimensions[dim].size, self._strides[dim]
        line = (gpu // (stride * size)) * stride + gpu % stride
        return f"dim{dim}.switch{line}"

    # -- routing ---------------------------------------------------------------------

    def _path(self, src_gpu: int, dst_gpu: int) -> list[str]:
        path = [self.gpu_name(src_gpu)]
        here = src_gpu
        for k, dim in enumerate(self.dimensions):
            start, goal = self.coordinate(here, k), self.coordinate(dst_gpu, k)
            if start == goal:
                continue
            if dim.kind == "switch":
                path.append(self._switch(k, here))
                here += (goal - start) * self._strides[k]
                path.append(self.gpu_name(here))
                continue
            ahead = (goal - start) % dim.size
            delta, hops = (+1, ahead) if ahead <= dim.size - ahead else (-1, dim.size - ahead)
            for _ in range(hops):
                here = self._step(here, k, delta)
                path.append(self.gpu_name(here))
        return path

    # -- summary ---------------------------------------------------------------------

    def describe(self) -> str:
        """One paragraph for humans: size, dimensions and link rates."""
        parts = []
        for dim in self.dimensions:
            per = "GPU to GPU" if dim.kind == "switch" else "per hop"
            parts.append(
                f"{dim.kind} of {dim.size} at {format_bandwidth(dim.bandwidth)} per direction "
                f"({format_time(dim.latency)} {per})"
            )
        return (
            f"{self._describe_size()} Custom topology of "
            f"{_count(len(self.dimensions), 'dimension')}, innermost first: "
            f"{'; '.join(parts)}. {len(self.links)} directed links."
        )
