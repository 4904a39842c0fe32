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
from simulator.arithmetic.moe import MoELayerTraffic, expert_backward_of, expert_ops

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

    def _all_to_all(self, splits, label: str, **tags: Any) -> None:
        """An uneven all-to-all on the EP group, which the next op waits for."""
        if self.ep_group is None:
            return
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
        self.wait_for(op)

    def _moe_forward(self, layer: int, mb: int, tags: dict[str, Any]) -> None:
        """Router, dispatch all-to-all, the local experts on the tokens this rank
        received, combine all-to-all (the dispatch's transpose)."""
        ops, traffic = self._moe_ops(layer, mb)
        phase = tags["phase"]
        router, experts = ops[0], ops[1:]
        self._forward_op(router, layer, mb, tags)
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        self._all_to_all(dispatch, f"L{layer}.dispatch.{phase}.mb{mb}", **tags)
        for cost in experts:
            self._forward_op(cost, layer, mb, tags)
        self._all_to_all(combine, f"L{layer}.combine.{phase}.mb{mb}", **tags)

    def _moe_backward(
        self, layer: int, mb: int, final: bool, tags: dict[str, Any], defer: bool
    ) -> None:
        """The combine's backward (an all-to-all along the dispatch), the experts'
        backward, the dispatch's backward (along the combine), the router's."""
        ops, traffic = self._moe_ops(layer, mb)
        router, experts = ops[0], ops[1:]
        local = self.moe.experts // self.ep
        phase = tags["phase"]
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        self._all_to_all(dispatch, f"L{layer}.combine_grad.{phase}.mb{mb}", **tags)
        for cost in reversed(experts):
            grads = expert_backward_of(cost, local)
            self._grads(grads, f"L{layer}.", mb, final, tags, self.stage, defer)
        self._all_to_all(combine, f"L{layer}.dispatch_grad.{phase}.mb{mb}", **tags)
        self._grads(backward_of(router), f"L{layer}.", mb, final, tags, self.stage, defer)
