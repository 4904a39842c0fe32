"""Full sharding (``training.sharding: full``) as each framework runs it: the gathers
before a layer, the reduce-scatters after its backward, and what runs beside them.

:class:`~simulator.schedule.gradients.DataParallelGradients` picks one of these by
``recipe.framework`` and hands it every layer boundary and weight gradient:

* :class:`BlockSharding` (``megatron``, unchanged from before frameworks were told
  apart; FSDP2-like): a unit per block (:func:`~.sharding_units.block_units`); before a
  unit's forward its bf16 weights are all-gathered on the ``dp`` stream, the next unit's
  gather is issued as this one starts; with ``reshard_after_forward`` the backward
  gathers again, one unit ahead in backward order; after a unit's backward (the stage's
  last) its gradients are reduce-scattered in ``grad_reduce_dtype``, then with HSDP
  all-reduced across the replicas.
* :class:`Fsdp2Sharding` (``torchtitan``; PyTorch 2.4 ``_fsdp_collectives.py``,
  ``_fsdp_param_group.py``): the same units and prefetch, plus the copies FSDP2's
  per-parameter sharding needs. ``foreach_all_gather`` casts each fp32 shard to bf16 and
  copies it into one flat input buffer on the all-gather copy-in stream (modelled as a
  memory-bound op on stream ``dp_copy_in``: 6 bytes read and written per fp32 shard
  element for the cast, 4 for the copy); the copy-in of the next unit waits for this
  unit's copy-out, whose event frees the previous all-gather output
  (``comm_ctx.all_gather_state``). ``foreach_all_gather_copy_out`` splits the gathered
  buffer into the parameters with ``split_with_sizes_copy`` on the compute stream (read
  and write the bf16 weights: 4 bytes per element), and the layer runs after it. The
  gradients are concatenated into the reduce-scatter input in the reduce dtype on the
  reduce-scatter stream (``foreach_reduce_scatter_copy_in``: a bf16 read and a
  ``grad_reduce_dtype`` write per element; stream ``dp_rs_copy_in``) before the
  reduce-scatter. Gathers and reduce-scatters share one NCCL stream (one process group).
* :class:`Fsdp1Sharding` (``fsdp1``; PyTorch 2.4 ``fsdp/_runtime_utils.py``,
  ``_limiter_utils.py``, ``_flat_param.py``): a FlatParameter per block, gathered
  straight into its padded unsharded flat buffer (no copy-in, views out). Without
  ``forward_prefetch`` (default false) a unit's gather is issued when the host reaches
  its pre-forward hook, which runs ahead of the GPU; ``limit_all_gathers=True`` keeps a
  queue of the reshards' free events and, with two in it, blocks the host on the
  oldest: the gather of unit ``k`` starts after unit ``k-2`` was freed (the end of its
  forward, or of its backward). ``BACKWARD_PRE`` prefetches the next unit in backward
  order as a unit's backward begins, under the same limiter. ``SHARD_GRAD_OP``
  (``reshard_after_forward: false``) never frees in the forward: no free events, so
  nothing holds the forward's gathers back.
* :class:`ZeroStage3Sharding` (``deepspeed``; DeepSpeed v0.16.5
  ``partitioned_param_coordinator.py``, ``stage3.py``): modules
  (:func:`~.sharding_units.submodule_units`) fetched as the coordinator does: a module
  not yet in flight is gathered alone; then the coordinator pops the trace of upcoming
  parameters until it holds ``min(max_live - live, prefetch_bucket)`` elements (5e7
  and 1e9 by default) and gathers them in one coalesced call; a module is released
  after its layer ran. Gradients join buckets of ``reduce_bucket_size`` elements (5e8)
  in the order backward completes them, each reduce-scattered (expert gradients over
  ``edp``) once full, the rest after the backward.

With several micro-batches the PyTorch stacks reduce-scatter after every micro-batch's
backward (FSDP2 without pipeline parallelism, FSDP1, ZeRO-3: ``reduces_every_microbatch``),
Megatron-Core once, after the stage's last.

With expert parallelism every framework shards an MoE block's routed experts over the
expert-data-parallel group and the rest over ``dp`` (with ``ep = 1`` the experts are
part of the block). Simplified, for every framework: a layer's ops wait for every unit
of the layer (the lowering hooks layers, not ops: DeepSpeed's ``o_proj`` waits with
``q_proj``); the embedding and output ops do not wait for their unit's gather; the
copies on their own streams do not slow the compute they overlap.
DeepSpeed's parameter reuse (``max_reuse_distance``), the trace across the forward /
backward boundary and the coordinator's host work per module are not modelled.
"""

from __future__ import annotations

from typing import Any

from simulator.arithmetic.layer_ops import ACT_BYTES, OpCost
from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ELEMENTWISE,
    REDUCE_SCATTER,
)
from simulator.schedule.sharding_units import (
    DEEPSPEED_MAX_LIVE_PARAMETERS,
    DEEPSPEED_PREFETCH_BUCKET,
    DEEPSPEED_REDUCE_BUCKET,
    Unit,
    block_units,
    submodule_units,
)

__all__ = [
    "BlockSharding",
    "Fsdp2Sharding",
    "Fsdp1Sharding",
    "ZeroStage3Sharding",
    "sharding_for",
    "FSDP2_COPY_IN_BYTES",
    "FSDP2_COPY_OUT_BYTES",
]

# FSDP2's copy-in per local (sharded) element: the fp32 -> bf16 cast of the shard (read
# 4, write 2) and its copy into the flat all-gather input (read 2, write 2); copy-out
# per gathered element: split_with_sizes_copy reads and writes the bf16 weight.
FSDP2_COPY_IN_BYTES = 10
FSDP2_COPY_OUT_BYTES = 2 * ACT_BYTES


class BlockSharding:
    """Megatron-Core's full sharding: FSDP2's units and prefetch without its copies (see
    the module docstring)."""

    @property
    def reduces_every_microbatch(self) -> bool:
        """Whether a unit's gradients are reduce-scattered after every micro-batch's
        backward (and accumulated sharded) rather than once, after the stage's last
        backward: Megatron-Core accumulates the whole gradient and reduces once."""
        return False

    def __init__(self, gradients: Any):
        self.gradients = gradients
        self.out = gradients.out  # where the rank's lowering writes
        self.recipe = gradients.recipe
        # units gathered ahead of use, by (writer, micro-batch, layer, backward?): the
        # ops the layer waits for
        self.prefetched: dict[tuple[int, int, int, bool], list[int]] = {}
        self.reduces: list[int] = []  # what the optimizer waits for
        self.program = self.out.w  # the rank's program (a block's body is another writer)
        self._units: dict[int, list[Unit]] = {}

    # -- units and groups ---------------------------------------------------------------
    def units(self, layer: int) -> list[Unit]:
        """``layer``'s units (memoised: gathered and reduced once per micro-batch)."""
        units = self._units.get(layer)
        if units is None:
            config = self.gradients.config
            units = self._units[layer] = self._layer_units(config, layer)
        return units

    def _layer_units(self, config: Any, layer: int) -> list[Unit]:
        return block_units(self.recipe, config.model, config.moe, layer)

    def group(self, unit: Unit) -> str | None:
        """The group ``unit`` shards over: ``edp`` for experts, else the shard group."""
        return self.gradients.edp_group if unit.expert else self.gradients.shard_group

    def gather_bytes(self, unit: Unit) -> float:
        """The bf16 weights of ``unit`` (the FP8 layers' in FP8 with ``fp8_all_gather``)."""
        size = unit.params * ACT_BYTES
        if self.recipe.fp8_all_gather:
            size -= unit.fp8
        return size

    def _tags(self, layer: int, microbatch: int, phase: str) -> dict[str, Any]:
        return self.out.w.tags(
            stage=self.out.stage, layer=layer, axis="dp", phase=phase, microbatch=microbatch
        )

    def _after_host(self) -> tuple:
        """Deps of an op issued now: after the rank's latest compute op."""
        return (self.out.last,) if self.out.w.ops else ()

    # -- forward and backward -----------------------------------------------------------
    def before_layer(self, layer: int, microbatch: int, phase: str) -> None:
        """Before ``layer`` runs: its units' gathers (prefetched or issued now), which the
        layer waits for, and the next layer's prefetch."""
        backward = phase != "fwd"
        if backward and not self.recipe.reshard_after_forward:
            return  # still gathered since this micro-batch's forward
        writer = id(self.out.w)
        waits = self.prefetched.pop((writer, microbatch, layer, backward), None)
        if waits is None:
            waits = self.gather_layer(layer, microbatch, phase, self._after_host())
        self.use(layer, microbatch, phase, waits)
        following = layer - 1 if backward else layer + 1
        if following in self.recipe.layers_of(self.out.stage):
            key = (writer, microbatch, following, backward)
            self.prefetched[key] = self.gather_layer(
                following, microbatch, phase, self.prefetch_deps(layer, backward)
            )

    def prefetch_deps(self, layer: int, backward: bool) -> tuple:
        """What the prefetch issued as ``layer`` starts waits for: the host's issue."""
        return self._after_host()

    def use(self, layer: int, microbatch: int, phase: str, waits: list[int]) -> None:
        """The layer's first op waits for ``waits``."""
        self.out.waits.extend(waits)

    def gather_layer(self, layer: int, microbatch: int, phase: str, deps: tuple) -> list[int]:
        """All-gather ``layer``'s units after ``deps``; the ops the layer waits for."""
        ops = []
        for unit in self.units(layer):
            group = self.group(unit)
            if group is None or unit.persistent:
                continue
            ops.append(self._gather(unit, group, layer, microbatch, phase, deps))
        return ops

    def _gather(
        self, unit: Unit, group: str, layer: int, microbatch: int, phase: str, deps: tuple
    ) -> int:
        name = f"L{layer}" if unit.name == f"L{layer}" else unit.name
        return self.out.w.collective(
            ALL_GATHER,
            group,
            self.gather_bytes(unit),
            "dp",
            f"{name}.fsdp_all_gather.{phase}.mb{microbatch}",
            deps,
            self._tags(layer, microbatch, phase),
        )

    def after_layer_backward(self, layer: int, microbatch: int, final: bool) -> None:
        """After ``layer``'s backward (in the stage's last backward only, unless
        :attr:`reduces_every_microbatch`): reduce-scatter each unit's gradients (with
        HSDP, then all-reduce the dense shard across replicas)."""
        if not (final or self.reduces_every_microbatch):
            return
        for unit in self.units(layer):
            if not unit.persistent:
                self._reduce_unit(unit, layer, microbatch)

    def _reduce_unit(self, unit: Unit, layer: int, microbatch: int) -> None:
        w = self.out.w
        grad_bytes = unit.params * self.recipe.grad_bytes
        tags = self._tags(layer, microbatch, "bwd")
        group = self.group(unit)
        name = f"L{layer}" if unit.name == f"L{layer}" else unit.name
        reduce = None
        if group is not None:
            deps = self.reduce_deps(unit, layer, microbatch, grad_bytes)
            reduce = w.collective(
                REDUCE_SCATTER,
                group,
                grad_bytes,
                "dp",
                f"{name}.fsdp_reduce_scatter.mb{microbatch}",
                deps,
                tags,
            )
        replicate = self.gradients.replicate_group
        if replicate is not None and not unit.expert:
            # HSDP: the shard's gradients, averaged across the replicas
            reduce = w.collective(
                ALL_REDUCE,
                replicate,
                grad_bytes / self.gradients.layout.shard_degree,
                "dp",
                f"{name}.hsdp_all_reduce.mb{microbatch}",
                (self.out.last,) if reduce is None else (reduce,),
                tags,
            )
        if reduce is not None:
            self.waited_by_optimizer(reduce)

    def waited_by_optimizer(self, reduce: int) -> None:
        """Make the optimizer wait for ``reduce``, written in the rank's program; one
        written in a block's body (an earlier micro-batch's backward, where the stack
        reduces every micro-batch) ends with its block, which the optimizer follows, and
        its number is the body's, not the program's."""
        if self.out.w is self.program:
            self.reduces.append(reduce)

    def reduce_deps(self, unit: Unit, layer: int, microbatch: int, grad_bytes: float) -> tuple:
        """What a unit's reduce-scatter waits for: the layer's last backward op."""
        return (self.out.last,)

    def grad_ready(self, params: int, producer: Any, microbatch: int, expert: bool) -> None:
        """A weight gradient is complete (units reduce after their layer instead)."""

    def end_step(self, microbatch: int) -> None:
        """Before the optimizer: nothing left to reduce."""

    # -- side ops ------------------------------------------------------------------------
    def side_compute(
        self, cost: OpCost, stream: str, label: str, deps: tuple, tags: dict[str, Any]
    ) -> int:
        """A memory-bound kernel on a stream of its own (FSDP2's copy-in streams), issued
        by the host as it reaches it: not its pipeline action's first op."""
        return self.out.w.compute(cost, label, deps, tags, stream=stream)


class Fsdp2Sharding(BlockSharding):
    """torchtitan's FSDP2: :class:`BlockSharding` with the copy-in before each gather,
    the copy-out before the layer and the reduce-scatter's copy-in (module docstring)."""

    @property
    def reduces_every_microbatch(self) -> bool:
        """FSDP2 reduce-scatters in every backward unless told not to: OLMo-core's and
        torchtitan's gradient accumulation leave it on (OLMo-core e27ba7455,
        ``trainer._train_microbatch_context``: ``no_sync`` for DDP only), while
        ``torch.distributed.pipelining``'s stages turn it off until the last backward
        (``backward_maybe_with_nosync``)."""
        return self.gradients.layout.pp == 1

    def __init__(self, gradients: Any):
        super().__init__(gradients)
        # writer -> the latest copy-out: the next copy-in waits for it (its event frees
        # the previous all-gather's output)
        self.copied_out: dict[int, Any] = {}

    def _gather(
        self, unit: Unit, group: str, layer: int, microbatch: int, phase: str, deps: tuple
    ) -> int:
        shard = unit.params / len(self.gradients.layout.members(group))
        tags = self._tags(layer, microbatch, phase)
        cost = OpCost("fsdp_copy_in", ELEMENTWISE, 0.0, FSDP2_COPY_IN_BYTES * shard, 0.0)
        previous = self.copied_out.get(id(self.out.w))
        copy_deps = tuple(deps) + ((previous,) if previous is not None else ())
        name = f"L{layer}" if unit.name == f"L{layer}" else unit.name
        copy_in = self.side_compute(
            cost, "dp_copy_in", f"{name}.fsdp_copy_in.{phase}.mb{microbatch}", copy_deps, tags
        )
        return super()._gather(unit, group, layer, microbatch, phase, (copy_in,))

    def prefetch_deps(self, layer: int, backward: bool) -> tuple:
        return ()  # the copy-in waits for this layer's copy-out (Fsdp2Sharding._gather)

    def use(self, layer: int, microbatch: int, phase: str, waits: list[int]) -> None:
        """The copy-out of each gathered unit on the compute stream, after its gather;
        the layer runs after it."""
        units = [u for u in self.units(layer) if not u.persistent and self.group(u)]
        for unit, gather in zip(units, waits, strict=True):
            self.out.waits.append(gather)
            cost = OpCost(
                "fsdp_copy_out",
                ELEMENTWISE,
                0.0,
                FSDP2_COPY_OUT_BYTES * unit.params,
                0.0,
            )
            name = f"L{layer}" if unit.name == f"L{layer}" else unit.name
            self.out.run(
                cost,
                f"{name}.fsdp_copy_out.{phase}.mb{microbatch}",
                layer=layer,
                microbatch=microbatch,
                phase=phase,
            )
        self.copied_out[id(self.out.w)] = self.out.last

    def reduce_deps(self, unit: Unit, layer: int, microbatch: int, grad_bytes: float) -> tuple:
        """The gradients concatenated into the reduce-scatter input, in the reduce dtype."""
        cost = OpCost(
            "fsdp_rs_copy_in",
            ELEMENTWISE,
            0.0,
            unit.params * ACT_BYTES + grad_bytes,
            0.0,
        )
        name = f"L{layer}" if unit.name == f"L{layer}" else unit.name
        copy_in = self.side_compute(
            cost,
            "dp_rs_copy_in",
            f"{name}.fsdp_rs_copy_in.mb{microbatch}",
            (self.out.last,),
            self._tags(layer, microbatch, "bwd"),
        )
        return (copy_in,)


class Fsdp1Sharding(BlockSharding):
    """PyTorch FSDP1: FlatParameter units, no copies, the all-gather rate limiter and
    no forward prefetch (module docstring)."""

    # torch.distributed.fsdp: limit_all_gathers=True keeps at most two free events
    # queued (_limiter_utils._FreeEventQueue._max_num_inflight_all_gathers = 2)
    INFLIGHT = 2

    @property
    def reduces_every_microbatch(self) -> bool:
        """It reduce-scatters in every backward, without ``no_sync``."""
        return True

    def __init__(self, gradients: Any):
        super().__init__(gradients)
        # writer -> the ends of the units freed so far, in order (the free events)
        self.freed: dict[int, list[Any]] = {}

    def before_layer(self, layer: int, microbatch: int, phase: str) -> None:
        backward = phase != "fwd"
        if backward and not self.recipe.reshard_after_forward:
            return
        writer = id(self.out.w)
        stage_layers = self.recipe.layers_of(self.out.stage)
        if self.recipe.reshard_after_forward and self.out.w.ops:
            # the unit run last was freed as it ended (after its forward, or its
            # backward): its free event joins the limiter's queue
            self.freed.setdefault(writer, []).append(self.out.last)
        waits = self.prefetched.pop((writer, microbatch, layer, backward), None)
        if waits is None:
            waits = self.gather_layer(layer, microbatch, phase, self._limited(writer))
        self.use(layer, microbatch, phase, waits)
        following = layer - 1 if backward else layer + 1
        if backward and following in stage_layers:  # BACKWARD_PRE; no forward_prefetch
            key = (writer, microbatch, following, backward)
            self.prefetched[key] = self.gather_layer(
                following, microbatch, phase, self._limited(writer, ahead=1)
            )

    def _limited(self, writer: int, ahead: int = 0) -> tuple:
        """An all-gather issued now waits for the free of the unit ``INFLIGHT`` units
        back (``ahead``: issued for the unit after the one starting)."""
        freed = self.freed.get(writer, [])
        back = self.INFLIGHT - 1 - ahead
        index = len(freed) - 1 - back
        return (freed[index],) if 0 <= index < len(freed) else ()


class ZeroStage3Sharding(BlockSharding):
    """DeepSpeed ZeRO-3: module-by-module gathers with the coordinator's prefetch, and
    bucketed reduce-scatters (module docstring)."""

    @property
    def reduces_every_microbatch(self) -> bool:
        """It reduce-scatters in every backward, without ``no_sync``."""
        return True

    def __init__(self, gradients: Any):
        super().__init__(gradients)
        # (writer, micro-batch, backward?) -> the pass's coordinator state
        self.passes: dict[tuple[int, int, bool], _Coordinator] = {}
        self.bucket_elements: dict[str, float] = {}
        self.bucket_index: dict[str, int] = {}

    def _layer_units(self, config: Any, layer: int) -> list[Unit]:
        return submodule_units(self.recipe, config.model, config.moe, layer)

    def before_layer(self, layer: int, microbatch: int, phase: str) -> None:
        backward = phase != "fwd"
        key = (id(self.out.w), microbatch, backward)
        stage_layers = self.recipe.layers_of(self.out.stage)
        order = list(reversed(stage_layers)) if backward else list(stage_layers)
        coordinator = self.passes.get(key)
        if coordinator is None or layer == order[0]:
            trace = [
                (at, unit)
                for at in order
                for unit in (reversed(self.units(at)) if backward else self.units(at))
                if not unit.persistent and self.group(unit) is not None
            ]
            coordinator = self.passes[key] = _Coordinator(trace)
        waits = coordinator.fetch_layer(layer, lambda units: self._call(units, microbatch, phase))
        self.use(layer, microbatch, phase, waits)

    def _call(self, units: list[tuple[int, Unit]], microbatch: int, phase: str) -> list[int]:
        """One coalesced all-gather per group of ``units`` (layer, module)."""
        ops = []
        for expert in (False, True):
            chosen = [(layer, unit) for layer, unit in units if unit.expert == expert]
            if not chosen:
                continue
            layer, first = chosen[0]
            size = sum(self.gather_bytes(unit) for _, unit in chosen)
            label = f"{first.name}+{len(chosen) - 1}.zero3_all_gather.{phase}.mb{microbatch}"
            ops.append(
                self.out.w.collective(
                    ALL_GATHER,
                    self.group(first),
                    size,
                    "dp",
                    label,
                    self._after_host(),
                    self._tags(layer, microbatch, phase),
                )
            )
        return ops

    def after_layer_backward(self, layer: int, microbatch: int, final: bool) -> None:
        """Gradients go to the buckets op by op (:meth:`grad_ready`); the end of a
        micro-batch's backward before the last flushes what they hold
        (``independent_gradient_partition_epilogue``; the last backward's go at
        :meth:`end_step`)."""
        if not final and layer == self.recipe.layers_of(self.out.stage)[0]:
            for group in list(self.bucket_elements):
                self._flush(group, self.out.last, microbatch)

    def grad_ready(self, params: int, producer: Any, microbatch: int, expert: bool) -> None:
        """Add the gradient to its group's bucket; reduce-scatter the bucket once it holds
        ``reduce_bucket_size`` elements."""
        group = self.gradients.edp_group if expert else self.gradients.shard_group
        if group is None or params == 0:
            return
        self.bucket_elements[group] = self.bucket_elements.get(group, 0.0) + params
        if self.bucket_elements[group] >= DEEPSPEED_REDUCE_BUCKET:
            self._flush(group, producer, microbatch)

    def _flush(self, group: str, producer: Any, microbatch: int) -> None:
        elements = self.bucket_elements.get(group, 0.0)
        if elements <= 0:
            return
        index = self.bucket_index.get(group, 0)
        self.waited_by_optimizer(
            self.out.w.collective(
                REDUCE_SCATTER,
                group,
                elements * self.recipe.grad_bytes,
                "dp",
                f"{self.gradients.layout.axis_of_group(group)}.zero3_bucket{index}",
                (producer,),
                self.out.w.tags(
                    stage=self.out.stage, axis="dp", phase="bwd", microbatch=microbatch
                ),
            )
        )
        self.bucket_index[group] = index + 1
        self.bucket_elements[group] = 0.0

    def end_step(self, microbatch: int) -> None:
        for group in list(self.bucket_elements):
            self._flush(group, self.out.last, microbatch)


class _Coordinator:
    """One pass (a forward or a backward of one micro-batch) of DeepSpeed's
    PartitionedParameterCoordinator over a stage's modules in trace order."""

    def __init__(self, trace: list[tuple[int, Unit]]):
        self.trace = trace
        self.frontier = 0  # the next trace entry the prefetch may take
        self.calls: dict[int, list[int]] = {}  # trace index -> the gather ops holding it
        self.live = 0  # elements gathered or in flight
        self.released = 0  # trace entries released so far

    def fetch_layer(self, layer: int, call) -> list[int]:
        """Fetch ``layer``'s modules as the coordinator fetches each (a module not yet in
        flight alone, then a prefetch); the gather ops the layer waits for."""
        waits: list[int] = []
        # the modules of layers already run are released (fetch_sub_module runs after)
        while self.released < len(self.trace) and self.trace[self.released][0] != layer:
            if self.released in self.calls:
                self.live -= self.trace[self.released][1].params
            self.released += 1
        index = self.released
        while index < len(self.trace) and self.trace[index][0] == layer:
            if index not in self.calls:
                self._issue([index], call)
            self.frontier = max(self.frontier, index + 1)
            self._prefetch(call)
            for op in self.calls[index]:
                if op not in waits:
                    waits.append(op)
            index += 1
        return waits

    def _issue(self, indices: list[int], call) -> None:
        ops = call([self.trace[i] for i in indices])
        for i in indices:
            self.calls[i] = ops
            self.live += self.trace[i][1].params

    def _prefetch(self, call) -> None:
        limit = min(DEEPSPEED_MAX_LIVE_PARAMETERS - self.live, DEEPSPEED_PREFETCH_BUCKET)
        taken: list[int] = []
        elements = 0
        while self.frontier < len(self.trace) and elements < limit:
            if self.frontier not in self.calls:
                taken.append(self.frontier)
                elements += self.trace[self.frontier][1].params
            self.frontier += 1
        if taken:
            self._issue(taken, call)


def sharding_for(gradients: Any) -> BlockSharding:
    """The full-sharding lowering of ``gradients``' recipe's framework."""
    kinds = {
        "megatron": BlockSharding,
        "torchtitan": Fsdp2Sharding,
        "fsdp1": Fsdp1Sharding,
        "deepspeed": ZeroStage3Sharding,
    }
    return kinds[gradients.recipe.framework](gradients)
