"""Programs lowered on one placement of a grid, moved onto another.

A search tries each ``tp × pp × dp`` grid with every distinct placement (which axis is
innermost), the rest of the recipe alike. The lowering passes write the same ops for
every placement: placement only decides which GPUs a rank's groups and pipeline
neighbours are, never what a rank computes or in which order it communicates. So the
representative programs of one stage per pipeline rank (:func:`~simulator.schedule.
step.build_step`'s templates) are lowered for the first placement a search meets, and
each other placement gets them *relocated*: the same compute ops (shared), every
collective on the rank's own group of the same axis, every send and receive to its own
neighbour in the same stage, every block body relocated once. The programs are the same
as lowering them anew would give (a test compares them op by op for every placement);
relocating costs one object per communication op instead of the whole lowering.

Only a search's numbers-only schedules (``share_bodies``) keep what they lowered here,
and only the last few grids' (:data:`KEPT`): a run of one scenario has nothing to share.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import fields

from simulator.request.layout import Layout
from simulator.schedule.context import StepConfig
from simulator.schedule.ir import Block, Compute, Op, retargeter

__all__ = ["KEPT", "forget", "keep_templates", "known_templates", "known_templates_count"]

#: Grids whose lowering is kept (a search meets a grid's placements one after another).
KEPT = 4

# placement-free key -> (the layout lowered on, templates, body templates, where each
# kept sequence of ops holds ops to relocate)
_LOWERED: dict[tuple, tuple[Layout, dict[int, tuple[int, list[Op]]], dict, dict]] = {}


def _key(config: StepConfig, plan: Hashable) -> tuple:
    """Everything the lowering reads but the placement: the recipe's other fields, the
    grid's sizes, the model, the routing seed, the node size and the builder's plan."""
    recipe, layout = config.recipe, config.layout
    return (
        tuple(getattr(recipe, f.name) for f in fields(recipe) if f.name != "layout" and f.init),
        (layout.tp, layout.pp, layout.dp, layout.ep, layout.dp_shard, layout.cp),
        config.model.model_dump_json(),
        config.seed,
        config.gpus_per_node,
        plan,
    )


def keep_templates(
    config: StepConfig, plan: Hashable, templates: dict[int, tuple[int, list[Op]]]
) -> None:
    """Keep ``templates`` (pipeline rank -> (rank, ops)), lowered on ``config``'s layout,
    and ``config``'s body templates, for the grid's other placements."""
    if len(_LOWERED) >= KEPT:
        _LOWERED.pop(next(iter(_LOWERED)))  # the oldest grid
    _LOWERED[_key(config, plan)] = (config.layout, templates, dict(config.body_templates), {})


def _placed(ops: Sequence[Op], known: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """Where ``ops`` holds an op that names a group, a peer or a body: every op but
    compute (memoised by the sequence, which the kept lowering keeps alive)."""
    found = known.get(id(ops))
    if found is None:
        found = known[id(ops)] = tuple(i for i, op in enumerate(ops) if type(op) is not Compute)
    return found


def known_templates(config: StepConfig, plan: Hashable) -> dict[int, tuple[int, list[Op]]] | None:
    """The templates of ``config``'s grid relocated onto its layout, with its body
    templates filled in to match; None when this grid was not lowered here. Compute ops,
    and block bodies of compute alone, are shared with the kept lowering."""
    known = _LOWERED.get(_key(config, plan))
    if known is None:
        return None
    source, templates, body_templates, placed = known
    target = config.layout
    bodies: dict[int, tuple] = {}

    def body_of(body: tuple, move: Callable[[Op], Op]) -> tuple:
        new = bodies.get(id(body))
        if new is None:
            positions = _placed(body, placed)
            ops = list(body)
            for i in positions:
                ops[i] = move(body[i])
            # a body whose groups keep their names on this placement stays as it was
            new = body if all(ops[i] is body[i] for i in positions) else tuple(ops)
            bodies[id(body)] = new
        return new

    def relocated(op: Op, move: Callable[[Op], Op]) -> Op:
        if type(op) is not Block:
            return move(op)
        body = body_of(op.body, move)
        if body is op.body:
            return op
        return Block(
            op.id,
            op.stream,
            body,
            op.flops,
            op.bytes,
            op.label,
            op.deps,
            op.tags,
            op.body_microbatch,
            op.points,
        )

    out: dict[int, tuple[int, list[Op]]] = {}
    for pipeline_rank, (rank, ops) in templates.items():
        # a representative rank: pipeline coordinate only (tp, dp, cp all 0)
        new_rank = target.rank_of(pp=source.coords(rank)["pp"])
        move = retargeter(new_rank, target, source)
        new_ops = list(ops)
        for i in _placed(ops, placed):
            new_ops[i] = relocated(ops[i], move)
        out[pipeline_rank] = (new_rank, new_ops)
    for body, base in body_templates.values():
        new_body, new_base = bodies.get(id(body)), bodies.get(id(base))
        if new_body is not None and new_base is not None:  # a timing hint: kept where whole
            config.body_templates[id(new_body)] = (new_body, new_base)
    return out


def known_templates_count() -> int:
    """How many grids' lowering is kept."""
    return len(_LOWERED)


def forget() -> None:
    """Drop every kept lowering."""
    _LOWERED.clear()
