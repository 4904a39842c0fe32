"""Build one training step in the Schedule IR: the lowering passes, in order.

1. **Pipeline orders** (:mod:`simulator.schedule.pipeline`, or the recipe's custom
   order): each pipeline rank's compute actions.
2. **Sends and receives** (:mod:`simulator.schedule.actions`): the actions with the
   communication between stages, in torch.distributed.pipelining's notation.
3. **Layer ops with TP/SP collectives** (:mod:`simulator.schedule.layers`), with
4. **MoE layers** (:mod:`simulator.schedule.experts`) and
5. **data-parallel gradients and the optimizer** (:mod:`simulator.schedule.gradients`).
6. **Folding and blocks** (here): ranks of one pipeline stage run the same program up
   to their process groups and neighbours, so each stage is lowered once and the other
   ranks share its compute ops; folded, only those representatives are simulated; in
   blocks, every pipeline action that hands no gradient to data parallelism becomes one
   :class:`~simulator.schedule.ir.Block`, and for a search's numbers the others become
   one block per layer, data parallelism waiting for points inside them.

:func:`build_step` runs them all; each pass can also be called on its own, and the
action lists print as torch's CSV cells do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from simulator.arithmetic.moe import loads_equal
from simulator.arithmetic.moe import stack_of as moe_stack_of
from simulator.arithmetic.stacks import stack_of
from simulator.request.layout import Layout
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec
from simulator.request.orders import Step, compute_actions
from simulator.request.recipe import Recipe
from simulator.schedule import relocate
from simulator.schedule.context import StepConfig
from simulator.schedule.ir import Block, Collective, Program, Schedule, retargeter
from simulator.schedule.layers import RankLowering

__all__ = ["build_step", "LoweringPlan", "STREAMS"]

STREAMS = ("compute", "tp", "dp", "pp_recv_fwd", "pp_send_fwd", "pp_recv_bwd", "pp_send_bwd")


@dataclass(frozen=True)
class LoweringPlan:
    """How :func:`build_step` writes a step, besides what the step is.

    ``fold``: only one representative rank per pipeline stage gets a program; the
    others are symmetric to it, and the schedule records which ranks and groups each
    representative stands for. ``blocks`` (analytic fidelity): each pipeline action
    that does not hand gradients to data parallelism is written as one
    :class:`~simulator.schedule.ir.Block`. ``images`` (analytic fidelity): an unfolded
    schedule records the same, for every rank and group the symmetric ones of its
    stage that run at the same moment, which analytic fidelity prices together.
    ``share_bodies`` (with ``blocks``): a block body is lowered once for every stage of
    its shape and each stage runs it on its own groups: the same times, but the stages'
    bodies keep the first one's layer and stage numbers in their labels and tags, so
    such a schedule is for numbers, not traces; and a grid lowered on one placement is
    relocated onto the others (:mod:`simulator.schedule.relocate`). ``layer_blocks``
    (with ``share_bodies``): the actions that hand gradients to data parallelism are
    written in blocks of layers, their data parallelism waiting for points inside them
    (``RankLowering._layer_block``). ``alike_copies`` (for the simulators, which read an
    all-to-all's whole matrix): every rank simulated, the ranks of an EP group that
    receive alike run copies of one program lowered for the group, whose calls keep the
    lowered rank's splits; the hardware, which sends each rank's own splits, lowers
    every rank. The default plan writes every op of every rank.
    """

    fold: bool = False
    blocks: bool = False
    images: bool = False
    share_bodies: bool = False
    layer_blocks: bool = False
    alike_copies: bool = False


def build_step(
    recipe: Recipe,
    model: ModelSpec,
    *,
    moe: MoESpec | None = None,
    seed: int = 0,
    gpus_per_node: int | None = None,
    plan: LoweringPlan = LoweringPlan(),
) -> Schedule:
    """The Schedule of one training step of ``model`` run as ``recipe``, for every rank
    of its layout (``moe``: the model's experts, routed from ``seed``), written as
    ``plan`` says.

    Ranks of one pipeline stage run the same program up to their process groups and
    neighbours, so each stage is built once, for its rank with TP and DP coordinate 0,
    and the other ranks of the stage share its compute ops.
    """
    config = StepConfig(recipe, model, moe, seed, gpus_per_node)
    fold, blocks, images = plan.fold, plan.blocks, plan.images
    if plan.share_bodies and blocks:
        config.shared_bodies = {}
        config.layer_blocks = plan.layer_blocks
    layout = config.layout
    orders = config.pipeline_orders()
    tokens = config.micro_batch * config.local.seq_len
    alike = loads_equal(config.moe, tokens)  # used where the step has experts
    if config.moe is not None and fold and layout.cp == 1:
        # each EP group routes its own tokens and its ranks receive unequal shares: one
        # rank per pipeline stage and EP group stands for the group (and its TP peers),
        # running the busiest member's experts in each layer and micro-batch; where the
        # ranks receive alike, every layer and micro-batch routes the same (uniform
        # routing draws nothing), so a stage's actions of one kind run the same ops and
        # are written as blocks, as a dense model's
        # where they receive alike, every EP group routes alike too: one rank per stage
        # stands for them all, the other groups' calls its images
        blocked = blocks and alike
        groups = 1 if alike else layout.dp // layout.ep
        programs = {}
        for pipeline_rank in range(layout.pp):
            for group in range(groups):
                rank = layout.rank_of(pp=pipeline_rank, dp=group * layout.ep)
                lowering = RankLowering(rank, config, envelope=True)
                programs[rank] = lowering.build(orders[pipeline_rank], blocked)
        # alike, one routing stands for every layer, micro-batch and EP group's
        routings = None
        if alike:
            routings = _routed_layers(config, programs, orders) * (layout.dp // layout.ep)
        schedule = _schedule(config, programs, orders, routings)
        _record_images(schedule, layout, by_ep_group=not alike)
        return schedule
    if plan.alike_copies and config.moe is not None and layout.cp == 1 and alike:
        # every rank simulated, but the ranks of an EP group receive alike: each runs the
        # same ops, its all-to-alls carrying the group's whole matrix (which the engines
        # read, not a call's own splits), so one rank per stage and EP group is lowered
        # and the others run its program retargeted
        by_group: dict[tuple[int, int], tuple[int, list]] = {}
        programs = {}
        for rank in range(layout.world):
            coords = layout.coords(rank)
            key = (coords["pp"], coords["dp"] // layout.ep)
            template = by_group.get(key)
            if template is None:
                first = layout.rank_of(pp=key[0], dp=key[1] * layout.ep)
                program = RankLowering(first, config, envelope=True).build(orders[key[0]])
                template = by_group[key] = (first, program.ops)
            first, ops = template
            moved = ops if rank == first else list(map(retargeter(rank, layout), ops))
            programs[rank] = Program(rank, moved)
        schedule = _schedule(config, programs, orders)
        if images:
            _record_images(schedule, layout)
        return schedule
    if config.moe is not None or layout.cp > 1:
        # each data-parallel replica routes its own tokens, so MoE ranks differ, and a
        # context-parallel ring sends to its own stage's ranks: every rank is built
        # (and simulated), none shares
        programs = {
            rank: RankLowering(rank, config).build(orders[layout.coords(rank)["pp"]])
            for rank in range(layout.world)
        }
        schedule = _schedule(config, programs, orders)
        if images:
            _record_images(schedule, layout)
        return schedule
    # a search's grid lowered on another placement: relocated, not lowered again
    kept = config.shared_bodies is not None
    # the plan as lowered (layer blocks only where bodies are shared): the kept key
    lowered = replace(plan, share_bodies=kept, layer_blocks=config.layer_blocks)
    templates = relocate.known_templates(config, lowered) if kept else None
    if templates is None:
        templates = {}
        for pipeline_rank in range(layout.pp):
            rank = layout.rank_of(pp=pipeline_rank)
            ops = RankLowering(rank, config).build(orders[pipeline_rank], blocks).ops
            templates[pipeline_rank] = (rank, ops)
        if kept:
            relocate.keep_templates(config, lowered, templates)
    programs = {}
    ranks = sorted(rank for rank, _ in templates.values()) if fold else range(layout.world)
    for rank in ranks:
        template_rank, ops = templates[layout.coords(rank)["pp"]]
        if rank == template_rank:
            programs[rank] = Program(rank, ops)
        else:
            programs[rank] = Program(rank, list(map(retargeter(rank, layout), ops)))
    schedule = _schedule(config, programs, orders)
    if fold or images:
        _record_images(schedule, layout)
    return schedule


def _record_images(schedule: Schedule, layout: Layout, by_ep_group: bool = False) -> None:
    """The ranks and groups each simulated rank and group stands for (folded), or runs
    beside by symmetry (unfolded): every rank of its pipeline stage with its own
    context-parallel coordinate (``by_ep_group``: and its own EP group's data-parallel
    coordinates), ordered by (dp, tp) coordinate so that image ``i`` of a rank and image
    ``i`` of its pipeline neighbour are neighbours too."""
    folded = len(schedule.programs) < layout.world
    for rank in schedule.programs:
        images = layout.stage_ranks(rank)
        if by_ep_group:
            block = layout.coords(rank)["dp"] // layout.ep
            images = tuple(r for r in images if layout.coords(r)["dp"] // layout.ep == block)
        schedule.rank_images[rank] = images
    simulated = set(schedule.programs)
    for name, members in schedule.groups.items():
        if folded and set(members) <= simulated:
            continue
        axis = layout.axis_of_group(name)
        representative = next(m for m in members if m in simulated)
        # the groups of the images in order of first appearance: an image in a group
        # already found adds nothing, and is passed over without naming its group
        images = schedule.rank_images[representative]
        if axis in layout.axes:  # a grid axis: its groups are arithmetic on the ranks
            numbers = layout.axis_group_numbers(axis, np.asarray(images))
            _, first = np.unique(numbers, return_index=True)
            rows = layout.axis_groups(axis, numbers[np.sort(first)])
            schedule.images[name] = tuple(map(tuple, rows.tolist()))
            continue
        found: list[tuple[int, ...]] = []
        covered: set[int] = set()
        for image in images:
            if image not in covered:
                group = layout.members(layout.group_name(axis, image))
                found.append(tuple(group))
                covered.update(group)
        schedule.images[name] = tuple(found)


def _routed_layers(
    config: StepConfig, programs: dict[int, Program], orders: Mapping[int, Sequence[Step]]
) -> int:
    """How many (MoE layer, micro-batch, EP group) routings the simulated ranks run."""
    layout = config.layout
    keys: set[tuple[int, int, int]] = set()
    for rank in programs:
        coords = layout.coords(rank)
        group = coords["dp"] // layout.ep
        for stage in {action.stage for action in compute_actions(orders[coords["pp"]])}:
            for layer in config.layers_of(stage):
                if config.is_moe_layer(layer):
                    keys.update((layer, mb, group) for mb in range(config.microbatches))
    return len(keys)


def _moe_meta(config: StepConfig, routings: int | None = None) -> dict[str, Any] | None:
    """Token routing over every MoE layer and micro-batch the step ran (``routings``:
    how many there were, where they route alike and only the first was worked out)."""
    if config.moe is None or not config._traffic:
        return None
    traffic = list(config._traffic.values())
    if routings is not None:
        traffic = traffic[:1] * routings
    routed = sum(int(t.tokens_routed.sum()) for t in traffic)
    dropped = sum(int(t.tokens_dropped.sum()) for t in traffic)
    imbalance = [t.imbalance for t in traffic]
    return {
        "experts": config.moe.experts,
        "top_k": config.moe.top_k,
        "ep": config.layout.ep,
        "routing": config.moe.routing.kind,
        "token_assignments": routed,
        "dropped_fraction": dropped / routed if routed else 0.0,
        "imbalance_mean": sum(imbalance) / len(imbalance),
        "imbalance_max": max(imbalance),
    }


def _schedule(
    config: StepConfig,
    programs: dict[int, Program],
    orders: Mapping[int, Sequence[Step]],
    routings: int | None = None,
) -> Schedule:
    layout = config.layout
    used: set[str] = set()
    bodies: dict[int, tuple] = {}
    for program in programs.values():
        for op in program.ops:
            if type(op) is Collective:
                used.add(op.group)
            elif type(op) is Block:
                bodies[id(op.body)] = op.body
    for body in bodies.values():
        used.update(inner.group for inner in body if type(inner) is Collective)
    groups = {name: layout.members(name) for name in sorted(used, key=layout.group_order)}
    meta = {
        "moe": _moe_meta(config, routings),
        "virtual_stages": config.recipe.virtual_stages,
        "sequence_parallel": config.sp,
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "placement": list(layout.placement),
        },
        "schedule": config.recipe.schedule,
        "microbatches": config.microbatches,
        # the host's time to issue one kernel (the software stack's)
        "host_dispatch_s": stack_of(config.recipe.framework, config.recipe.compile).dispatch_s,
        # the fused attention kernel asked for, and the stack that picks it under auto
        "attention_backend": config.recipe.attention_backend,
        "framework": config.recipe.framework,
        # how the stack issues a grouped GEMM's experts (simulator.arithmetic.moe)
        "expert_streams": moe_stack_of(config.recipe.framework).expert_streams,
        "pipeline_orders": {str(s): [str(a) for a in actions] for s, actions in orders.items()},
    }
    return Schedule(
        programs=programs, groups=groups, meta=meta, body_templates=config.body_templates
    )
