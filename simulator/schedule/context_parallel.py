"""Lowering pass for context parallelism: what splitting each sequence over ``cp`` ranks
adds around attention.

Every op of a layer but attention works on the rank's ``1/cp`` of the sequence (the
layer ops are built from the rank's view of the model). Attention needs all of it:

* **Ring** (Liu, Zaharia and Abbeel, "Ring Attention with Blockwise Transformers",
  2023; Megatron-Core and torchtitan pass K/V with point-to-point sends): the rank runs
  ``cp`` FlashAttention blocks, its queries against one rank's keys each. Before block
  ``j`` it sends the K/V block it holds to the next rank of the CP ring and receives the
  previous rank's, on streams of their own, so the transfer overlaps block ``j``;
  block ``j + 1`` waits for it. Each rank holds two chunks of the sequence (the ``i``-th
  and the ``2cp−1−i``-th), which balances the causal mask: every block computes about
  half its scores. The backward passes K/V and their gradients together (twice the
  bytes), and after its last block the accumulated K/V gradients travel one more hop
  home.
* **Ulysses** (Jacobs et al., "DeepSpeed Ulysses", 2023): an all-to-all on the CP group
  before attention trades the sequence split for a head split (Q, K, V), attention
  runs over the whole sequence for ``1/cp`` of the heads, and an all-to-all after it
  brings the output back; the backward runs the transposes (dO before, dQ/dK/dV after).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.arithmetic.layer_ops import ACT_BYTES, OpCost
from simulator.common.vocabulary import ALL_TO_ALL
from simulator.schedule.ir import Recv, Send

if TYPE_CHECKING:
    from simulator.request.layout import Layout
    from simulator.schedule.context import StepConfig
    from simulator.schedule.writer import Writing

__all__ = ["ContextParallelLowering"]

# tags of the ring's sends and receives: above any pipeline tag, and inside the 32-bit
# tags gloo and NCCL take
_RING_TAG_BASE = 1 << 28
_PHASE_CODE = {"fwd": 0, "recompute": 1}


class ContextParallelLowering:
    """The context-parallel part of :class:`~simulator.schedule.layers.RankLowering` (a
    mixin: it writes through the same program writer and helpers)."""

    # what RankLowering provides
    config: StepConfig
    layout: Layout
    rank: int
    out: Writing
    tp: int
    _kv_local: int

    def _cp_setup(self) -> None:
        layout = self.layout
        self.cp = layout.cp
        self.cp_kind = self.config.recipe.cp_kind
        self.cp_group = layout.group_name("cp", self.rank) if self.cp > 1 else None
        if self.cp_group is None:
            return
        members = layout.members(self.cp_group)
        at = members.index(self.rank)
        self.cp_next, self.cp_prev = members[(at + 1) % self.cp], members[(at - 1) % self.cp]
        local = self.config.local
        b, d = self.config.micro_batch, local.head_dim
        assert d is not None  # set by ModelSpec's validator
        heads, kv = local.heads // self.tp, self._kv_local
        tokens = b * local.seq_len
        self.kv_block_bytes = ACT_BYTES * 2 * tokens * kv * d
        self.qkv_bytes = ACT_BYTES * tokens * (heads + 2 * kv) * d
        self.out_bytes = ACT_BYTES * tokens * heads * d
        self.ring_recv: int | None = None

    # -- ring ---------------------------------------------------------------------------
    def _ring_tag(self, layer: int, mb: int, phase: str, step: int) -> int:
        code = _PHASE_CODE.get(phase, 2)
        return (
            _RING_TAG_BASE
            + ((layer * self.config.microbatches + mb) * 3 + code) * (self.cp + 1)
            + step
        )

    def _ring_step(
        self, layer: int, mb: int, phase: str, step: int, size: float, last: bool
    ) -> None:
        """Before block ``step``: wait for the K/V the last step received; unless this is
        the last block, pass the block on and receive the next one beside it."""
        if self.ring_recv is not None:
            self.out.waits.append(self.ring_recv)
            self.ring_recv = None
        if last:
            return
        self._ring_exchange(layer, mb, phase, step, size, "kv")

    def _ring_exchange(
        self, layer: int, mb: int, phase: str, step: int, size: float, what: str
    ) -> None:
        tag = self._ring_tag(layer, mb, phase, step)
        tags = self.out.w.tag_set("cp", layer, mb, phase, self.out.stage)
        label = f"L{layer}.cp_{what}{step}.{phase}.mb{mb}"
        # the block forwarded: the one computed locally (step 0) or received last step
        deps = (self.out.last,) if self.out.w.ops else ()
        self.out.w.p2p(Send, "cp_send", self.cp_next, size, tag, f"send.{label}", deps, tags)
        self.ring_recv = self.out.w.p2p(
            Recv, "cp_recv", self.cp_prev, size, tag, f"recv.{label}", (), tags
        )

    # -- the hooks the layer lowering calls ----------------------------------------------
    def _cp_before(self, cost: OpCost, layer: int, mb: int, phase: str) -> None:
        """Before an attention op (forward, recompute or backward) of a CP layer."""
        name = cost.name
        if name.startswith("attn_ring"):
            step = int(name.removeprefix("attn_ring").split(".")[0])
            backward = name.endswith(".bwd")
            order = self.cp - 1 - step if backward else step
            size = self.kv_block_bytes * (2 if backward else 1)
            self._ring_step(layer, mb, phase, order, size, order == self.cp - 1)
        elif name in ("attn_core", "attn_core.bwd") and self.cp_kind == "ulysses":
            size = self.out_bytes if name.endswith(".bwd") else self.qkv_bytes
            self._cp_all_to_all(size, f"L{layer}.cp_a2a_in.{phase}.mb{mb}", layer, mb, phase)

    def _cp_after(self, cost: OpCost, layer: int, mb: int, phase: str) -> None:
        """After an attention op of a CP layer."""
        name = cost.name
        if name == "attn_ring0.bwd":
            # the K/V gradients accumulated around the ring go home: one more hop
            self._ring_exchange(layer, mb, phase, self.cp, self.kv_block_bytes, "dkv")
            self.out.waits.append(self.ring_recv)
            self.ring_recv = None
        elif name in ("attn_core", "attn_core.bwd") and self.cp_kind == "ulysses":
            size = self.qkv_bytes if name.endswith(".bwd") else self.out_bytes
            self._cp_all_to_all(size, f"L{layer}.cp_a2a_out.{phase}.mb{mb}", layer, mb, phase)

    def _cp_all_to_all(self, size: float, label: str, layer: int, mb: int, phase: str) -> None:
        """Ulysses' all-to-all on the CP group, which the next op waits for."""
        group = self.cp_group
        assert group is not None  # called for a CP layer only
        tags: dict[str, Any] = self.out.w.tag_set("cp", layer, mb, phase, self.out.stage)
        op = self.out.w.collective(
            ALL_TO_ALL,
            group,
            size,
            "cp",
            label,
            (self.out.last, *self.out.waits),
            tags,
        )
        self.out.waits.append(op)
