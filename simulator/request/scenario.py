"""Scenario files: reading, overriding, validating and resolving them.

A scenario (docs/guide.md, "The scenario file") names a cluster, a model, the training
recipe, the parallel layout and the simulation settings. :func:`load_scenario` reads
the YAML (at most :data:`~topologies.files.LARGEST_SCENARIO` bytes, within the bounds of
:func:`topologies.config_text.read_yaml`: no key given twice, no runaway nesting, value
count, length or number), applies ``--set key.path=value`` overrides, validates every
section with pydantic (unknown keys are errors with the nearest valid key suggested, or
the field another framework's name stands for) and resolves presets, giving a
:class:`Scenario` whose layout is known to be possible. Layers that do not divide over
the pipeline's stages are split as evenly as they go (:func:`balanced_stages`) and the
result says so. Every problem becomes a :class:`~simulator.common.errors.ScenarioError`
with one line naming the field and the numbers.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from pydantic import Field, ValidationError

from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import (
    CHUNKS_PER_RANK,
    MICROBATCHES_PER_STAGE,
    PLACEMENT_AXES,
    SPLIT_BACKWARD_SCHEDULES,
    Algorithm,
    AttentionBackend,
    AttentionKernel,
    CpKind,
    CrossEntropyKernel,
    Fidelity,
    Framework,
    GradientDtype,
    GridAxis,
    MlpKind,
    NcclProtocol,
    NormKind,
    OptimizerDtype,
    PositionKind,
    RecomputeMode,
    Schedule,
    ShardingLevel,
    TpCommOverlap,
    TrainingDtype,
)
from simulator.request.knobs import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, KNOBS
from simulator.request.layout import FEWEST_UNEVEN_LAYERS, Layout, balanced_stages
from simulator.request.model import MODEL_PRESETS, ModelSpec
from simulator.request.moe import MoESpec, check_expert_parallel
from simulator.request.orders import Action, load_csv_order, validate_order
from simulator.request.recipe import Recipe
from simulator.request.run_plan import RunSpec
from topologies import Cluster, ClusterSpec, TopologyError, build_cluster, load_cluster_spec
from topologies.config_text import LONGEST_NUMBER, ConfigTextError, read_yaml
from topologies.files import LARGEST_SCENARIO, ConfigFileError, read_config_text
from topologies.units import Bytes
from topologies.validation import (
    ConfigModel,
    Description,
    Name,
    nearest_key_hint,
    shown,
    validation_message,
)

__all__ = [
    "TrainingSpec",
    "ParallelSpec",
    "SimulationSpec",
    "ScenarioSpec",
    "Scenario",
    "load_scenario",
    "read_scenario_file",
    "scenario_from_dict",
    "scenario_model",
    "apply_overrides",
    "check_stage_layers",
    "spec_settings",
]


#: The most GPUs a scenario may have: far beyond today's largest training clusters, and
#: the rank grid's process groups (O(world) each) still fit in a laptop's memory.
MAX_WORLD = 2**20


class _Strict(ConfigModel):
    pass


class TrainingSpec(_Strict):
    global_batch: int = Field(gt=0)
    micro_batch: int = Field(default=1, gt=0)
    dtype: TrainingDtype = "bf16"
    recompute: RecomputeMode = "none"
    # with recompute full: the share of each stage's layers checkpointed and rerun in the
    # backward, evenly spaced (Megatron-LM's --recompute-method block with
    # --recompute-num-layers, fms-fsdp's selective_checkpointing, torchtitan's
    # selective_ac_option "n" as 1/n); the others keep their activations
    recompute_fraction: float = Field(default=1.0, gt=0, le=1)
    # the dtype of Adam's two moments, and whether it keeps an fp32 master copy of the
    # weights (false: it updates the bf16 weights in place, pure-bf16 training)
    optimizer_dtype: OptimizerDtype = "fp32"
    master_weights: bool = True
    # what data parallelism shards: nothing, the optimizer state (ZeRO-1), also the
    # gradients (ZeRO-2), also the weights (ZeRO-3, FSDP); None: as optimizer_sharding says
    sharding: ShardingLevel | None = None
    optimizer_sharding: bool = False  # the older spelling of sharding: optimizer
    # full sharding: free each layer's gathered weights after its forward and gather them
    # again for its backward (FSDP2's reshard_after_forward), or keep them to the backward
    reshard_after_forward: bool = True
    # with dtype fp8 and a sharded optimizer or full sharding: the FP8 layers' weights
    # are kept and gathered in FP8 (torchtitan's enable_fsdp_float8_all_gather,
    # Megatron-Core's --fp8-param-gather, NeMo's fp8_params)
    fp8_all_gather: bool = False
    # the attention kernel: FlashAttention, or Megatron-LM's unfused path before it
    attention: AttentionKernel = "flash"
    # the fused kernel behind flash: the stack's own on the GPU (auto), FlashAttention-2,
    # cuDNN's or PyTorch SDPA's flash backend (simulator.engine.attention_kernels)
    attention_backend: AttentionBackend = "auto"
    # DDP-style gradient buckets reduced during the backward, or one reduction after it
    grad_reduce_overlap: bool = True
    # whether the backward TP all-reduce (SP: reduce-scatter) hides behind the weight
    # gradient GEMM (Megatron-LM's asynchronous TP communication) or is waited for at
    # once; pipelined: Transformer Engine's userbuffers also overlap the forward's SP
    # all-gathers and reduce-scatters with their GEMMs (Megatron-Core --tp-comm-overlap)
    tp_comm_overlap: TpCommOverlap = "async"
    # with optimizer_sharding: the updated weights are all-gathered beside the next
    # forward (Megatron-Core --overlap-param-gather) instead of after the optimizer
    param_gather_overlap: bool = False
    # the dtype gradients are accumulated and reduced in: Megatron-LM keeps fp32 main
    # gradients for bf16 training and torchtitan's FSDP reduces in fp32 by default
    grad_reduce_dtype: GradientDtype = "fp32"
    grad_bucket_bytes: Bytes = float(DDP_BUCKET_BYTES)
    first_grad_bucket_bytes: Bytes = float(DDP_FIRST_BUCKET_BYTES)
    # the software stack that runs the step: its kernels, attention backend, sharded
    # data parallelism and host dispatch (simulator.arithmetic.stacks)
    framework: Framework = "megatron"
    # torch.compile on the model (the PyTorch stacks): elementwise chains fuse
    compile: bool = False
    # the loss's kernels over the logits: the stack's own (auto), one fused
    # softmax-cross-entropy kernel pair (fused), Transformer Engine's (te)
    cross_entropy: CrossEntropyKernel = "auto"

    def sharding_level(self) -> str:
        """``sharding``, or ``optimizer`` when only the older ``optimizer_sharding`` is
        set."""
        if self.sharding is None:
            return "optimizer" if self.optimizer_sharding else "none"
        if self.optimizer_sharding and self.sharding != "optimizer":
            raise ScenarioError(
                f"training.optimizer_sharding: true means sharding optimizer, but "
                f"training.sharding is {self.sharding}; give one of them"
            )
        return self.sharding


class ParallelSpec(_Strict):
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    dp: int | None = Field(default=None, gt=0)
    ep: int = Field(default=1, gt=0)
    # context parallelism: each sequence split over cp ranks, attention by a ring of K/V
    # blocks or by Ulysses' all-to-alls; world = tp · cp · pp · dp
    cp: int = Field(default=1, gt=0)
    cp_kind: CpKind = "ring"
    # HSDP (torchtitan's ParallelDims): full sharding inside groups of dp_shard replicas,
    # replication across dp_replicate such groups; dp = dp_shard · dp_replicate
    dp_shard: int | None = Field(default=None, gt=0)
    dp_replicate: int | None = Field(default=None, gt=0)
    sp: bool = False
    schedule: Schedule = "1f1b"
    virtual_stages: int = Field(default=1, gt=0)
    schedule_file: str | None = None  # custom: torch.distributed.pipelining CSV order
    # layers of each global pipeline stage (pp · virtual_stages entries), when the model
    # is not split evenly (Megatron-DeepSpeed's and Megatron-Core's uneven first and last
    # stages); None: layers / (pp · virtual_stages) each
    stage_layers: list[int] | None = None
    # PLACEMENT_AXES holds GridAxis values, typed as plain strings in the vocabulary
    placement: list[GridAxis] = cast("list[GridAxis]", list(PLACEMENT_AXES))


class SimulationSpec(_Strict):
    fidelity: Fidelity = "flow"
    seed: int = Field(default=0, ge=0)
    algorithm: Algorithm | None = None
    protocol: NcclProtocol | None = None
    # simulate one rank per pipeline stage (and EP group) for the others (None: analytic
    # always folds; flow folds above FLOW_FOLD_WORLD ranks; a MoE step whose EP ranks
    # receive unequal loads folds only when this is true: simulate.would_fold)
    fold: bool | None = None


class ModelSection(_Strict):
    preset: str | None = None
    name: Name | None = None
    layers: int | None = Field(default=None, gt=0)
    hidden: int | None = Field(default=None, gt=0)
    heads: int | None = Field(default=None, gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    vocab: int | None = Field(default=None, gt=0)
    ffn_hidden: int | None = Field(default=None, gt=0)
    kv_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    mlp: MlpKind | None = None
    norm: NormKind | None = None
    position: PositionKind | None = None
    bias: bool | None = None
    tie_embeddings: bool | None = None
    dropout: bool | None = None
    moe: MoESpec | None = None


class ScenarioSpec(_Strict):
    name: Name
    description: Description = ""
    cluster: dict[str, Any]
    model: ModelSection
    training: TrainingSpec
    parallel: ParallelSpec = ParallelSpec()
    simulation: SimulationSpec = SimulationSpec()
    run: RunSpec | None = None


@dataclass
class Scenario:
    """A validated scenario with its presets resolved and its layout checked."""

    spec: ScenarioSpec
    model: ModelSpec
    cluster_spec: ClusterSpec
    layout: Layout
    recipe: Recipe
    warnings: list[str] = field(default_factory=list)
    moe_spec: MoESpec | None = None
    _cluster: Cluster | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def training(self) -> TrainingSpec:
        return self.spec.training

    @property
    def parallel(self) -> ParallelSpec:
        return self.spec.parallel

    @property
    def moe(self) -> MoESpec | None:
        """The model's mixture of experts: the scenario's ``model.moe``, else its preset's."""
        return self.moe_spec

    @property
    def microbatches(self) -> int:
        """Micro-batches each pipeline runs per step: ``global_batch / (dp · micro_batch)``."""
        return self.training.global_batch // (self.layout.dp * self.training.micro_batch)

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = build_cluster(self.cluster_spec)
        return self._cluster


# Values YAML reads as a plain int or a plain string, for which a search's thousands of
# overrides skip the YAML parser: decimal integers without leading zeros (YAML 1.1
# reads 012 as octal), and words that are not one of YAML's booleans or nulls.
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_PLAIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# YAML 1.1's booleans and nulls, as PyYAML's safe loader reads them
_YAML_WORDS: dict[str, bool | None] = {
    **dict.fromkeys("yes Yes YES true True TRUE on On ON".split(), True),
    **dict.fromkeys("no No NO false False FALSE off Off OFF".split(), False),
    **dict.fromkeys("null Null NULL ~".split(), None),
}
# a flow list of plain integers and words: [6, 6, 7] or [tp, dp, pp]
_PLAIN_LIST = re.compile(r"\[\s*([A-Za-z0-9_-]+(\s*,\s*[A-Za-z0-9_-]+)*)?\s*\]")


def _read_plain(text: str) -> Any:
    """A plain integer, word, boolean or null as YAML reads it; ``_read_plain`` (the
    marker) when it is none of those (an integer too long for any field included, which
    the YAML reader refuses)."""
    if len(text) <= LONGEST_NUMBER and _PLAIN_INT.fullmatch(text):
        return int(text)
    if text in _YAML_WORDS:
        return _YAML_WORDS[text]
    if _PLAIN_WORD.fullmatch(text):
        return text
    return _read_plain


def _read_value(text: str, key: str = "") -> Any:
    """An override's value as YAML reads it (``tests/test_overrides.py`` holds the fast
    paths to ``yaml.safe_load``); ``key`` names it in a refusal."""
    if not text.strip():
        return ""
    value = _read_plain(text)
    if value is not _read_plain:
        return value
    if _PLAIN_LIST.fullmatch(text):
        inner = text.strip()[1:-1]
        if not inner.strip():  # "[]" and "[ ]"
            return []
        items = [_read_plain(item.strip()) for item in inner.split(",")]
        if all(item is not _read_plain for item in items):
            return items
    return read_yaml(text, key)


def apply_overrides(raw: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` assignments (values read as YAML) to a copy of ``raw``."""
    result = copy.deepcopy(raw)
    for assignment in assignments:
        if "=" not in assignment:
            raise ScenarioError(f"--set {shown(assignment)}: expected key.path=value")
        path, text = assignment.split("=", 1)
        keys = [k.strip() for k in path.strip().split(".")]
        if not any(keys):
            raise ScenarioError(f"--set {shown(assignment)}: empty key path")
        if not all(keys):
            raise ScenarioError(
                f"--set {shown(assignment)}: an empty key in {shown(path)} (two dots, or a "
                "dot at an end)"
            )
        try:
            value = _read_value(text, ".".join(keys))
        except ConfigTextError as exc:
            raise ScenarioError(f"--set {exc}") from None
        node = result
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                where = ".".join(keys[: depth + 1])
                raise ScenarioError(f"--set {path}: {where} is {shown(child)}, not a section")
            node = child
        node[keys[-1]] = value
    return result


def preset_model(name: str) -> tuple[ModelSpec, MoESpec | None]:
    """The shape and mixture of experts of model preset ``name``."""
    return _resolve_model(ModelSection(preset=name))


def scenario_model(spec: ScenarioSpec) -> tuple[ModelSpec, MoESpec | None]:
    """The shape and mixture of experts of a scenario's model, resolved without laying
    out its ranks (which costs O(world)): what a guard or a search needs first."""
    return _resolve_model(spec.model)


def _resolve_model(section: ModelSection) -> tuple[ModelSpec, MoESpec | None]:
    """The model's shape and its mixture of experts (the section's, else the preset's)."""
    # the section's own fields as given (its values are plain: no serializer needed)
    fields = {key: value for key, value in section if value is not None}
    fields.pop("moe", None)
    preset = fields.pop("preset", None)
    base: dict[str, Any] = {}
    if preset is not None:
        if preset not in MODEL_PRESETS:
            hint = nearest_key_hint(preset, sorted(MODEL_PRESETS))
            raise ScenarioError(
                f"model.preset: unknown model {shown(preset)}{hint}; "
                f"presets: {', '.join(sorted(MODEL_PRESETS))}"
            )
        base = dict(MODEL_PRESETS[preset], name=preset)
    preset_moe = base.pop("moe", None)
    base.update(fields)
    try:
        model = ModelSpec(**base)
    except ValidationError as exc:
        raise ScenarioError(validation_message(exc, ModelSpec, "model")) from None
    moe = section.moe
    if moe is None and preset_moe is not None:
        moe = MoESpec(**preset_moe)
    return model, moe


def _check_divisibility(model: ModelSpec, training: TrainingSpec, layout: Layout) -> None:
    """What the model's shape and the batch need of the layout (layers that do not
    divide over the pipeline are split unevenly instead: :func:`_even_split`)."""
    tp, dp = layout.tp, layout.dp
    checks = [
        (model.heads % tp, f"parallel.tp: heads({model.heads}) is not divisible by tp({tp})"),
        (
            model.kv % tp and tp % model.kv,
            f"parallel.tp: kv_heads({model.kv}) is neither divisible by tp({tp}) nor a "
            f"divisor of it (KV heads are split or replicated over TP ranks)",
        ),
        (model.ffn % tp, f"parallel.tp: ffn_hidden({model.ffn}) is not divisible by tp({tp})"),
        (model.vocab % tp, f"parallel.tp: vocab({model.vocab}) is not divisible by tp({tp})"),
        (
            training.global_batch % (dp * training.micro_batch),
            f"training.global_batch: global_batch({training.global_batch}) is not divisible "
            f"by dp({dp}) * micro_batch({training.micro_batch}) = {dp * training.micro_batch}",
        ),
    ]
    for remainder, message in checks:
        if remainder:
            raise ScenarioError(message)


def check_stage_layers(split: list[int], stages: int, layers: int, what: str) -> None:
    """``parallel.stage_layers`` gives each of ``stages`` stages its layers, ``layers`` in
    all; ``what`` names where the stage count comes from. Only the first stage (which
    holds the embedding) and the last (the final norm, output layer and loss) may hold no
    transformer layer, as Megatron-Core's ``--pipeline-model-parallel-layout`` allows
    (``Et|(tt|)*30L``: a last stage of the loss alone); a middle stage needs one."""
    if len(split) != stages:
        raise ScenarioError(
            f"parallel.stage_layers: {len(split)} entries, but {what} = {stages} stages"
        )
    if min(split) < 0:
        raise ScenarioError(f"parallel.stage_layers: a stage holds {min(split)} layers")
    empty = [stage for stage, count in enumerate(split) if count == 0]
    middle = [stage for stage in empty if 0 < stage < stages - 1]
    if middle or len(empty) == stages:
        raise ScenarioError(
            f"parallel.stage_layers: stage {(middle or empty)[0]} holds no layer; only the "
            f"first stage (the embedding) and the last (the loss) may be without one"
        )
    if sum(split) != layers:
        raise ScenarioError(
            f"parallel.stage_layers: {split} sums to {sum(split)}, not layers({layers})"
        )


def _check_schedule(
    spec: ScenarioSpec, model: ModelSpec, layout: Layout, microbatches: int
) -> None:
    parallel = spec.parallel
    v, pp = parallel.virtual_stages, layout.pp
    if parallel.schedule == "interleaved-1f1b":
        if pp < 2:
            raise ScenarioError(
                f"parallel.schedule: interleaved-1f1b needs a pipeline (pp >= 2, got pp({pp}))"
            )
        if microbatches % pp:
            raise ScenarioError(
                f"parallel.schedule: interleaved-1f1b needs micro-batches({microbatches}) "
                f"divisible by pp({pp}) (global_batch / (dp * micro_batch))"
            )
    elif parallel.schedule in CHUNKS_PER_RANK:
        chunks = CHUNKS_PER_RANK[parallel.schedule]
        if pp < 2:
            raise ScenarioError(
                f"parallel.schedule: {parallel.schedule} needs a pipeline (pp >= 2, got pp({pp}))"
            )
        if v != chunks:
            raise ScenarioError(
                f"parallel.virtual_stages: {parallel.schedule} places {chunks} model chunks "
                f"on each pipeline rank; set virtual_stages: {chunks} (got {v})"
            )
        fewest = MICROBATCHES_PER_STAGE.get(parallel.schedule, 0) * pp * chunks
        if microbatches < fewest:
            raise ScenarioError(
                f"parallel.schedule: {parallel.schedule} needs at least one micro-batch per "
                f"stage, {fewest} for pp({pp}) x {chunks} chunks; got micro-batches"
                f"({microbatches}) (global_batch / (dp * micro_batch))"
            )
    elif v != 1:
        raise ScenarioError(
            f"parallel.virtual_stages: {v} virtual stages need schedule interleaved-1f1b "
            f"(got {parallel.schedule})"
        )
    if parallel.stage_layers is not None and parallel.schedule != "custom":
        check_stage_layers(
            parallel.stage_layers, pp * v, model.layers, f"pp({pp}) * virtual_stages({v})"
        )
    training = spec.training
    if training.recompute_fraction < 1 and training.recompute != "full":
        raise ScenarioError(
            f"training.recompute_fraction: {training.recompute_fraction:g} is the share of "
            f"layers fully recomputed; it needs training.recompute: full (got "
            f"{training.recompute})"
        )
    sharding = training.sharding_level()
    if training.param_gather_overlap and sharding not in ("optimizer", "gradients"):
        raise ScenarioError(
            "training.param_gather_overlap: only with training.sharding optimizer or gradients "
            f"(got {sharding}): it moves the sharded optimizer's parameter all-gather"
        )
    if sharding == "full" and layout.ep > 1 and layout.dp_shard:
        # FSDP with EP: experts shard over edp, dense layers over dp
        # (simulator.schedule.sharded_dp); HSDP beside EP is not split that way
        raise ScenarioError(
            f"parallel.dp_shard: HSDP (dp_shard {layout.dp_shard}) with expert parallelism "
            f"(ep {layout.ep}) is not modelled; use one of them"
        )
    if sharding == "full" and parallel.schedule in SPLIT_BACKWARD_SCHEDULES:
        raise ScenarioError(
            f"training.sharding: full with schedule {parallel.schedule} is not modelled "
            "(FSDP's reduce-scatter would wait for the deferred weight gradients); use "
            "1f1b, gpipe or interleaved-1f1b"
        )
    if training.tp_comm_overlap == "pipelined" and layout.tp > 1 and not parallel.sp:
        raise ScenarioError(
            "training.tp_comm_overlap: pipelined (Transformer Engine's GEMM-collective "
            f"overlap) needs parallel.sp: true with tp({layout.tp}), as Megatron-LM requires"
        )
    if parallel.schedule == "custom" and not parallel.schedule_file:
        raise ScenarioError("parallel.schedule_file: schedule custom needs a CSV order file")
    if parallel.schedule_file and parallel.schedule != "custom":
        raise ScenarioError(
            f"parallel.schedule_file: only used with schedule custom (got {parallel.schedule})"
        )


def _recipe(
    spec: ScenarioSpec, model: ModelSpec, layout: Layout, base_dir: Path | None = None
) -> Recipe:
    """The scenario's recipe: its layout and training settings, with a custom schedule's
    order read from its CSV file (a relative path next to the scenario first, then in
    the working directory, as a custom topology's) and the layers split over the
    stages."""
    training, parallel = spec.training, spec.parallel
    microbatches = training.global_batch // (layout.dp * training.micro_batch)
    orders, virtual = None, parallel.virtual_stages
    if parallel.schedule == "custom":
        assert parallel.schedule_file is not None
        source = Path(parallel.schedule_file)
        if not source.is_absolute() and base_dir is not None and (base_dir / source).exists():
            source = base_dir / source
        order = _load_custom_order(str(source), layout, microbatches)
        virtual = (max(a.stage for actions in order.values() for a in actions) + 1) // layout.pp
        orders = tuple(tuple(order[rank]) for rank in range(layout.pp))
    stages = layout.pp * virtual
    split = parallel.stage_layers
    if split is None:
        split = list(_even_split(model.layers, stages, _stage_count(parallel, layout, stages)))
    elif parallel.schedule == "custom":
        check_stage_layers(split, stages, model.layers, "the order's stage count")
    settings = spec_settings(spec) | {"virtual_stages": virtual, "stage_layers": tuple(split)}
    return Recipe(layout=layout, microbatches=microbatches, orders=orders, **settings)


def spec_settings(spec: ScenarioSpec) -> dict[str, Any]:
    """The recipe's settings (:data:`~simulator.request.knobs.KNOBS` the recipe holds)
    as the scenario writes them, each read at its knob's path; the sharding level
    resolved from its older spelling."""
    settings = {
        knob.name: getattr(getattr(spec, section), name)
        for knob in KNOBS
        if knob.owner == "recipe"
        for section, _, name in (knob.path.partition("."),)
    }
    return settings | {"sharding": spec.training.sharding_level()}


def _stage_count(parallel: ParallelSpec, layout: Layout, stages: int) -> str:
    """Where the pipeline's ``stages`` come from, for a message."""
    if parallel.schedule == "custom":
        return f"the order's {stages} stages"
    if parallel.virtual_stages > 1:
        return f"pp({layout.pp}) * virtual_stages({parallel.virtual_stages}) = {stages} stages"
    return f"pp({layout.pp}) stages"


def _even_split(layers: int, stages: int, what: str) -> tuple[int, ...]:
    """``layers`` over ``stages``: the same number each where they divide, else as
    ``parasim sweep`` splits them (:func:`balanced_stages`, where every stage gets at
    least :data:`FEWEST_UNEVEN_LAYERS`)."""
    if layers % stages == 0:
        return (layers // stages,) * stages
    if layers < FEWEST_UNEVEN_LAYERS * stages:
        raise ScenarioError(
            f"parallel.pp: layers({layers}) do not divide over {what}, and an uneven split "
            f"needs at least {FEWEST_UNEVEN_LAYERS} layers a stage "
            f"({FEWEST_UNEVEN_LAYERS * stages}); give parallel.stage_layers to choose one"
        )
    return balanced_stages(layers, stages)


def _split_text(split: tuple[int, ...] | list[int]) -> str:
    """``7/8×14/7``: each run of equal stages once, with its length."""
    runs: list[list[int]] = []
    for layers in split:
        if runs and runs[-1][0] == layers:
            runs[-1][1] += 1
        else:
            runs.append([layers, 1])
    return "/".join(f"{layers}×{count}" if count > 1 else str(layers) for layers, count in runs)


def _split_warnings(spec: ScenarioSpec, model: ModelSpec, recipe: Recipe) -> list[str]:
    """The result's note that the layers did not divide over the stages and how they
    were split, where the scenario gave no ``parallel.stage_layers``."""
    split = recipe.stage_layers
    if spec.parallel.stage_layers is not None or len(set(split)) == 1:
        return []
    what = _stage_count(spec.parallel, recipe.layout, len(split))
    return [
        f"model.layers: {model.layers} layers do not divide over {what}; split "
        f"{_split_text(split)} as evenly as they go, the heavier stages in the middle "
        "(as parasim sweep splits them; give parallel.stage_layers to choose)"
    ]


def _check_fp8(spec: ScenarioSpec, cluster_spec: ClusterSpec) -> None:
    """FP8 needs FP8 tensor cores; FP8 all-gathers need FP8 and gathered weights."""
    training = spec.training
    gpu = cluster_spec.gpu
    if training.dtype == "fp8" and gpu.fp8_peak_flops is None:
        raise ScenarioError(
            f"training.dtype: fp8 needs FP8 tensor cores; the {gpu.name} has none "
            "(cluster gpu.fp8_peak_flops)"
        )
    if training.fp8_all_gather and (training.dtype != "fp8" or training.sharding_level() == "none"):
        raise ScenarioError(
            "training.fp8_all_gather: only with training.dtype fp8 and a training.sharding "
            f"that gathers weights (optimizer, gradients or full; got dtype "
            f"{training.dtype}, sharding {training.sharding_level()})"
        )


def _check_context_parallel(
    spec: ScenarioSpec, model: ModelSpec, moe: MoESpec | None, tp: int, cp: int
) -> None:
    """What context parallelism needs of the model and the recipe."""
    if cp == 1:
        return
    parallel = spec.parallel
    if spec.training.attention != "flash":
        raise ScenarioError(
            f"parallel.cp: context parallelism runs FlashAttention blocks (got "
            f"training.attention {spec.training.attention})"
        )
    if moe is not None or parallel.dp_shard is not None or parallel.dp_replicate is not None:
        raise ScenarioError(f"parallel.cp: cp({cp}) with MoE or HSDP is not modelled yet")
    if parallel.cp_kind == "ring" and model.seq_len % (2 * cp):
        raise ScenarioError(
            f"parallel.cp: the ring splits each sequence into 2·cp = {2 * cp} chunks "
            f"(two per rank, for causal balance); seq_len({model.seq_len}) is not divisible"
        )
    if parallel.cp_kind == "ulysses":
        if model.heads % (tp * cp) or model.kv % (tp * cp):
            raise ScenarioError(
                f"parallel.cp: Ulysses gives each rank heads / (tp·cp); heads({model.heads}) "
                f"and kv_heads({model.kv}) must be divisible by tp({tp}) * cp({cp}) = {tp * cp}"
            )
        if model.seq_len % cp:
            raise ScenarioError(
                f"parallel.cp: seq_len({model.seq_len}) is not divisible by cp({cp})"
            )


def _dp_shard(spec: ScenarioSpec, dp: int) -> int:
    """HSDP's shard group size from ``parallel.dp_shard`` / ``dp_replicate`` (0: none)."""
    parallel = spec.parallel
    shard, replicate = parallel.dp_shard, parallel.dp_replicate
    if shard is None:
        if replicate is None:
            return 0
        if dp % replicate:
            raise ScenarioError(
                f"parallel.dp_replicate: dp_replicate({replicate}) does not divide dp({dp})"
            )
        shard = dp // replicate
    replicate = dp // shard if replicate is None else replicate
    if shard * replicate != dp:
        raise ScenarioError(
            f"parallel: dp_shard({shard}) * dp_replicate({replicate}) = {shard * replicate} "
            f"!= dp({dp})"
        )
    if replicate > 1 and spec.training.sharding_level() != "full":
        raise ScenarioError(
            f"parallel.dp_replicate: HSDP (dp_replicate {replicate}) needs training.sharding: "
            f"full (got {spec.training.sharding_level()})"
        )
    return shard


def _global_ranks(message: str, layout: Layout) -> str:
    """``message`` with the global ranks of each pipeline rank it names."""
    named = sorted({int(p) for p in re.findall(r"pipeline rank (\d+)", message)})
    parts = []
    for stage in named:
        if stage < layout.pp:
            ranks = [r for r in range(layout.world) if layout.coords(r)["pp"] == stage]
            shown = ", ".join(map(str, ranks[:4])) + (
                f", ... ({len(ranks)})" if len(ranks) > 4 else ""
            )
            parts.append(f"pipeline rank {stage} is global ranks {shown}")
    return message + (f" ({'; '.join(parts)})" if parts else "")


def _load_custom_order(path: str, layout: Layout, microbatches: int) -> dict[int, list[Action]]:
    """A custom pipeline order from torch.distributed.pipelining's CSV format, checked."""
    pp = layout.pp
    try:
        order = load_csv_order(path)
        stages = max(a.stage for actions in order.values() for a in actions) + 1
        validate_order(order, stages, microbatches)
    except (OSError, ValueError) as exc:
        message = str(exc) if str(exc).startswith(path) else f"{path}: {exc}"
        message = _global_ranks(message, layout)
        raise ScenarioError(f"parallel.schedule_file: {message}") from None
    if sorted(order) != list(range(pp)) or stages % pp:
        raise ScenarioError(
            f"parallel.schedule_file: {path} orders {len(order)} ranks and {stages} stages; "
            f"the layout has pp({pp})"
        )
    return order


def _layout_warnings(layout: Layout, cluster_spec: ClusterSpec) -> list[str]:
    per_node = cluster_spec.gpus_per_node
    calibration = cluster_spec.calibration
    notes = [calibration.note] if calibration is not None and calibration.note else []
    tp_groups, spanning, first = _spanning_tp_groups(layout, per_node)
    if not spanning:
        return notes
    return notes + [
        f"tensor-parallel groups span nodes ({spanning} of {tp_groups} TP groups, "
        f"e.g. ranks {list(first)} on nodes {sorted({r // per_node for r in first})}): "
        "every layer's all-reduces cross the network instead of the node's "
        f"{'NVLink' if cluster_spec.nvswitch is not None else 'PCIe'}"
    ]


@functools.lru_cache(maxsize=64)
def _spanning_tp_groups(layout: Layout, per_node: int) -> tuple[int, int, tuple[int, ...]]:
    """How many TP groups ``layout`` has, how many of them have ranks on more than one
    node of ``per_node`` GPUs, and the first of those (a search asks for every recipe
    of one grid)."""
    members = layout.axis_groups("tp")
    nodes = members // per_node
    spanning = np.flatnonzero(nodes.min(axis=1) != nodes.max(axis=1))
    first = tuple(members[spanning[0]].tolist()) if len(spanning) else ()
    return len(members), len(spanning), first


def scenario_from_dict(
    raw: Any, source: str = "scenario", base_dir: Path | None = None
) -> Scenario:
    """Validate and resolve a scenario given as a parsed YAML mapping; relative paths
    (a custom topology, a calibration profile) are read next to ``base_dir``."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        spec = ScenarioSpec(**raw)
    except ValidationError as exc:
        raise ScenarioError(validation_message(exc, ScenarioSpec)) from None
    try:
        cluster_spec = load_cluster_spec(spec.cluster, prefix="cluster", base_dir=base_dir)
    except TopologyError as exc:
        raise ScenarioError(str(exc)) from None
    model, moe = _resolve_model(spec.model)
    parallel = spec.parallel
    world = cluster_spec.nodes * cluster_spec.gpus_per_node
    if world > MAX_WORLD:
        raise ScenarioError(
            f"cluster: {cluster_spec.nodes} nodes * {cluster_spec.gpus_per_node} GPUs = {world} "
            f"GPUs; parasim lays out at most {MAX_WORLD} (the rank grid alone would not fit "
            "in memory)"
        )
    tp, pp, cp = parallel.tp, parallel.pp, parallel.cp
    grid = f"tp({tp}) * cp({cp}) * pp({pp})" if cp > 1 else f"tp({tp}) * pp({pp})"
    if parallel.dp is None:
        if world % (tp * cp * pp):
            raise ScenarioError(
                f"parallel: world({world}) is not divisible by {grid} = {tp * cp * pp}, "
                "so dp cannot be inferred"
            )
        dp = world // (tp * cp * pp)
    else:
        dp = parallel.dp
        if tp * cp * pp * dp != world:
            raise ScenarioError(
                f"parallel: {grid} * dp({dp}) = {tp * cp * pp * dp} != world({world}) "
                f"= {cluster_spec.nodes} nodes * {cluster_spec.gpus_per_node} GPUs"
            )
    _check_context_parallel(spec, model, moe, tp, cp)
    _check_fp8(spec, cluster_spec)
    if spec.training.compile and spec.training.framework == "megatron":
        raise ScenarioError(
            "training.compile: Megatron-Core does not run torch.compile on the model (its "
            "kernels are fused already); compile applies to torchtitan, fsdp1 and deepspeed"
        )
    if parallel.ep > 1 and moe is None:
        raise ScenarioError(f"parallel.ep: ep({parallel.ep}) needs a mixture-of-experts model.moe")
    if moe is not None:
        check_expert_parallel(moe, parallel.ep, dp)
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        placement=tuple(parallel.placement),
        ep=parallel.ep,
        dp_shard=_dp_shard(spec, dp),
        cp=cp,
    )
    _check_divisibility(model, spec.training, layout)
    _check_schedule(
        spec, model, layout, spec.training.global_batch // (dp * spec.training.micro_batch)
    )
    recipe = _recipe(spec, model, layout, None if base_dir is None else Path(base_dir))
    return Scenario(
        spec=spec,
        model=model,
        cluster_spec=cluster_spec,
        layout=layout,
        recipe=recipe,
        warnings=_layout_warnings(layout, cluster_spec) + _split_warnings(spec, model, recipe),
        moe_spec=moe,
    )


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    """The parsed YAML mapping of a scenario file; a missing file or bad YAML is one line."""
    path = Path(path)
    try:
        text = read_config_text(path, LARGEST_SCENARIO)
    except ConfigFileError as exc:
        raise ScenarioError(f"{path}: cannot read scenario ({exc.reason})") from None
    try:
        raw = read_yaml(text, "", str(path))
    except ConfigTextError as exc:
        raise ScenarioError(str(exc)) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read a scenario YAML file, apply ``--set`` overrides and resolve it."""
    path = Path(path)
    raw = apply_overrides(read_scenario_file(path), overrides or [])
    return scenario_from_dict(raw, source=str(path), base_dir=path.parent)
