"""The error parasim raises for a cluster it cannot build.

A bad preset name, an unknown or mistyped key, a zero bandwidth, a route to a GPU
that does not exist: each becomes a :class:`TopologyError` whose message is one line
that names the field and the numbers involved, e.g.
``cluster.nic.bandwidth: must be > 0 (got '0 Gb/s')`` or
``route(0, 16): GPU 16 is out of range 0..15 (2 nodes x 8 GPUs)``.
"""

from __future__ import annotations

__all__ = ["TopologyError"]


class TopologyError(ValueError):
    """A cluster description is invalid, or a query names something the cluster lacks."""
