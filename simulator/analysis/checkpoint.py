"""A checkpoint's size and the time each layout takes to write it.

The state saved is every parameter's bf16 weight and its optimizer state (fp32 master
weight, momentum and variance with Adam: the recipe's ``optimizer_state_bytes``), once:
``parameters × (2 + optimizer_state_bytes)`` bytes, Rajbhandari et al., "ZeRO" (SC'20),
section 3.1. How it is spread over the ranks that write it is the layout's:

- **sharded** (torch.distributed.checkpoint, Megatron-Core's fully parallel save, FSDP's
  sharded state dict): every rank writes an equal share, so each node writes
  ``1/nodes`` of it;
- **replicated**: one data-parallel replica (the ranks of data-parallel coordinate 0)
  writes its model-parallel shards, each rank ``1/(world/dp)`` of the state, and the
  nodes holding those ranks write it all.

A node writes at its share of the storage's bandwidth, so the write takes as long as
the busiest node's bytes over it. An asynchronous save stops the step only while each
rank copies its share of the state to host memory (over its PCIe link, the
``nic.pcie_bandwidth`` of its GPU), and writes beside the training.

Simplified: the write's latency and the file system's metadata are not counted, nor a
checkpoint's read back (in the restart's time).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.request.layout import Layout

__all__ = ["CheckpointWrite", "WEIGHT_BYTES", "checkpoint_write"]

#: Bytes per parameter of the saved bf16 weight.
WEIGHT_BYTES = 2
#: A GPU's copy to host memory where the cluster does not say (PCIe 4.0 x16's 25 GB/s
#: in practice, of 32 GB/s raw).
HOST_COPY_BANDWIDTH = 25e9


@dataclass(frozen=True)
class CheckpointWrite:
    """A checkpoint: its bytes, whether sharded, the busiest node's and rank's bytes,
    the write's seconds, and the seconds it stops the step for."""

    bytes: float
    sharded: bool
    node_bytes: float
    rank_bytes: float
    write_s: float
    stall_s: float

    def to_json(self) -> dict[str, float | bool]:
        return {
            "bytes": self.bytes,
            "sharded": self.sharded,
            "busiest_node_bytes": self.node_bytes,
            "busiest_rank_bytes": self.rank_bytes,
            "write_s": self.write_s,
            "stall_s": self.stall_s,
        }


def checkpoint_write(
    parameters: float,
    optimizer_state_bytes: float,
    layout: Layout,
    gpus_per_node: int,
    bandwidth_per_node: float,
    sharded: bool,
    asynchronous: bool,
    host_bandwidth: float | None = None,
) -> CheckpointWrite:
    """The checkpoint of ``parameters`` on ``layout`` (:class:`CheckpointWrite`)."""
    total = parameters * (WEIGHT_BYTES + optimizer_state_bytes)
    world = layout.world
    if sharded:
        rank_bytes = total / world
        per_node: dict[int, float] = {}
        for rank in range(world):
            node = rank // gpus_per_node
            per_node[node] = per_node.get(node, 0.0) + rank_bytes
    else:
        writers = [r for r in range(world) if layout.coords(r)["dp"] == 0]
        rank_bytes = total / len(writers)
        per_node = {}
        for rank in writers:
            node = rank // gpus_per_node
            per_node[node] = per_node.get(node, 0.0) + rank_bytes
    node_bytes = max(per_node.values())
    write = node_bytes / bandwidth_per_node
    stall = rank_bytes / (host_bandwidth or HOST_COPY_BANDWIDTH) if asynchronous else write
    return CheckpointWrite(total, sharded, node_bytes, rank_bytes, write, stall)
