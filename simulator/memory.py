"""Memory per GPU: weights, gradients, optimizer state, activations, NCCL buffers.

* Weights, gradients and Adam state with mixed precision take 16 bytes per parameter:
  2 (bf16 weight) + 2 (bf16 gradient) + 12 (fp32 master weight, momentum, variance),
  as in Rajbhandari et al., "ZeRO" (SC'20), section 3.1. With optimizer sharding
  (ZeRO-1) the 12 bytes of Adam state are split across the ``dp`` replicas.
* Activations per layer and micro-batch follow Korthikanti et al. (2022) for each
  combination of TP, SP and recompute (:func:`simulator.model.activation_bytes_per_layer`),
  times the (stage, micro-batch) activation sets a rank holds at its peak, counted from
  its actual pipeline order: ``m`` with GPipe, ``p − s`` on stage ``s`` with 1F1B, and
  whatever interleaved, zero-bubble and custom orders hold. Full recompute keeps each
  layer's input and, during a layer's backward, that one layer's full activations. The
  last stage also keeps fp32 logits (``4·b·s·V/t`` bytes) per micro-batch in flight.
* NCCL's buffers: 128 MiB per communicator the rank belongs to (see below).

Not counted: allocator fragmentation, the CUDA context and cuBLAS workspaces
(docs/modelling.md).
"""

from __future__ import annotations

from typing import Any

from .model import activation_bytes_per_layer
from .schedule.pipeline import Action
from .schedule.step import StepConfig, stage_parameter_count

__all__ = [
    "BYTES_PER_PARAM",
    "NCCL_BUFFERS_PER_COMMUNICATOR",
    "held_activations",
    "memory_per_rank",
]

BYTES_PER_PARAM = {"weights": 2, "gradients": 2, "optimizer_state": 12}
# NCCL keeps NCCL_BUFFSIZE = 4 MiB (its documented default) per channel and direction of
# each connection; a ring has 2 connections and NCCL opens up to 16 channels on
# NVSwitch systems: 2 x 16 x 4 MiB = 128 MiB per communicator.
NCCL_BUFFERS_PER_COMMUNICATOR = 2 * 16 * 4 * 2**20


def held_activations(actions: list[Action]) -> tuple[int, dict[int, int]]:
    """Peak number of (stage, micro-batch) activation sets a rank holds, and how many of
    them belong to each stage at that peak. A forward stores them; the backward that
    last needs them (B, or W when the backward is split) frees them."""
    splits = {a.stage for a in actions if a.type == "W"}
    held: dict[int, int] = {}
    peak, at_peak = 0, {}
    for action in actions:
        if action.type == "F":
            held[action.stage] = held.get(action.stage, 0) + 1
        elif action.type == "B" or (action.type == "W" and action.stage in splits):
            held[action.stage] -= 1
        total = sum(held.values())
        if total > peak:
            peak, at_peak = total, dict(held)
    return peak, at_peak


def memory_per_rank(config: StepConfig, capacity_bytes: float) -> dict[str, Any]:
    """Peak bytes per pipeline rank (every rank of a stage holds the same), and the verdict."""
    model, layout = config.model, config.layout
    orders = config.pipeline_orders()
    sp = config.sp and layout.tp > 1
    layers_per_stage = model.layers // config.stages
    per_layer = activation_bytes_per_layer(
        model, config.micro_batch, layout.tp, sp=sp, recompute=config.recompute
    )
    last_stage = config.stages - 1
    communicators = sum(1 for size in (layout.tp, layout.dp) if size > 1) + (layout.pp > 1)
    ranks = []
    for pipeline_rank in range(layout.pp):
        params = stage_parameter_count(model, layout, pipeline_rank, config.moe)
        terms = {name: float(params * size) for name, size in BYTES_PER_PARAM.items()}
        if config.zero1:
            terms["optimizer_state"] /= layout.dp
        in_flight, by_stage = held_activations(orders[pipeline_rank])
        activations = per_layer * layers_per_stage * in_flight
        if config.recompute == "full":  # one layer's full activations during its backward
            activations += activation_bytes_per_layer(model, config.micro_batch, layout.tp, sp=sp)
        logits = 4.0 * config.micro_batch * model.seq_len * model.vocab / layout.tp
        activations += logits * by_stage.get(last_stage, 0)
        terms["activations"] = activations
        terms["communication_buffers"] = float(communicators * NCCL_BUFFERS_PER_COMMUNICATOR)
        total = sum(terms.values())
        ranks.append(
            {
                "stage": pipeline_rank,
                "parameters": params,
                "in_flight_microbatches": in_flight,
                "terms_bytes": terms,
                "total_bytes": total,
                "dominant": max(terms, key=terms.get),
            }
        )
    peak = max(ranks, key=lambda r: r["total_bytes"])
    return {
        "peak_bytes_per_gpu": peak["total_bytes"],
        "peak_stage": peak["stage"],
        "capacity_bytes": capacity_bytes,
        "oom": peak["total_bytes"] > capacity_bytes,
        "dominant_term": peak["dominant"],
        "per_stage": ranks,
    }
