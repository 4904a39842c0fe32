"""Lowering pass for mixture-of-experts layers: the router, the dispatch and combine
all-to-alls on the EP group, and the local experts on the tokens this rank received.

An MoE layer replaces the dense MLP of :mod:`simulator.schedule.layers`. Forward:
router, dispatch all-to-all (each rank sends every token-assignment to the rank that
holds its expert; uneven, as :func:`~simulator.arithmetic.moe.moe_layer_traffic` routes
the micro-batch), the local experts as grouped GEMMs over what arrived, and the
combine all-to-all (the dispatch's transpose). Backward runs them in reverse: the
combine's gradient travels along the dispatch's splits and the dispatch's along the
combine's. Expert weight gradients go to the expert-data-parallel group.
"""

from __future__ import annotations

from typing import Any

from simulator.arithmetic.layer_ops import OpCost, backward_of, fp8_ops
from simulator.arithmetic.moe import (
    MoELayerTraffic,
    expert_backward_of,
    expert_ops,
    shared_expert_ops,
)

__all__ = ["ExpertLowering"]


class ExpertLowering:
    """The MoE part of :class:`~simulator.schedule.layers.RankLowering` (a mixin: it
    writes through the same program writer and layer helpers)."""

    # -- mixture of experts -----------------------------------------------------------
    def _moe_ops(self, layer: int, mb: int) -> tuple[list[OpCost], MoELayerTraffic]:
        traffic = self.config.moe_traffic(layer, mb, self.ep_group_index)
        received = int(traffic.tokens_received[self.ep_index])
        tokens = self.config.micro_batch * self.model.seq_len
        ops = expert_ops(
            self.moe,
            self.model.hidden,
            received,
            self.tp,
            ep=self.ep,
            model_ffn=self.model.ffn,
            router_tokens=tokens,
            mlp=self.model.mlp,
            bias=self.model.bias,
        )
        if self.config.recipe.fp8:
            ops = fp8_ops(ops)
        return ops, traffic

    def _shared_ops(self) -> list[OpCost]:
        """The layer's shared experts on the rank's own tokens (none without them)."""
        ops = shared_expert_ops(
            self.moe,
            self.model.hidden,
            self.config.micro_batch * self.model.seq_len,
            self.tp,
            model_ffn=self.model.ffn,
            mlp=self.model.mlp,
            bias=self.model.bias,
        )
        return fp8_ops(ops) if self.config.recipe.fp8 else ops

    def _all_to_all(self, splits, label: str, wait: bool = True, **tags: Any) -> int | None:
        """An uneven all-to-all on the EP group, which the next op waits for (with
        ``wait``; otherwise the caller waits for the returned op later)."""
        if self.ep_group is None:
            return None
        splits = tuple(float(b) for b in splits)
        op = self.w.collective(
            "all_to_all",
            self.ep_group,
            sum(splits),
            "ep",
            label,
            (self.last, *self.waits),
            self.w.tags(stage=self.stage, axis="ep", **tags),
        )
        self.w.ops[op].splits = splits
        if wait:
            self.wait_for(op)
        return op

    def _moe_forward(self, layer: int, mb: int, tags: dict[str, Any]) -> None:
        """Router, dispatch all-to-all, the local experts on the tokens this rank
        received, combine all-to-all (the dispatch's transpose). Shared experts run
        after the combine, or, overlapped, their first GEMM and activation beside the
        dispatch and their second GEMM beside the combine."""
        ops, traffic = self._moe_ops(layer, mb)
        shared = self._shared_ops()
        overlap = bool(shared) and self.moe.overlap_shared_experts
        split = next((i for i, op in enumerate(shared) if op.name.startswith("shared_fc2")), 0)
        phase = tags["phase"]
        router, experts = ops[0], ops[1:]
        self._forward_op(router, layer, mb, tags)
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        label = f"L{layer}.dispatch.{phase}.mb{mb}"
        sent = self._all_to_all(dispatch, label, wait=not overlap, **tags)
        if overlap:
            for cost in shared[:split]:
                self._forward_op(cost, layer, mb, tags)
            self.wait_for(sent)
        for cost in experts:
            self._forward_op(cost, layer, mb, tags)
        label = f"L{layer}.combine.{phase}.mb{mb}"
        back = self._all_to_all(combine, label, wait=not overlap, **tags)
        for cost in shared[split:] if overlap else shared:
            self._forward_op(cost, layer, mb, tags)
        if overlap:
            self.wait_for(back)

    def _moe_backward(
        self, layer: int, mb: int, final: bool, tags: dict[str, Any], defer: bool
    ) -> None:
        """The combine's backward (an all-to-all along the dispatch), the experts'
        backward, the dispatch's backward (along the combine), the router's."""
        ops, traffic = self._moe_ops(layer, mb)
        shared = self._shared_ops()
        overlap = bool(shared) and self.moe.overlap_shared_experts
        router, experts = ops[0], ops[1:]
        local = self.moe.experts // self.ep
        phase = tags["phase"]
        prefix = f"L{layer}."
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        label = f"L{layer}.combine_grad.{phase}.mb{mb}"
        back = self._all_to_all(dispatch, label, wait=not overlap, **tags)
        if overlap:  # the shared experts' backward beside the combine's
            for cost in reversed(shared):
                self._grads(backward_of(cost), prefix, mb, final, tags, self.stage, defer)
            self.wait_for(back)
        for cost in reversed(experts):
            grads = expert_backward_of(cost, local)
            self._grads(grads, prefix, mb, final, tags, self.stage, defer)
        self._all_to_all(combine, f"L{layer}.dispatch_grad.{phase}.mb{mb}", **tags)
        if not overlap:
            for cost in reversed(shared):
                self._grads(backward_of(cost), prefix, mb, final, tags, self.stage, defer)
        self._grads(backward_of(router), prefix, mb, final, tags, self.stage, defer)
