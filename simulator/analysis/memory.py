"""Memory per GPU: weights, gradients, optimizer state, activations, NCCL buffers.

* Weights, gradients and Adam state with mixed precision: 2 bytes (bf16 weight), the
  gradient (4 bytes as Megatron-LM's fp32 main gradients, 2 in bf16:
  ``training.grad_reduce_dtype``) and 12 bytes (fp32 master weight, momentum and
  variance), as in Rajbhandari et al., "ZeRO" (SC'20), section 3.1. ``sharding``
  splits them across the ``dp`` replicas as ZeRO's stages do: ``optimizer`` (ZeRO-1)
  the Adam state; ``gradients`` (ZeRO-2) also the gradients, with one bucket of whole
  gradients waiting for its reduce-scatter; ``full`` (ZeRO-3, FSDP) also the weights,
  with the units gathered at once (two with ``reshard_after_forward``, the rank's
  every unit without) and two units of whole gradients.
* Activations are what the ops of a layer save for their backward
  (:func:`simulator.arithmetic.layer_ops.layer_saved_bytes`), summed over the layers of each stage
  a rank holds, plus the embedding's, the final norm's, the logits' and the loss's
  (the fp32 softmax) on the first and last stage, times the (stage, micro-batch)
  activation sets a rank holds at its peak, counted from its actual pipeline order:
  ``m`` with GPipe, ``p − s`` on stage ``s`` with 1F1B, and whatever interleaved,
  zero-bubble and custom orders hold. For the GPT block with unfused attention the
  layer sums are Korthikanti et al.'s formulas; FlashAttention keeps no ``s²`` term.
  Full recompute keeps each layer's input and, during a layer's backward, that one
  layer's full activations.
* NCCL's buffers: 128 MiB per communicator the rank belongs to (see below).
* What the loss holds while it runs (``transient``, on the rank of the last stage),
  beyond what it keeps for the backward: per logit, the fp32 copy and the gradients of
  an eager ``F.cross_entropy`` on fp32 logits (8 B), the bf16 logits or gradient beside
  a fused loss (2 B) (:func:`simulator.arithmetic.stacks.loss_peak_bytes`). The loss
  of the last micro-batch runs while the rank holds its peak of activations, so it
  adds to that peak: over a 128K vocabulary and 8K tokens an eager loss holds 8 GiB
  more for a moment.

Not counted: allocator fragmentation, the CUDA context and cuBLAS workspaces
(docs/modelling.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from simulator.analysis.result import MemoryEstimate, StageMemory
from simulator.arithmetic.counts import (
    layer_fp8_parameters,
    pipeline_rank_parameters,
    unit_parameters,
)
from simulator.arithmetic.layer_ops import (
    OpCost,
    checkpoint_bytes,
    embedding_op,
    final_norm_op,
    fp8_ops,
    layer_forward_ops,
    layer_saved_bytes,
    logits_forward_op,
    loss_elements,
    loss_op,
)
from simulator.arithmetic.moe import expert_ops, shared_expert_ops
from simulator.arithmetic.stacks import loss_peak_bytes, restack, stack_of
from simulator.common.vocabulary import BACKWARD_WEIGHT, FORWARD, FULL_BACKWARD
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec, is_moe_layer
from simulator.request.orders import Step, compute_actions
from simulator.request.recipe import Recipe
from simulator.schedule.context import StepConfig
from simulator.schedule.sharding_units import rank_expert_parameters

__all__ = [
    "BYTES_PER_PARAM",
    "NCCL_BUFFERS_PER_COMMUNICATOR",
    "held_activations",
    "layer_activation_bytes",
    "stage_activation_bytes",
    "memory_per_rank",
]

# the bf16 weights; the gradients and the optimizer's state take the recipe's dtypes
# (Recipe.grad_bytes, Recipe.optimizer_state_bytes)
BYTES_PER_PARAM = {"weights": 2}
# NCCL keeps NCCL_BUFFSIZE = 4 MiB (its documented default) per channel and direction of
# each connection; a ring has 2 connections and NCCL opens up to 16 channels on
# NVSwitch systems: 2 x 16 x 4 MiB = 128 MiB per communicator.
NCCL_BUFFERS_PER_COMMUNICATOR = 2 * 16 * 4 * 2**20


def held_activations(steps: Iterable[Step]) -> tuple[int, dict[int, int]]:
    """Peak number of (stage, micro-batch) activation sets a rank holds, and how many of
    them belong to each stage at that peak. A forward stores them; the backward that
    last needs them (B, or W when the backward is split) frees them; an overlapped pair
    stores its forward's before its backward frees its own."""
    actions = list(compute_actions(steps))
    splits = {a.stage for a in actions if a.type == BACKWARD_WEIGHT}
    held: dict[int, int] = {}
    peak, at_peak = 0, {}
    for action in actions:
        if action.type == FORWARD:
            held[action.stage] = held.get(action.stage, 0) + 1
        elif action.type == FULL_BACKWARD or (
            action.type == BACKWARD_WEIGHT and action.stage in splits
        ):
            held[action.stage] -= 1
        total = sum(held.values())
        if total > peak:
            peak, at_peak = total, dict(held)
    return peak, at_peak


def _layer_ops(config: StepConfig, layer: int) -> list[OpCost]:
    """The forward ops of ``layer`` on one rank (an MoE layer's experts on the ``k·T``
    assignments a rank receives when routing is balanced)."""
    model, layout, recipe = config.local, config.layout, config.recipe
    sp = recipe.sequence_parallel
    ops = layer_forward_ops(
        model,
        config.micro_batch,
        layout.tp,
        sp,
        recipe.attention,
        layout.cp,
        recipe.cp_kind,
        recipe.fp8,
        stack_of(recipe.framework, recipe.compile, recipe.cross_entropy),
    )
    if config.moe is None or not is_moe_layer(config.moe, layer):
        return ops
    tokens = config.micro_batch * model.seq_len
    experts = expert_ops(
        config.moe,
        model.hidden,
        tokens * config.moe.top_k,
        layout.tp,
        ep=layout.ep,
        model_ffn=model.ffn,
        router_tokens=tokens,
        mlp=model.mlp,
        bias=model.bias,
    )
    experts += shared_expert_ops(
        config.moe,
        model.hidden,
        tokens,
        layout.tp,
        model_ffn=model.ffn,
        mlp=model.mlp,
        bias=model.bias,
    )
    if recipe.fp8:
        experts = fp8_ops(experts)
    dense_mlp = ("fc1", "fc1.cast", "gelu", "swiglu", "fc2", "fc2.cast")
    return [op for op in ops if op.name not in dense_mlp] + experts


def layer_activation_bytes(config: StepConfig, layer: int, recompute: str | None = None) -> float:
    """Bytes ``layer`` keeps for backward per micro-batch on one rank (by default under
    the recipe's recompute: with a ``recompute_fraction``, a layer left out of the
    recompute keeps everything)."""
    layout = config.layout
    sp = config.recipe.sequence_parallel
    checkpoint = checkpoint_bytes(config.local, config.micro_batch, layout.tp, sp)
    if recompute is None:
        recompute = config.recipe.recompute
        if recompute == "full" and not config.recipe.recomputes(layer):
            recompute = "none"
    return layer_saved_bytes(
        _layer_ops(config, layer), recompute, config.recipe.attention, checkpoint
    )


def stage_activation_bytes(
    config: StepConfig, stage: int, per_layer: dict[tuple[bool, bool], float] | None = None
) -> float:
    """Bytes one micro-batch leaves on a rank for global ``stage``: its layers', and
    the embedding's (first stage) or the final norm's, logits' and loss's (last).
    ``per_layer`` keeps the bytes of each kind of layer (dense or MoE, recomputed or
    not), which every stage of the step shares (a layer saves what its kind does,
    whatever its place)."""
    model, layout, b = config.local, config.layout, config.micro_batch
    known: dict[tuple[bool, bool], float] = {} if per_layer is None else per_layer
    total = 0.0
    for layer in config.layers_of(stage):
        kind = (config.is_moe_layer(layer), config.recipe.recomputes(layer))
        value = known.get(kind)
        if value is None:
            value = known[kind] = layer_activation_bytes(config, layer)
        total += value
    shard = layout.tp if config.recipe.sequence_parallel else 1
    if stage == 0:
        total += embedding_op(model, b, layout.tp).saved_bytes
    if stage == config.stages - 1:
        r = config.recipe
        head = [final_norm_op(model, b, shard), loss_op(model, b, layout.tp)]
        total += sum(
            op.saved_bytes
            for op in restack(head, stack_of(r.framework, r.compile, r.cross_entropy))
        )
        total += logits_forward_op(model, b, layout.tp, shard).saved_bytes
    return total


def _gradients_grow_in_backward(config: StepConfig) -> bool:
    """Whether a rank holds no gradient when its step's first loss runs: a PyTorch
    stack (``optimizer.zero_grad()`` frees the gradients, ``set_to_none`` by default
    since PyTorch 2.0) without data or pipeline parallelism (no DDP bucket or FSDP shard
    kept across steps) and with one micro-batch per step (no accumulated gradient).
    Megatron-Core keeps its gradient buffer for the whole run."""
    return (
        config.recipe.framework != "megatron"
        and config.layout.dp == 1
        and config.layout.pp == 1
        and config.microbatches == 1
    )


def _largest_units(recipe: Recipe, model: ModelSpec, moe: MoESpec | None, rank: int) -> float:
    """Parameters of the two largest units a pipeline rank holds (full sharding gathers
    a unit and prefetches the next; its gradients are whole until reduce-scattered)."""
    units = sorted(
        (unit_parameters(recipe, model, moe, layer) for layer in recipe.rank_layers(rank)),
        reverse=True,
    )
    return float(sum(units[:2]))


def _sharded_weights(recipe: Recipe, params: int, units: float) -> float:
    """Full sharding: the bf16 shard of every weight, plus what is gathered at once: two
    units (the one running and the one prefetched) when each is freed after its forward,
    every unit of the rank when they stay gathered until their backward (``units``:
    the two largest units' parameters, :func:`_largest_units`)."""
    size = BYTES_PER_PARAM["weights"]
    if recipe.layout.shard_degree == 1:
        return float(params * size)  # nothing to shard over, nothing gathered
    shard = params * size / recipe.layout.shard_degree
    if recipe.reshard_after_forward:
        return shard + units * size
    return shard + params * size


def _sharded_gradients(recipe: Recipe, params: int, units: float) -> float:
    """ZeRO-2 and up: each replica keeps ``1/dp`` of the gradients, plus the whole
    gradients waiting to be reduce-scattered: a bucket (ZeRO-2), or two units (full
    sharding: the one just finished and the one being computed; ``units`` is their
    parameters, :func:`_largest_units`)."""
    if recipe.layout.shard_degree == 1:
        return float(params * recipe.grad_bytes)
    shard = params * recipe.grad_bytes / recipe.layout.shard_degree
    if recipe.shards_weights:
        return shard + units * recipe.grad_bytes
    return shard + min(recipe.grad_bucket_bytes, params * recipe.grad_bytes)


def memory_per_rank(
    recipe: Recipe, model: ModelSpec, moe: MoESpec | None, capacity_bytes: float
) -> MemoryEstimate:
    """Peak bytes per pipeline rank (every rank of a stage holds the same), and the
    verdict against ``capacity_bytes``."""
    config = StepConfig(recipe, model, moe)
    layout = config.layout
    stack = stack_of(recipe.framework, recipe.compile, recipe.cross_entropy)
    orders = config.pipeline_orders()
    communicators = sum(1 for size in (layout.tp, layout.dp, layout.cp) if size > 1)
    communicators += (layout.pp > 1) + (layout.cp > 1 and layout.dp > 1)  # pp, dp × cp
    if layout.dp_shard and layout.dp_shard < layout.dp:
        communicators += 1 + (layout.dp_shard > 1)  # HSDP's replicate and shard groups
    per_layer: dict[tuple[bool, bool], float] = {}
    per_stage = {
        stage: stage_activation_bytes(config, stage, per_layer) for stage in range(config.stages)
    }
    sizes = dict(
        BYTES_PER_PARAM, gradients=config.grad_bytes, optimizer_state=recipe.optimizer_state_bytes
    )
    ranks = []
    for pipeline_rank in range(layout.pp):
        params = pipeline_rank_parameters(recipe, model, moe, pipeline_rank)
        terms = {name: float(params * size) for name, size in sizes.items()}
        # with EP the routed experts shard over their expert-data-parallel group (dp / ep
        # ranks), not over dp: what sharding saves on them is 1/edp, not 1/dp
        # (Megatron-Core's distributed optimizer, FSDP: simulator.schedule.sharded_dp)
        sharded_experts = layout.ep > 1 and layout.shard_degree > 1
        experts = (
            rank_expert_parameters(recipe, model, moe, pipeline_rank) if sharded_experts else 0
        )
        edp = layout.expert_shard_degree
        extra = experts * (1 / edp - 1 / layout.shard_degree)  # parameters' worth, per term
        if recipe.shards_optimizer:
            terms["optimizer_state"] /= layout.shard_degree
            terms["optimizer_state"] += extra * sizes["optimizer_state"]
        units = _largest_units(recipe, model, moe, pipeline_rank) if recipe.shards_weights else 0.0
        if recipe.shards_gradients:
            terms["gradients"] = _sharded_gradients(recipe, params, units)
            terms["gradients"] += extra * sizes["gradients"]
        if recipe.shards_weights:
            terms["weights"] = _sharded_weights(recipe, params, units)
            terms["weights"] += extra * BYTES_PER_PARAM["weights"]
        if recipe.fp8 and not (recipe.fp8_all_gather and not recipe.shards_weights):
            # Transformer Engine keeps each FP8 layer's weight in FP8 and, for Hopper's
            # TN-only FP8 GEMMs, its transpose too: 2 bytes per such parameter beside the
            # bf16 weight. With FP8 primary weights under a sharded optimizer
            # (fp8_all_gather: Megatron-Core's --fp8-param-gather) the FP8 copy and its
            # transpose are the weight: no bf16 copy, the same 2 + 2 bytes less 2.
            fp8_params: float = sum(
                layer_fp8_parameters(recipe, model, moe, layer)
                for layer in recipe.rank_layers(pipeline_rank)
            )
            if recipe.shards_weights:  # every routed expert weight is an FP8 GEMM's
                fp8_params = fp8_params / layout.shard_degree + extra
            terms["weights"] += 2.0 * fp8_params
        in_flight, by_stage = held_activations(orders[pipeline_rank])
        activations = sum(per_stage[stage] * count for stage, count in by_stage.items())
        held = [layer for stage in by_stage for layer in recipe.layers_of(stage)]
        held = [layer for layer in held if recipe.recomputes(layer)]
        if held:  # a recomputed layer's full activations during its backward
            kinds = {config.is_moe_layer(layer): layer for layer in held}  # a dense, an MoE
            activations += max(
                layer_activation_bytes(config, layer, "none") for layer in kinds.values()
            )
        terms["activations"] = activations
        # the loss runs beside the held activations (on the last stage's rank)
        terms["transient"] = (
            loss_elements(config.local, config.micro_batch, layout.tp) * loss_peak_bytes(stack)
            if config.stages - 1 in by_stage
            else 0.0
        )
        if _gradients_grow_in_backward(config):
            # the gradients are made as the backward frees the activations: the peak is
            # the larger of the loss's moment (no gradient yet) and the step's end
            if terms["gradients"] <= activations + terms["transient"]:
                terms["gradients"] = 0.0
            else:
                terms["activations"] = terms["transient"] = 0.0
        terms["communication_buffers"] = float(communicators * NCCL_BUFFERS_PER_COMMUNICATOR)
        total = sum(terms.values())
        ranks.append(
            StageMemory(
                stage=pipeline_rank,
                parameters=params,
                in_flight_microbatches=in_flight,
                terms_bytes=terms,
                total_bytes=total,
                dominant=max(terms, key=lambda term: terms[term]),
            )
        )
    peak = max(ranks, key=lambda r: r.total_bytes)
    return MemoryEstimate(
        peak_bytes_per_gpu=peak.total_bytes,
        peak_stage=peak.stage,
        capacity_bytes=capacity_bytes,
        oom=peak.total_bytes > capacity_bytes,
        dominant_term=peak.dominant,
        per_stage=ranks,
    )
