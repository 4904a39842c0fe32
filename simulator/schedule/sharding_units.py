"""What full sharding gathers at once, as each framework splits a model into units.

A *unit* is the set of weights one all-gather brings in and one reduce-scatter (or
one bucket of them) sends back: its parameters on one rank (the rank's TP shard and
its ``E/ep`` experts, unsharded), how many of them an FP8 recipe keeps in FP8, and
whether it is an expert unit, sharded over the expert-data-parallel group (``edp``)
instead of ``dp``.

* :func:`block_units` (Megatron-Core's FSDP, torchtitan's FSDP2, PyTorch FSDP1 with the
  transformer auto-wrap policy): one unit per transformer block, the first also holding
  the embedding, the last the final norm and output layer
  (:func:`~simulator.arithmetic.counts.unit_parameters`). With expert parallelism an MoE
  block's routed experts are a unit of their own: torchtitan wraps
  ``transformer_block.moe.experts`` with ``fully_shard`` on the ``dp_shard_mod_ep``
  mesh before wrapping the block on the ``dp_shard`` mesh
  (torchtitan ``models/llama4/infra/parallelize.py``, ``apply_fsdp``).
* :func:`submodule_units` (DeepSpeed ZeRO-3): every ``nn.Module`` with parameters of its
  own, as a Hugging Face decoder has them: ``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``, ``gate_proj``, ``up_proj`` (SwiGLU) or one first MLP projection,
  ``down_proj``, each expert's projections, the router, the norms, ``embed_tokens`` and
  ``lm_head``. A module of at most ``stage3_param_persistence_threshold`` parameters
  stays whole on every rank (``persistent``) and is never gathered (DeepSpeed
  ``partition_parameters.py``: ``ds_persist`` when ``numel <= param_persistence_threshold``).

Summed over a layer, the units' parameters are the layer's unit of
:func:`~simulator.arithmetic.counts.unit_parameters` (a test holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.arithmetic.counts import layer_fp8_parameters, unit_parameters
from simulator.arithmetic.layer_ops import (
    FP8_GEMMS,
    embedding_op,
    final_norm_op,
    kv_heads_per_rank,
    layer_forward_ops,
    logits_forward_op,
)
from simulator.arithmetic.moe import expert_ops, shared_expert_ops
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec, is_moe_layer
from simulator.request.recipe import Recipe

__all__ = [
    "Unit",
    "block_units",
    "submodule_units",
    "layer_expert_parameters",
    "rank_expert_parameters",
    "DEEPSPEED_PREFETCH_BUCKET",
    "DEEPSPEED_MAX_LIVE_PARAMETERS",
    "DEEPSPEED_PERSISTENCE_THRESHOLD",
    "DEEPSPEED_REDUCE_BUCKET",
    "DEEPSPEED_ALLGATHER_BUCKET",
]

# DeepSpeed's ZeRO defaults, in elements (deepspeed/runtime/zero/config.py at v0.16.5,
# commit 38327e07): stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9,
# stage3_param_persistence_threshold 1e5, reduce_bucket_size 5e8,
# allgather_bucket_size 5e8.
DEEPSPEED_PREFETCH_BUCKET = 50_000_000
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
DEEPSPEED_REDUCE_BUCKET = 500_000_000
DEEPSPEED_ALLGATHER_BUCKET = 500_000_000


@dataclass(frozen=True, slots=True)
class Unit:
    """Weights gathered together: ``params`` on this rank (unsharded), ``fp8`` of them
    in FP8 layers, ``expert`` (sharded over ``edp``), ``persistent`` (never sharded)."""

    name: str
    params: int
    fp8: int = 0
    expert: bool = False
    persistent: bool = False


def _expert_split(recipe: Recipe, moe: MoESpec | None, layer: int) -> bool:
    """Whether ``layer``'s routed experts shard apart from the block: an MoE layer with
    expert parallelism (without it the experts are replicated like the dense weights)."""
    return moe is not None and recipe.layout.ep > 1 and is_moe_layer(moe, layer)


def _expert_ops(recipe: Recipe, model: ModelSpec, moe: MoESpec):
    """The routed experts' ops of one rank (its ``E/ep`` experts, its TP shard)."""
    return [
        op
        for op in expert_ops(
            moe,
            model.hidden,
            1,
            recipe.layout.tp,
            ep=recipe.layout.ep,
            model_ffn=model.ffn,
            router_tokens=1,
            mlp=model.mlp,
            bias=model.bias,
        )
        if op.name.startswith("expert_")
    ]


def layer_expert_parameters(
    recipe: Recipe, model: ModelSpec, moe: MoESpec | None, layer: int
) -> int:
    """Parameters of ``layer``'s routed experts on one rank that shard over ``edp`` (0
    for a dense layer, and without expert parallelism)."""
    if not _expert_split(recipe, moe, layer):
        return 0
    assert moe is not None  # _expert_split says so
    return sum(op.weight_params for op in _expert_ops(recipe, model, moe))


def rank_expert_parameters(
    recipe: Recipe, model: ModelSpec, moe: MoESpec | None, pipeline_rank: int
) -> int:
    """:func:`layer_expert_parameters` over the layers of a pipeline rank."""
    return sum(
        layer_expert_parameters(recipe, model, moe, layer)
        for layer in recipe.rank_layers(pipeline_rank)
    )


def block_units(recipe: Recipe, model: ModelSpec, moe: MoESpec | None, layer: int) -> list[Unit]:
    """``layer``'s units for FSDP-style wrapping: the block, and with expert parallelism
    its routed experts apart (see the module docstring)."""
    params = unit_parameters(recipe, model, moe, layer)
    fp8 = layer_fp8_parameters(recipe, model, moe, layer)
    experts = layer_expert_parameters(recipe, model, moe, layer)
    if not experts:
        return [Unit(f"L{layer}", params, fp8)]
    # every routed expert weight is an FP8 GEMM's (layer_fp8_parameters)
    expert_fp8 = experts if recipe.fp8 else 0
    return [
        Unit(f"L{layer}", params - experts, fp8 - expert_fp8),
        Unit(f"L{layer}.experts", experts, expert_fp8, expert=True),
    ]


def _module(name: str, params: int, fp8: bool, expert: bool, threshold: int) -> Unit:
    return Unit(
        name,
        params,
        params if fp8 else 0,
        expert=expert,
        persistent=params <= threshold,
    )


def submodule_units(
    recipe: Recipe,
    model: ModelSpec,
    moe: MoESpec | None,
    layer: int,
    threshold: int = DEEPSPEED_PERSISTENCE_THRESHOLD,
) -> list[Unit]:
    """``layer``'s modules in the order its forward runs them, as DeepSpeed ZeRO-3
    gathers them (see the module docstring); ``threshold``: the persistence threshold."""
    tp = recipe.layout.tp
    fp8 = recipe.fp8
    modules: list[Unit] = []
    if layer == 0:
        modules.append(_module("embed_tokens", embedding_op(model, 1, tp).weight_params, False,
                               False, threshold))  # fmt: skip
    moe_layer = moe is not None and is_moe_layer(moe, layer)
    heads = model.heads // tp
    kv = kv_heads_per_rank(model, tp)
    prefix = f"L{layer}."
    for op in layer_forward_ops(model, 1, tp):
        params = op.weight_params
        if not params:
            continue
        name = op.name
        in_fp8 = fp8 and name in FP8_GEMMS
        if name == "qkv":  # q, k and v projections, by their heads
            q = params * heads // (heads + 2 * kv)
            k = (params - q) // 2
            for part, count in (("q_proj", q), ("k_proj", k), ("v_proj", params - q - k)):
                modules.append(_module(prefix + part, count, in_fp8, False, threshold))
        elif name in ("fc1", "fc2") and moe_layer:
            if name == "fc1":
                assert moe is not None  # moe_layer says so
                modules += _moe_modules(recipe, model, moe, prefix, threshold)
        elif name == "fc1" and model.mlp == "swiglu":
            gate = params // 2
            modules.append(_module(prefix + "gate_proj", gate, in_fp8, False, threshold))
            modules.append(_module(prefix + "up_proj", params - gate, in_fp8, False, threshold))
        else:
            label = {"proj": "o_proj", "fc1": "up_proj", "fc2": "down_proj"}.get(name, name)
            modules.append(_module(prefix + label, params, in_fp8, False, threshold))
    if layer == recipe.layers - 1:
        norm = final_norm_op(model, 1).weight_params
        modules.append(_module("norm", norm, False, False, threshold))
        if not model.tie_embeddings or recipe.stages > 1:
            head = logits_forward_op(model, 1, tp).weight_params
            modules.append(_module("lm_head", head, False, False, threshold))
    return modules


def _moe_modules(
    recipe: Recipe, model: ModelSpec, moe: MoESpec, prefix: str, threshold: int
) -> list[Unit]:
    """An MoE layer's modules in forward order: the router (its gate), each local expert's
    projections (Mixtral's ``w1``, ``w3``, ``w2``), then the shared experts'."""
    tp, fp8 = recipe.layout.tp, recipe.fp8
    router = next(
        op
        for op in expert_ops(
            moe, model.hidden, 1, tp, ep=recipe.layout.ep, model_ffn=model.ffn,
            router_tokens=1, mlp=model.mlp, bias=model.bias,
        )
        if not op.name.startswith("expert_")
    )  # fmt: skip
    modules = [_module(prefix + "router", router.weight_params, False, False, threshold)]
    split = recipe.layout.ep > 1
    local = moe.experts // recipe.layout.ep
    swiglu = model.mlp == "swiglu"
    ops = {op.name: op for op in _expert_ops(recipe, model, moe)}
    for expert in range(local):
        for name, parts in (
            ("expert_fc1", ("w1", "w3") if swiglu else ("w1",)),
            ("expert_fc2", ("w2",)),
        ):
            each = ops[name].weight_params // (local * len(parts))
            for part in parts:
                label = f"{prefix}experts.{expert}.{part}"
                modules.append(_module(label, each, fp8, split, threshold))
    # what integer division left over (none for whole shapes) goes to the last expert
    total = sum(op.weight_params for op in ops.values())
    counted = sum(m.params for m in modules[1:])
    if total != counted:
        last = modules[-1]
        modules[-1] = _module(last.name, last.params + total - counted, fp8, split, threshold)
    shared = shared_expert_ops(
        moe, model.hidden, 1, tp, model_ffn=model.ffn, mlp=model.mlp, bias=model.bias
    )
    for op in shared:
        if op.weight_params:
            label = prefix + op.name.replace("shared_", "shared_expert.")
            modules.append(_module(label, op.weight_params, fp8, False, threshold))
    return modules
