"""Reading the YAML and JSON text of configuration files, within bounds.

Every YAML text parasim reads (a scenario, a custom topology, a preset, a ``--set`` or
``--fix`` value) goes through :func:`read_yaml`, and every JSON file (a calibration
profile) through :func:`read_json`. Before any object is built each text is checked
against bounds far above what a real file needs, so that a hostile or broken file is
refused in one line and well under a second instead of overflowing the parser's stack,
filling memory or running for minutes:

* nesting deeper than :data:`DEEPEST_NESTING` levels;
* more than :data:`MOST_VALUES` values, counting what each alias expands to (an
  anchor-and-alias "billion laughs" bomb is refused before it is expanded);
* a value or key longer than :data:`LONGEST_SCALAR` characters;
* a number of more than :data:`LONGEST_NUMBER` digits (Python refuses to convert an
  integer of 4,301 digits or more; no field comes near it);
* a key given twice in one mapping (YAML would keep the last silently);
* in JSON, the ``NaN`` and ``Infinity`` literals, which are not JSON.

YAML is walked as the parser's event stream (libyaml's, where PyYAML has it), which
holds no nesting on Python's stack, and loaded only once the walk passed. Each refusal
is a :class:`ConfigTextError` whose message names the key path (``training.global_batch``),
the numbers and the line; the caller's prefix (``cluster.topology``) starts the path.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import yaml

__all__ = [
    "ConfigTextError",
    "DEEPEST_NESTING",
    "MOST_VALUES",
    "LONGEST_SCALAR",
    "LONGEST_NUMBER",
    "read_yaml",
    "read_json",
]

#: The deepest nesting read. A scenario's deepest value, an inline topology link's
#: bandwidth (``cluster.topology.links[3].bandwidth``) or a ``gemm_table`` cell, is five
#: levels down; 64 is far above it and far below what a recursive parser overflows at.
DEEPEST_NESTING = 64
#: The most values (scalars, lists and mappings, an alias counting as what it stands
#: for; not the keys that name them) one text holds. The largest real ones: a custom
#: graph topology of 1,024 GPUs (with four NVSwitches a node, a NIC a GPU, 8 rails of
#: leaves and 16 spines: 2,700 devices and 6,500 links, about 41,000 values) and a
#: calibrated ``gemm_table`` of a few thousand rows (five values a row). Walking this
#: many takes about a third of a second of one core.
MOST_VALUES = 100_000
#: The longest key or value read, in characters: a file path is at most 4,096 bytes
#: (Linux's PATH_MAX) and a description a paragraph.
LONGEST_SCALAR = 16_384
#: The most digits a number may have: a float holds 17 significant digits and a 64-bit
#: integer 19; a number written out longer is a mistake (Python refuses to convert an
#: integer of 4,301 digits).
LONGEST_NUMBER = 40

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_STR_TAG = "tag:yaml.org,2002:str"
# the plain words YAML 1.1 (PyYAML's safe loader) reads as booleans and nulls; every
# other plain scalar that starts with a letter or an underscore is a string
_NOT_STRINGS = frozenset(
    "yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF "
    "null Null NULL".split()
)
_RESOLVER = yaml.resolver.Resolver()
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigTextError(ValueError):
    """A configuration text past a bound, or not valid YAML or JSON, in one line."""


def _at(path: str, source: str, line: int) -> str:
    """``path`` (or ``<top>``) with the file and the line it is on, for a message (no
    line for a one-line text without a name, such as a ``--set`` value)."""
    where = path or "<top>"
    return f"{where} ({source} line {line})" if source else where


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _digits(text: str) -> int:
    return sum(char.isdigit() for char in text)


def _number_problem(text: str) -> str | None:
    """Why a number written as ``text`` is refused, or None."""
    digits = _digits(text)
    if digits > LONGEST_NUMBER:
        return f"a number of {digits} digits; no field takes more than {LONGEST_NUMBER}"
    return None


def _plain_tag(value: str) -> str:
    """The tag YAML's safe loader gives a plain scalar."""
    first = value[:1]
    if (first.isalpha() or first == "_") and value not in _NOT_STRINGS:
        return _STR_TAG
    return _RESOLVER.resolve(yaml.ScalarNode, value, (True, False))


def _key_identity(event: yaml.ScalarEvent) -> tuple[str, Any]:
    """What a scalar key means, so that ``a`` and ``'a'`` are the same key but ``1`` and
    ``'1'`` are not: its tag, and its value as YAML reads it where that is not a string."""
    value = event.value
    if event.tag not in (None, "!"):
        return event.tag, value
    if not event.implicit[0]:
        return _STR_TAG, value
    tag = _plain_tag(value)
    if tag == _STR_TAG:
        return tag, value
    try:
        read = yaml.load(value, Loader=_LOADER)  # a short plain scalar: int, bool, null...
    except yaml.YAMLError:
        read = value
    try:
        hash(read)
    except TypeError:
        read = value
    return tag, read


class _Frame:
    """One open list or mapping of the walk. Its path is built only for a message: from
    its parent and where it sits there (a key or an index)."""

    __slots__ = (
        "parent",
        "place",
        "is_mapping",
        "level",
        "anchor",
        "first",
        "deepest",
        "keys",
        "key",
        "index",
    )

    def __init__(
        self, parent: _Frame | None, place: str | int, is_mapping: bool, anchor: str | None
    ):
        self.parent = parent
        self.place = place
        self.is_mapping = is_mapping
        self.level: int = 1 if parent is None else parent.level + 1
        self.anchor = anchor
        self.first = 0  # the count of values before this one (for an anchor's size)
        self.deepest = self.level
        self.keys: dict[tuple[str, Any], int] = {}
        self.key: str | None = None  # the key whose value comes next (mappings)
        self.index = 0  # the next item's index (lists)

    def path(self, prefix: str) -> str:
        """The key path of this container, under ``prefix``."""
        parts: list[str] = []
        frame: _Frame | None = self
        while frame is not None and frame.parent is not None:
            place = frame.place
            parts.append(f"[{place}]" if isinstance(place, int) else f".{place}")
            frame = frame.parent
        joined = "".join(reversed(parts))
        if not prefix:
            return joined.removeprefix(".")
        return prefix + joined

    def child(self, prefix: str) -> str:
        """The key path of the node that comes next in this container."""
        if self.is_mapping:
            return _child(self.path(prefix), str(self.key))
        return f"{self.path(prefix)}[{self.index}]"


#: Keep the middle of a long key path out of a message (a path 64 levels deep).
_LONGEST_PATH = 120


def _short(path: str) -> str:
    if len(path) <= _LONGEST_PATH:
        return path
    return f"{path[:60]}…{path[-40:]}"


class _Walk:
    """The bounds of one YAML text, checked event by event (see the module docstring).
    Written for speed: a file at the bound is walked in a fraction of a second."""

    def __init__(self, prefix: str, source: str):
        self.prefix = prefix
        self.source = source
        self.top: _Frame | None = None
        self.values = 0
        # anchor -> (values, levels) it stands for
        self.anchors: dict[str, tuple[int, int]] = {}

    def refuse(self, path: str, event: Any, reason: str) -> NoReturn:
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        raise ConfigTextError(f"{_at(_short(path), self.source, line)}: {reason}")

    def here(self) -> str:
        """The path of the node the last event started."""
        top = self.top
        if top is None:
            return self.prefix
        if top.is_mapping and top.key is None:
            return top.path(self.prefix)
        return top.child(self.prefix)

    def too_many(self, event: Any) -> NoReturn:
        self.refuse(
            self.here(),
            event,
            f"more than {MOST_VALUES} values in one file (aliases counted as what they "
            "repeat); no configuration needs that many",
        )

    def too_deep(self, event: Any) -> NoReturn:
        self.refuse(
            self.here(), event, f"nested more than {DEEPEST_NESTING} levels deep; no field nests so"
        )

    def key(self, event: Any) -> None:
        """A mapping's key: a scalar or an alias of one, given once."""
        top = self.top
        assert top is not None
        if type(event) is yaml.AliasEvent:
            identity: tuple[str, Any] = ("*", event.anchor)
            name = f"*{event.anchor}"
        elif type(event) is yaml.ScalarEvent:
            identity, name = _key_identity(event), event.value
        else:
            self.refuse(top.path(self.prefix), event, "a key that is a list or a mapping")
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        first = top.keys.get(identity)
        if first is not None:
            top.key = name
            self.refuse(
                top.child(self.prefix),
                event,
                f"given twice in one mapping, first at line {first}; YAML would keep the "
                "last silently, so give each key once",
            )
        top.keys[identity] = line

    def scalar(self, event: Any) -> None:
        value = event.value
        if len(value) > LONGEST_NUMBER:
            if len(value) > LONGEST_SCALAR:
                self.refuse(
                    self.here(),
                    event,
                    f"a value of {len(value)} characters; parasim reads at most {LONGEST_SCALAR}",
                )
            if event.implicit[0] and event.tag in (None, "!"):
                if _plain_tag(value) in (_INT_TAG, _FLOAT_TAG):
                    problem = _number_problem(value)
                    if problem is not None:
                        self.refuse(self.here(), event, problem)
        if event.anchor is not None:
            self.anchors[event.anchor] = (1, 0)

    def node(self, event: Any) -> None:
        """Count a scalar, an alias or the start of a container, where it sits."""
        top = self.top
        is_key = top is not None and top.is_mapping and top.key is None
        kind = type(event)
        if is_key:
            self.key(event)
        if kind is yaml.ScalarEvent:
            self.scalar(event)
            added, levels = 1, 0
        elif kind is yaml.AliasEvent:
            # an unknown anchor: the loader says so in its own words
            added, levels = self.anchors.get(event.anchor, (0, 0))
        else:
            added, levels = 1, 1
        if is_key:
            added = 0  # a key names a value; the values are what is counted
        self.values += added
        if self.values > MOST_VALUES:
            self.too_many(event)
        depth = (top.level if top is not None else 0) + levels
        if depth > DEEPEST_NESTING:
            self.too_deep(event)
        if kind is yaml.ScalarEvent or kind is yaml.AliasEvent:
            if top is not None and depth > top.deepest:
                top.deepest = depth
            self.advance(top, is_key, event)
            return
        frame = _Frame(top, self.place(top), kind is yaml.MappingStartEvent, event.anchor)
        frame.first = self.values - 1
        self.top = frame

    def place(self, top: _Frame | None) -> str | int:
        """Where a container starting now sits in ``top``: its key or its index."""
        if top is None:
            return ""
        if top.is_mapping:
            return str(top.key)
        return top.index

    def advance(self, top: _Frame | None, is_key: bool, event: Any) -> None:
        """``top`` past the node that just ended: a key waits for its value."""
        if top is None:
            return
        if top.is_mapping:
            top.key = (
                (event.value if type(event) is yaml.ScalarEvent else f"*{event.anchor}")
                if is_key
                else None
            )
        else:
            top.index += 1

    def close(self, event: Any) -> None:
        frame = self.top
        assert frame is not None
        parent = self.top = frame.parent
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (
                self.values - frame.first,
                frame.deepest - frame.level + 1,
            )
        if parent is not None:
            if frame.deepest > parent.deepest:
                parent.deepest = frame.deepest
            self.advance(parent, False, event)

    def walk(self, parser: Any) -> None:
        """Every event of ``parser``'s stream."""
        get = parser.get_event
        ends = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
        nodes = (yaml.ScalarEvent, yaml.AliasEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
        while True:
            event = get()
            kind = type(event)
            if kind in nodes:
                self.node(event)
            elif kind in ends:
                self.close(event)
            elif event is None or kind is yaml.StreamEndEvent:
                return


def _syntax(exc: yaml.YAMLError, prefix: str, source: str) -> ConfigTextError:
    """One line for a YAML syntax error: where, the line and the parser's own words."""
    mark = getattr(exc, "problem_mark", None)
    line = f" at line {mark.line + 1}" if mark is not None and source else ""
    problem = getattr(exc, "problem", None)
    detail = f" ({problem})" if problem else ""
    lead = ": ".join(part for part in (prefix, source) if part)
    return ConfigTextError(f"{lead}: not valid YAML{line}{detail}")


def _walk(text: str, prefix: str, source: str, loader: Any) -> None:
    """Walk ``text``'s events with ``loader``'s parser, within the bounds. libyaml
    from 0.2.5 on refuses deep flow nesting itself, at a depth of its own and before
    this walk meets its bound: the text is then walked again by PyYAML's own parser
    (which keeps no nesting on Python's stack either), so the message names the path."""
    parser = loader(text)
    try:
        _Walk(prefix, source).walk(parser)
    except yaml.YAMLError as exc:
        problem = str(getattr(exc, "problem", "") or "")
        if "nesting" in problem and loader is not yaml.SafeLoader:
            _walk(text, prefix, source, yaml.SafeLoader)
        raise _syntax(exc, prefix, source) from None
    finally:
        parser.dispose()


def read_yaml(text: str, prefix: str = "", source: str = "") -> Any:
    """The value YAML's safe loader reads from ``text``, once its event stream passed
    the bounds. ``prefix`` starts every key path a message names (``cluster.topology``,
    or the key a ``--set`` value is for); ``source`` names the file, whose lines the
    messages then give."""
    _walk(text, prefix, source, _LOADER)
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _syntax(exc, prefix, source) from None


# ------------------------------------------------------------------------------ JSON

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def _json_values(text: str) -> int:
    """How many values (not the keys that name them) a JSON text holds, at most: one
    plus its commas and opening brackets outside strings. Counted on the raw text first,
    which strings can only inflate, then without the strings where that is over the
    bound (unless half its strings, fewer than its values, are already over it)."""

    def structure(t: str) -> int:
        return 1 + t.count(",") + t.count("[") + t.count("{")

    counted = structure(text)
    if counted <= MOST_VALUES:
        return counted
    # every key names a value and every other string is one: at least half the strings
    strings = (text.count('"') - text.count('\\"')) // 2
    if strings // 2 > MOST_VALUES:
        return strings // 2
    return structure(_JSON_STRING.sub('""', text))


def _no_constant(name: str) -> float:
    raise ConfigTextError(f"{name} is not a number JSON has; give a finite number")


def _json_int(text: str) -> int:
    problem = _number_problem(text)
    if problem is not None:
        raise ConfigTextError(problem)
    return int(text)


def _json_float(text: str) -> float:
    problem = _number_problem(text)
    if problem is not None:
        raise ConfigTextError(problem)
    value = float(text)
    if not math.isfinite(value):
        raise ConfigTextError(f"{text} is beyond a float's range; give a finite number")
    return value


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            shown = key if len(key) <= 60 else f"{key[:60]}…"
            raise ConfigTextError(
                f"key {shown!r} given twice in one object; JSON would keep the last silently"
            )
        result[key] = value
    return result


def _walk_json(value: Any, prefix: str) -> None:
    """The nesting and string lengths of a parsed JSON value (its count is known)."""
    stack: list[tuple[Any, str, int]] = [(value, prefix, 0)]
    while stack:
        node, path, level = stack.pop()
        if isinstance(node, str):
            if len(node) > LONGEST_SCALAR:
                raise ConfigTextError(
                    f"{_short(path) or '<top>'}: a value of {len(node)} characters; "
                    f"parasim reads at most {LONGEST_SCALAR}"
                )
            continue
        if not isinstance(node, (dict, list)):
            continue
        if level + 1 > DEEPEST_NESTING:
            raise ConfigTextError(
                f"{_short(path) or '<top>'}: nested more than {DEEPEST_NESTING} levels deep; "
                "no field nests so"
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if len(key) > LONGEST_SCALAR:
                    raise ConfigTextError(
                        f"{_short(path) or '<top>'}: a key of {len(key)} characters; "
                        f"parasim reads at most {LONGEST_SCALAR}"
                    )
                stack.append((child, _child(path, key), level + 1))
        else:
            stack.extend((child, f"{path}[{i}]", level + 1) for i, child in enumerate(node))


def read_json(text: str, prefix: str = "", source: str = "the text") -> Any:
    """The value of JSON ``text`` within the bounds (see the module docstring).
    ``prefix`` (``cluster.profile (prof.json)``) starts the key paths a message names
    and, else ``source``, every other message."""
    lead = prefix or source
    values = _json_values(text)
    if values > MOST_VALUES:
        raise ConfigTextError(
            f"{lead}: more than {MOST_VALUES} values ({values}); no configuration needs that many"
        )
    try:
        value = json.loads(
            text,
            parse_constant=_no_constant,
            parse_int=_json_int,
            parse_float=_json_float,
            object_pairs_hook=_json_object,
        )
    except ConfigTextError as exc:
        raise ConfigTextError(f"{lead}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigTextError(f"{lead} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise ConfigTextError(
            f"{lead}: nested more than {DEEPEST_NESTING} levels deep; no field nests so"
        ) from None
    _walk_json(value, prefix)
    return value
