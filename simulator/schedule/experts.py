"""Lowering pass for mixture-of-experts layers: the router, the dispatch and combine
all-to-alls on the EP group, and the local experts on the tokens this rank received.

An MoE layer replaces the dense MLP of :mod:`simulator.schedule.layers`. Forward:
router, dispatch all-to-all (each rank sends every token-assignment to the rank that
holds its expert; uneven, as :func:`~simulator.arithmetic.moe.moe_layer_traffic` routes
the micro-batch), the local experts over what arrived, each at its own row count, and
the combine all-to-all (the dispatch's transpose). The token reordering around the
all-to-alls, the router's top-k and load-balancing loss, and whether the experts run as
grouped GEMMs or a loop follow ``training.framework``
(:func:`~simulator.arithmetic.moe.moe_layer_ops`). Backward runs them in reverse: the
combine's gradient travels along the dispatch's splits and the dispatch's along the
combine's. Expert weight gradients go to the expert-data-parallel group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from simulator.arithmetic.layer_ops import OpCost, backward_of, fp8_ops
from simulator.arithmetic.moe import (
    MoELayerOps,
    MoELayerTraffic,
    expert_backward_of,
    local_experts,
    moe_layer_ops,
    padded_capacity_rows,
    shared_expert_ops,
)
from simulator.common.vocabulary import ALL_TO_ALL, GROUPED_GEMM
from simulator.schedule.ir import Collective

if TYPE_CHECKING:
    from simulator.request.model import ModelSpec
    from simulator.request.moe import MoESpec
    from simulator.schedule.context import StepConfig
    from simulator.schedule.writer import Writing

__all__ = ["ExpertLowering"]


class ExpertLowering:
    """The MoE part of :class:`~simulator.schedule.layers.RankLowering` (a mixin: it
    writes through the same program writer and layer helpers)."""

    # what RankLowering provides
    config: StepConfig
    model: ModelSpec
    moe: MoESpec | None
    out: Writing
    tp: int
    ep: int
    ep_group: str | None
    ep_index: int
    ep_group_index: int
    envelope: bool
    wait_for: Callable[[int | None], None]
    _forward_op: Callable[[OpCost, int, int, dict[str, Any]], None]
    _grads: Callable[..., None]

    # -- mixture of experts -----------------------------------------------------------
    def _moe_ops(self, layer: int, mb: int) -> tuple[MoELayerOps, MoELayerTraffic, np.ndarray]:
        """The layer's ops as the stack runs them (:func:`moe_layer_ops`), its routing,
        and the dispatch splits (bytes rank i sends rank j; padded to capacity when the
        stack pads)."""
        moe = self.moe
        assert moe is not None  # an MoE layer's
        traffic = self.config.moe_traffic(layer, mb, self.ep_group_index)
        framework = self.config.recipe.framework
        # a folded rank runs, of its EP group, the busiest rank's experts (the most
        # assignments received) and the most tokens sent: the group's all-to-alls wait
        # for the last of its members, so its time is the step's (simulate.py, "MoE")
        index = int(np.argmax(traffic.tokens_received)) if self.envelope else self.ep_index
        rows = traffic.expert_tokens[list(local_experts(moe, self.ep, index))]
        capacity_rows, padded_splits = padded_capacity_rows(moe, traffic, self.ep, framework)
        splits = traffic.splits if padded_splits is None else padded_splits
        sent_by = traffic.tokens_sent
        if padded_splits is not None:
            sent_by = np.round(padded_splits.sum(axis=1) / traffic.bytes_per_token)
        sent = int(sent_by.max() if self.envelope else sent_by[self.ep_index])
        ops = moe_layer_ops(
            moe,
            self.model.hidden,
            rows,
            tokens=self.config.micro_batch * self.model.seq_len,
            sent=sent,
            tp=self.tp,
            framework=framework,
            fp8=self.config.recipe.fp8,
            compiled=self.config.recipe.compile,
            capacity_rows=capacity_rows,
            model_ffn=self.model.ffn,
            mlp=self.model.mlp,
            bias=self.model.bias,
        )
        return ops, traffic, splits

    def _shared_ops(self) -> list[OpCost]:
        """The layer's shared experts on the rank's own tokens (none without them)."""
        moe = self.moe
        assert moe is not None  # an MoE layer's
        ops = shared_expert_ops(
            moe,
            self.model.hidden,
            self.config.micro_batch * self.model.seq_len,
            self.tp,
            model_ffn=self.model.ffn,
            mlp=self.model.mlp,
            bias=self.model.bias,
        )
        return fp8_ops(ops) if self.config.recipe.fp8 else ops

    def _all_to_all(
        self, matrix: np.ndarray, label: str, wait: bool = True, **tags: Any
    ) -> int | None:
        """An uneven all-to-all on the EP group (``matrix``: bytes rank i sends rank j),
        which the next op waits for (with ``wait``; otherwise the caller waits for the
        returned op later). A folded rank's call carries the whole matrix."""
        if self.ep_group is None:
            return None
        splits = tuple(float(b) for b in matrix[self.ep_index])
        op = self.out.w.collective(
            ALL_TO_ALL,
            self.ep_group,
            sum(splits),
            "ep",
            label,
            (self.out.last, *self.out.waits),
            self.out.w.tags(stage=self.out.stage, axis="ep", **tags),
        )
        call = cast(Collective, self.out.w.ops[op])
        call.splits = splits
        if self.envelope:
            call.matrix = matrix
        if wait:
            self.wait_for(op)
        return op

    def _moe_forward(self, layer: int, mb: int, tags: dict[str, Any]) -> None:
        """Router (its top-k and load-balancing loss), the permute, dispatch all-to-all,
        the re-sort by local expert, the local experts on the rows this rank received,
        the reverse re-sort, combine all-to-all (the dispatch's transpose), the
        unpermute. Shared experts run after the combine, or, overlapped, their first GEMM
        and activation beside the dispatch and their second GEMM beside the combine."""
        moe = self.moe
        assert moe is not None  # an MoE layer's
        ops, _, splits = self._moe_ops(layer, mb)
        shared = self._shared_ops()
        overlap = bool(shared) and moe.overlap_shared_experts
        split = next((i for i, op in enumerate(shared) if op.name.startswith("shared_fc2")), 0)
        phase = tags["phase"]
        for cost in (*ops.router, *ops.dispatch):
            self._forward_op(cost, layer, mb, tags)
        dispatch, combine = splits, splits.T
        label = f"L{layer}.dispatch.{phase}.mb{mb}"
        sent = self._all_to_all(dispatch, label, wait=not overlap, **tags)
        if overlap:
            for cost in shared[:split]:
                self._forward_op(cost, layer, mb, tags)
            self.wait_for(sent)
        for cost in (*ops.received, *ops.experts, *ops.returned):
            self._forward_op(cost, layer, mb, tags)
        label = f"L{layer}.combine.{phase}.mb{mb}"
        back = self._all_to_all(combine, label, wait=not overlap, **tags)
        for cost in shared[split:] if overlap else shared:
            self._forward_op(cost, layer, mb, tags)
        if overlap:
            self.wait_for(back)
        for cost in ops.combine:
            self._forward_op(cost, layer, mb, tags)

    def _moe_backward(
        self, layer: int, mb: int, final: bool, tags: dict[str, Any], defer: bool
    ) -> None:
        """The unpermute's backward, the combine's backward (an all-to-all along the
        dispatch), the re-sort's and the experts' backward, the dispatch's backward
        (along the combine), the permute's and the router's."""
        moe = self.moe
        assert moe is not None  # an MoE layer's
        ops, _, splits = self._moe_ops(layer, mb)
        shared = self._shared_ops()
        overlap = bool(shared) and moe.overlap_shared_experts
        local = moe.experts // self.ep
        phase = tags["phase"]
        prefix = f"L{layer}."

        def grads(costs) -> None:
            for cost in reversed(costs):
                grouped = cost.kind == GROUPED_GEMM
                backward = expert_backward_of(cost, local) if grouped else backward_of(cost)
                self._grads(backward, prefix, mb, final, tags, self.out.stage, defer)

        dispatch, combine = splits, splits.T
        grads(ops.combine)
        label = f"L{layer}.combine_grad.{phase}.mb{mb}"
        back = self._all_to_all(dispatch, label, wait=not overlap, **tags)
        if overlap:  # the shared experts' backward beside the combine's
            for cost in reversed(shared):
                self._grads(backward_of(cost), prefix, mb, final, tags, self.out.stage, defer)
            self.wait_for(back)
        grads((*ops.received, *ops.experts, *ops.returned))
        self._all_to_all(combine, f"L{layer}.dispatch_grad.{phase}.mb{mb}", **tags)
        if not overlap:
            for cost in reversed(shared):
                self._grads(backward_of(cost), prefix, mb, final, tags, self.out.stage, defer)
        grads((*ops.router, *ops.dispatch))
