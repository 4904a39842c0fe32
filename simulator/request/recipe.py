"""How a training step is run: the layout and every knob of the training recipe, as one
frozen value built once from the scenario.

A :class:`Recipe` is what the step builder, memory, sweep, scale, explain and the
reports read instead of the scenario's sections: the rank grid (:class:`Layout`),
micro-batching, the pipeline schedule and its virtual stages, how the layers are split
over the stages, recompute, sequence parallelism, optimizer sharding, the attention
kernel and the framework's overlap settings.

It has one compact text form, printed by ``str()`` and read back by
:meth:`Recipe.parse`, as pipeline actions have (``0F1``)::

    tp8 pp4 dp4 sp mb1x16 interleaved-1f1b v2 rc=selective [tp,dp,pp] L96 sharding=optimizer

Tokens, in the order of :data:`~simulator.request.knobs.KNOBS`, which says how each
knob is written: ``tp``, ``cp`` (when > 1), ``pp``, ``dp``, ``ep`` (when > 1), ``sp``
(when on), ``mb<micro-batch>x<micro-batches>``, the schedule, ``v<virtual stages>``
(when > 1), ``rc=<recompute>``, the placement, ``L<layers>``, then ``key=value`` for
every other setting that differs from its default (``stage_layers`` as ``3/5`` when
the stages are uneven). :meth:`Recipe.label` is the same without the micro-batch count,
the layers and the settings: the sweep's one-line name for a layout, whose rows share
all three.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from simulator.common.errors import ScenarioError
from simulator.request.knobs import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    KNOB,
    KNOBS,
    LAYOUT_KNOBS,
    SEARCHED,
    Knob,
    format_value,
)
from simulator.request.layout import Layout
from simulator.request.orders import Action
from simulator.request.placement import Placement, placement_style

__all__ = [
    "Recipe",
    "LAYOUT_KNOBS",
    "layout_label",
    "knob_overrides",
    "knob_tokens",
    "GRADIENT_BYTES",
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
]

# Bytes per gradient element in the dtype gradients are accumulated and reduced in.
GRADIENT_BYTES = {"fp32": 4, "bf16": 2}
# Bytes of each of Adam's two moments (``optimizer_dtype``) and of the fp32 master copy
# of a weight (``master_weights``). The step reads and writes both moments and the
# master weight, and writes the bf16 weight (reading it too when it is the master):
# 4 + 4 + 4 (+ 4 + 4 + 4) + 2 = 26 B per parameter for fp32 moments and master weights
# (Apex/Megatron-LM's fused multi-tensor Adam), 2 + 2 + 2 (+ 2 + 2) + 2 = 12 B in pure
# bf16 (torch.optim.AdamW's foreach path on bf16 tensors)
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
WEIGHT_BYTES = 2  # a bf16 weight
MASTER_WEIGHT_BYTES = 4


def knob_tokens(
    values: dict[str, Any],
    *,
    microbatches: int | None = None,
    layers: int | None = None,
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """The text form's tokens for knob ``values`` by name, in :data:`KNOBS` order (a
    knob not in ``values`` is not written): the label's knobs (``mb<n>x<microbatches>``
    where the count is given), ``L<layers>`` where given, then every other knob given
    whose value differs from its default (``defaults`` overrides a knob's own)."""
    defaults = defaults or {}
    parts = []
    for knob in KNOBS:
        if knob.in_label and knob.name in values:
            value = values[knob.name]
            if knob.written(value):
                parts.append(knob.token(value, microbatches))
    if layers is not None:
        parts.append(f"L{layers}")
    for knob in KNOBS:
        if knob.in_label or knob.name not in values:
            continue
        value = values[knob.name]
        if value != defaults.get(knob.name, knob.default):
            parts.append(knob.token(value))
    return parts


def layout_label(**values: Any) -> str:
    """``tp8 pp4 dp4 sp mb1 1f1b rc=full [tp,dp,pp]``: layout knobs by name in the
    recipe's text form (``mb1x16`` with ``microbatches``); any other knob given that
    differs from its default follows as ``key=value``."""
    microbatches = values.pop("microbatches", None)
    return " ".join(knob_tokens(values, microbatches=microbatches))


def knob_overrides(knobs: dict[str, Any]) -> list[str]:
    """``key.path=value`` assignments that set layout ``knobs`` in a scenario, in
    :data:`LAYOUT_KNOBS` order."""
    return [
        f"{path}={format_value(knobs[name], brackets=True)}"
        for name, path in LAYOUT_KNOBS.items()
        if name in knobs
    ]


@dataclass(frozen=True)
class Recipe:
    """The layout and training recipe of one step (see the module docstring)."""

    layout: Layout
    micro_batch: int
    microbatches: int
    stage_layers: tuple[int, ...]
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    # with recompute full: the share of each stage's layers that are checkpointed and
    # rerun in the backward, evenly spaced (the rest keep their activations)
    recompute_fraction: float = 1.0
    sp: bool = False
    sharding: str = "none"
    attention: str = "flash"
    attention_backend: str = "auto"
    grad_reduce_overlap: bool = True
    tp_comm_overlap: str = "async"
    grad_reduce_dtype: str = "fp32"
    optimizer_dtype: str = "fp32"
    master_weights: bool = True
    param_gather_overlap: bool = False
    reshard_after_forward: bool = True
    cp_kind: str = "ring"
    # the linear layers' GEMMs in FP8 (Transformer Engine, torchtitan's float8) or bf16
    dtype: str = "bf16"
    # the FP8 layers' weights kept and gathered in FP8, half the bytes (torchtitan's
    # enable_fsdp_float8_all_gather under full sharding; Megatron-Core's
    # --fp8-param-gather, NeMo's fp8_params, under a sharded optimizer)
    fp8_all_gather: bool = False
    grad_bucket_bytes: float = float(DDP_BUCKET_BYTES)
    first_grad_bucket_bytes: float = float(DDP_FIRST_BUCKET_BYTES)
    # the software stack (simulator.arithmetic.stacks) and whether torch.compile runs
    framework: str = "megatron"
    compile: bool = False
    # the loss's kernels over the logits (simulator.arithmetic.stacks)
    cross_entropy: str = "auto"
    # a custom schedule's order, per pipeline rank (None: the schedule builds it)
    orders: tuple[tuple[Action, ...], ...] | None = None
    # the first layer of each stage, derived from stage_layers
    _first_layer: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for knob in KNOBS:
            if knob.owner == "recipe" and knob.choices:
                value = getattr(self, knob.name)
                if value not in knob.choices:
                    raise ScenarioError(
                        f"{knob.name}: {value!r} is not one of {', '.join(knob.choices)}"
                    )
        counts = [k.name for k in KNOBS if k.owner == "recipe" and k.kind is int]
        for name in (*counts, "microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{name}: must be a positive integer (got {value!r})")
        if len(self.stage_layers) != self.stages:
            raise ScenarioError(
                f"stage_layers: {len(self.stage_layers)} entries for "
                f"pp({self.layout.pp}) x virtual_stages({self.virtual_stages}) = "
                f"{self.stages} stages"
            )
        fraction = self.recompute_fraction
        if isinstance(fraction, bool) or not 0 < fraction <= 1:
            raise ScenarioError(f"recompute_fraction: {fraction!r} must be above 0 and at most 1")
        if fraction < 1 and self.recompute != "full":
            raise ScenarioError(
                f"recompute_fraction: {fraction:g} applies to recompute full, not {self.recompute}"
            )
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        first, start = [], 0
        for count in self.stage_layers:
            first.append(start)
            start += count
        object.__setattr__(self, "_first_layer", tuple(first))

    # -- the pipeline's split of the layers ---------------------------------------------
    @property
    def stages(self) -> int:
        """Global pipeline stages: ``pp × virtual_stages``."""
        return self.layout.pp * self.virtual_stages

    @property
    def layers(self) -> int:
        return sum(self.stage_layers)

    def layers_of(self, stage: int) -> range:
        """The layers of global ``stage`` (contiguous, in stage order)."""
        first = self._first_layer[stage]
        return range(first, first + self.stage_layers[stage])

    def recomputes(self, layer: int) -> bool:
        """Whether ``layer``'s forward is rerun in its backward (full recompute): every
        layer, or with ``recompute_fraction`` p the evenly spaced share p of each stage's
        layers, the i-th (from 1) when ``round(i·p)`` steps up there, as fms-fsdp's
        block checkpointing picks them (``fms_fsdp/policies/ac_handler.py``)."""
        if self.recompute != "full":
            return False
        fraction = self.recompute_fraction
        if fraction >= 1:
            return True
        stage = bisect_right(self._first_layer, layer) - 1
        index = layer - self._first_layer[stage] + 1
        return math.floor(index * fraction + 0.5) > math.floor((index - 1) * fraction + 0.5)

    @cached_property
    def placement(self) -> Placement:
        """Where the global stages live: ``pp`` ranks of ``virtual_stages`` chunks, in
        the schedule's style (:mod:`simulator.request.placement`)."""
        return Placement(self.layout.pp, self.virtual_stages, placement_style(self.schedule))

    def rank_layers(self, pipeline_rank: int) -> list[int]:
        """The layers pipeline rank ``pipeline_rank`` holds: those of its global stages
        (with virtual stages, not contiguous). The builder, the parameter count and
        memory all ask this one function."""
        return [
            layer
            for stage in self.placement.stages_of(pipeline_rank)
            for layer in self.layers_of(stage)
        ]

    # -- derived settings -------------------------------------------------------------
    @property
    def sequence_parallel(self) -> bool:
        """SP in effect: asked for, with more than one TP rank."""
        return self.sp and self.layout.tp > 1

    @property
    def shards_optimizer(self) -> bool:
        """The Adam state is split across the data-parallel replicas (ZeRO-1 and up)."""
        return self.sharding != "none"

    @property
    def shards_gradients(self) -> bool:
        """Each replica keeps only its shard of the gradients (ZeRO-2 and up)."""
        return self.sharding in ("gradients", "full")

    @property
    def shards_weights(self) -> bool:
        """Each replica keeps only its shard of the weights (ZeRO-3, FSDP)."""
        return self.sharding == "full"

    @property
    def fp8(self) -> bool:
        """The linear layers run on FP8 tensor cores."""
        return self.dtype == "fp8"

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in the reduction dtype."""
        return GRADIENT_BYTES[self.grad_reduce_dtype]

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter the optimizer holds: two moments and the master copy."""
        master = MASTER_WEIGHT_BYTES if self.master_weights else 0
        return 2 * MOMENT_BYTES[self.optimizer_dtype] + master

    @property
    def optimizer_step_bytes(self) -> int:
        """HBM bytes per parameter of the optimizer step, besides the gradient's: its
        state read and written, the bf16 weight written (and read, when it is the
        master)."""
        weight = WEIGHT_BYTES if self.master_weights else 2 * WEIGHT_BYTES
        return 2 * self.optimizer_state_bytes + weight

    def with_(self, **changes: Any) -> Recipe:
        """A copy with ``changes`` (layout fields included: ``tp=8``)."""
        layout_keys = {f.name for f in fields(Layout) if f.init}
        layout_changes = {k: changes.pop(k) for k in list(changes) if k in layout_keys}
        recipe = self
        if layout_changes:
            recipe = replace(recipe, layout=replace(self.layout, **layout_changes))
        return replace(recipe, **changes) if changes else recipe

    def value_of(self, knob: Knob) -> Any:
        """The recipe's value of ``knob`` (a layout knob's from its layout)."""
        return getattr(self.layout if knob.owner == "layout" else self, knob.name)

    def knobs(self) -> dict[str, Any]:
        """The layout knobs (:data:`LAYOUT_KNOBS`) by name, JSON-ready."""
        return {name: _json_ready(self.value_of(KNOB[name])) for name in LAYOUT_KNOBS}

    def searched_knobs(self) -> dict[str, Any]:
        """Every knob ``parasim sweep`` searches, by name (``stage_layers`` None where
        the stages split the layers evenly)."""
        values = {knob.name: self.value_of(knob) for knob in SEARCHED}
        if "stage_layers" in values and values["stage_layers"] == self._even_split():
            values["stage_layers"] = None
        return values

    # -- the compact text form --------------------------------------------------------
    def label(self) -> str:
        """``tp8 pp4 dp4 sp mb1 1f1b rc=full [tp,dp,pp]``: the layout knobs only."""
        values = {knob.name: self.value_of(knob) for knob in KNOBS if knob.in_label}
        return " ".join(knob_tokens(values))

    def __str__(self) -> str:
        values = {knob.name: self.value_of(knob) for knob in KNOBS}
        return " ".join(
            knob_tokens(
                values,
                microbatches=self.microbatches,
                layers=self.layers,
                defaults={"stage_layers": self._even_split()},
            )
        )

    def _even_split(self) -> tuple[int, ...] | None:
        """The stage split the text form leaves out: the same layers on every stage."""
        per = self.layers // self.stages
        return (per,) * self.stages if per * self.stages == self.layers else None

    @classmethod
    def parse(cls, text: str) -> Recipe:
        """Read :func:`str` of a recipe back (a custom schedule's order is not in it)."""
        values: dict[str, Any] = {}
        layout: dict[str, Any] = {}
        for token in text.split():
            try:
                _read_token(token, values, layout)
            except ValueError as exc:
                raise ScenarioError(f"recipe {text!r}: {token!r}: {exc}") from None
        for key in ("tp", "pp", "dp"):
            if key not in layout:
                raise ScenarioError(f"recipe {text!r}: no {key} token")
        if "microbatches" not in values:
            raise ScenarioError(f"recipe {text!r}: no mb<size>x<count> token")
        layout_value = Layout(**layout)
        stages = layout_value.pp * values.get("virtual_stages", 1)
        layers = values.pop("layers", None)
        if "stage_layers" not in values:
            if layers is None or layers % stages:
                raise ScenarioError(
                    f"recipe {text!r}: no L<layers> token that {stages} stages split evenly, "
                    "and no stage_layers"
                )
            values["stage_layers"] = (layers // stages,) * stages
        elif layers is not None and sum(values["stage_layers"]) != layers:
            raise ScenarioError(
                f"recipe {text!r}: stage_layers sum to {sum(values['stage_layers'])}, not L{layers}"
            )
        return cls(layout=layout_value, **values)


def _json_ready(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# the text form's tokens, matched in this order
_GRID = next(k for k in KNOBS if k.form == "grid")
_MICRO = next(k for k in KNOBS if k.form == "micro")
_SETTINGS = {k.prefix or k.name: k for k in KNOBS if k.form == "setting"}
_FLAGS = {k.prefix: k for k in KNOBS if k.form == "flag"}
_WORDS = [k for k in KNOBS if k.form == "word"]
_COUNTS = [k for k in KNOBS if k.form == "count"]


def _read_token(token: str, values: dict[str, Any], layout: dict[str, Any]) -> None:
    def put(knob: Knob, value: Any) -> None:
        (layout if knob.owner == "layout" else values)[knob.name] = value

    if token.startswith("[") and token.endswith("]"):
        put(_GRID, tuple(token[1:-1].split(",")))
        return
    if "=" in token:
        key, _, raw = token.partition("=")
        if key not in _SETTINGS:
            raise ValueError("unknown setting")
        put(_SETTINGS[key], _SETTINGS[key].parse(raw))
        return
    if token in _FLAGS:
        put(_FLAGS[token], True)
        return
    for knob in _WORDS:
        if token in knob.choices:
            put(knob, token)
            return
    for knob in _COUNTS:
        if token.startswith(knob.prefix) and token[len(knob.prefix) :].isdigit():
            put(knob, int(token[len(knob.prefix) :]))
            return
    if token.startswith("L") and token[1:].isdigit():
        values["layers"] = int(token[1:])
        return
    if token.startswith("mb"):
        size, _, count = token[2:].partition("x")
        if size.isdigit() and count.isdigit():
            put(_MICRO, int(size))
            values["microbatches"] = int(count)
            return
    raise ValueError("not a recipe token")
