"""Layout sweeps: every valid way to split a scenario's model over its cluster, ranked.

``parasim sweep SCENARIO`` keeps the scenario's model, cluster and training recipe and
tries every layout of the space below, each built by applying ``--set``-style overrides
to the scenario's own YAML, so every rule of the scenario validator applies to it.

The space (``--gpus N`` first resizes the cluster to ``N / gpus_per_node`` nodes;
``--fix KEY=VALUE`` replaces one dimension's list by that single value, which may lie
outside the list, and the validator then judges it):

================ ===================================================================
``tp``           divisors of the GPUs per node, up to ``--max-tp``; a ``--max-tp``
                 above the node size adds the multiples of the node size that divide
                 the world (TP groups that span nodes)
``pp``           divisors of the model's layers such that ``tp · pp`` divides the world;
                 and the other ``pp`` that divide ``world / (tp · cp)`` with at least
                 two layers per stage, the layers split as evenly as they go with the
                 lighter stages first and last (``stage_layers``; 61 layers over 8
                 stages: 7/8/8/8/8/8/7/7, as DeepSeek-V3 and Llama 3 405B split theirs)
``dp``           the rest: ``world / (tp · pp)``
``ep``           mixture-of-experts models only: divisors of ``dp`` that divide the
                 experts
``sp``           off, and on when ``tp > 1`` (with ``tp = 1`` it is always off)
``micro_batch``  divisors of ``global_batch / dp`` up to 8; where the replicas cannot
                 split the global batch into whole micro-batches, one candidate stands
                 for all the variations of that ``tp · pp · dp`` and the validator
                 says why it is invalid
``schedule``     ``1f1b`` alone when ``pp = 1``; otherwise ``1f1b``, ``gpipe``,
                 ``zb-h1`` and ``interleaved-1f1b`` with 2 and 4 virtual stages where
                 ``layers % (pp · v) == 0`` and ``micro-batches % pp == 0``
                 (``interleaved-1f1b`` needs ``pp > 1``, even when pinned)
``recompute``    ``none``, ``selective``, ``full``
``placement``    ``[tp,dp,pp]``, ``[tp,pp,dp]`` and ``[dp,tp,pp]`` (TP across nodes,
                 the classic mistake); orders that differ only in where an axis of
                 size 1 sits give the same rank grid and are tried once
``cp``,          the scenario's own (context parallelism takes ``cp`` ranks out of
``cp_kind``      the world before ``dp``; CP joins the placement after TP); for
                 sequences of ``LONG_SEQUENCE`` (16K) tokens or more, also every CP
                 degree that keeps the CP group inside a node, as a ring and, where
                 heads and KV heads divide by ``tp · cp``, as Ulysses
``sharding``     where the weights have replicas (``dp · cp > 1``), every level:
                 ``none``, ``optimizer`` (ZeRO-1), ``gradients`` (ZeRO-2) and ``full``
                 (ZeRO-3, FSDP); ``none`` alone otherwise. ``full`` is not tried with
                 the zero-bubble schedules nor with expert parallelism (neither is
                 modelled)
``dp_shard``     with ``full`` sharding, also HSDP sharding over the data-parallel
                 ranks of one node and replicating across nodes, where a node holds
                 more than one of them and fewer than all (not with ``cp > 1``);
                 ``--fix dp_shard=N`` tries that shard group only, ``dp_shard=0`` no
                 HSDP
================ ===================================================================

Each candidate then meets these filters, in order, and the count of each is reported:

1. *invalid*: the scenario validator rejects it (counted by the first line of its
   message, e.g. ``parallel.tp: heads(12) is not divisible by tp(8)``);
2. *pruned*: it is valid but does not fit in memory
   (:func:`simulator.analysis.memory.memory_per_rank`, no simulation needed); the
   dominant memory term of the pruned layouts is reported;
3. *dominated*: the same layout with lighter recompute (``none`` < ``selective`` < ``full``)
   also fits. Recompute only adds work to a step, so the lighter one is never slower
   and the heavier one is not simulated. Likewise ZeRO-2 is simulated only where
   ZeRO-1 does not fit: both reduce-scatter the gradients and gather the updated
   parameters, so their steps take the same time and ZeRO-2 only saves memory.
   ``--exhaustive`` simulates them anyway;
4. *simulated*: one step with :func:`simulator.run.simulate.run_scenario`, in ``analytic``
   fidelity by default (collectives in closed form, symmetric ranks folded), on every
   core, and ranked by step time (ties broken by the layout string). A simulation
   that ends in an error (a schedule that cannot finish) is counted as *failed*.

The size of the space: GPT-3 175B on 1024 A100s (``scenarios/gpt3-175b.yaml --gpus
1024``, global batch 64) enumerates 6,574 candidates. The global batch rules out
``dp > 64`` (10 invalid candidates stand for those), 552 do not fit in memory, 4,566
are dominated, and 1,446 analytic runs of 0.05–0.5 s remain: about a minute on two
cores (``benchmarks/RESULTS.md``).
Mixture-of-experts steps are not folded (every rank routes differently), so their runs
take seconds each; pin some dimensions with ``--fix`` to keep such a sweep short.

:func:`run_sweep` does the work and returns a :class:`SweepResult`: data only. The
ranking table, the counts, ``sweep.csv``, ``sweep.json`` and ``sweep.html`` are drawn
by :mod:`simulator.report.sweep_report`, and the command line lives in
:mod:`simulator.cli.sweep`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import CATEGORIES
from simulator.common.collector import fewer_collections
from simulator.common.errors import ParasimError, ScenarioError
from simulator.common.vocabulary import (
    CP_KINDS,
    PIPELINE_SCHEDULES,
    PLACEMENT_AXES,
    RECOMPUTE_MODES,
    SHARDING_LEVELS,
    SWEEP_FIX_KEYS,
)
from simulator.request.layout import FEWEST_UNEVEN_LAYERS, balanced_stages
from simulator.request.recipe import LAYOUT_KNOBS, Recipe, knob_overrides, layout_label
from simulator.request.scenario import (
    ScenarioSpec,
    apply_overrides,
    read_scenario_file,
    scenario_from_dict,
)
from simulator.run.simulate import run_scenario
from simulator.tools.cache import ResultCache
from simulator.tools.progress import Progress, Silent
from simulator.tools.scheduler import open_dask
from topologies import TopologyError, load_cluster_spec
from topologies.config_text import ConfigTextError, read_yaml
from topologies.validation import nearest_key_hint, validation_message

__all__ = [
    "FIX_KEYS",
    "SCHEDULES",
    "PLACEMENTS",
    "MAX_MICRO_BATCH",
    "VIRTUAL_STAGES",
    "Candidate",
    "SweepBase",
    "SweepResult",
    "prepare",
    "parse_fixes",
    "check_fixed",
    "enumerate_layouts",
    "balanced_stages",
    "run_sweep",
    "run_chunked",
    "process_pool",
    "resolve_workers",
    "no_layout_message",
    "check_chunk",
    "simulate_chunk",
    "simulate_overrides",
    "read_raw",
]

#: Dimensions ``--fix`` can pin, in the order a layout string shows them.
FIX_KEYS = SWEEP_FIX_KEYS
_FIX_ALIASES = {"mb": "micro_batch", "v": "virtual_stages", "rc": "recompute"}
# searched by default, in this order: every built-in schedule but ZB-H2, which holds
# more micro-batches in flight than ZB-H1 for the last of the bubble (--fix
# schedule=zb-h2 searches it)
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1")
assert set(SCHEDULES) < set(PIPELINE_SCHEDULES)
PLACEMENTS = (PLACEMENT_AXES, ("tp", "pp", "dp"), ("dp", "tp", "pp"))
MAX_MICRO_BATCH = 8
# Sequences at least this long make the sweep also try context parallelism inside a
# node: shorter ones rarely need it for memory, and their ring blocks are too short to
# hide the K/V transfers (see docs/modelling.md, CP).
LONG_SEQUENCE = 16384
VIRTUAL_STAGES = (2, 4)
# full sharding's reduce-scatter would wait for the weight gradients these defer
_ZERO_BUBBLE = ("zb-h1", "zb-h2")
_RECOMPUTE_RANK = {name: i for i, name in enumerate(RECOMPUTE_MODES)}
_SHARDING_RANK = {name: i for i, name in enumerate(SHARDING_LEVELS)}
# ZeRO-2 moves what ZeRO-1 moves and saves memory only: the same step time
_SAME_TIME = {"gradients": "optimizer"}


# -- the space ------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One point of the layout space."""

    tp: int
    pp: int
    dp: int
    ep: int
    sp: bool
    micro_batch: int
    schedule: str
    virtual_stages: int
    recompute: str
    placement: tuple[str, ...]
    cp: int = 1
    cp_kind: str = "ring"
    sharding: str = "none"
    # HSDP's shard group (0: the weights shard over every replica, or not at all)
    dp_shard: int = 0
    # the layers of each pipeline stage when pp does not divide them (None: even)
    stage_layers: tuple[int, ...] | None = None

    @classmethod
    def from_knobs(cls, knobs: dict[str, Any]) -> Candidate:
        """The candidate of layout knobs by name (:data:`LAYOUT_KNOBS`, and ``cp``,
        ``cp_kind``, ``sharding``, ``dp_shard`` where given); other keys are ignored, so
        a sweep row will do."""
        names = [f.name for f in dataclasses.fields(cls) if f.name in knobs]
        values = {n: knobs[n] for n in names}
        if values.get("stage_layers") is not None:
            values["stage_layers"] = tuple(values["stage_layers"])
        return cls(**{**values, "placement": tuple(knobs["placement"])})

    @classmethod
    def of_recipe(cls, recipe: Recipe, **changes: Any) -> Candidate:
        """A scenario's own layout, with ``changes``."""
        layout = recipe.layout
        return cls.from_knobs(
            {
                **recipe.knobs(),
                "cp": layout.cp,
                "cp_kind": recipe.cp_kind,
                "sharding": recipe.sharding,
                "dp_shard": layout.dp_shard,
                "stage_layers": None
                if len(set(recipe.stage_layers)) == 1
                else tuple(recipe.stage_layers),
                **changes,
            }
        )

    def overrides(self) -> list[str]:
        """The ``key.path=value`` assignments that turn the scenario into this layout."""
        return knob_overrides(self.fields())

    def label(self) -> str:
        """``tp8 pp4 dp4 sp mb1 1f1b rc=full [tp,dp,pp]``, as :meth:`Recipe.label`, then
        HSDP's shard group, the sharding level and Ulysses CP in the recipe's text form
        (``dp_shard=8 sharding=full``)."""
        knobs = {k: v for k, v in self.fields().items() if k in _LABEL_KNOBS}
        parts = [layout_label(**knobs)]
        if self.stage_layers is not None:
            parts.append("stage_layers=" + "/".join(map(str, self.stage_layers)))
        if self.dp_shard:
            parts.append(f"dp_shard={self.dp_shard}")
        if self.sharding != "none":
            parts.append(f"sharding={self.sharding}")
        if self.cp > 1 and self.cp_kind == "ulysses":
            parts.append("cp_kind=ulysses")
        return " ".join(parts)

    def fields(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "sp": self.sp,
            "micro_batch": self.micro_batch,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "recompute": self.recompute,
            "placement": list(self.placement),
            "cp": self.cp,
            "cp_kind": self.cp_kind,
            "sharding": self.sharding,
            "dp_shard": self.dp_shard,
            "stage_layers": list(self.stage_layers) if self.stage_layers else None,
        }


_LABEL_KNOBS = (*LAYOUT_KNOBS, "cp")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParasimError(f"--fix {key}={value!r}: expected a positive integer")
    return value


def check_fixed(fixed: dict[str, Any]) -> dict[str, Any]:
    """Check and normalise pinned dimensions (``{'tp': 8, 'placement': 'tp,dp,pp'}``)."""
    result: dict[str, Any] = {}
    for raw_key, value in fixed.items():
        key = str(raw_key).strip()
        for prefix in ("parallel.", "training."):
            key = key.removeprefix(prefix)
        key = _FIX_ALIASES.get(key, key)
        if key not in FIX_KEYS:
            hint = nearest_key_hint(key, list(FIX_KEYS))
            raise ParasimError(
                f"--fix {raw_key}: unknown dimension{hint}; dimensions: {', '.join(FIX_KEYS)}"
            )
        if key in ("tp", "pp", "dp", "ep", "micro_batch", "virtual_stages"):
            value = _positive_int(key, value)
        elif key == "sp":
            if isinstance(value, str) and value.lower() in ("on", "off", "true", "false"):
                value = value.lower() in ("on", "true")
            if not isinstance(value, bool):
                raise ParasimError(f"--fix sp={value!r}: expected true or false")
        elif key == "schedule":
            if value not in PIPELINE_SCHEDULES:
                hint = nearest_key_hint(str(value), list(PIPELINE_SCHEDULES))
                raise ParasimError(
                    f"--fix schedule={value!r}: unknown schedule{hint}; "
                    f"schedules: {', '.join(PIPELINE_SCHEDULES)}"
                )
        elif key == "recompute":
            if value not in RECOMPUTE_MODES:
                raise ParasimError(
                    f"--fix recompute={value!r}: expected one of {', '.join(RECOMPUTE_MODES)}"
                )
        elif key == "cp":
            value = _positive_int(key, value)
        elif key == "dp_shard":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ParasimError(
                    f"--fix dp_shard={value!r}: expected a whole number of replicas (0: no HSDP)"
                )
        elif key in ("cp_kind", "sharding"):
            names = CP_KINDS if key == "cp_kind" else SHARDING_LEVELS
            if value not in names:
                raise ParasimError(f"--fix {key}={value!r}: expected one of {', '.join(names)}")
        elif key == "placement":
            if isinstance(value, str):
                value = [part.strip() for part in value.strip("[]").split(",")]
            if not isinstance(value, (list, tuple)) or sorted(map(str, value)) != sorted(
                ("tp", "dp", "pp")
            ):
                raise ParasimError(
                    f"--fix placement={value!r}: must order each of tp, dp, pp exactly once, "
                    "e.g. [tp,dp,pp]"
                )
            value = tuple(str(axis) for axis in value)
        result[key] = value
    return result


def parse_fixes(items: Iterable[str]) -> dict[str, Any]:
    """``['tp=8', 'placement=[tp,dp,pp]']`` → checked pins (values read as YAML)."""
    fixed: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ParasimError(f"--fix {item!r}: expected KEY=VALUE, e.g. --fix tp=8")
        key, text = item.split("=", 1)
        try:
            value = read_yaml(text, f"--fix {key.strip()}") if text.strip() else None
        except ConfigTextError as exc:
            raise ParasimError(str(exc)) from None
        fixed[key.strip()] = value
    return check_fixed(fixed)


def _distinct_placements(tp: int, dp: int, pp: int) -> list[tuple[str, ...]]:
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    seen: set[tuple[str, ...]] = set()
    kept = []
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
            levels = [
                level
                for level in SHARDING_LEVELS
                if level != "full" or (ep == 1 and schedule not in _ZERO_BUBBLE)
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
                        candidates.append(
                            Candidate(
                                tp,
                                pp,
                                dp,
                                ep,
                                sp,
                                mb,
                                schedule,
                                v,
                                recompute,
                                placement,
                                **extra,
                                **level,
                                **split,
                            )
                        )
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
        elif fixed.get("virtual_stages", 1) == 1:
            pairs.append((name, 1))
    return pairs


# -- the scenario being swept -----------------------------------------------------------


@dataclass
class SweepBase:
    """A scenario's raw YAML (overrides and resize applied) and what the space needs."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    name: str
    world: int
    nodes: int
    gpus_per_node: int
    cluster_name: str
    gpu_name: str
    capacity_bytes: float
    model_name: str
    layers: int
    global_batch: int
    experts: int | None
    extra_overrides: list[str]
    # the scenario's context parallelism, sharding and model shape the space starts from
    context: dict[str, Any]

    def candidate_overrides(self, candidate: Candidate, fidelity: str) -> list[str]:
        """Everything to pass to ``parasim run SCENARIO --set ...`` for this layout."""
        fixed = [f"simulation.fidelity={fidelity}"]
        if candidate.cp != self.context["cp"]:
            fixed.append(f"parallel.cp={candidate.cp}")
        if candidate.cp_kind != self.context["cp_kind"]:
            fixed.append(f"parallel.cp_kind={candidate.cp_kind}")
        if candidate.sharding != self.context["sharding"]:
            # the older optimizer_sharding spelling would contradict the new level
            fixed += [
                f"training.sharding={candidate.sharding}",
                "training.optimizer_sharding=false",
            ]
        training = self.raw.get("training") or {}
        if training.get("param_gather_overlap") and candidate.sharding not in (
            "optimizer",
            "gradients",
        ):
            fixed.append("training.param_gather_overlap=false")  # a ZeRO-1/2 setting only
        parallel = self.raw.get("parallel") or {}
        if candidate.dp_shard or any(
            parallel.get(key) is not None for key in ("dp_shard", "dp_replicate")
        ):
            fixed += [
                f"parallel.dp_shard={candidate.dp_shard or 'null'}",
                "parallel.dp_replicate=null",
            ]
        if parallel.get("schedule_file") is not None:
            fixed.append("parallel.schedule_file=null")
        if candidate.stage_layers is not None:
            stages = ",".join(map(str, candidate.stage_layers))
            fixed.append(f"parallel.stage_layers=[{stages}]")
        elif parallel.get("stage_layers") is not None:
            fixed.append("parallel.stage_layers=null")  # a split for the scenario's pp only
        return [*self.extra_overrides, *candidate.overrides(), *fixed]


def read_raw(path: str | Path) -> dict[str, Any]:
    """The parsed YAML of a scenario file
    (:func:`simulator.request.scenario.read_scenario_file`)."""
    return read_scenario_file(path)


def _cluster_spec(raw: dict[str, Any], base_dir: str):
    try:
        return load_cluster_spec(raw.get("cluster"), prefix="cluster", base_dir=base_dir)
    except TopologyError as exc:
        raise ScenarioError(str(exc)) from None


def prepare(
    scenario_path: str | Path, overrides: list[str] | None = None, gpus: int | None = None
) -> SweepBase:
    """Read a scenario, apply ``--set`` overrides and resize its cluster to ``gpus``."""
    path = Path(scenario_path)
    base_dir = str(path.parent)
    overrides = list(overrides or [])
    raw = apply_overrides(read_raw(path), overrides)
    try:
        spec = ScenarioSpec(**raw)
    except ValidationError as exc:
        raise ScenarioError(validation_message(exc, ScenarioSpec)) from None
    cluster = _cluster_spec(raw, base_dir)
    per_node = cluster.gpus_per_node
    if gpus is not None:
        if gpus < 1 or gpus % per_node:
            raise ParasimError(
                f"--gpus: {gpus} GPUs is not a whole number of {cluster.name} nodes "
                f"({per_node} GPUs per node; {gpus} / {per_node} = {gpus / per_node:g})"
            )
        resize = [f"cluster.nodes={gpus // per_node}"]
        raw = apply_overrides(raw, resize)
        overrides = overrides + resize
        cluster = _cluster_spec(raw, base_dir)
        if cluster.nodes * cluster.gpus_per_node != gpus:
            raise ParasimError(
                f"--gpus: cannot resize {cluster.name} to {gpus} GPUs "
                f"(it has {cluster.nodes} nodes of {cluster.gpus_per_node} GPUs)"
            )
    world = cluster.nodes * cluster.gpus_per_node
    # the model and cluster as the validator resolves them, on the simplest layout
    probe = apply_overrides(raw, [f"training.global_batch={world}", "training.micro_batch=1"])
    probe["parallel"] = {"tp": 1, "pp": 1, "cp": 1}
    resolved = scenario_from_dict(probe, source=str(path), base_dir=path.parent)
    moe = resolved.moe
    return SweepBase(
        raw=raw,
        source=str(path),
        base_dir=base_dir,
        name=spec.name,
        world=world,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        cluster_name=cluster.name,
        gpu_name=cluster.gpu.name,
        capacity_bytes=cluster.gpu.hbm_capacity,
        model_name=resolved.model.name,
        layers=resolved.model.layers,
        global_batch=spec.training.global_batch,
        experts=moe.experts if moe is not None else None,
        extra_overrides=overrides,
        context={
            "cp": spec.parallel.cp,
            "cp_kind": spec.parallel.cp_kind,
            "sharding": spec.training.sharding
            or ("optimizer" if spec.training.optimizer_sharding else "none"),
            "seq_len": resolved.model.seq_len,
            "heads": resolved.model.heads,
            "kv_heads": resolved.model.kv,
        },
    )


# -- work done in worker processes (plain, picklable inputs) ----------------------------

_CLUSTERS: dict[str, Any] = {}


def _load(raw: dict[str, Any], source: str, base_dir: str, overrides: list[str]):
    return scenario_from_dict(
        apply_overrides(raw, overrides), source=source, base_dir=Path(base_dir)
    )


def _check(
    raw: dict[str, Any],
    source: str,
    base_dir: str,
    overrides: list[str],
    estimates: dict[tuple[str, ...], Any] | None = None,
) -> dict:
    """Validate one candidate and estimate its memory. ``estimates`` holds the memory
    of the candidates already checked, by :func:`same_grid`: a placement decides which
    ranks a group joins, not what a rank holds, so the candidates that differ only in
    placement share one estimate (``tests/test_sweep.py`` holds them equal)."""
    try:
        scenario = _load(raw, source, base_dir, overrides)
        estimates = {} if estimates is None else estimates
        key = same_grid(overrides)
        memory = estimates.get(key)
        if memory is None:
            capacity = scenario.cluster_spec.gpu.hbm_capacity
            memory = estimates[key] = memory_per_rank(
                scenario.recipe, scenario.model, scenario.moe, capacity
            )
    except ParasimError as exc:
        return {"status": "invalid", "reason": (str(exc).splitlines() or [""])[0]}
    return {
        "status": "pruned" if memory.oom else "fits",
        "peak_bytes_per_gpu": memory.peak_bytes_per_gpu,
        "capacity_bytes": memory.capacity_bytes,
        "dominant_term": memory.dominant_term,
    }


def check_chunk(
    raw: dict[str, Any], source: str, base_dir: str, chunk: list[list[str]]
) -> list[dict]:
    """:func:`_check` of several candidates (one task of the process pool); those that
    differ only in placement share one memory estimate."""
    estimates: dict[tuple[str, ...], Any] = {}
    return [_check(raw, source, base_dir, overrides, estimates) for overrides in chunk]


@fewer_collections()
def simulate_overrides(
    raw: dict[str, Any], source: str, base_dir: str, overrides: list[str]
) -> dict[str, Any]:
    """Simulate one candidate; the headline numbers of its ``result.json``. The
    collector's slower pace lasts until the candidate's schedule and times are dropped,
    so the collection that follows finds little left to walk (run_scenario's own block,
    which ends while its result is alive, is then inside this one)."""
    try:
        raw = apply_overrides(raw, overrides)
        scenario = scenario_from_dict(raw, source=source, base_dir=Path(base_dir))
        key = json.dumps([raw.get("cluster"), base_dir], sort_keys=True, default=str)
        cluster = _CLUSTERS.get(key)
        if cluster is None:
            _CLUSTERS.clear()  # one cluster at a time: a sweep has one, a scale run one per size
            _CLUSTERS[key] = scenario.cluster
        else:  # the network graph and its routes do not depend on the layout: reuse them
            scenario = dataclasses.replace(scenario, _cluster=cluster)
        # a search keeps numbers, not traces: stages of one shape share their lowering
        result = run_scenario(scenario, numbers_only=True).result
    except ParasimError as exc:
        return {"status": "failed", "reason": (str(exc).splitlines() or [""])[0]}
    step = result.step_time_s
    mean = result.breakdown.mean
    memory = result.memory
    return {
        "status": "simulated",
        "step_time_s": step,
        "tokens_per_s": result.tokens_per_s,
        "tflops_per_gpu": result.tflops_per_gpu,
        "mfu": result.mfu,
        "microbatches": result.layout.microbatches,
        "global_batch": result.layout.global_batch,
        "peak_bytes_per_gpu": memory.peak_bytes_per_gpu,
        "capacity_bytes": memory.capacity_bytes,
        "memory_fraction": memory.peak_bytes_per_gpu / memory.capacity_bytes,
        "oom": memory.oom,
        "dominant_memory_term": memory.dominant_term,
        "breakdown_mean_s": {c: mean[c] for c in CATEGORIES},
        "bubble_fraction": mean["bubble"] / step,
        "exposed_comm_fraction": mean["exposed_comm"] / step,
        "stall_fraction": mean["imbalance_stall"] / step,
        "warnings": result.warnings,
    }


def simulate_chunk(
    raw: dict[str, Any], source: str, base_dir: str, chunk: list[list[str]]
) -> list[dict]:
    """:func:`simulate_overrides` of several candidates (one task of the process pool)."""
    return [simulate_overrides(raw, source, base_dir, overrides) for overrides in chunk]


# -- running tasks on every core --------------------------------------------------------


def process_pool(workers: int) -> ProcessPoolExecutor:
    # fork starts workers in milliseconds and they inherit the imported modules; the
    # progress bar refreshes by hand, so no thread is running when they start
    method = "fork" if sys.platform.startswith("linux") else None
    context = multiprocessing.get_context(method)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def _chunks(
    items: list, workers: int, largest: int, together: Callable[[Any], Hashable] | None = None
) -> list[list[int]]:
    """Indices of ``items`` in chunks of at most ``largest`` (fewer, for four chunks a
    worker at least); items of one ``together`` key go in one chunk, whole, in the
    order their keys first appear, so that one worker runs them one after another."""
    size = max(1, min(largest, math.ceil(len(items) / (4 * workers))))
    if together is None:
        return [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
    runs: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        runs.setdefault(together(item), []).append(index)
    chunks: list[list[int]] = []
    for run in runs.values():
        if chunks and len(chunks[-1]) + len(run) <= size:
            chunks[-1].extend(run)
        else:
            chunks.append(list(run))
    return chunks


def run_chunked(
    function: Callable[..., list[dict]],
    args: tuple,
    items: list,
    executor: Executor | None,
    workers: int,
    advance: Callable[[int], None],
    largest: int = 16,
    together: Callable[[Any], Hashable] | None = None,
) -> list[dict]:
    """``function(*args, chunk)`` over chunks of ``items``, in the pool when there is one;
    the results in the order of ``items``. Items of one ``together`` key run in one
    chunk (:func:`_chunks`), and so one after another in one process, which may reuse
    what the first of them built."""
    chunks = _chunks(items, workers if executor is not None else 1, largest, together)
    results: list[dict | None] = [None] * len(items)

    def keep(chunk: list[int], rows: list[dict]) -> None:
        for index, row in zip(chunk, rows, strict=True):
            results[index] = row
        advance(len(chunk))

    if executor is None:  # here, chunk by chunk in order, as a worker would run them
        for chunk in chunks:
            keep(chunk, function(*args, [items[i] for i in chunk]))
        return results  # type: ignore[return-value]
    futures = {
        executor.submit(function, *args, [items[i] for i in chunk]): chunk for chunk in chunks
    }
    for future in as_completed(futures):
        keep(futures[future], future.result())
    return results  # type: ignore[return-value]


def _executor(scheduler: str | None, workers: int, tasks: int) -> tuple[Executor | None, int]:
    """The executor a search runs on, and how many tasks it runs at once: a Dask
    cluster when ``scheduler`` names one, else a process pool of ``workers`` (none for
    one worker or one task)."""
    if scheduler is not None:
        dask = open_dask(scheduler, workers)
        return dask, max(1, sum(dask.client.nthreads().values()))
    if workers > 1 and tasks > 1:
        return process_pool(workers), workers
    return None, workers


def same_grid(overrides: list[str]) -> tuple[str, ...]:
    """A candidate's overrides but its placement: the candidates that differ only in
    placement lower the same programs (:mod:`simulator.schedule.relocate`)."""
    return tuple(o for o in overrides if not o.startswith("parallel.placement="))


def resolve_workers(workers: int | None) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if workers < 1:
        raise ParasimError(f"--workers: expected a positive number (got {workers})")
    return workers


# -- the sweep ---------------------------------------------------------------------------


@dataclass
class SweepResult:
    """A finished sweep: what was searched, what each filter removed, and the ranking.

    ``cluster`` holds the cluster's ``name``, ``nodes``, ``gpus_per_node``, ``gpu`` and
    per-GPU ``capacity_bytes``; ``counts`` how many layouts were ``enumerated``,
    ``invalid`` (with ``invalid_by_reason``), ``pruned_memory`` (with
    ``pruned_by_term`` and ``smallest_pruned_bytes``), ``dominated``, ``failed`` (with
    ``failed_by_reason``) and ``simulated``; ``rows`` one dict per simulated layout,
    fastest first, each with its ``rank``, its fields, its headline numbers and the
    ``overrides`` that reproduce it with ``parasim run``. ``wall_s`` and ``timing_s``
    (seconds spent checking and simulating) vary from run to run.
    """

    scenario: str
    source: str
    gpus: int
    cluster: dict[str, Any]
    model: str
    global_batch: int
    fidelity: str
    fixed: dict[str, Any]
    max_tp: int | None
    exhaustive: bool
    counts: dict[str, Any]
    rows: list[dict[str, Any]]
    wall_s: float
    timing_s: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        """What ``sweep.json`` holds: every field but the timings, so that the same
        inputs give the same bytes."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in ("wall_s", "timing_s")
        }


def run_sweep(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    fixed: dict[str, Any] | None = None,
    max_tp: int | None = None,
    fidelity: str = "analytic",
    workers: int | None = None,
    progress: Progress | None = None,
    exhaustive: bool = False,
    cache: ResultCache | None = None,
    scheduler: str | None = None,
) -> SweepResult:
    """Enumerate, validate, prune and simulate every layout; rows ranked by step time
    (:class:`SweepResult`). With ``cache``, a candidate checked or simulated before
    (the same scenario, files and parasim) is read from it instead. With
    ``scheduler`` (``local`` or a Dask scheduler's address), the candidates run on that
    Dask cluster instead of this machine's process pool
    (:mod:`simulator.tools.scheduler`)."""
    started = time.perf_counter()
    if fidelity not in ("analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow (got {fidelity!r})")
    if max_tp is not None and max_tp < 1:
        raise ParasimError(f"--max-tp: expected a positive number (got {max_tp})")
    workers = resolve_workers(workers)
    fixed = check_fixed(fixed or {})
    base = prepare(scenario_path, overrides, gpus)
    candidates = enumerate_layouts(
        base.world,
        base.gpus_per_node,
        base.layers,
        base.global_batch,
        base.experts,
        fixed,
        max_tp,
        base.context,
    )
    if not candidates:
        pins = ", ".join(f"{k}={v}" for k, v in fixed.items()) or "no pins"
        raise ParasimError(
            f"no layout to try for {base.name} on {base.world} GPUs ({pins}): tp * cp * pp "
            f"must divide the {base.world} GPUs and pp the {base.layers} layers"
        )
    all_overrides = [base.candidate_overrides(c, fidelity) for c in candidates]
    args = (base.raw, base.source, base.base_dir)
    cache = cache or ResultCache(None)
    executor, workers = _executor(scheduler, workers, len(candidates))
    # a Dask task costs the scheduler milliseconds: hand it chunks four times as large
    scale = 4 if scheduler is not None else 1
    try:
        with progress or Silent() as bar:
            advance = bar.stage(f"checking {len(candidates)} layouts", len(candidates))
            checks = cache.run(
                "check",
                base.raw,
                base.base_dir,
                all_overrides,
                lambda items: run_chunked(
                    check_chunk,
                    args,
                    items,
                    executor,
                    workers,
                    advance,
                    largest=64 * scale,
                    together=same_grid,
                ),
                advance,
            )
            chosen, dominated = _select(candidates, checks, exhaustive)
            checked = time.perf_counter()
            advance = bar.stage(f"simulating {len(chosen)} layouts ({fidelity})", len(chosen))
            runs = cache.run(
                "simulate",
                base.raw,
                base.base_dir,
                [all_overrides[i] for i in chosen],
                lambda items: run_chunked(
                    simulate_chunk,
                    args,
                    items,
                    executor,
                    workers,
                    advance,
                    largest=4 * scale,
                    together=same_grid,
                ),
                advance,
            )
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)

    invalid = Counter(c["reason"] for c in checks if c["status"] == "invalid")
    pruned = [c for c in checks if c["status"] == "pruned"]
    failed = Counter(r["reason"] for r in runs if r["status"] == "failed")
    rows = []
    for index, run in zip(chosen, runs, strict=True):
        if run["status"] != "simulated":
            continue
        candidate = candidates[index]
        rows.append(
            {
                "layout": candidate.label(),
                **candidate.fields(),
                **{k: v for k, v in run.items() if k != "status"},
                "overrides": all_overrides[index],
            }
        )
    rows.sort(key=lambda row: (row["step_time_s"], row["layout"]))
    for position, row in enumerate(rows, 1):
        row["rank"] = position
    counts = {
        "enumerated": len(candidates),
        "invalid": sum(invalid.values()),
        "invalid_by_reason": dict(sorted(invalid.items(), key=lambda kv: (-kv[1], kv[0]))),
        "pruned_memory": len(pruned),
        "pruned_by_term": dict(Counter(c["dominant_term"] for c in pruned).most_common()),
        "smallest_pruned_bytes": min((c["peak_bytes_per_gpu"] for c in pruned), default=None),
        "dominated": dominated,
        "failed": sum(failed.values()),
        "failed_by_reason": dict(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))),
        "simulated": len(rows),
    }
    return SweepResult(
        scenario=base.name,
        source=base.source,
        gpus=base.world,
        cluster={
            "name": base.cluster_name,
            "nodes": base.nodes,
            "gpus_per_node": base.gpus_per_node,
            "gpu": base.gpu_name,
            "capacity_bytes": base.capacity_bytes,
        },
        model=base.model_name,
        global_batch=base.global_batch,
        fidelity=fidelity,
        fixed={k: list(v) if isinstance(v, tuple) else v for k, v in fixed.items()},
        max_tp=max_tp,
        exhaustive=exhaustive,
        counts=counts,
        rows=rows,
        wall_s=time.perf_counter() - started,
        timing_s={
            "check": checked - started,
            "simulate": time.perf_counter() - checked,
            "cached": cache.hits,
        },
    )


def _select(
    candidates: list[Candidate], checks: list[dict], exhaustive: bool
) -> tuple[list[int], int]:
    """Indices of the candidates to simulate, and how many were dominated."""
    fits = [i for i, check in enumerate(checks) if check["status"] == "fits"]
    if exhaustive:
        return fits, 0
    lightest: dict[Candidate, int] = {}

    def weight(i: int) -> tuple[int, int]:
        return (
            _RECOMPUTE_RANK[candidates[i].recompute],
            _SHARDING_RANK[candidates[i].sharding],
        )

    for i in fits:
        candidate = candidates[i]
        key = dataclasses.replace(
            candidate, recompute="", sharding=_SAME_TIME.get(candidate.sharding, candidate.sharding)
        )
        if key not in lightest or weight(i) < weight(lightest[key]):
            lightest[key] = i
    chosen = sorted(lightest.values())
    return chosen, len(fits) - len(chosen)


def no_layout_message(result: SweepResult) -> str:
    """One line saying why a sweep has nothing to rank."""
    counts = result.counts
    head = f"no layout of {result.model} runs on {result.gpus} GPUs ({counts['enumerated']} tried"
    if counts["invalid"]:
        reason, n = next(iter(counts["invalid_by_reason"].items()))
        head += f"; {counts['invalid']} invalid, most often {n} x '{reason}'"
    if counts["pruned_memory"]:
        term = next(iter(counts["pruned_by_term"]))
        head += (
            f"; {counts['pruned_memory']} out of memory, the smallest needs "
            f"{counts['smallest_pruned_bytes'] / 2**30:.1f} GiB of "
            f"{result.cluster['capacity_bytes'] / 2**30:.1f} GiB per GPU (mostly {term})"
        )
    if counts["failed"]:
        reason = next(iter(counts["failed_by_reason"]))
        head += f"; {counts['failed']} failed to simulate: {reason}"
    return head + ")"
