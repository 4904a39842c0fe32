"""A lower bound on a layout's step time, without simulating it: what lets a sweep
simulate its best layouts only.

Most layouts a sweep enumerates are far slower than the best, and a number that no
simulation of a layout can beat says which of them need no simulation: a sweep
simulates its candidates in the order of this bound and stops where the next bound
exceeds the slowest layout its ranking must hold (:mod:`simulator.tools.sweep`).

The bound of a layout is the longest of its pipeline ranks' necessary time, each
rank's made of what its compute stream cannot avoid, priced by the same models the
simulation uses:

* **its layers' compute**, every micro-batch: the ops the lowering runs for a layer
  (:func:`~simulator.arithmetic.layer_ops.layer_forward_ops` and their backward), each
  at :class:`~simulator.engine.compute.ComputeModel`'s time alone, plus the forward
  again in the layers full recompute reruns (``recompute_fraction`` as the recipe picks
  them) or the attention core (selective recompute);
* **the collectives the compute stream waits for**: the tensor-parallel forward's
  all-reduces (with SP, its all-gathers and reduce-scatters) unless Transformer
  Engine's pipelined overlap runs them beside their GEMMs; in the backward, the SP
  all-gathers before the row-parallel GEMMs (unless pipelined) and, without
  ``tp_comm_overlap``, every collective after an input gradient and the re-gathered
  inputs; where an MoE layer's EP ranks receive alike, its dispatch and combine
  all-to-alls and their gradients (only the dispatch's gradient where shared experts
  run beside the others). Each is priced as NCCL's plan for the call alone on its
  group, with nothing else on the network (the simulation prices it with its images,
  never faster), on the cheaper of two groups (the first rank's and the last's);
* **full sharding's ``dp`` stream** (Megatron-Core's and FSDP2's units): every
  micro-batch's gathers of the rank's layers and their reduce-scatters, one after
  another, which no rank's step can be shorter than;
* **the pipeline's fill and drain**: no op of a rank can start before the forward of
  every stage ahead of its first one has run, and without a split backward a rank's
  last op is a backward of its first stage, after which every stage ahead of it runs
  its backward of that micro-batch (a zero-bubble schedule may end on a weight
  gradient, so only the fill counts for it).

What the bound leaves out only makes the step longer, so the bound stays below any
simulation of the layout: the embedding, the output layer and the loss, the optimizer,
the other data-parallel, expert, context-parallel and pipeline transfers, the host's
issue of kernels, the SMs NCCL takes from overlapped GEMMs, an MoE layer's experts and
all-to-alls where routing is skewed, DualPipeV's tensor-parallel and expert calls (it
runs them behind the other micro-batch's compute). With stragglers (``gpu.jitter``)
every rank's compute is scaled by the fastest rank's factor. ``tests/test_bound.py``
holds the bound below the simulated step on every shipped scenario's layout and on
sampled sweep candidates.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from simulator.arithmetic.counts import layer_parameter_count
from simulator.arithmetic.layer_ops import (
    ACT_BYTES,
    OpCost,
    attention_core_names,
    backward_of,
    fp8_ops,
    layer_forward_ops,
)
from simulator.arithmetic.moe import (
    expert_backward_of,
    loads_equal,
    local_experts,
    moe_layer_ops,
    moe_layer_traffic,
    shared_expert_ops,
)
from simulator.arithmetic.stacks import stack_of
from simulator.common.errors import ParasimError
from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_TO_ALL,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    GROUPED_GEMM,
    PIPELINE_SCHEDULES,
    REDUCE_SCATTER,
    SPLIT_BACKWARD_SCHEDULES,
    CollectiveKind,
)
from simulator.engine.alone import time_alone
from simulator.engine.collectives import collective_transfers
from simulator.engine.compute import ComputeModel
from simulator.engine.stragglers import normal_scores
from simulator.request.layout import Layout, balanced_stages
from simulator.request.moe import is_moe_layer
from simulator.request.orders import Overlap
from simulator.request.placement import Placement, placement_style
from simulator.request.scenario import Scenario
from simulator.schedule.layers import RankLowering
from simulator.schedule.pipeline import pipeline_order

__all__ = ["StepBound", "LayerTimes"]

#: The schedule whose tensor- and expert-parallel calls run behind the other
#: micro-batch's compute, where two of them are overlapped.
_OVERLAPPED_PAIRS = ("dualpipev",)
#: The schedules whose order a walk bounds more tightly than their fill and drain do.
_WALKED = ("interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipev")
#: The frameworks whose full sharding gathers a layer's block as one unit on the ``dp``
#: stream, which its reduce-scatters share (simulator.schedule.sharded_dp).
_BLOCK_SHARDING = ("megatron", "torchtitan")


@dataclass(frozen=True)
class LayerTimes:
    """One layer's necessary seconds for one micro-batch on one rank: ``forward``,
    ``backward_input`` (input gradients, with the exposed calls of both), ``weight``
    (weight gradients), and what its recompute adds, ``full`` or ``selective``."""

    forward: float
    backward_input: float
    weight: float
    full: float
    selective: float


class StepBound:
    """Lower bounds on the steps of layouts of one scenario (module docstring): its
    model, cluster and every recipe setting but the searched knobs come from
    ``scenario``, each layout's searched knobs from the candidate;
    ``recompute_fraction`` is the scenario's as written."""

    def __init__(self, scenario: Scenario, recompute_fraction: float = 1.0):
        recipe = scenario.recipe
        self.model, self.moe = scenario.model, scenario.moe
        self.layers = self.model.layers
        self.recipe = recipe
        self.stack = stack_of(recipe.framework, recipe.compile, recipe.cross_entropy)
        meta = {
            "host_dispatch_s": self.stack.dispatch_s,
            "attention_backend": recipe.attention_backend,
            "framework": recipe.framework,
        }
        self.compute = ComputeModel(scenario.cluster_spec, meta)
        self.cluster = scenario.cluster
        self.world = scenario.layout.world
        simulation = scenario.spec.simulation
        self.algorithm, self.protocol = simulation.algorithm, simulation.protocol
        # the share of a stage's layers full recompute reruns: the scenario's (a layout
        # with another recompute may have reset it), the smaller where the two differ
        own = recipe.recompute_fraction if recipe.recompute == "full" else 1.0
        self.fraction = min(own, recompute_fraction)
        jitter = scenario.cluster_spec.gpu.jitter
        # the fastest rank's compute factor (stragglers.rank_factors draws no faster one)
        self.fastest = 1.0
        if jitter > 0:
            self.fastest = min(1.0, max(0.5, 1.0 + jitter * float(normal_scores(self.world)[0])))
        self.overlap_tp = recipe.tp_comm_overlap in ("async", "pipelined")
        self._layers: dict[tuple, tuple[LayerTimes, LayerTimes]] = {}
        self._groups: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self._calls: dict[tuple, float] = {}
        self._ranks: dict[tuple, tuple[list[tuple[float, float]], int, int]] = {}
        self._sharded: dict[tuple, tuple[float, float]] = {}
        self._paths: dict[tuple, float] = {}
        self._layer_params = layer_parameter_count(self.model)
        self.seed = simulation.seed
        self._moe_layers = [
            self.moe is not None and is_moe_layer(self.moe, layer) for layer in range(self.layers)
        ]
        self._first_moe = self._moe_layers.index(True) if any(self._moe_layers) else 0

    # -- one layer -------------------------------------------------------------------
    def layer_times(
        self, candidate: Any, calls: bool | None = None
    ) -> tuple[LayerTimes, LayerTimes]:
        """A dense and an MoE layer's :class:`LayerTimes` for ``candidate``, with the
        calls its compute stream waits for (``calls``; by default, unless its schedule
        runs them behind another micro-batch's compute)."""
        tp, sp, mb = candidate.tp, candidate.sp, candidate.micro_batch
        cp, cp_kind, ep = candidate.cp, candidate.cp_kind, candidate.ep
        overlapped = candidate.schedule in _OVERLAPPED_PAIRS if calls is None else not calls
        tp_calls = None if overlapped else self._groups_of(candidate, "tp")
        ep_calls = None if overlapped or self.moe is None else self._groups_of(candidate, "ep")
        key = (tp, sp, mb, cp, cp_kind, ep, tp_calls, ep_calls)
        known = self._layers.get(key)
        if known is None:
            known = self._layers[key] = (
                self._layer(tp, sp, mb, cp, cp_kind, ep, tp_calls, None, moe=False),
                self._layer(tp, sp, mb, cp, cp_kind, ep, tp_calls, ep_calls, moe=True),
            )
        return known

    def _layer(
        self,
        tp: int,
        sp: bool,
        mb: int,
        cp: int,
        cp_kind: str,
        ep: int,
        groups: tuple[tuple[int, ...], ...] | None,
        ep_groups: tuple[tuple[int, ...], ...] | None,
        moe: bool,
    ) -> LayerTimes:
        recipe, model = self.recipe, self.model
        local = model.model_copy(update={"seq_len": model.seq_len // cp}) if cp > 1 else model
        ops = layer_forward_ops(
            local, mb, tp, sp, recipe.attention, cp, cp_kind, recipe.fp8, self.stack
        )
        pairs = [(op, backward_of(op)) for op in ops]
        forward = backward_input = 0.0
        if moe:
            mlp = RankLowering._MLP
            pairs = [pair for pair in pairs if pair[0].name not in mlp]
            experts, splits = self._expert_pairs(local, tp, mb, ep)
            pairs += experts
            if splits is not None and ep_groups is not None:
                forward, backward_input = self._exposed_all_to_alls(ep_groups, splits)
        time = self.compute.duration
        activation = ACT_BYTES * mb * local.seq_len * local.hidden
        pipelined = recipe.tp_comm_overlap == "pipelined" and sp

        def call(kind: CollectiveKind) -> float:
            return 0.0 if groups is None or tp == 1 else self._call(groups, kind, activation)

        forward += sum(time(op) for op, _ in pairs)
        if not pipelined:
            forward_calls = RankLowering._FWD_COMM[sp]
            forward += sum(
                call(forward_calls[op.name]) for op, _ in pairs if op.name in forward_calls
            )
        weight = 0.0
        backward_calls = RankLowering._BWD_COMM[sp]
        for _, grads in pairs:
            for grad in grads:
                if grad.name.endswith(".wgrad"):
                    weight += time(grad)
                    continue
                backward_input += time(grad)
                kind = backward_calls.get(grad.name)
                if kind == ALL_GATHER:  # SP's gather before a row-parallel GEMM's backward
                    backward_input += 0.0 if pipelined else call(kind)
                elif kind is not None and not self.overlap_tp:  # after an input gradient
                    backward_input += call(kind)
                if sp and grad.name in RankLowering._REGATHER and not self.overlap_tp:
                    backward_input += call(ALL_GATHER)
        core = attention_core_names(recipe.attention, cp, cp_kind)
        selective = sum(time(op) for op, _ in pairs if op.name in core)
        return LayerTimes(forward, backward_input, weight, forward, selective)

    def _expert_pairs(
        self, local: Any, tp: int, mb: int, ep: int
    ) -> tuple[list[tuple[OpCost, list[OpCost]]], np.ndarray | None]:
        """An MoE layer's own ops with their backward, as
        :class:`~simulator.schedule.experts.ExpertLowering` runs them: the router, the
        reordering around the all-to-alls (counted at no assignment sent) and the shared
        experts on the rank's own tokens; the local experts only where every rank
        receives alike (uniform routing), on the rows routing gives them, unpadded. With
        them, the dispatch's bytes from each EP rank to each (None where routing is
        skewed, or node-limited routing sends less than it routes)."""
        moe = self.moe
        if moe is None:
            return [], None
        recipe = self.recipe
        tokens = mb * local.seq_len
        alike = loads_equal(moe, tokens)
        rows = np.zeros(moe.experts // ep, dtype=np.int64)
        splits = None
        if alike:
            traffic = moe_layer_traffic(
                moe, ep, tokens, local.hidden, ACT_BYTES, self.seed, self._first_moe, 0
            )
            rows = traffic.expert_tokens[list(local_experts(moe, ep, 0))]
            plain = moe.dispatcher != "deepep" and moe.max_nodes_per_token is None
            splits = traffic.splits if plain else None
        ops = moe_layer_ops(
            moe,
            local.hidden,
            rows,
            tokens=tokens,
            sent=0,
            tp=tp,
            framework=recipe.framework,
            fp8=recipe.fp8,
            compiled=recipe.compile,
            model_ffn=local.ffn,
            mlp=local.mlp,
            bias=local.bias,
        )
        routed = (*ops.received, *ops.experts, *ops.returned) if alike else ()
        shared = shared_expert_ops(
            moe, local.hidden, tokens, tp, model_ffn=local.ffn, mlp=local.mlp, bias=local.bias
        )
        if recipe.fp8:
            shared = fp8_ops(shared)
        per_rank = moe.experts // ep
        pairs = []
        for op in (*ops.router, *ops.dispatch, *routed, *ops.combine):
            grouped = op.kind == GROUPED_GEMM
            pairs.append((op, expert_backward_of(op, per_rank) if grouped else backward_of(op)))
        return pairs + [(op, backward_of(op)) for op in shared], splits

    def _exposed_all_to_alls(
        self, groups: tuple[tuple[int, ...], ...], splits: np.ndarray
    ) -> tuple[float, float]:
        """The EP all-to-alls an MoE layer's compute stream waits for, forward and
        backward: the dispatch and the combine and their gradients, each alone on the
        cheaper of ``groups``; with shared experts overlapped, only the dispatch's
        gradient (the others run beside the shared experts)."""
        moe = self.moe
        assert moe is not None  # an MoE layer's
        key = (groups, splits.tobytes())
        seconds = self._calls.get(key)
        if seconds is None:
            times = []
            for gpus in groups:
                rows = {gpu: tuple(map(float, row)) for gpu, row in zip(gpus, splits, strict=True)}
                choice, specs = collective_transfers(
                    self.cluster,
                    ALL_TO_ALL,
                    list(gpus),
                    float(splits[0].sum()),
                    rows,
                    self.algorithm,
                    self.protocol,
                )
                times.append(time_alone(self.cluster, specs, choice.latency))
            seconds = self._calls[key] = min(times)
        if moe.shared_experts and moe.overlap_shared_experts:
            return 0.0, seconds
        return 2 * seconds, 2 * seconds

    def _groups_of(self, candidate: Any, axis: str) -> tuple[tuple[int, ...], ...] | None:
        """The GPUs of the first and the last rank's ``axis`` groups (None where the
        axis has one rank)."""
        if getattr(candidate, axis) == 1:
            return None
        key = (
            axis,
            candidate.tp,
            candidate.cp,
            candidate.pp,
            candidate.dp,
            candidate.ep,
            tuple(candidate.placement),
        )
        known = self._groups.get(key)
        if known is None:
            layout = Layout(
                candidate.tp,
                candidate.pp,
                candidate.dp,
                tuple(candidate.placement),
                ep=candidate.ep,
                cp=candidate.cp,
            )
            known = self._groups[key] = tuple(
                layout.members(layout.group_name(axis, rank)) for rank in (0, layout.world - 1)
            )
        return known

    def _call(self, groups: tuple[tuple[int, ...], ...], kind: str, size: float) -> float:
        """NCCL's time for one call alone on the cheaper of ``groups``."""
        key = (groups, kind, size)
        seconds = self._calls.get(key)
        if seconds is None:
            times = []
            for gpus in groups:
                choice, specs = collective_transfers(
                    self.cluster, kind, list(gpus), size, None, self.algorithm, self.protocol
                )
                times.append(time_alone(self.cluster, specs, choice.latency))
            seconds = self._calls[key] = min(times)
        return seconds

    # -- a whole step ----------------------------------------------------------------
    def seconds(self, candidate: Any, global_batch: int) -> float:
        """The bound on ``candidate``'s step with ``global_batch`` sequences a step; 0
        for a layout the lowering cannot form (the validator says why)."""
        try:
            dense, moe = self.layer_times(candidate)
        except (ValueError, ArithmeticError, ParasimError):
            return 0.0
        microbatches = max(1, global_batch // (candidate.dp * candidate.micro_batch))
        pp, chunks = candidate.pp, candidate.virtual_stages
        stages = candidate.stage_layers or _balanced(self.layers, pp * chunks)
        if len(stages) != pp * chunks or sum(stages) != self.layers:
            return 0.0  # not a valid split: the validator says why
        recompute = candidate.recompute if candidate.recompute != "none" else None
        key = (dense, moe, pp, chunks, tuple(stages), candidate.schedule, recompute)
        known = self._ranks.get(key)
        if known is None:
            known = self._ranks[key] = self._rank_terms(*key)
        terms, busiest, fewest = known
        compute = max(fill + microbatches * work for fill, work in terms) * self.fastest
        compute += self._gather_after_step(candidate, fewest)
        sharded = self._sharded_calls(candidate)
        if sharded is None:
            return compute
        gather, reduce = sharded
        gathers = microbatches * (2 if candidate.reshard_after_forward else 1)
        return max(compute, busiest * (gathers * gather + reduce))

    def _gather_after_step(self, candidate: Any, layers: int) -> float:
        """A sharded optimizer's (ZeRO-1/2) all-gather of ``layers`` layers' updated
        weights, alone on the cheaper of two DP groups: a rank gathers its layers' in
        one call after its optimizer, which waits for its last backward's gradients, so nothing
        of the rank overlaps it (:mod:`simulator.schedule.gradients`); 0 where it runs
        beside the next step (``param_gather_overlap``), or another framework (DeepSpeed
        gathers in chunks), grid or model decides it (experts, context parallelism)."""
        recipe = self.recipe
        if (
            candidate.sharding not in ("optimizer", "gradients")
            or recipe.param_gather_overlap
            or recipe.framework == "deepspeed"
            or candidate.dp == 1
            or candidate.cp > 1
            or self.moe is not None
        ):
            return 0.0
        groups = self._groups_of(candidate, "dp")
        assert groups is not None  # more than one replica
        weight_bytes = 1 if recipe.fp8_all_gather else ACT_BYTES
        size = layers * self._layer_params / candidate.tp * weight_bytes
        return self._call(groups, ALL_GATHER, size)

    def _sharded_calls(self, candidate: Any) -> tuple[float, float] | None:
        """One layer's gather and reduce-scatter on a rank's ``dp`` stream under full
        sharding, each alone on the cheaper of two DP groups; None where another
        sharding, framework or grid decides that stream (ZeRO-1/2, FSDP1, ZeRO-3, HSDP,
        experts, context parallelism).

        Megatron-Core's and FSDP2's units (:mod:`simulator.schedule.sharded_dp`) put
        their calls one after another on the ``dp`` stream: every micro-batch gathers
        each of the rank's layers before its forward (and, resharded after it, again
        before its backward), and their gradients are reduce-scattered at least once. A
        layer's weights count as its parameters over ``tp`` (norms and biases, which
        every TP rank holds whole, once); the embedding's and output layer's units are
        left out."""
        if (
            candidate.sharding != "full"
            or self.recipe.framework not in _BLOCK_SHARDING
            or candidate.dp_shard
            or candidate.cp > 1
            or candidate.dp == 1
            or self.moe is not None
        ):
            return None
        groups = self._groups_of(candidate, "dp")
        assert groups is not None  # more than one replica
        key = (groups, candidate.tp)
        known = self._sharded.get(key)
        if known is None:
            params = self._layer_params / candidate.tp
            weight_bytes = 1 if self.recipe.fp8_all_gather else ACT_BYTES
            known = self._sharded[key] = (
                self._call(groups, ALL_GATHER, params * weight_bytes),
                self._call(groups, REDUCE_SCATTER, params * self.recipe.grad_bytes),
            )
        return known

    def refined(self, candidate: Any, global_batch: int) -> float:
        """A tighter bound than :meth:`seconds`, at the cost of walking the pipeline's
        order (about a millisecond for a few thousand actions): the longest path through
        the schedule's actions (:func:`~simulator.schedule.pipeline.pipeline_order`), each
        action its stage's layers' time as :meth:`seconds` counts them, each rank's
        actions one after another in its order, a forward after the previous stage's, a
        backward after the next stage's and its own forward, a weight gradient after its
        input gradient, and an overlapped forward and backward (DualPipeV) taking both
        of their times from the later of the two being ready. Where the walk cannot
        follow the order, :meth:`seconds`."""
        cheap = self.seconds(candidate, global_batch)
        if cheap == 0.0 or candidate.pp == 1 or candidate.schedule not in _WALKED:
            return cheap  # 1F1B's and GPipe's fill and drain are the walk's already
        microbatches = max(1, global_batch // (candidate.dp * candidate.micro_batch))
        pp, chunks = candidate.pp, candidate.virtual_stages
        stages = tuple(candidate.stage_layers or _balanced(self.layers, pp * chunks))
        recompute = candidate.recompute if candidate.recompute != "none" else None
        # an action alone waits for its calls; an overlapped pair's run behind the other
        alone = self._stage_times(*self.layer_times(candidate, True), stages, recompute)
        paired = self._stage_times(*self.layer_times(candidate, False), stages, recompute)
        key = (candidate.schedule, pp, microbatches, chunks, alone, paired)
        longest = self._paths.get(key)
        if longest is None:
            plan = _walk_plan(candidate.schedule, pp, microbatches, chunks)
            longest = self._paths[key] = 0.0 if plan is None else _longest_path(plan, alone, paired)
        placement = Placement(pp, chunks, placement_style(candidate.schedule))
        fewest = min(sum(stages[s] for s in placement.stages_of(rank)) for rank in range(pp))
        tail = self._gather_after_step(candidate, fewest)
        return max(cheap, longest * self.fastest + tail)

    def _stage_times(
        self, dense: LayerTimes, moe: LayerTimes, stages: tuple[int, ...], recompute: str | None
    ) -> _StageTimes:
        """Each global stage's forward, input-gradient (with its recompute) and
        weight-gradient seconds for one micro-batch."""
        fraction = self.fraction if recompute == "full" else 1.0
        forward, inputs, weights = [], [], []
        first = 0
        for count in stages:
            moe_count = sum(self._moe_layers[first : first + count])
            first += count
            dense_count = count - moe_count
            forward.append(dense_count * dense.forward + moe_count * moe.forward)
            weights.append(dense_count * dense.weight + moe_count * moe.weight)
            base = dense_count * dense.backward_input + moe_count * moe.backward_input
            if recompute is not None:
                # full recompute reruns round(count·fraction) of the stage's layers
                reruns = math.floor(count * fraction + 0.5) if recompute == "full" else count
                kinds = [dense] * bool(dense_count) + [moe] * bool(moe_count)
                base += reruns * min((getattr(kind, recompute) for kind in kinds), default=0.0)
            inputs.append(base)
        return tuple(forward), tuple(inputs), tuple(weights)

    def _rank_terms(
        self,
        dense: LayerTimes,
        moe: LayerTimes,
        pp: int,
        chunks: int,
        stages: tuple[int, ...],
        schedule: str,
        recompute: str | None,
    ) -> tuple[list[tuple[float, float]], int, int]:
        """Each pipeline rank's ``(fill and drain, work of one micro-batch)`` (its time is
        the first plus the micro-batches times the second; only the ranks no other
        outlasts at every count of micro-batches), and the most and fewest layers a rank
        holds."""
        forward, inputs, weights = self._stage_times(dense, moe, stages, recompute)
        backward = [i + w for i, w in zip(inputs, weights, strict=True)]
        placement = Placement(pp, chunks, placement_style(schedule))
        # a custom order may end on a weight gradient as a zero-bubble one does
        split = schedule in SPLIT_BACKWARD_SCHEDULES or schedule not in PIPELINE_SCHEDULES
        ahead_forward = list(itertools.accumulate(forward, initial=0.0))
        ahead_backward = list(itertools.accumulate(backward, initial=0.0))
        terms: dict[float, float] = {}  # work of a micro-batch -> the longest fill with it
        for rank in range(pp):
            held = placement.stages_of(rank)
            ahead = min(held)
            fill = ahead_forward[ahead] + (0.0 if split else ahead_backward[ahead])
            work = sum(forward[s] + backward[s] for s in held)
            terms[work] = max(fill, terms.get(work, 0.0))
        kept: list[tuple[float, float]] = []
        for work, fill in sorted(terms.items(), reverse=True):
            if not kept or fill > kept[-1][0]:
                kept.append((fill, work))
        layers = [sum(stages[s] for s in placement.stages_of(rank)) for rank in range(pp)]
        return kept, max(layers), min(layers)


#: Each global stage's forward, input-gradient and weight-gradient seconds.
_StageTimes = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]


#: An action's part as the walk reads it: its kind (0 forward, 1 input gradient, 2 weight
#: gradient, 3 whole backward), its stage, the number of what it completes and of what
#: it needs (a forward's or an input gradient's end, numbered by stage and micro-batch).
_Part = tuple[int, int, int, tuple[int, ...]]
_KINDS = {FORWARD: 0, BACKWARD_INPUT: 1, BACKWARD_WEIGHT: 2, FULL_BACKWARD: 3}


@functools.lru_cache(maxsize=64)
def _walk_plan(
    schedule: str, pp: int, microbatches: int, chunks: int
) -> tuple[tuple[tuple[_Part, ...], ...], ...] | None:
    """Each pipeline rank's actions, each the parts it runs (two for an overlapped
    pair), in the form :func:`_longest_path` walks; None where an action is not a
    forward or a backward."""
    order = pipeline_order(schedule, pp, microbatches, chunks)
    last = pp * chunks - 1
    grads = (last + 1) * microbatches  # an input gradient's number: after the forwards'

    def part(action: Any) -> _Part | None:
        kind = _KINDS.get(action.type)
        if kind is None:
            return None
        stage, mb = action.stage, action.microbatch
        forward = stage * microbatches + mb
        if kind == 0:
            return 0, stage, forward, (forward - microbatches,) if stage else ()
        if kind == 2:
            return 2, stage, -1, (grads + forward,)
        later = (grads + forward + microbatches,) if stage < last else ()
        return kind, stage, grads + forward, (forward, *later)

    plan = []
    for rank in sorted(order):
        actions = []
        for action in order[rank]:
            halves = (action.forward, action.backward) if type(action) is Overlap else (action,)
            parts = tuple(part(half) for half in halves)
            if any(p is None for p in parts):
                return None
            actions.append(cast("tuple[_Part, ...]", parts))
        plan.append(tuple(actions))
    return tuple(plan)


def _longest_path(
    plan: tuple[tuple[tuple[_Part, ...], ...], ...], alone: _StageTimes, paired: _StageTimes
) -> float:
    """The last action's end when each pipeline rank runs its actions (``plan``,
    :func:`_walk_plan`) one after another as soon as what it needs is done
    (:meth:`StepBound.refined`), an action taking its stage's ``alone`` times, the
    halves of an overlapped pair their ``paired`` ones; 0 where the walk cannot finish."""
    seconds = [
        [forward, inputs, weights, tuple(i + w for i, w in zip(inputs, weights, strict=True))]
        for forward, inputs, weights in (alone, paired)
    ]
    ends: dict[int, float] = {}
    ranks = range(len(plan))
    position = [0] * len(plan)
    free = [0.0] * len(plan)
    waiting: dict[int, list[int]] = {}
    ready = list(ranks)
    while ready:
        rank = ready.pop()
        actions = plan[rank]
        while position[rank] < len(actions):
            parts = actions[position[rank]]
            afters = []
            missing = -1
            for _, _, _, deps in parts:
                after = 0.0
                for dep in deps:
                    end = ends.get(dep)
                    if end is None:
                        missing = dep
                        break
                    if end > after:
                        after = end
                if missing >= 0:
                    break
                afters.append(after)
            if missing >= 0:
                waiting.setdefault(missing, []).append(rank)
                break
            times = seconds[len(parts) > 1]
            start = max(free[rank], afters[0])
            done = start
            for (kind, stage, key, _), after in zip(parts, afters, strict=True):
                took = times[kind][stage]
                end = max(start, after) + took
                done = max(done + took, end)
                if key >= 0:
                    ends[key] = end
                    ready.extend(waiting.pop(key, ()))
            free[rank] = done
            position[rank] += 1
    if any(position[rank] < len(plan[rank]) for rank in ranks):
        return 0.0
    return max(free, default=0.0)


@functools.lru_cache(maxsize=256)
def _balanced(layers: int, stages: int) -> tuple[int, ...]:
    return balanced_stages(layers, stages)
