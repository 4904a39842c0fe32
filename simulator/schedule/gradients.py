"""The lowering pass for parameters and gradients: what data parallelism adds to a
rank's program, and the optimizer step.

The layer lowering (:mod:`simulator.schedule.layers`) calls this pass when a step
begins (:meth:`DataParallelGradients.begin_step`), before each layer's forward and
backward (:meth:`~DataParallelGradients.before_layer`), whenever a weight gradient is
complete (:meth:`~DataParallelGradients.grad_ready`: the op that produced it, and
whether this is the stage's last backward), after each layer's backward
(:meth:`~DataParallelGradients.after_layer_backward`), and when the pipeline order is
done (:meth:`~DataParallelGradients.end_step`). What it emits is decided here only:

* **DDP buckets**: during a stage's last backward, each weight gradient joins a bucket
  in the order backward produces them; a bucket is all-reduced (with optimizer
  sharding, ZeRO-1: reduce-scattered) on the ``dp`` stream once it holds its cap
  (``first_grad_bucket_bytes`` for the first, then ``grad_bucket_bytes``: PyTorch
  DDP's 1 MiB and 25 MiB by default), overlapping the rest of the backward; with
  ``grad_reduce_overlap: false`` every gradient is reduced once after the backward
  (Megatron-LM's local DDP). Gradients are ``grad_reduce_dtype`` (fp32 by default).
  Expert gradients go to the expert-data-parallel group instead.
* **The optimizer**: the gradient norm for clipping, then Adam over the rank's
  parameters (``1/dp`` of them with optimizer sharding), after the last bucket.
* **The parameter all-gather** of a sharded optimizer: after the optimizer, or, with
  ``param_gather_overlap``, beside the step's forward (Megatron-Core's
  ``--overlap-param-gather``), which the optimizer then waits for.

* **Full sharding** (``sharding: full``, ZeRO-3, FSDP): the units, their gathers
  before each layer and their reduce-scatters after its backward, as
  ``recipe.framework`` runs them, are :mod:`simulator.schedule.sharded_dp`'s: Megatron-Core
  (FSDP2-like: a unit per layer, the first also holding the embedding and the last the
  final norm and output layer, prefetched one unit ahead, regathered for the backward
  with ``reshard_after_forward``), torchtitan's FSDP2 (the same with its copy-in and
  copy-out kernels), PyTorch FSDP1 (flat units, the all-gather rate limiter) and
  DeepSpeed ZeRO-3 (module by module, the coordinator's prefetch bucket, bucketed
  reduce-scatters). The optimizer updates the local shard and nothing is gathered after
  it. With HSDP (``parallel.dp_shard`` < ``dp``) the units shard over groups of
  ``dp_shard`` replicas, and each reduce-scattered shard is then all-reduced across the
  ``dp_replicate`` groups; with expert parallelism the experts shard over ``edp``.
* **DeepSpeed ZeRO-1/2** (``framework: deepspeed``): buckets of ``reduce_bucket_size``
  (5e8 elements) instead of DDP's 25 MiB while ``grad_bucket_bytes`` keeps its default,
  and the updated weights gathered in calls of ``allgather_bucket_size`` (5e8 elements).

With data parallelism alone or ZeRO-1/2 nothing happens around a layer. With FP8
(``dtype: fp8``) the updated weights of the FP8 layers are cast once after the
optimizer, and ``fp8_all_gather`` gathers those weights in FP8.
"""

from __future__ import annotations

import math

from simulator.arithmetic.counts import layer_fp8_parameters, pipeline_rank_parameters
from simulator.arithmetic.layer_ops import ACT_BYTES, OpCost
from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ELEMENTWISE,
    OPTIMIZER,
    REDUCE_SCATTER,
)
from simulator.request.knobs import DDP_BUCKET_BYTES
from simulator.schedule.context import StepConfig
from simulator.schedule.sharded_dp import sharding_for
from simulator.schedule.sharding_units import (
    DEEPSPEED_ALLGATHER_BUCKET,
    DEEPSPEED_REDUCE_BUCKET,
    rank_expert_parameters,
)
from simulator.schedule.writer import Writing

__all__ = ["DataParallelGradients", "ADAM_FLOPS_PER_PARAM"]

# Adam reads its states and the gradient and writes the states and the weight
# (Recipe.optimizer_step_bytes: 26 B per parameter with fp32 master weights, 12 B in
# pure bf16), about a dozen FLOPs; the gradient buffer is zeroed for the next step (one
# more write of the gradient). Clipping first computes the gradient norm, one read of
# every gradient (Megatron-LM's multi_tensor_l2norm).
ADAM_FLOPS_PER_PARAM = 12


class DataParallelGradients:
    """Gradient buckets, the optimizer and the parameter all-gather of one rank."""

    def __init__(
        self,
        config: StepConfig,
        out: Writing,
        pipeline_rank: int,
        dp_group: str | None,
        edp_group: str | None,
    ):
        """``out``: where the rank's lowering writes (its writer, last op and pending
        waits, shared); ``dp_group`` and ``edp_group``: the groups that reduce the dense
        and the expert gradients (None: no replicas)."""
        self.config, self.layout, self.out = config, config.layout, out
        self.pipeline_rank, self.dp_group, self.edp_group = pipeline_rank, dp_group, edp_group
        self.recipe = config.recipe
        self.parameters = pipeline_rank_parameters(
            config.recipe, config.model, config.moe, self.pipeline_rank
        )
        # the routed experts' share of them, whose gradients, optimizer state and
        # updated weights belong to the expert-data-parallel group (dp / ep ranks:
        # Megatron-Core's distributed optimizer keeps the expert parameters in buffers
        # of their own over it), where the rest belong to dp
        self.expert_parameters = (
            rank_expert_parameters(config.recipe, config.model, config.moe, self.pipeline_rank)
            if self.edp_group != self.dp_group
            else 0
        )
        # gradient buckets, per group that reduces them (dense: dp; experts: edp)
        self.bucket_bytes: dict[str, float] = {}
        self.bucket_index: dict[str, int] = {}
        self.last_buckets: dict[str, int] = {}
        self.gathers = (
            self.recipe.sharding in ("optimizer", "gradients") and self.dp_group is not None
        )
        self.early_gather: list[int] | None = None
        self.units = self.recipe.shards_weights and self.dp_group is not None
        # HSDP: units shard over the dp_shard group and their gradient shards are
        # all-reduced over the dp_replicate group; plain FSDP shards over all of dp
        layout, rank = self.layout, self.out.rank
        self.shard_group = self.dp_group
        self.replicate_group = None
        if layout.dp_shard:
            shard = layout.group_name("dp_shard", rank)
            self.shard_group = shard if len(layout.members(shard)) > 1 else None
            replicate = layout.group_name("dp_replicate", rank)
            self.replicate_group = replicate if len(layout.members(replicate)) > 1 else None
        # full sharding: the units, their gathers and reduce-scatters as the framework
        # runs them
        self.sharded = sharding_for(self) if self.units else None
        # DeepSpeed ZeRO-1/2 buckets gradients by reduce_bucket_size and gathers the
        # updated weights by allgather_bucket_size (elements), where PyTorch DDP's
        # bucket_cap_mb stands (the recipe's DDP defaults mean "not set")
        deepspeed = self.recipe.framework == "deepspeed"
        self.first_bucket_cap: float
        self.bucket_cap: float
        self.first_bucket_cap, self.bucket_cap = (
            (DEEPSPEED_REDUCE_BUCKET * self.recipe.grad_bytes,) * 2
            if deepspeed and self.recipe.grad_bucket_bytes == DDP_BUCKET_BYTES
            else (self.recipe.first_grad_bucket_bytes, self.recipe.grad_bucket_bytes)
        )
        self.gather_chunk = DEEPSPEED_ALLGATHER_BUCKET * ACT_BYTES if deepspeed else None

    def begin_step(self, first_stage: int) -> None:
        """Before the first action: gather the weights the last step updated beside this
        step's forward, when the recipe overlaps that gather."""
        if not (self.gathers and self.recipe.param_gather_overlap):
            return
        w = self.out.w
        self.early_gather = [
            w.collective(
                ALL_GATHER,
                group,
                size,
                "dp",
                f"{axis}.param_all_gather",
                (),
                w.tags(stage=first_stage, axis="dp", phase="fwd"),
            )
            for group, axis, size in self._gathered()
        ]

    def _gathered(self) -> list[tuple[str, str, float]]:
        """What a sharded optimizer's parameter all-gathers move, as ``(group, label,
        bytes)``: the rank's bf16 weights over ``dp``, its routed experts' over ``edp``
        (none where a rank holds its experts' whole state), the FP8 layers' in FP8 with
        ``fp8_all_gather`` (Megatron-Core's --fp8-param-gather; every routed expert
        weight is an FP8 GEMM's)."""
        experts = float(self.expert_parameters)
        dense = (self.parameters - experts) * ACT_BYTES
        expert = experts * ACT_BYTES
        if self.recipe.fp8_all_gather:
            config = self.config
            fp8: float = sum(
                layer_fp8_parameters(self.recipe, config.model, config.moe, layer)
                for layer in self.recipe.rank_layers(self.pipeline_rank)
            )
            expert_fp8 = experts if self.recipe.fp8 else 0.0
            dense -= fp8 - expert_fp8
            expert -= expert_fp8
        assert self.dp_group is not None  # self.gathers says so
        gathers = [(self.dp_group, "dp", dense)]
        if experts and self.edp_group is not None:
            gathers.append((self.edp_group, "edp", expert))
        return [entry for entry in gathers if entry[2] > 0]

    def before_layer(self, layer: int, microbatch: int, phase: str) -> None:
        """Before ``layer`` runs its forward (or its backward, or the forward that full
        recompute reruns): with full sharding, its units' gathers as the framework issues
        them (:mod:`simulator.schedule.sharded_dp`)."""
        if self.sharded is not None:
            self.sharded.before_layer(layer, microbatch, phase)

    def after_layer_backward(self, layer: int, microbatch: int, final: bool) -> None:
        """After ``layer``'s backward: with full sharding, in the stage's last backward,
        reduce-scatter its units' gradients as the framework does; otherwise they went to
        :meth:`grad_ready` op by op, which buckets them."""
        sharded = self.sharded
        if sharded is not None and (final or sharded.reduces_every_microbatch):
            sharded.after_layer_backward(layer, microbatch, final)

    def grad_ready(
        self,
        params: int,
        producer: int | tuple[int, int],
        microbatch: int,
        final: bool,
        expert: bool = False,
    ) -> None:
        """``params`` weight gradients were completed by op ``producer`` (``(block, body
        op)``: an op inside a layer's block); ``final``: in
        the stage's last backward, when they are whole and can be reduced."""
        if self.sharded is not None:
            if final or self.sharded.reduces_every_microbatch:
                self.sharded.grad_ready(params, producer, microbatch, expert)
            return
        group = self.edp_group if expert else self.dp_group
        if not final or group is None or params == 0:
            return
        self.bucket_bytes[group] = self.bucket_bytes.get(group, 0.0) + (
            params * self.recipe.grad_bytes
        )
        if not self.recipe.grad_reduce_overlap:
            return  # one reduction of every gradient after the whole backward
        first = self.bucket_index.get(group, 0) == 0
        cap = self.first_bucket_cap if first else self.bucket_cap
        if self.bucket_bytes[group] >= cap:
            self._flush_bucket(group, producer, microbatch)

    def _flush_bucket(self, group: str, producer: int | tuple[int, int], microbatch: int) -> None:
        w = self.out.w
        size = self.bucket_bytes.get(group, 0.0)
        if size <= 0:
            return
        kind = REDUCE_SCATTER if self.recipe.shards_optimizer else ALL_REDUCE
        index = self.bucket_index.get(group, 0)
        label = f"{self.layout.axis_of_group(group)}.bucket{index}"
        self.last_buckets[group] = w.collective(
            kind,
            group,
            size,
            "dp",
            label,
            (producer,),
            w.tags(stage=self.out.stage, axis="dp", phase="bwd", microbatch=microbatch),
        )
        self.bucket_index[group] = index + 1
        self.bucket_bytes[group] = 0.0

    def end_step(self, last_microbatch: int) -> None:
        """After the last action: reduce what the buckets still hold, then the gradient
        norm and the optimizer, then (optimizer sharding) gather the updated weights."""
        for group in list(self.bucket_bytes):
            self._flush_bucket(group, self.out.last, last_microbatch)
        layout = self.layout
        dp = layout.shard_degree if self.recipe.shards_optimizer else 1
        experts = self.expert_parameters
        edp = layout.expert_shard_degree if self.recipe.shards_optimizer else 1
        local = (self.parameters - experts) / dp + experts / edp
        grad_bytes = self.recipe.grad_bytes
        grad_norm = OpCost("grad_norm", ELEMENTWISE, 2.0 * local, grad_bytes * local, 0.0)
        optimizer = OpCost(
            "optimizer",
            OPTIMIZER,
            ADAM_FLOPS_PER_PARAM * local,
            (self.recipe.optimizer_step_bytes + 2 * grad_bytes) * local,
            0.0,
        )
        self.out.waits.extend(self.last_buckets.values())
        if self.sharded is not None:
            self.sharded.end_step(last_microbatch)
            self.out.waits.extend(self.sharded.reduces)
        for gather in self.early_gather or ():
            self.out.wait_for(gather)
        self.out.w.action_open = True
        self.out.run(grad_norm, "optimizer.grad_norm", phase="optimizer")
        self.out.run(optimizer, "optimizer.step", phase="optimizer")
        if self.recipe.fp8:
            # the updated FP8 layers' weights cast once for the next step: read bf16,
            # write FP8 and its transpose (Transformer Engine casts on the first
            # micro-batch and reuses the copy)
            config = self.config
            fp8: float = sum(
                layer_fp8_parameters(self.recipe, config.model, config.moe, layer)
                for layer in self.recipe.rank_layers(self.pipeline_rank)
            )
            expert_fp8 = experts if self.recipe.fp8 else 0
            fp8 = (fp8 - expert_fp8) / dp + expert_fp8 / edp
            cast = OpCost("fp8_weight_cast", ELEMENTWISE, 2.0 * fp8, 4.0 * fp8, 0.0)
            self.out.run(cast, "optimizer.fp8_weight_cast", phase="optimizer")
        if self.gathers and self.early_gather is None:
            # ZeRO-1: every rank updated 1/dp of the weights (its experts' 1/edp); gather
            # the updated bf16 weights (DeepSpeed: in calls of allgather_bucket_size
            # elements, stage_1_and_2.py's all_gather_dp_groups)
            w = self.out.w
            for group, axis, total in self._gathered():
                calls = max(1, math.ceil(total / self.gather_chunk)) if self.gather_chunk else 1
                for index in range(calls):
                    w.collective(
                        ALL_GATHER,
                        group,
                        total / calls,
                        "dp",
                        f"{axis}.param_all_gather" + (f"{index}" if calls > 1 else ""),
                        (self.out.last,),
                        w.tags(stage=self.out.stage, axis="dp", phase="optimizer"),
                    )
