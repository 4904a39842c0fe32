"""Every knob of a training recipe, declared once.

A :class:`Knob` says what a setting is (its type, allowed values and default), where a
scenario sets it, how the recipe's text form writes it, whether ``parasim sweep``
searches it (and ``--fix`` pins it), and its column heading in the reports. The rest is
derived from :data:`KNOBS`:

* the :class:`~simulator.request.recipe.Recipe` is built from a scenario by reading each
  knob's ``path``, and its text form (``str()``, :meth:`Recipe.label`,
  :meth:`Recipe.parse`) writes and reads the knobs in table order;
* :data:`LAYOUT_KNOBS` (the searched knobs, scenario path by name),
  :data:`SWEEP_FIX_KEYS` (what ``--fix`` may pin), the sweep's ``Candidate`` (a
  frozen dataclass of the searched knobs), its checks of pinned values, its dominance
  rule, the columns of ``sweep.csv`` and the report tables.

The sweep's own enumerator lays out the rank grid (``tp``, ``cp``, ``pp``, ``dp``,
``ep``), the micro-batch, the schedule with its chunks, the placement and the
sharding, whose choices depend on each other; any other searched knob declares its
choices here (``choices_for``), so a new one is a row of this table and the mechanism
that reads it. A test fails if a list of knob names is written anywhere else.

A knob's Python type and default are also those of its field in
:class:`~simulator.request.layout.Layout` or :class:`Recipe`, and its path names a
field of the scenario schema with the same default; a test checks both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from simulator.common.vocabulary import (
    ATTENTION_BACKENDS,
    ATTENTION_KERNELS,
    CP_KINDS,
    CROSS_ENTROPY_KERNELS,
    FRAMEWORKS,
    GRADIENT_DTYPES,
    OPTIMIZER_DTYPES,
    RECOMPUTE_MODES,
    SCHEDULES,
    SHARDING_LEVELS,
    TP_COMM_OVERLAP,
    TRAINING_DTYPES,
)

__all__ = [
    "Knob",
    "KNOBS",
    "KNOB",
    "SEARCHED",
    "LAYOUT_KNOBS",
    "SWEEP_FIX_KEYS",
    "FIX_ALIASES",
    "DDP_BUCKET_BYTES",
    "DDP_FIRST_BUCKET_BYTES",
]

# PyTorch DDP's default bucket_cap_mb=25 (MiB), and its first bucket of 1 MiB
# (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES) that lets the first all-reduce start early.
DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024

# How the recipe's text form writes a knob:
#   count    ``<prefix><n>`` (tp8, v2)        flag     ``<prefix>`` when true (sp)
#   micro    ``mb<n>x<micro-batches>``        word     the bare value (1f1b)
#   grid     ``[tp,dp,pp]``                   setting  ``<prefix or name>=<value>``
# A count or setting appears only where it differs from its default, unless ``always``.
# The label (the sweep's one-line name of a layout) is every knob but the settings that
# are not ``always``; the full form adds ``L<layers>`` and those settings after it.
TextForm = Literal["count", "flag", "micro", "word", "grid", "setting"]
Owner = Literal["layout", "recipe"]


@dataclass(frozen=True)
class Knob:
    """One setting of the recipe (see the module docstring)."""

    name: str
    # where a scenario sets it (``--set`` writes this path)
    path: str
    # the dataclass that holds it: the rank grid (Layout) or the Recipe
    owner: Owner
    kind: type
    default: Any
    form: TextForm = "setting"
    prefix: str = ""
    always: bool = False
    choices: tuple[Any, ...] = ()
    # the smallest whole number it takes
    least: int | None = None
    # searched by ``parasim sweep`` (a Candidate field, a ``--fix`` key, a CSV column);
    # ``searched_how`` says how, for the docs and ``--help``
    searched_how: str = ""
    # also accepted by ``--fix``
    aliases: tuple[str, ...] = ()
    # a candidate writes its override always (True), or where it differs from the
    # scenario's own value (False: a knob most scenarios never set)
    always_set: bool = False
    # the choices the sweep tries, given the candidate laid out so far and the
    # scenario's own values (None: the enumerator's own rule)
    choices_for: Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, ...]] | None = None
    # values that never make a step slower than the ones after them in their group, so
    # that a later one is not simulated where an earlier one fits (``--exhaustive``
    # simulates them all); values of one group give the same layout otherwise
    faster_first: tuple[tuple[Any, ...], ...] = ()
    # its heading in the report tables ("" : the name)
    column: str = ""
    # choices ``--fix`` refuses (a custom schedule needs its order file)
    not_pinned: tuple[Any, ...] = ()
    # where the knob means something, given a layout's knobs by name: a report table
    # leaves its cell blank elsewhere (None: everywhere)
    matters: Callable[[Mapping[str, Any]], bool] | None = None

    @property
    def searched(self) -> bool:
        return bool(self.searched_how)

    @property
    def heading(self) -> str:
        return self.column or self.name.replace("_", " ")

    @property
    def in_label(self) -> bool:
        """Part of the label (the layout's short name), not a trailing setting."""
        return self.form != "setting" or self.always

    def written(self, value: Any) -> bool:
        """Whether the text form shows ``value``."""
        if self.form == "flag":
            return bool(value)
        return self.always or self.form in ("micro", "word", "grid") or value != self.default

    def token(self, value: Any, microbatches: int | None = None) -> str:
        """``value`` as the text form writes it."""
        if self.form == "count":
            return f"{self.prefix}{value}"
        if self.form == "flag":
            return self.prefix
        if self.form == "micro":
            return f"mb{value}" + (f"x{microbatches}" if microbatches is not None else "")
        if self.form == "word":
            return str(value)
        if self.form == "grid":
            return "[" + ",".join(value) + "]"
        return f"{self.prefix or self.name}={format_value(value)}"

    def parse(self, raw: str) -> Any:
        """A setting's ``raw`` text read back into its type."""
        if self.kind is bool:
            if raw not in ("true", "false"):
                raise ValueError("expected true or false")
            return raw == "true"
        if self.kind is tuple:
            return tuple(int(part) for part in raw.split("/"))
        if self.kind is int:
            return int(raw)
        if self.kind is float:
            return float(raw)
        return raw

    def check(self, value: Any) -> Any:
        """``value`` checked as this knob's and normalised, or ``ValueError`` saying
        what was expected (a placement may be written ``tp,dp,pp``; a flag ``on``)."""
        if self.kind is bool:
            if isinstance(value, str) and value.lower() in ("on", "off", "true", "false"):
                value = value.lower() in ("on", "true")
            if not isinstance(value, bool):
                raise ValueError("expected true or false")
            return value
        if self.kind is int:
            least = 1 if self.least is None else self.least
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                expected = "a positive integer" if least == 1 else f"a whole number >= {least}"
                raise ValueError(f"expected {expected}")
            return value
        if self.form == "grid":
            if isinstance(value, str):
                value = [part.strip() for part in value.strip("[]").split(",")]
            if not isinstance(value, list | tuple) or sorted(map(str, value)) != sorted(
                self.default
            ):
                axes = ", ".join(self.default)
                example = ",".join(self.default)
                raise ValueError(f"must order each of {axes} exactly once, e.g. [{example}]")
            return tuple(str(axis) for axis in value)
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}")
        return value

    @property
    def pinnable(self) -> tuple[Any, ...]:
        """The choices ``--fix`` takes."""
        return tuple(c for c in self.choices if c not in self.not_pinned)


def format_value(value: Any, brackets: bool = False) -> str:
    """A value as the text form writes it: tuples as ``a/b`` (``[a,b]`` with
    ``brackets``, as a scenario override)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        items = [str(v) for v in value]
        return f"[{','.join(items)}]" if brackets else "/".join(items)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _reshard_choices(candidate: Mapping[str, Any], scenario: Mapping[str, Any]) -> tuple[Any, ...]:
    # only full sharding frees the gathered weights; elsewhere the scenario's value stands
    if candidate["sharding"] == "full":
        return (True, False)
    return (scenario["reshard_after_forward"],)


# The table, in the order of the text form: the label's knobs, then the settings.
KNOBS: tuple[Knob, ...] = (
    Knob("tp", "parallel.tp", "layout", int, 1, "count", "tp", always=True,
         searched_how="divisors of the GPUs per node, up to --max-tp (above the node "
         "size: multiples of it that divide the world)", always_set=True),
    Knob("cp", "parallel.cp", "layout", int, 1, "count", "cp",
         searched_how="the scenario's; for sequences of 16K tokens or more also every "
         "degree that keeps the group inside a node"),
    Knob("pp", "parallel.pp", "layout", int, 1, "count", "pp", always=True,
         searched_how="divisors of the layers whose grid divides the world, and uneven "
         "splits of at least two layers a stage", always_set=True),
    Knob("dp", "parallel.dp", "layout", int, 1, "count", "dp", always=True,
         searched_how="the rest of the world", always_set=True),
    Knob("ep", "parallel.ep", "layout", int, 1, "count", "ep",
         searched_how="MoE only: divisors of dp that divide the experts", always_set=True),
    Knob("sp", "parallel.sp", "recipe", bool, False, "flag", "sp",
         searched_how="off, and on when tp > 1", always_set=True, column="SP",
         matters=lambda knobs: knobs["tp"] > 1),
    Knob("micro_batch", "training.micro_batch", "recipe", int, 1, "micro", aliases=("mb",),
         searched_how="divisors of global_batch / dp up to 8", always_set=True,
         column="micro-batch"),
    Knob("schedule", "parallel.schedule", "recipe", str, "1f1b", "word", choices=SCHEDULES,
         searched_how="1f1b when pp = 1; else every built-in schedule but zb-h2",
         always_set=True, not_pinned=("custom",), matters=lambda knobs: knobs["pp"] > 1),
    Knob("virtual_stages", "parallel.virtual_stages", "recipe", int, 1, "count", "v",
         aliases=("v",), searched_how="2 and 4 with interleaved-1f1b; 2 with zbv and dualpipev",
         always_set=True, matters=lambda knobs: knobs["pp"] > 1 and knobs["virtual_stages"] > 1),
    Knob("recompute", "training.recompute", "recipe", str, "none", "setting", "rc",
         always=True, choices=RECOMPUTE_MODES, aliases=("rc",),
         searched_how="none, selective, full", always_set=True,
         faster_first=(RECOMPUTE_MODES,)),
    Knob("placement", "parallel.placement", "layout", tuple, ("tp", "dp", "pp"), "grid",
         searched_how="[tp,dp,pp], [tp,pp,dp] and [dp,tp,pp] (TP across nodes)",
         always_set=True),
    Knob("dp_shard", "parallel.dp_shard", "layout", int, 0, least=0, column="HSDP shard",
         searched_how="with full sharding, also the replicas of one node (HSDP); "
         "0: no HSDP", matters=lambda knobs: bool(knobs["dp_shard"])),
    Knob("sharding", "training.sharding", "recipe", str, "none", choices=SHARDING_LEVELS,
         searched_how="every level where the weights have replicas; not full with the "
         "split-backward schedules nor with ep",
         faster_first=(("none",), ("optimizer", "gradients"), ("full",))),
    Knob("attention", "training.attention", "recipe", str, "flash", choices=ATTENTION_KERNELS),
    Knob("attention_backend", "training.attention_backend", "recipe", str, "auto",
         choices=ATTENTION_BACKENDS),
    Knob("tp_comm_overlap", "training.tp_comm_overlap", "recipe", str, "async",
         choices=TP_COMM_OVERLAP),
    Knob("grad_reduce_overlap", "training.grad_reduce_overlap", "recipe", bool, True),
    Knob("grad_reduce_dtype", "training.grad_reduce_dtype", "recipe", str, "fp32",
         choices=GRADIENT_DTYPES),
    Knob("param_gather_overlap", "training.param_gather_overlap", "recipe", bool, False),
    Knob("reshard_after_forward", "training.reshard_after_forward", "recipe", bool, True,
         searched_how="with full sharding, true and false (the gathered weights kept from "
         "the forward to the backward)",
         choices_for=_reshard_choices, faster_first=((False, True),), column="reshard",
         matters=lambda knobs: knobs["sharding"] == "full"),
    Knob("cp_kind", "parallel.cp_kind", "recipe", str, "ring", choices=CP_KINDS,
         searched_how="the scenario's; with long sequences ring and, where the heads "
         "split, ulysses", column="CP kind", matters=lambda knobs: knobs["cp"] > 1),
    Knob("dtype", "training.dtype", "recipe", str, "bf16", choices=TRAINING_DTYPES),
    Knob("fp8_all_gather", "training.fp8_all_gather", "recipe", bool, False),
    Knob("grad_bucket_bytes", "training.grad_bucket_bytes", "recipe", float,
         float(DDP_BUCKET_BYTES)),
    Knob("first_grad_bucket_bytes", "training.first_grad_bucket_bytes", "recipe", float,
         float(DDP_FIRST_BUCKET_BYTES)),
    Knob("framework", "training.framework", "recipe", str, "megatron", choices=FRAMEWORKS),
    Knob("compile", "training.compile", "recipe", bool, False),
    Knob("stage_layers", "parallel.stage_layers", "recipe", tuple, None,
         searched_how="even where pp divides the layers; else the lighter stages first "
         "and last", column="stage layers", matters=lambda knobs: bool(knobs["stage_layers"])),
    Knob("recompute_fraction", "training.recompute_fraction", "recipe", float, 1.0),
    Knob("optimizer_dtype", "training.optimizer_dtype", "recipe", str, "fp32",
         choices=OPTIMIZER_DTYPES),
    Knob("master_weights", "training.master_weights", "recipe", bool, True),
    Knob("cross_entropy", "training.cross_entropy", "recipe", str, "auto",
         choices=CROSS_ENTROPY_KERNELS),
)  # fmt: skip

#: Each knob by name.
KNOB: dict[str, Knob] = {knob.name: knob for knob in KNOBS}
#: The knobs ``parasim sweep`` searches, in table order.
SEARCHED: tuple[Knob, ...] = tuple(knob for knob in KNOBS if knob.searched)
#: The searched knobs a candidate always writes, and where each lives in a scenario: the
#: sweep's candidates and explain's fixes are written with these keys.
LAYOUT_KNOBS: dict[str, str] = {knob.name: knob.path for knob in SEARCHED if knob.always_set}
#: What ``parasim sweep --fix`` may pin.
SWEEP_FIX_KEYS: tuple[str, ...] = tuple(knob.name for knob in SEARCHED)
#: The short names ``--fix`` also takes (``mb``, ``v``, ``rc``).
FIX_ALIASES: dict[str, str] = {alias: knob.name for knob in SEARCHED for alias in knob.aliases}
