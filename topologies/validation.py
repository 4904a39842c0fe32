"""One-line messages for pydantic validation errors, shared by every config parser.

A user who writes ``parallel: {tpp: 8}`` must read
``parallel.tpp: unknown key (did you mean 'tp'?)`` — one line that names the field
and what was wrong with it, never a pydantic dump or a traceback.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

__all__ = [
    "validation_message",
    "nearest_key_hint",
    "numbers_are_numbers",
    "LARGEST_COUNT",
    "ConfigModel",
]


def nearest_key_hint(key: str, valid: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid key closest to ``key``, or ''."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def validation_message(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Turn the first error of ``exc`` (raised validating ``model``) into one line."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in (prefix, *loc) if p != "") or prefix or "<root>"
    if error["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = sorted(parent.model_fields) if parent is not None else []
        hint = nearest_key_hint(str(loc[-1]), valid)
        listing = f"; valid keys: {', '.join(valid)}" if valid else ""
        return f"{path}: unknown key{hint}{listing}"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error["type"] == "missing":
        return f"{path}: required field is missing"
    value = error.get("input")
    if isinstance(value, (dict, list)) or (isinstance(value, str) and repr(value) in message):
        return f"{path}: {message}"
    return f"{path}: {message} (got {value!r})"


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
    if int in kinds and isinstance(value, (int, float)) and abs(value) > LARGEST_COUNT:
        raise ValueError(f"{value:g} is too large (at most {LARGEST_COUNT})")
    return value


class ConfigModel(BaseModel):
    """The base of every configuration model (scenario, model, cluster, profile):
    unknown keys, non-finite numbers, booleans given for numbers and counts beyond
    :data:`LARGEST_COUNT` are refused, each naming its field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return numbers_are_numbers(cls, value, info)
