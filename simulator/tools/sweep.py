"""Layout sweeps: every valid way to split a scenario's model over its cluster, ranked.

``parasim sweep SCENARIO`` keeps the scenario's model, cluster and training recipe and
tries every layout of the space below, each built by applying ``--set``-style overrides
to the scenario's own YAML, so every rule of the scenario validator applies to it.

The space (``--gpus N`` first resizes the cluster to ``N / gpus_per_node`` nodes, the
global batch following ``--batch``, :func:`scaled_batch`; ``--fix KEY=VALUE`` replaces
one dimension's list by that single value, which may lie outside the list, and the
validator then judges it):

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
                 ``zb-h1``, ``zbv`` (two chunks a rank, where ``layers % (2·pp) ==
                 0``) and ``interleaved-1f1b`` with 2 and 4 virtual stages where
                 ``layers % (pp · v) == 0`` and ``micro-batches % pp == 0``
                 (``interleaved-1f1b`` and ``zbv`` need ``pp > 1``, even when pinned)
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
1024 --batch fixed``, global batch 64) enumerates 6,574 candidates. The global batch rules out
``dp > 64`` (10 invalid candidates stand for those), 552 do not fit in memory, 4,566
are dominated, and 1,446 analytic runs of 0.05–0.5 s remain: about a minute on two
cores (``benchmarks/RESULTS.md``).
Mixture-of-experts steps are not folded (every rank routes differently), so their runs
take seconds each; pin some dimensions with ``--fix`` to keep such a sweep short. A
sweep estimated too large for this machine, every listed candidate simulated, is
refused before anything is laid out (:func:`check_search`); so is ``--workers`` above
four a core (:func:`resolve_workers`).

Every ranking says where the scenario's own layout stands (:func:`_scenario_layout`):
its rank, or why it has none, simulating it on its own where the space does not hold
it or a lighter recompute of it fits.

:func:`run_sweep` does the work and returns a :class:`SweepResult`: data only. The
ranking table, the counts, ``sweep.csv``, ``sweep.json`` and ``sweep.html`` are drawn
by :mod:`simulator.report.sweep_report`, and the command line lives in
:mod:`simulator.cli.sweep`.
"""

from __future__ import annotations

import dataclasses
import functools
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
from fractions import Fraction
from operator import attrgetter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import CATEGORIES
from simulator.common.collector import fewer_collections
from simulator.common.errors import ParasimError, ScenarioError
from simulator.common.machine import machine_memory
from simulator.common.vocabulary import (
    BATCH_POLICIES,
    CHUNKS_PER_RANK,
    CP_KINDS,
    PIPELINE_SCHEDULES,
    PLACEMENT_AXES,
    RECOMPUTE_MODES,
    SEARCHED_WHEN_FIXED,
    SHARDING_LEVELS,
    SPLIT_BACKWARD_SCHEDULES,
    SWEEP_FIX_KEYS,
)
from simulator.request.layout import FEWEST_UNEVEN_LAYERS, balanced_stages
from simulator.request.recipe import LAYOUT_KNOBS, Recipe, knob_overrides, layout_label
from simulator.request.scenario import (
    MAX_WORLD,
    ScenarioSpec,
    SimulationSpec,
    apply_overrides,
    read_scenario_file,
    scenario_from_dict,
    scenario_model,
)
from simulator.run.simulate import (
    SECONDS_PER_GPU,
    StepSize,
    advice,
    run_scenario,
    size_problem,
    step_size,
    would_fold,
)
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
]

#: Dimensions ``--fix`` can pin, in the order a layout string shows them.
FIX_KEYS = SWEEP_FIX_KEYS
_FIX_ALIASES = {"mb": "micro_batch", "v": "virtual_stages", "rc": "recompute"}
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
        """The ``key.path=value`` assignments that turn the scenario into this layout (a
        lighter recompute than full also drops the scenario's ``recompute_fraction``,
        which is a share of the fully recomputed layers)."""
        assignments = knob_overrides(self.fields())
        if self.recompute != "full":
            assignments.append("training.recompute_fraction=1")
        return assignments

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
        elif name in CHUNKS_PER_RANK:  # ZB-V: its two chunks a rank, as a V
            chunks = CHUNKS_PER_RANK[name]
            if pp > 1 and fixed.get("virtual_stages", chunks) == chunks:
                if layers % (pp * chunks) == 0:
                    pairs.append((name, chunks))
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
    # the scenario's simulation settings (its fold, before --fidelity)
    simulation: SimulationSpec
    # how the global batch was set: the ``policy`` (None: the scenario's own size) and
    # the scenario's own ``scenario_gpus`` and ``scenario_global_batch``
    batch: dict[str, Any]

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


def _cluster_spec(raw: dict[str, Any], base_dir: str):
    try:
        return load_cluster_spec(raw.get("cluster"), prefix="cluster", base_dir=base_dir)
    except TopologyError as exc:
        raise ScenarioError(str(exc)) from None


def scaled_batch(policy: str, batch: int, gpus: int, scenario_gpus: int) -> int:
    """The global batch at ``gpus`` GPUs of a scenario whose global batch is ``batch``
    on its own ``scenario_gpus``, by ``policy`` (:data:`BATCH_POLICIES`):

    * ``per-gpu``: each GPU keeps the scenario's share of the batch, so the global
      batch grows with the GPUs: ``batch · gpus / scenario_gpus``, which must be a whole
      number of sequences (weak scaling);
    * ``fixed``: the global batch stays ``batch`` (strong scaling);
    * ``tokens``: each GPU keeps the scenario's tokens per step as closely as whole
      sequences allow: ``batch · gpus / scenario_gpus`` rounded to the nearest whole
      number, at least one.
    """
    if policy not in BATCH_POLICIES:
        raise ParasimError(f"--batch: expected one of {', '.join(BATCH_POLICIES)} (got {policy!r})")
    if policy == "fixed" or gpus == scenario_gpus:
        return batch
    share = Fraction(batch * gpus, scenario_gpus)
    if policy == "tokens":
        return max(1, round(share))
    if share.denominator != 1:
        raise ParasimError(
            f"--batch per-gpu: global_batch({batch}) * {gpus} / {scenario_gpus} GPUs = "
            f"{float(share):g} is not a whole number of sequences; choose a GPU count it "
            "divides, or --batch tokens (the nearest whole batch) or --batch fixed"
        )
    return int(share)


def prepare(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    batch: str | None = None,
) -> SweepBase:
    """Read a scenario, apply ``--set`` overrides and resize its cluster to ``gpus``,
    its global batch following ``batch`` (:func:`scaled_batch`; default ``per-gpu``).
    Nothing is laid out yet: a million GPUs are refused (:func:`check_search`) before
    any rank grid is built."""
    path = Path(scenario_path)
    base_dir = str(path.parent)
    overrides = list(overrides or [])
    raw = apply_overrides(read_scenario_file(path), overrides)
    spec = _spec(raw)
    cluster = _cluster_spec(raw, base_dir)
    per_node = cluster.gpus_per_node
    scenario_gpus = cluster.nodes * per_node
    global_batch = spec.training.global_batch
    if gpus is not None:
        if gpus > MAX_WORLD:
            raise ParasimError(f"--gpus: {gpus:,} GPUs; parasim lays out at most {MAX_WORLD:,}")
        if gpus < 1 or gpus % per_node:
            raise ParasimError(
                f"--gpus: {gpus} GPUs is not a whole number of {cluster.name} nodes "
                f"({per_node} GPUs per node; {gpus} / {per_node} = {gpus / per_node:g})"
            )
        resize = [f"cluster.nodes={gpus // per_node}"]
        global_batch = scaled_batch(batch or BATCH_POLICIES[0], global_batch, gpus, scenario_gpus)
        if global_batch != spec.training.global_batch:
            resize.append(f"training.global_batch={global_batch}")
        raw = apply_overrides(raw, resize)
        overrides = overrides + resize
        cluster = _cluster_spec(raw, base_dir)
        if cluster.nodes * cluster.gpus_per_node != gpus:
            raise ParasimError(
                f"--gpus: cannot resize {cluster.name} to {gpus} GPUs "
                f"(it has {cluster.nodes} nodes of {cluster.gpus_per_node} GPUs)"
            )
    model, moe = scenario_model(spec)
    return SweepBase(
        raw=raw,
        source=str(path),
        base_dir=base_dir,
        name=spec.name,
        world=cluster.nodes * cluster.gpus_per_node,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        cluster_name=cluster.name,
        gpu_name=cluster.gpu.name,
        capacity_bytes=cluster.gpu.hbm_capacity,
        model_name=model.name,
        layers=model.layers,
        global_batch=global_batch,
        experts=moe.experts if moe is not None else None,
        extra_overrides=overrides,
        context={
            "cp": spec.parallel.cp,
            "cp_kind": spec.parallel.cp_kind,
            "sharding": spec.training.sharding
            or ("optimizer" if spec.training.optimizer_sharding else "none"),
            "seq_len": model.seq_len,
            "heads": model.heads,
            "kv_heads": model.kv,
        },
        simulation=spec.simulation,
        batch={
            "policy": (batch or BATCH_POLICIES[0]) if gpus is not None else None,
            "scenario_gpus": scenario_gpus,
            "scenario_global_batch": spec.training.global_batch,
        },
    )


def _spec(raw: dict[str, Any]) -> ScenarioSpec:
    try:
        return ScenarioSpec(**raw)
    except ValidationError as exc:
        raise ScenarioError(validation_message(exc, ScenarioSpec)) from None


def check_base(base: SweepBase) -> None:
    """Validate the scenario's model and cluster as the validator resolves them, on the
    simplest layout (every GPU a data-parallel replica: O(world) to lay out, so after
    the size guard), so that a mistake of theirs is one line rather than the reason
    every candidate is invalid."""
    probe = apply_overrides(
        base.raw, [f"training.global_batch={base.world}", "training.micro_batch=1"]
    )
    probe["parallel"] = {"tp": 1, "pp": 1, "cp": 1}
    scenario_from_dict(probe, source=base.source, base_dir=Path(base.base_dir))


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
    raw: dict[str, Any], source: str, base_dir: str, overrides: list[str], force: bool = False
) -> dict[str, Any]:
    """Simulate one candidate; the headline numbers of its ``result.json`` (``force``:
    past the step guard, as the search itself was forced). The
    collector's slower pace lasts until the candidate's schedule and times are dropped,
    so the collection that follows finds little left to walk (run_scenario's own block,
    which ends while its result is alive, is then inside this one)."""
    try:
        raw = apply_overrides(raw, overrides)
        scenario = scenario_from_dict(raw, source=source, base_dir=Path(base_dir))
        key = json.dumps([raw.get("cluster"), base_dir], sort_keys=True, default=str)
        cluster = _CLUSTERS.get(key)
        spec = scenario.cluster_spec
        if cluster is None or cluster.spec is not spec and cluster.spec != spec:
            # first here, or a file the cluster names (a profile, a topology) has changed
            # since a search in this process built it
            _CLUSTERS.clear()  # one cluster at a time: a sweep has one, a scale run one per size
            _CLUSTERS[key] = scenario.cluster
        else:  # the network graph and its routes do not depend on the layout: reuse them
            scenario = dataclasses.replace(scenario, _cluster=cluster)
        # a search keeps numbers, not traces: stages of one shape share their lowering
        result = run_scenario(scenario, force=force, numbers_only=True).result
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
        "interval": result.interval,
    }


def simulate_chunk(
    raw: dict[str, Any], source: str, base_dir: str, chunk: list[list[str]], force: bool = False
) -> list[dict]:
    """:func:`simulate_overrides` of several candidates (one task of the process pool)."""
    return [simulate_overrides(raw, source, base_dir, overrides, force) for overrides in chunk]


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
        return dask, dask.threads
    if workers > 1 and tasks > 1:
        return process_pool(workers), workers
    return None, workers


def same_grid(overrides: list[str]) -> tuple[str, ...]:
    """A candidate's overrides but its placement: the candidates that differ only in
    placement lower the same programs (:mod:`simulator.schedule.relocate`)."""
    return tuple(o for o in overrides if not o.startswith("parallel.placement="))


#: The most processes a search runs per core, and in all: each holds its own copy of
#: the cluster and of the candidate it simulates, and more than a few per core only take
#: turns on them (Python's process pool starts them all with the first task).
WORKERS_PER_CORE = 4
MAX_WORKERS = 256


def resolve_workers(workers: int | None) -> int:
    """``--workers``: every core by default; refused below one and above
    :data:`WORKERS_PER_CORE` per core or :data:`MAX_WORKERS`."""
    cores = os.cpu_count() or 1
    if workers is None:
        return cores
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParasimError(f"--workers: expected a positive number (got {workers})")
    limit = min(MAX_WORKERS, WORKERS_PER_CORE * cores)
    if workers > limit:
        raise ParasimError(
            f"--workers: {workers} processes on {cores} cores; at most {limit} "
            f"({WORKERS_PER_CORE} a core, {MAX_WORKERS} in all): more only take turns on "
            "the cores, each with its own copy of the cluster"
        )
    return workers


# -- how large a search is ---------------------------------------------------------------

# A sweep's worker builds the cluster once and reuses its network graph, routes and
# priced collectives for every candidate, which then costs about a quarter of a lone
# step per GPU: gpt3-175b's 54 layouts with tp 8 on 8,192 GPUs in analytic fidelity took
# 2.1 s each after the first, 0.26 ms a GPU (2-core VM, 2026-12-03).
SECONDS_PER_GPU_SEARCHED = 2.5e-4
#: The longest a search may be estimated to take (s), as if every candidate it lists
#: were simulated: a search beyond it is a mistake more often than not (pin dimensions).
MAX_SEARCH_SECONDS = 8 * 3600.0


def check_search(
    what: str,
    sizes: list[StepSize],
    workers: int,
    shared: bool = True,
    reuses_cluster: bool = True,
    hint: str = "use fewer GPUs",
) -> None:
    """Refuse a search (``what``: ``the sweep``...) of steps of ``sizes`` on ``workers``
    processes before it starts: one step beyond the step guard
    (:func:`simulator.run.simulate.size_problem`), the workers' steps together beyond
    half the machine's memory (with ``shared``: they run on this machine), or all the
    steps estimated above :data:`MAX_SEARCH_SECONDS`. ``reuses_cluster``: the steps
    share one cluster, which each worker builds once (a sweep), rather than one each
    (a scale run)."""
    if not sizes:
        return
    running = min(workers, len(sizes))
    slowest = max(sizes, key=attrgetter("seconds"))
    largest = max(sizes, key=attrgetter("bytes"))
    problem = None
    for size in (slowest, largest):
        step = f"a layout of {what}" if reuses_cluster else f"the step at {size.gpus:,} GPUs"
        alone = size_problem(size, step)
        if problem is None and alone is not None:
            problem = f"{alone}; {advice(size)}"
            if reuses_cluster:
                problem += f", {hint}"
    available = machine_memory()
    if problem is None and shared and available is not None and running > 1:
        if running * largest.bytes > available / 2:
            problem = (
                f"{what} is too large to run here: {running} workers holding about "
                f"{largest.bytes / 2**30:.3g} GiB each, beyond half the machine's "
                f"{available / 2**30:.0f} GiB; use fewer --workers"
            )
    seconds = sum(size.seconds for size in sizes)
    if reuses_cluster:  # each worker builds the cluster once, then reuses it
        saved = SECONDS_PER_GPU - SECONDS_PER_GPU_SEARCHED
        seconds -= (len(sizes) - running) * largest.gpus * saved
    wall = seconds / running
    if problem is None and wall > MAX_SEARCH_SECONDS:
        steps = "layouts" if reuses_cluster else "steps"
        problem = (
            f"{what} is too large to simulate here: up to {len(sizes):,} {steps} on up to "
            f"{largest.gpus:,} GPUs, about {wall / 3600:.3g} hours on {running} "
            f"worker{'s' * (running > 1)}, beyond {MAX_SEARCH_SECONDS / 3600:.0f} hours; "
            f"{hint}"
        )
    if problem is not None:
        raise ParasimError(f"{problem}, or pass --force to run it anyway")


# -- the sweep ---------------------------------------------------------------------------


@dataclass
class SweepResult:
    """A finished sweep: what was searched, what each filter removed, and the ranking.

    ``cluster`` holds the cluster's ``name``, ``nodes``, ``gpus_per_node``, ``gpu`` and
    per-GPU ``capacity_bytes``; ``batch`` how the global batch was set (``policy``,
    None at the scenario's own size; the scenario's own ``scenario_gpus`` and
    ``scenario_global_batch``); ``experts`` the model's experts (None: a dense model);
    ``counts`` how many layouts were ``enumerated``, ``invalid`` (with
    ``invalid_by_reason``), ``pruned_memory`` (with ``pruned_by_term`` and
    ``smallest_pruned_bytes``), ``dominated``, ``failed`` (with ``failed_by_reason``)
    and ``simulated``; ``rows`` one dict per simulated layout, fastest first, each with
    its ``rank``, its fields, its headline numbers and the ``overrides`` that reproduce
    it with ``parasim run``. ``scenario_layout`` is the scenario's own layout at this
    size (:func:`_scenario_layout`). ``wall_s`` and ``timing_s`` (seconds spent checking
    and simulating) vary from run to run.
    """

    scenario: str
    source: str
    gpus: int
    cluster: dict[str, Any]
    model: str
    experts: int | None
    global_batch: int
    batch: dict[str, Any]
    fidelity: str
    fixed: dict[str, Any]
    max_tp: int | None
    exhaustive: bool
    counts: dict[str, Any]
    rows: list[dict[str, Any]]
    scenario_layout: dict[str, Any] | None
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


def plan_sweep(
    scenario_path: str | Path,
    overrides: list[str] | None = None,
    gpus: int | None = None,
    fixed: dict[str, Any] | None = None,
    max_tp: int | None = None,
    batch: str | None = None,
) -> tuple[SweepBase, list[Candidate]]:
    """The scenario prepared for a sweep (:func:`prepare`) and every candidate of its
    space (:func:`enumerate_layouts`): what :func:`run_sweep` and its size guard start
    from, before anything is laid out."""
    if max_tp is not None and max_tp < 1:
        raise ParasimError(f"--max-tp: expected a positive number (got {max_tp})")
    fixed = check_fixed(fixed or {})
    base = prepare(scenario_path, overrides, gpus, batch)
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
    return base, candidates


def sweep_sizes(base: SweepBase, candidates: list[Candidate], fidelity: str) -> list[StepSize]:
    """What simulating each candidate costs (:func:`simulator.run.simulate.step_size`),
    for :func:`check_search`; tens of thousands of candidates share a few sizes."""
    simulation = base.simulation.model_copy(update={"fidelity": fidelity})
    analytic, moe = fidelity == "analytic", base.experts is not None
    folded = {cp: would_fold(simulation, moe, cp, base.world) for cp in {c.cp for c in candidates}}
    known: dict[tuple[int, int, int, int, int], StepSize] = {}
    sizes = []
    for candidate in candidates:
        pp, dp, micro, cp = candidate.pp, candidate.dp, candidate.micro_batch, candidate.cp
        ep = candidate.ep
        size = known.get((pp, dp, micro, cp, ep))
        if size is None:
            microbatches = max(1, base.global_batch // (dp * micro))
            size = step_size(
                base.world, pp, base.layers, microbatches, folded[cp], analytic, moe=moe, ep=ep
            )
            known[(pp, dp, micro, cp, ep)] = size
        sizes.append(size)
    return sizes


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
    batch: str | None = None,
    force: bool = False,
) -> SweepResult:
    """Enumerate, validate, prune and simulate every layout; rows ranked by step time
    (:class:`SweepResult`). ``gpus`` resizes the cluster, the global batch following
    ``batch`` (:func:`scaled_batch`, default ``per-gpu``). A sweep too large for this
    machine is refused before anything is laid out (:func:`check_search`) unless
    ``force``. With ``cache``, a candidate checked or simulated before (the same
    scenario, files and parasim) is read from it instead. With ``scheduler``
    (``local`` or a Dask scheduler's address), the candidates run on that Dask cluster
    instead of this machine's process pool (:mod:`simulator.tools.scheduler`)."""
    started = time.perf_counter()
    if fidelity not in ("analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow (got {fidelity!r})")
    workers = resolve_workers(workers)
    base, candidates = plan_sweep(scenario_path, overrides, gpus, fixed, max_tp, batch)
    fixed = check_fixed(fixed or {})
    if not force:
        hint = "pin dimensions with --fix, or use fewer GPUs"
        own = base.batch["scenario_global_batch"]
        if base.global_batch != own:
            hint += (
                f" (--batch {base.batch['policy']} made the global batch {base.global_batch:,}"
                f" of the scenario's {own:,}; --batch fixed keeps it)"
            )
        check_search(
            "the sweep",
            sweep_sizes(base, candidates, fidelity),
            workers,
            shared=scheduler in (None, "local"),
            hint=hint,
        )
    check_base(base)
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
                    functools.partial(simulate_chunk, force=force),
                    args,
                    items,
                    executor,
                    workers,
                    advance,
                    largest=4 * scale,
                    together=same_grid,
                ),
                advance,
                force,
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
    outcomes = {
        candidate: (checks[i], runs[chosen.index(i)] if i in chosen else None)
        for i, candidate in enumerate(candidates)
    }
    own = _scenario_layout(base, fidelity, rows, outcomes, cache, force)
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
        experts=base.experts,
        global_batch=base.global_batch,
        batch=base.batch,
        fidelity=fidelity,
        fixed={k: list(v) if isinstance(v, tuple) else v for k, v in fixed.items()},
        max_tp=max_tp,
        exhaustive=exhaustive,
        counts=counts,
        rows=rows,
        scenario_layout=own,
        wall_s=time.perf_counter() - started,
        timing_s={
            "check": checked - started,
            "simulate": time.perf_counter() - checked,
            "cached": cache.hits,
        },
    )


def _scenario_layout(
    base: SweepBase,
    fidelity: str,
    rows: list[dict[str, Any]],
    outcomes: dict[Candidate, tuple[dict[str, Any], dict[str, Any] | None]],
    cache: ResultCache,
    force: bool,
) -> dict[str, Any]:
    """The scenario's own layout at the sweep's size (its ``tp``, ``cp``, ``pp`` and
    recipe as written, ``dp`` the rest), so that a ranking always says where the
    user's layout stands: its ``layout``, ``status`` (``simulated``, ``pruned``,
    ``invalid`` or ``failed``), ``rank`` among the rows (None where
    it is not one of them: a lighter recompute of it fits, or it lies outside the
    searched space, and it is then checked and simulated on its own, through the
    cache), its fields and numbers or its ``reason``, and the ``overrides`` that give it
    with ``parasim run``."""
    own = ["parallel.dp=null", f"simulation.fidelity={fidelity}"]
    entry: dict[str, Any] = {"rank": None, "overrides": [*base.extra_overrides, *own]}
    try:
        scenario = _load(base.raw, base.source, base.base_dir, own)
    except ParasimError as exc:
        return {**entry, "layout": None, "status": "invalid", "reason": _first_line(exc)}
    candidate = Candidate.of_recipe(scenario.recipe)
    for row in rows:
        if Candidate.from_knobs(row) == candidate:
            return {**row, "status": "simulated"}
    searched = candidate in outcomes
    entry = {
        "layout": candidate.label(),
        **candidate.fields(),
        **entry,
        "unranked": "a lighter recompute of it fits, or ZeRO-1 where it has ZeRO-2 (never slower)"
        if searched
        else "outside the searched space",
    }
    check, run = outcomes.get(candidate, (None, None))
    if check is None:
        check = _alone(cache, "check", base, own, check_chunk)
    if check["status"] != "fits":
        return {**entry, **check}
    if run is None:
        chunk = functools.partial(simulate_chunk, force=force)
        run = _alone(cache, "simulate", base, own, chunk, force)
    return {**entry, **run}


def _alone(
    cache: ResultCache,
    kind: str,
    base: SweepBase,
    overrides: list[str],
    chunk: Callable[..., list[dict]],
    force: bool = False,
) -> dict[str, Any]:
    """``chunk`` (:func:`check_chunk`, :func:`simulate_chunk`) of one candidate here,
    through the cache (``force``: a forced search's)."""
    compute = functools.partial(chunk, base.raw, base.source, base.base_dir)
    return cache.run(kind, base.raw, base.base_dir, [overrides], compute, _no_progress, force)[0]


def _no_progress(n: int) -> None:
    """No progress to show for one layout."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


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
