"""The mixture-of-experts part of a model, as the scenario states it (``model.moe``):
how many experts, top-k, capacity, which layers, and the routing distribution.

The routing, capacity, traffic and expert compute that follow from it are in
:mod:`simulator.arithmetic.moe`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import MoeDispatcher
from topologies.validation import ConfigModel

__all__ = [
    "UniformRouting",
    "ZipfRouting",
    "DirichletRouting",
    "HistogramRouting",
    "RoutingSpec",
    "MoESpec",
    "is_moe_layer",
    "moe_layers",
    "experts_per_rank",
    "check_expert_parallel",
]


class _Strict(ConfigModel):
    pass


class _Routing(BaseModel):
    # the routing kinds form a discriminated union on ``kind``, which pydantic lets no
    # before-validator touch: the same rules as ConfigModel but the boolean check
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, defer_build=True)


class UniformRouting(_Routing):
    """Every expert gets the same number of assignments (exactly, up to one)."""

    kind: Literal["uniform"] = "uniform"


class ZipfRouting(_Routing):
    """Expert popularity ``∝ 1/rank^exponent``, ranks permuted at random per layer."""

    kind: Literal["zipf"]
    exponent: float = Field(ge=0)


class DirichletRouting(_Routing):
    """Expert popularity drawn per layer from a symmetric Dirichlet distribution."""

    kind: Literal["dirichlet"]
    concentration: float = Field(gt=0)


class HistogramRouting(_Routing):
    """A measured per-expert load (any scale; normalised here)."""

    kind: Literal["histogram"]
    loads: list[float]
    sample: bool = True

    @field_validator("loads")
    @classmethod
    def _normalise(cls, loads: list[float]) -> list[float]:
        for e, x in enumerate(loads):
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"loads[{e}]({x}) must be finite and >= 0")
        total = sum(loads)
        if total <= 0:
            raise ValueError(f"loads sum to {total}; at least one expert needs a load > 0")
        return [x / total for x in loads]


RoutingSpec = Annotated[
    UniformRouting | ZipfRouting | DirichletRouting | HistogramRouting,
    Field(discriminator="kind"),
]


class MoESpec(_Strict):
    """The mixture-of-experts part of a model (scenario key ``model.moe``).

    Layer ``i`` (0-based) is an MoE layer when ``(i + 1) % every == 0``: ``every: 1``
    makes every layer MoE (GShard's decoder, Switch, Mixtral), ``every: 2`` every other
    layer. ``expert_ffn_hidden`` is each routed expert's MLP width (the model's by
    default; ``ffn_hidden`` is its older name): fine-grained experts (DeepSeekMoE, Dai et
    al. 2024) are many narrow ones. ``shared_experts`` always-on experts of the same
    width run on every token beside the routed ones (DeepSeekMoE's shared experts, as one
    MLP of ``shared_experts`` times the width); with ``overlap_shared_experts`` they run
    while the dispatch and combine all-to-alls travel (Megatron-Core's
    ``--moe-shared-expert-overlap``, off by default as there).
    """

    experts: int = Field(gt=0)
    top_k: int = Field(default=1, gt=0)
    capacity_factor: float | None = Field(default=None, gt=0)
    every: int = Field(default=1, ge=1)
    expert_ffn_hidden: int | None = Field(default=None, gt=0)
    ffn_hidden: int | None = Field(default=None, gt=0)
    shared_experts: int = Field(default=0, ge=0)
    # the first layers stay dense (DeepSeek-V3's first_k_dense_replace)
    first_dense: int = Field(default=0, ge=0)
    # node-limited routing: a token's dispatch reaches at most this many nodes (None: no
    # limit; DeepSeek-V3 uses 4)
    max_nodes_per_token: int | None = Field(default=None, gt=0)
    # how tokens travel (simulator.common.vocabulary.MOE_DISPATCHERS): a copy per
    # assignment (alltoall) or per destination GPU and node (deepep)
    dispatcher: MoeDispatcher = "alltoall"
    overlap_shared_experts: bool = False
    # the load-balancing (auxiliary) loss over the router's T x E probabilities (Switch,
    # GShard); None: the stack's default (simulator.arithmetic.moe.STACKS)
    aux_loss: bool | None = None
    # every expert's input padded to its capacity, the padded rows computed and sent
    # (Megatron-Core's --moe-pad-expert-input-to-capacity; DeepSpeed-MoE always pads)
    pad_to_capacity: bool = False
    routing: RoutingSpec = Field(default_factory=UniformRouting)

    @model_validator(mode="after")
    def _consistent(self) -> MoESpec:
        if self.ffn_hidden is not None and self.expert_ffn_hidden not in (None, self.ffn_hidden):
            raise ValueError(
                f"ffn_hidden({self.ffn_hidden}) and expert_ffn_hidden({self.expert_ffn_hidden})"
                " name the same width; give one"
            )
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs a capacity_factor to pad to")
        if self.top_k > self.experts:
            raise ValueError(f"top_k({self.top_k}) > experts({self.experts})")
        if isinstance(self.routing, HistogramRouting) and len(self.routing.loads) != self.experts:
            raise ValueError(
                f"routing.loads has {len(self.routing.loads)} entries != experts({self.experts})"
            )
        return self


def is_moe_layer(spec: MoESpec, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) is an MoE layer: past the ``first_dense``
    layers, every ``every``-th."""
    return layer >= spec.first_dense and (layer + 1) % spec.every == 0


def moe_layers(spec: MoESpec, layers: int) -> list[int]:
    """Indices of the MoE layers of a ``layers``-layer model."""
    return [i for i in range(layers) if is_moe_layer(spec, i)]


def experts_per_rank(spec: MoESpec, ep: int) -> int:
    """Experts each rank of an EP group of ``ep`` ranks holds."""
    if ep < 1:
        raise ScenarioError(f"parallel.ep: ep({ep}) must be >= 1")
    if spec.experts % ep:
        raise ScenarioError(f"parallel.ep: experts({spec.experts}) is not divisible by ep({ep})")
    return spec.experts // ep


def check_expert_parallel(spec: MoESpec, ep: int, dp: int | None = None) -> None:
    """Raise :class:`ScenarioError` unless ``ep`` splits the experts evenly and, given
    ``dp``, divides it (EP ranks are data-parallel replicas of the dense layers)."""
    experts_per_rank(spec, ep)
    if dp is not None and dp % ep:
        raise ScenarioError(f"parallel.ep: dp({dp}) is not divisible by ep({ep})")
