"""One-line messages for pydantic validation errors, shared by every config parser.

A user who writes ``parallel: {tpp: 8}`` must read
``parallel.tpp: unknown key (did you mean 'tp'?)`` — one line that names the field
and what was wrong with it, never a pydantic dump or a traceback.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["validation_message", "nearest_key_hint"]


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
