"""A first estimate of memory per GPU: weights, gradients, optimizer state, activations.

* Weights, gradients and Adam state with mixed precision take 16 bytes per parameter:
  2 (bf16 weight) + 2 (bf16 gradient) + 12 (fp32 master weight, momentum, variance),
  as in Rajbhandari et al., "ZeRO" (SC'20), section 3.1.
* Activations per layer and micro-batch follow Korthikanti et al. (2022), see
  :func:`simulator.model.activation_bytes_per_layer`, times the micro-batches a stage
  holds at its peak: all ``m`` with GPipe, ``min(p − s, m)`` on stage ``s`` with 1F1B.
  Full recompute keeps each layer's input and, during a layer's backward, that one
  layer's full activations. The last stage also keeps its fp32 logits
  (``4·b·s·V/t`` bytes) for the loss.

Not counted yet: communication buffers, allocator fragmentation, the CUDA context and
workspace (see docs/modelling.md).
"""

from __future__ import annotations

from typing import Any

from .layout import Layout
from .model import ModelSpec, activation_bytes_per_layer
from .schedule.step import stage_parameter_count

__all__ = ["BYTES_PER_PARAM", "in_flight_microbatches", "memory_per_rank"]

BYTES_PER_PARAM = {"weights": 2, "gradients": 2, "optimizer_state": 12}


def in_flight_microbatches(schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return microbatches
    return min(stages - stage, microbatches)


def memory_per_rank(
    model: ModelSpec,
    layout: Layout,
    micro_batch: int,
    microbatches: int,
    schedule: str,
    recompute: str,
    capacity_bytes: float,
) -> dict[str, Any]:
    """Peak bytes per stage (every rank of a stage holds the same), and the verdict."""
    stages = []
    layers_per_stage = model.layers // layout.pp
    for stage in range(layout.pp):
        params = stage_parameter_count(model, layout, stage)
        terms = {name: float(params * size) for name, size in BYTES_PER_PARAM.items()}
        in_flight = in_flight_microbatches(schedule, layout.pp, stage, microbatches)
        per_layer = activation_bytes_per_layer(model, micro_batch, layout.tp, recompute=recompute)
        activations = per_layer * layers_per_stage * in_flight
        if recompute == "full":
            activations += activation_bytes_per_layer(model, micro_batch, layout.tp)
        if stage == layout.pp - 1:
            activations += 4.0 * micro_batch * model.seq_len * model.vocab / layout.tp * in_flight
        terms["activations"] = activations
        total = sum(terms.values())
        stages.append(
            {
                "stage": stage,
                "parameters": params,
                "in_flight_microbatches": in_flight,
                "terms_bytes": terms,
                "total_bytes": total,
                "dominant": max(terms, key=terms.get),
            }
        )
    peak = max(stages, key=lambda s: s["total_bytes"])
    return {
        "peak_bytes_per_gpu": peak["total_bytes"],
        "peak_stage": peak["stage"],
        "capacity_bytes": capacity_bytes,
        "oom": peak["total_bytes"] > capacity_bytes,
        "dominant_term": peak["dominant"],
        "per_stage": stages,
    }
