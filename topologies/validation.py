"""One-line messages for pydantic validation errors, shared by every config parser.

A user who writes ``parallel: {tpp: 8}`` must read
``parallel.tpp: unknown key (did you mean 'tp'?)`` — one line that names the field
and what was wrong with it, never a pydantic dump or a traceback. A key that another
framework uses for one of parasim's fields (Megatron-LM's ``tensor_model_parallel_size``,
torchtitan's ``data_parallel_shard_degree``, DeepSpeed's ``zero_stage``, a Hugging Face
config's ``num_hidden_layers``) is answered with the field, wherever it is written:
``tensor_model_parallel_size: unknown key (did you mean 'parallel.tp'? ...)``.
A value a message quotes is cut to :data:`LONGEST_SHOWN` characters (:func:`shown`).
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

__all__ = [
    "validation_message",
    "nearest_key_hint",
    "unknown_key_hint",
    "FOREIGN_NAMES",
    "shown",
    "LONGEST_SHOWN",
    "Name",
    "Description",
    "printable",
    "LONGEST_NAME",
    "LONGEST_DESCRIPTION",
    "numbers_are_numbers",
    "LARGEST_COUNT",
    "ConfigModel",
]


#: The most characters of a value a message quotes: enough to recognise it.
LONGEST_SHOWN = 80
#: The longest key compared with the valid ones for a close spelling (no key is longer).
_LONGEST_NAME = 64
#: The longest name (a scenario's, a model's, a cluster's, a GPU's, a device's): the
#: summary prints it in one line, and the shipped ones are under 30 characters.
LONGEST_NAME = 256
#: The longest description: a paragraph (the shipped ones are under 150 characters).
LONGEST_DESCRIPTION = 4096


def printable(value: str, limit: int, allowed: str = "") -> str:
    """``value`` if it is at most ``limit`` characters of printable text (and the
    characters of ``allowed``): the summary prints it to the terminal."""
    if len(value) > limit:
        raise ValueError(f"{len(value)} characters; at most {limit}")
    for index, char in enumerate(value):
        if not char.isprintable() and char not in allowed:
            raise ValueError(
                f"holds the control character {char!r} at {index}; it is printed on the "
                "terminal, so it must be printable text"
            )
    return value


Name = Annotated[str, AfterValidator(lambda value: printable(value, LONGEST_NAME))]
"""A name the summary prints: printable text of at most :data:`LONGEST_NAME` characters."""
Description = Annotated[
    str, AfterValidator(lambda value: printable(value, LONGEST_DESCRIPTION, "\n\t"))
]
"""A description: printable text (lines and tabs allowed) of a paragraph at most."""


def shown(value: Any, limit: int = LONGEST_SHOWN) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters with the count
    of those left out (a 1 MB value is quoted by its start)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value) - limit} more characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def nearest_key_hint(key: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid key closest to ``key``, or ''."""
    if len(key) > _LONGEST_NAME:
        return ""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _foreign(project: str, names: str, field: str) -> dict[str, tuple[str, str]]:
    return {name: (field, project) for name in names.split()}


#: Keys of other frameworks' configurations, each mapped to parasim's field and the
#: framework it comes from: Megatron-LM's arguments and Megatron-Core's
#: ModelParallelConfig and TransformerConfig, torchtitan's JobConfig, DeepSpeed's
#: config JSON, Hugging Face's model configs and TrainingArguments (and nanoGPT's).
FOREIGN_NAMES: dict[str, tuple[str, str]] = {
    **_foreign("Megatron-LM", "tensor_model_parallel_size", "parallel.tp"),
    **_foreign("Megatron-LM", "pipeline_model_parallel_size", "parallel.pp"),
    **_foreign(
        "Megatron-LM",
        "virtual_pipeline_model_parallel_size num_layers_per_virtual_pipeline_stage",
        "parallel.virtual_stages",
    ),
    **_foreign("Megatron-LM", "context_parallel_size", "parallel.cp"),
    **_foreign("Megatron-LM", "expert_model_parallel_size", "parallel.ep"),
    **_foreign("Megatron-LM", "sequence_parallel", "parallel.sp"),
    **_foreign(
        "Megatron-LM",
        "decoder_first_pipeline_num_layers decoder_last_pipeline_num_layers "
        "num_layers_in_first_pipeline_stage num_layers_in_last_pipeline_stage",
        "parallel.stage_layers",
    ),
    **_foreign("Megatron-LM", "micro_batch_size", "training.micro_batch"),
    **_foreign("Megatron-LM", "global_batch_size", "training.global_batch"),
    **_foreign("Megatron-LM", "recompute_granularity", "training.recompute"),
    **_foreign("Megatron-LM", "use_distributed_optimizer", "training.sharding"),
    **_foreign("Megatron-LM", "overlap_grad_reduce", "training.grad_reduce_overlap"),
    **_foreign("Megatron-LM", "overlap_param_gather", "training.param_gather_overlap"),
    **_foreign("Megatron-LM", "accumulate_allreduce_grads_in_fp32", "training.grad_reduce_dtype"),
    **_foreign("Megatron-LM", "ddp_bucket_size", "training.grad_bucket_bytes"),
    **_foreign("Megatron-LM", "use_flash_attn", "training.attention"),
    **_foreign("Megatron-LM", "bf16 fp16 fp8 fp8_format", "training.dtype"),
    **_foreign("Megatron-LM", "seq_length", "model.seq_len"),
    **_foreign("Megatron-LM", "num_layers", "model.layers"),
    **_foreign("Megatron-LM", "num_attention_heads", "model.heads"),
    **_foreign("Megatron-LM", "num_query_groups", "model.kv_heads"),
    **_foreign("Megatron-LM", "kv_channels", "model.head_dim"),
    **_foreign("Megatron-LM", "padded_vocab_size", "model.vocab"),
    **_foreign("Megatron-LM", "swiglu gated_linear_unit", "model.mlp"),
    **_foreign("Megatron-LM", "normalization", "model.norm"),
    **_foreign("Megatron-LM", "position_embedding_type", "model.position"),
    **_foreign("Megatron-LM", "add_bias_linear", "model.bias"),
    **_foreign("Megatron-LM", "untie_embeddings_and_output_weights", "model.tie_embeddings"),
    **_foreign("Megatron-LM", "attention_dropout hidden_dropout", "model.dropout"),
    **_foreign("Megatron-LM", "num_experts num_moe_experts", "model.moe.experts"),
    **_foreign("Megatron-LM", "moe_router_topk", "model.moe.top_k"),
    **_foreign("Megatron-LM", "moe_expert_capacity_factor", "model.moe.capacity_factor"),
    **_foreign("Megatron-LM", "moe_ffn_hidden_size", "model.moe.expert_ffn_hidden"),
    **_foreign("Megatron-LM", "moe_layer_freq", "model.moe.every"),
    **_foreign("Megatron-LM", "seed", "simulation.seed"),
    **_foreign("torchtitan", "parallelism", "parallel"),
    **_foreign("torchtitan", "tensor_parallel_degree", "parallel.tp"),
    **_foreign("torchtitan", "pipeline_parallel_degree", "parallel.pp"),
    **_foreign("torchtitan", "context_parallel_degree", "parallel.cp"),
    **_foreign("torchtitan", "expert_parallel_degree", "parallel.ep"),
    **_foreign("torchtitan", "data_parallel_shard_degree", "parallel.dp_shard"),
    **_foreign("torchtitan", "data_parallel_replicate_degree", "parallel.dp_replicate"),
    **_foreign("torchtitan", "pipeline_parallel_schedule", "parallel.schedule"),
    **_foreign("torchtitan", "pipeline_parallel_schedule_csv", "parallel.schedule_file"),
    **_foreign("torchtitan", "pipeline_parallel_microbatch_size", "training.micro_batch"),
    **_foreign("torchtitan", "local_batch_size", "training.micro_batch"),
    **_foreign("torchtitan", "seq_len", "model.seq_len"),
    **_foreign("torchtitan", "fsdp_reshard_after_forward", "training.reshard_after_forward"),
    **_foreign("torchtitan", "enable_async_tensor_parallel", "training.tp_comm_overlap"),
    **_foreign("torchtitan", "mixed_precision_param", "training.dtype"),
    **_foreign("torchtitan", "mixed_precision_reduce", "training.grad_reduce_dtype"),
    **_foreign("torchtitan", "activation_checkpoint", "training.recompute"),
    **_foreign("DeepSpeed", "zero_optimization zero_stage", "training.sharding"),
    **_foreign("DeepSpeed", "train_batch_size", "training.global_batch"),
    **_foreign("DeepSpeed", "train_micro_batch_size_per_gpu", "training.micro_batch"),
    **_foreign("DeepSpeed", "activation_checkpointing", "training.recompute"),
    **_foreign("Hugging Face", "num_hidden_layers n_layer", "model.layers"),
    **_foreign("Hugging Face", "hidden_size n_embd d_model", "model.hidden"),
    **_foreign("Hugging Face", "n_head", "model.heads"),
    **_foreign("Hugging Face", "num_key_value_heads", "model.kv_heads"),
    **_foreign("Hugging Face", "intermediate_size ffn_dim", "model.ffn_hidden"),
    **_foreign("Hugging Face", "vocab_size", "model.vocab"),
    **_foreign("Hugging Face", "max_position_embeddings n_positions", "model.seq_len"),
    **_foreign("Hugging Face", "tie_word_embeddings", "model.tie_embeddings"),
    **_foreign("Hugging Face", "hidden_act", "model.mlp"),
    **_foreign("Hugging Face", "num_local_experts n_routed_experts", "model.moe.experts"),
    **_foreign("Hugging Face", "num_experts_per_tok", "model.moe.top_k"),
    **_foreign("Hugging Face", "moe_intermediate_size", "model.moe.expert_ffn_hidden"),
    **_foreign("Hugging Face", "n_shared_experts", "model.moe.shared_experts"),
    **_foreign("Hugging Face", "per_device_train_batch_size", "training.micro_batch"),
    **_foreign("Hugging Face", "gradient_checkpointing", "training.recompute"),
}


def unknown_key_hint(key: str, valid: list[str]) -> str:
    """The hint for an unknown ``key``: the parasim field a foreign framework's name
    stands for (:data:`FOREIGN_NAMES`, written with dashes or underscores), else the
    valid key closest in spelling, else ''."""
    name = key.strip().lstrip("-").replace("-", "_")
    foreign = FOREIGN_NAMES.get(name) if len(name) <= _LONGEST_NAME else None
    if foreign is not None:
        field, project = foreign
        return f" (did you mean {field!r}? {key!r} is {project}'s name)"
    return nearest_key_hint(key, valid)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _submodel(current.model_fields[part].annotation)
    return current


def _path(prefix: str, loc: tuple[Any, ...]) -> str:
    """``prefix`` and pydantic's location as a key path: ``cluster.gpu.gemm_table[3][0]``."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "":
            path = f"{path}.{part}" if path else str(part)
    return path or "<root>"


def validation_message(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Turn the first error of ``exc`` (raised validating ``model``) into one line."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    path = _path(prefix, loc)
    if error["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = sorted(parent.model_fields) if parent is not None else []
        hint = unknown_key_hint(str(loc[-1]), valid)
        listing = f"; valid keys: {', '.join(valid)}" if valid else ""
        return f"{path}: unknown key{hint}{listing}"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error["type"] == "missing":
        return f"{path}: required field is missing"
    value = error.get("input")
    if isinstance(value, (dict, list)) or (isinstance(value, str) and shown(value) in message):
        return f"{path}: {message}"
    return f"{path}: {message} (got {shown(value)})"


#: The largest whole number a count field takes (a C ``int``): no layer count, width,
#: batch or GPU count comes near it, and larger ones overflow the arithmetic.
LARGEST_COUNT = 2**31 - 1


def _kinds(annotation: Any) -> set[type]:
    """The plain types an annotation admits (``int | None`` → ``{int, NoneType}``);
    ``object`` for anything open (``Any``, a model, a string)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_kinds(arg) for arg in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    if annotation in (int, float, bool, type(None)):
        return {annotation}
    return {object}


def numbers_are_numbers(cls: type[BaseModel], value: Any, info: Any) -> Any:
    """A ``mode='before'`` validator for every field of a config model: a boolean is
    not a number (pydantic would read ``true`` as 1), and a whole number beyond
    :data:`LARGEST_COUNT` is refused where the field is a count."""
    field = cls.model_fields.get(info.field_name) if info.field_name else None
    if field is None:
        return value
    kinds = _kinds(field.annotation)
    if object in kinds or bool in kinds:
        return value
    if isinstance(value, bool) and kinds & {int, float}:
        raise ValueError(f"expected a number, not {str(value).lower()}")
    if int in kinds and isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a whole number, not {value}")
    if int in kinds and isinstance(value, (int, float)) and abs(value) > LARGEST_COUNT:
        bound = f"too large (at most {LARGEST_COUNT})" if value > 0 else f"below -{LARGEST_COUNT}"
        raise ValueError(f"{_number(value)} is {bound}")
    return value


def _number(value: int | float) -> str:
    """A number for a message: ``1e+200``, or an integer too large for a float by its
    digits."""
    try:
        return f"{value:g}"
    except OverflowError:
        return f"an integer of {len(str(abs(value)))} digits"


class ConfigModel(BaseModel):
    """The base of every configuration model (scenario, model, cluster, profile):
    unknown keys, non-finite numbers, booleans given for numbers and counts beyond
    :data:`LARGEST_COUNT` are refused, each naming its field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return numbers_are_numbers(cls, value, info)
