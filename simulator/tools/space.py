"""The layout space a sweep searches: its candidates, the pins ``--fix`` sets, and which
candidates another one makes needless.

A :class:`Candidate` is a frozen value of every searched knob
(:data:`simulator.request.knobs.SEARCHED`): its fields, its label, its ``--set``
overrides and the checks of a pinned value all come from the knob table. The
enumerator below lays out the knobs whose choices depend on one another (the rank
grid, the micro-batch, the schedule and its chunks, the placement, context
parallelism and the sharding, as :mod:`simulator.tools.sweep` describes); every other
searched knob adds its own declared choices (``Knob.choices_for``). Which candidates
need no simulation (a heavier recompute where a lighter one fits) follows each knob's
``faster_first``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Self

from simulator.common.errors import ParasimError
from simulator.common.vocabulary import (
    CHUNKS_PER_RANK,
    MICROBATCHES_PER_STAGE,
    PIPELINE_SCHEDULES,
    PLACEMENT_AXES,
    RECOMPUTE_MODES,
    SEARCHED_WHEN_FIXED,
    SHARDING_LEVELS,
    SPLIT_BACKWARD_SCHEDULES,
)
from simulator.request.knobs import FIX_ALIASES, KNOB, SEARCHED, SWEEP_FIX_KEYS
from simulator.request.layout import FEWEST_UNEVEN_LAYERS, balanced_stages
from simulator.request.recipe import Recipe, knob_overrides, layout_label
from topologies.config_text import ConfigTextError, read_yaml
from topologies.validation import nearest_key_hint

__all__ = [
    "FIX_KEYS",
    "SCHEDULES",
    "PLACEMENTS",
    "MAX_MICRO_BATCH",
    "VIRTUAL_STAGES",
    "LONG_SEQUENCE",
    "Candidate",
    "check_fixed",
    "parse_fixes",
    "enumerate_layouts",
    "select_lightest",
    "faster_first",
    "never_slower",
]

#: Dimensions ``--fix`` can pin, in the order a layout string shows them.
FIX_KEYS = SWEEP_FIX_KEYS
# searched by default: every built-in schedule but those the vocabulary leaves to --fix,
# 1F1B, the default, first (where two layouts tie the first found stands)
SCHEDULES = (
    "1f1b",
    *(s for s in PIPELINE_SCHEDULES if s not in SEARCHED_WHEN_FIXED and s != "1f1b"),
)
PLACEMENTS = (PLACEMENT_AXES, ("tp", "pp", "dp"), ("dp", "tp", "pp"))
MAX_MICRO_BATCH = 8
# Sequences at least this long make the sweep also try context parallelism inside a
# node: shorter ones rarely need it for memory, and their ring blocks are too short to
# hide the K/V transfers (see docs/modelling.md, CP).
LONG_SEQUENCE = 16384
VIRTUAL_STAGES = (2, 4)
_FASTER_FIRST = tuple(knob for knob in SEARCHED if knob.faster_first)
# knob name -> value -> (its group in the knob's faster_first order, its place in it)
_PLACES = {
    knob.name: {
        value: (group, within)
        for group, values in enumerate(knob.faster_first)
        for within, value in enumerate(values)
    }
    for knob in _FASTER_FIRST
}


class _CandidateMethods:
    """What a :class:`Candidate` does; its fields are the searched knobs."""

    if TYPE_CHECKING:
        # made a dataclass by make_dataclass below
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

        def __init__(self, **knobs: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def from_knobs(cls, knobs: dict[str, Any]) -> Candidate:
        """The candidate of searched knobs by name (each knob's default where absent;
        other keys are ignored, so a sweep row will do)."""
        values = {}
        for knob in SEARCHED:
            value = knobs.get(knob.name, knob.default)
            values[knob.name] = tuple(value) if isinstance(value, list) else value
        return Candidate(**values)

    @classmethod
    def of_recipe(cls, recipe: Recipe, **changes: Any) -> Candidate:
        """A scenario's own layout, with ``changes``."""
        return cls.from_knobs({**recipe.searched_knobs(), **changes})

    def with_(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    def fields(self) -> dict[str, Any]:
        """The knobs by name, JSON-ready (tuples as lists)."""
        return {
            knob.name: list(value) if isinstance(value, tuple) else value
            for knob in SEARCHED
            for value in (getattr(self, knob.name),)
        }

    def overrides(self) -> list[str]:
        """The ``key.path=value`` assignments of the knobs a candidate always writes (a
        lighter recompute than full also drops the scenario's ``recompute_fraction``,
        which is a share of the fully recomputed layers)."""
        assignments = knob_overrides(self.fields())
        if self.recompute != "full":
            assignments.append("training.recompute_fraction=1")
        return assignments

    def label(self) -> str:
        """``tp8 pp4 dp4 sp mb1 1f1b rc=full [tp,dp,pp]``, as :meth:`Recipe.label`, then
        the other knobs that differ from their defaults in the recipe's text form
        (``dp_shard=8 sharding=full``; the CP kind only with ``cp > 1``)."""
        values = {knob.name: getattr(self, knob.name) for knob in SEARCHED}
        if values["stage_layers"] is None:
            del values["stage_layers"]
        if values["cp"] == 1:
            values["cp_kind"] = KNOB["cp_kind"].default
        return layout_label(**values)


if TYPE_CHECKING:
    # the checker sees the fields through _CandidateMethods.__getattr__
    Candidate = _CandidateMethods
else:
    Candidate = dataclasses.make_dataclass(
        "Candidate",
        [(knob.name, Any, dataclasses.field(default=knob.default)) for knob in SEARCHED],
        bases=(_CandidateMethods,),
        frozen=True,
        kw_only=True,
    )
    Candidate.__module__ = __name__
    Candidate.__doc__ = "One point of the layout space: a value of every searched knob."


def check_fixed(fixed: dict[str, Any]) -> dict[str, Any]:
    """Check and normalise pinned dimensions (``{'tp': 8, 'placement': 'tp,dp,pp'}``)
    as their knobs say (:meth:`Knob.check`)."""
    result: dict[str, Any] = {}
    for raw_key, value in fixed.items():
        key = str(raw_key).strip()
        for prefix in ("parallel.", "training."):
            key = key.removeprefix(prefix)
        key = FIX_ALIASES.get(key, key)
        if key not in FIX_KEYS:
            hint = nearest_key_hint(key, list(FIX_KEYS))
            raise ParasimError(
                f"--fix {raw_key}: unknown dimension{hint}; dimensions: {', '.join(FIX_KEYS)}"
            )
        knob = KNOB[key]
        try:
            value = knob.check(value)
            if knob.choices and value not in knob.pinnable:
                raise ValueError(f"expected one of {', '.join(map(str, knob.pinnable))}")
        except ValueError as exc:
            choices = list(map(str, knob.pinnable))
            hint = nearest_key_hint(str(value), choices) if choices else ""
            raise ParasimError(f"--fix {key}={value!r}: {exc}{hint}") from None
        result[key] = value
    return result


def faster_first(candidate: Candidate) -> tuple[Candidate, tuple[int, ...]]:
    """``candidate``'s place in its knobs' ``faster_first`` orders: the candidate with each
    such knob replaced by its group (the same for every candidate one of them makes
    needless) and its position within each group (lighter first)."""
    spots = [_PLACES[knob.name][getattr(candidate, knob.name)] for knob in _FASTER_FIRST]
    groups = {knob.name: group for knob, (group, _) in zip(_FASTER_FIRST, spots, strict=True)}
    return candidate.with_(**groups), tuple(within for _, within in spots)


def never_slower(lighter: tuple[int, ...], heavier: tuple[int, ...]) -> bool:
    """Whether a candidate at positions ``lighter`` makes one at ``heavier`` needless
    (the same group): no knob of it later in its ``faster_first`` order, and not the
    same candidate."""
    return lighter != heavier and all(a <= b for a, b in zip(lighter, heavier, strict=True))


def select_lightest(
    candidates: list[Candidate], checks: list[dict], exhaustive: bool
) -> tuple[list[int], int]:
    """Indices of the candidates to simulate, and how many were dominated: of the
    candidates that fit and differ only in knobs with a ``faster_first`` order, those
    no other one makes needless (:func:`never_slower`: as light in every such knob and
    lighter in one; ``--exhaustive``: all)."""
    fits = [i for i, check in enumerate(checks) if check["status"] == "fits"]
    if exhaustive:
        return fits, 0
    groups: dict[Candidate, list[tuple[tuple[int, ...], int]]] = {}
    for i in fits:
        key, weight = faster_first(candidates[i])
        groups.setdefault(key, []).append((weight, i))
    chosen = sorted(
        i
        for members in groups.values()
        for weight, i in members
        if not any(never_slower(other, weight) for other, _ in members)
    )
    return chosen, len(fits) - len(chosen)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_fixes(items: Iterable[str]) -> dict[str, Any]:
    """``['tp=8', 'placement=[tp,dp,pp]']`` → checked pins (values read as YAML); a pin
    without a key or a value, or one dimension pinned twice, is refused."""
    fixed: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not key or not text.strip():
            raise ParasimError(f"--fix {item!r}: expected KEY=VALUE, e.g. --fix tp=8")
        try:
            value = read_yaml(text, f"--fix {key}")
        except ConfigTextError as exc:
            raise ParasimError(str(exc)) from None
        name = check_fixed({key: value}).popitem()[0]  # aliases and prefixes resolved
        if name in given and given[name] != text.strip():
            raise ParasimError(
                f"--fix {name}: pinned twice ({given[name]} and {text.strip()}); pin it once"
            )
        given[name] = text.strip()
        fixed[key] = value
    return check_fixed(fixed)


def _distinct_placements(tp: int, dp: int, pp: int) -> list[tuple[str, ...]]:
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    seen: set[tuple[str, ...]] = set()
    kept: list[tuple[str, ...]] = []
    for placement in PLACEMENTS:
        grid = tuple(axis for axis in placement if sizes[axis] > 1)
        if grid not in seen:
            seen.add(grid)
            kept.append(placement)
    return kept


def enumerate_layouts(
    world: int,
    gpus_per_node: int,
    layers: int,
    global_batch: int,
    experts: int | None = None,
    fixed: dict[str, Any] | None = None,
    max_tp: int | None = None,
    context: dict[str, Any] | None = None,
) -> list[Candidate]:
    """Every candidate of the space (module docstring), before any validation;
    ``context``: the scenario's ``cp`` and ``cp_kind`` (which every candidate keeps
    unless ``fixed`` pins another value or the sequence is long) and its ``seq_len``,
    ``heads`` and ``kv_heads``."""
    fixed = check_fixed(fixed or {})
    context = {"cp": 1, "cp_kind": "ring", **(context or {})}
    scenario = {knob.name: context.get(knob.name, knob.default) for knob in SEARCHED}

    def _declared(laid: dict[str, Any]) -> list[dict[str, Any]]:
        """``laid`` with each searched knob it does not set: pinned, that value; else
        its declared choices (``Knob.choices_for``), or the scenario's own."""
        expanded = [laid]
        for knob in SEARCHED:
            if knob.name in laid:
                continue
            if knob.name in fixed:
                expanded = [{**one, knob.name: fixed[knob.name]} for one in expanded]
                continue
            expanded = [
                {**one, knob.name: value}
                for one in expanded
                for value in (
                    knob.choices_for(one, scenario)
                    if knob.choices_for is not None
                    else (scenario[knob.name],)
                )
            ]
        return expanded

    def contexts(tp: int) -> list[dict[str, Any]]:
        """The context-parallel settings to try with ``tp``: the scenario's (or the pinned
        ones); for a long sequence with nothing pinned, also every CP degree that keeps
        the CP group inside a node, as a ring and, where the heads split, as Ulysses."""
        cp = fixed.get("cp", context["cp"])
        kind = fixed.get("cp_kind", context["cp_kind"])
        options = [{"cp": cp, "cp_kind": kind}]
        if "cp" in fixed or context.get("seq_len", 0) < LONG_SEQUENCE:
            return options
        heads, kv = context.get("heads", 0), context.get("kv_heads", 0)
        for c in _divisors(gpus_per_node // tp) if gpus_per_node % tp == 0 else []:
            kinds = ["ring"]
            if heads % (tp * c) == 0 and kv % (tp * c) == 0:
                kinds.append("ulysses")
            for k in kinds if "cp_kind" not in fixed else [kind]:
                option = {"cp": c, "cp_kind": k}
                if c > 1 and option not in options:
                    options.append(option)
        return options

    def shardings(
        tp: int, cp: int, pp: int, dp: int, ep: int, schedule: str, placement: tuple[str, ...]
    ) -> list[dict[str, Any]]:
        """The sharding levels (and HSDP shard groups) to try for one layout."""
        pinned_shard = fixed.get("dp_shard")
        if pinned_shard:  # HSDP pinned: full sharding over that group
            return [{"sharding": fixed.get("sharding", "full"), "dp_shard": pinned_shard}]
        if "sharding" in fixed:
            levels = [fixed["sharding"]]
        elif dp * cp == 1:
            levels = ["none"]  # one copy of the weights: nothing to shard
        else:
            # full sharding's reduce-scatter would wait for the weight gradients a split
            # backward defers
            levels = [
                level
                for level in SHARDING_LEVELS
                if level != "full" or (ep == 1 and schedule not in SPLIT_BACKWARD_SCHEDULES)
            ]
        options = [{"sharding": level, "dp_shard": 0} for level in levels]
        if "full" in levels and cp == 1 and pinned_shard is None:
            inside = _replicas_in_node(tp, pp, dp, placement, gpus_per_node)
            if 1 < inside < dp:
                options.append({"sharding": "full", "dp_shard": inside})
        return options

    limit = gpus_per_node if max_tp is None else max_tp

    def pick(key: str, default: list) -> list:
        return [fixed[key]] if key in fixed else default

    tps = pick(
        "tp",
        [
            d
            for d in _divisors(world)
            if d <= limit and (gpus_per_node % d == 0 or d % gpus_per_node == 0)
        ],
    )
    candidates = []
    pairs = [(tp, extra) for tp in tps for extra in contexts(tp)]
    for tp, extra in pairs:
        cp = extra["cp"]
        grid = _divisors(world // (tp * cp)) if world % (tp * cp) == 0 else []
        uneven = [p for p in grid if layers % p and layers >= FEWEST_UNEVEN_LAYERS * p]
        for pp in pick("pp", sorted(_divisors(layers) + uneven)):
            if world % (tp * cp * pp):
                continue
            split = {"stage_layers": balanced_stages(layers, pp)} if layers % pp else {}
            dp = world // (tp * cp * pp)
            if fixed.get("dp", dp) != dp:
                continue
            ep_default = [d for d in _divisors(dp) if experts % d == 0] if experts else [1]
            sps = [False] if tp == 1 else pick("sp", [False, True])
            if global_batch % dp == 0:
                mb_default = [d for d in _divisors(global_batch // dp) if d <= MAX_MICRO_BATCH]
            else:
                mb_default = [1]
            recomputes = pick("recompute", list(RECOMPUTE_MODES))
            placements = pick("placement", _distinct_placements(tp, dp, pp))
            for ep, mb in itertools.product(
                pick("ep", ep_default), pick("micro_batch", mb_default)
            ):
                schedules = _schedules(pp, layers, global_batch, dp, mb, fixed)
                combinations = list(itertools.product(sps, schedules, recomputes, placements))
                if global_batch % (dp * mb):
                    # no whole number of micro-batches per replica: one candidate stands
                    # for every variation, and the validator says why
                    combinations = combinations[:1]
                for sp, (schedule, v), recompute, placement in combinations:
                    levels = shardings(tp, cp, pp, dp, ep, schedule, placement)
                    if global_batch % (dp * mb):
                        levels = levels[:1]
                    for level in levels:
                        laid = {
                            "tp": tp,
                            "pp": pp,
                            "dp": dp,
                            "ep": ep,
                            "sp": sp,
                            "micro_batch": mb,
                            "schedule": schedule,
                            "virtual_stages": v,
                            "recompute": recompute,
                            "placement": placement,
                            **extra,
                            **level,
                            **split,
                        }
                        candidates += [Candidate(**knobs) for knobs in _declared(laid)]
    return candidates


def _replicas_in_node(
    tp: int, pp: int, dp: int, placement: tuple[str, ...], gpus_per_node: int
) -> int:
    """How many data-parallel replicas of one group share a node: the node's GPUs over
    the stride of the ``dp`` axis in the rank grid (CP is never combined with HSDP)."""
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    stride = 1
    for axis in placement:
        if axis == "dp":
            break
        stride *= sizes[axis]
    if gpus_per_node % stride:
        return 1
    return min(dp, gpus_per_node // stride)


def _schedules(
    pp: int, layers: int, global_batch: int, dp: int, mb: int, fixed: dict[str, Any]
) -> list[tuple[str, int]]:
    if "schedule" in fixed:
        names = [fixed["schedule"]]
    else:
        names = ["1f1b"] if pp == 1 else list(SCHEDULES)
    microbatches = global_batch // (dp * mb) if global_batch % (dp * mb) == 0 else None
    pairs = []
    for name in names:
        if name == "interleaved-1f1b":
            if pp == 1:  # chunks of one stage would hand activations to themselves
                continue
            if "virtual_stages" in fixed:
                pairs.append((name, fixed["virtual_stages"]))
                continue
            for v in VIRTUAL_STAGES:
                if layers % (pp * v) == 0 and microbatches is not None and microbatches % pp == 0:
                    pairs.append((name, v))
        elif name in CHUNKS_PER_RANK:  # ZB-V, DualPipeV: two chunks a rank, as a V
            chunks = CHUNKS_PER_RANK[name]
            fewest = MICROBATCHES_PER_STAGE.get(name, 0) * pp * chunks
            enough = microbatches is None or microbatches >= fewest
            if pp > 1 and fixed.get("virtual_stages", chunks) == chunks and enough:
                if layers % (pp * chunks) == 0:
                    pairs.append((name, chunks))
        elif fixed.get("virtual_stages", 1) == 1:
            pairs.append((name, 1))
    return pairs
