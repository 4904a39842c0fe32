"""Write one training step of a GPT model into the Schedule IR.

For every rank the builder walks its pipeline stage's action list (GPipe or 1F1B,
see :mod:`simulator.schedule.pipeline`) and emits, per action:

* **forward** ``sFm``: receive the activation from stage ``s−1`` (``pp_recv_fwd``),
  run the embedding (first stage), each layer's ops, the final norm, logits and loss
  (last stage), and send the activation to stage ``s+1`` (``pp_send_fwd``). Each
  layer's two tensor-parallel all-reduces (after the attention projection and after
  the second MLP GEMM, Megatron-LM's ``g`` operator) run on the ``tp`` stream, and the
  next op waits for them: they sit on the critical path.
* **backward** ``sBm``: receive the output gradient (``pp_recv_bwd``), recompute the
  forward when ``recompute`` says so, run the layers' backward in reverse, send the
  input gradient back (``pp_send_bwd``). The two TP all-reduces of the backward (the
  input gradients of the QKV and first MLP GEMMs, Megatron's ``f`` operator) overlap
  the weight-gradient GEMM that follows, as Megatron-LM's asynchronous TP all-reduce
  does; the op after the weight gradient waits for both.
* **data-parallel gradient all-reduce**: during the stage's last backward, each
  weight gradient joins a bucket in the order backward produces them; a bucket is
  all-reduced on the ``dp`` stream as soon as it holds at least its cap (1 MiB for the
  first bucket, then 25 MiB: PyTorch DDP's defaults), so it overlaps the rest of the
  backward. The optimizer step waits for the last bucket.

Sends and receives use one stream per direction and neighbour, so each stream pairs
with exactly one stream of the neighbour, in the same order, and matching can never
deadlock. Receives are posted eagerly (like pre-posted ``irecv``); the compute that
needs the data waits for them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..layout import Layout
from ..model import (
    ACT_BYTES,
    ModelSpec,
    OpCost,
    backward_of,
    layer_forward_ops,
    logits_forward_op,
)
from .ir import Collective, Compute, Op, Program, Recv, Schedule, Send
from .pipeline import Action, pipeline_order

__all__ = ["StepConfig", "build_step", "stage_parameter_count", "STREAMS"]

STREAMS = ("compute", "tp", "dp", "pp_recv_fwd", "pp_send_fwd", "pp_recv_bwd", "pp_send_bwd")

# Adam with mixed precision reads the fp32 master weight, momentum and variance (12 B)
# and the gradient (2 B), and writes the three fp32 states (12 B) and the bf16 weight
# (2 B): 28 bytes of HBM traffic and about a dozen FLOPs per parameter.
ADAM_BYTES_PER_PARAM = 28
ADAM_FLOPS_PER_PARAM = 12


class StepConfig:
    """What the builder needs: model, layout, and the training recipe."""

    def __init__(
        self,
        model: ModelSpec,
        layout: Layout,
        micro_batch: int,
        microbatches: int,
        schedule: str = "1f1b",
        recompute: str = "none",
        grad_bucket_bytes: float = 25 * 1024 * 1024,
        first_grad_bucket_bytes: float = 1024 * 1024,
    ):
        self.model = model
        self.layout = layout
        self.micro_batch = micro_batch
        self.microbatches = microbatches
        self.schedule = schedule
        self.recompute = recompute
        self.grad_bucket_bytes = grad_bucket_bytes
        self.first_grad_bucket_bytes = first_grad_bucket_bytes


def _embedding_op(model: ModelSpec, micro_batch: int, tp: int) -> OpCost:
    """Token + position embedding lookup; its gradient covers the (vocab-split) token
    table and the position table."""
    elements = micro_batch * model.seq_len * model.hidden
    params = model.vocab // tp * model.hidden + model.seq_len * model.hidden
    return OpCost("embedding", "elementwise", elements, ACT_BYTES * elements * 2, 0.0, None, params)


def _final_norm_op(model: ModelSpec, micro_batch: int) -> OpCost:
    elements = micro_batch * model.seq_len * model.hidden
    return OpCost(
        "final_ln",
        "elementwise",
        8 * elements,
        ACT_BYTES * elements * 2,
        0.0,
        None,
        2 * model.hidden,
    )


def _loss_op(model: ModelSpec, micro_batch: int, tp: int) -> OpCost:
    """Vocabulary-parallel softmax cross-entropy over the local logits (fp32)."""
    elements = micro_batch * model.seq_len * model.vocab / tp
    return OpCost("loss", "elementwise", 5 * elements, 4 * elements * 2, 0.0)


def stage_parameter_count(model: ModelSpec, layout: Layout, stage: int) -> int:
    """Parameters held by one rank of ``stage`` (its TP shard of the stage's layers,
    plus the embedding on the first stage and the norm and logits on the last)."""
    tp, pp = layout.tp, layout.pp
    per_layer = sum(op.weight_params for op in layer_forward_ops(model, 1, tp))
    count = per_layer * model.layers // pp
    if stage == 0:
        count += _embedding_op(model, 1, tp).weight_params
    if stage == pp - 1:
        count += _final_norm_op(model, 1).weight_params
        if pp > 1:  # untied copy of the word embeddings on the last stage (Megatron-LM)
            count += logits_forward_op(model, 1, tp).weight_params
    return count


class _ProgramWriter:
    """Appends ops to one rank's program and keeps the bucketing state."""

    def __init__(self, rank: int, config: StepConfig):
        self.rank = rank
        self.config = config
        self.ops: list[Op] = []
        self._tags: dict[tuple, dict[str, Any]] = {}
        self.bucket_bytes = 0.0
        self.bucket_index = 0
        self.last_bucket: int | None = None

    def tags(self, **values: Any) -> dict[str, Any]:
        key = tuple(sorted(values.items()))
        cached = self._tags.get(key)
        if cached is None:
            cached = self._tags[key] = {k: v for k, v in key if v is not None}
        return cached

    def compute(self, cost: OpCost, label: str, deps: tuple[int, ...], **tags: Any) -> int:
        op_id = len(self.ops)
        self.ops.append(
            Compute(
                op_id,
                "compute",
                cost.flops,
                cost.bytes,
                cost.kind,
                label,
                deps,
                self.tags(**tags),
                cost.shape,
            )
        )
        return op_id

    def collective(
        self,
        kind: str,
        group: str,
        size: float,
        stream: str,
        label: str,
        deps: tuple[int, ...],
        **tags: Any,
    ) -> int:
        op_id = len(self.ops)
        self.ops.append(
            Collective(op_id, stream, kind, group, size, label, deps, self.tags(**tags))
        )
        return op_id

    def p2p(
        self,
        op_type: type,
        stream: str,
        peer: int,
        size: float,
        tag: int,
        label: str,
        deps: tuple[int, ...],
        **tags: Any,
    ) -> int:
        op_id = len(self.ops)
        self.ops.append(op_type(op_id, stream, peer, size, tag, label, deps, self.tags(**tags)))
        return op_id


class _RankBuilder:
    """Builds the program of one rank."""

    def __init__(self, rank: int, config: StepConfig):
        self.config = config
        self.layout = layout = config.layout
        self.rank = rank
        self.w = _ProgramWriter(rank, config)
        coords = layout.coords(rank)
        self.stage = coords["pp"]
        self.pp = layout.pp
        self.tp = layout.tp
        model = config.model
        self.model = model
        b = config.micro_batch
        self.layers = range(
            self.stage * model.layers // self.pp, (self.stage + 1) * model.layers // self.pp
        )
        self.fwd_ops = layer_forward_ops(model, b, self.tp)
        self.bwd_ops = [(op, backward_of(op)) for op in reversed(self.fwd_ops)]
        self.boundary_bytes = ACT_BYTES * b * model.seq_len * model.hidden
        self.tp_group = layout.group_name("tp", rank) if self.tp > 1 else None
        self.dp_group = layout.group_name("dp", rank) if layout.dp > 1 else None
        self.prev = layout.stage_rank(rank, self.stage - 1) if self.stage > 0 else None
        self.next = layout.stage_rank(rank, self.stage + 1) if self.stage < self.pp - 1 else None
        self.embedding = _embedding_op(model, b, self.tp)
        self.final_norm = _final_norm_op(model, b)
        self.logits = logits_forward_op(model, b, self.tp)
        self.loss = _loss_op(model, b, self.tp)
        self.last = 0  # the latest compute op
        self.waits: list[int] = []  # ops on other streams the next compute op must wait for

    # -- helpers ----------------------------------------------------------------------
    def _run(self, cost: OpCost, label: str, **tags: Any) -> int:
        deps, self.waits = tuple(self.waits), []
        self.last = self.w.compute(cost, label, deps, stage=self.stage, **tags)
        return self.last

    def _after_last(self) -> tuple[int, ...]:
        """Deps of an op that must follow everything the compute stream has done."""
        return (*([self.last] if self.w.ops else []), *self.waits)

    def _tp_all_reduce(self, label: str, **tags: Any) -> int | None:
        """All-reduce, over the TP group, of the activation-sized tensor the last compute
        op produced."""
        if self.tp_group is None:
            return None
        return self.w.collective(
            "all_reduce",
            self.tp_group,
            self.boundary_bytes,
            "tp",
            label,
            (self.last,),
            stage=self.stage,
            axis="tp",
            **tags,
        )

    def _grad_ready(self, params: int, producer: int, microbatch: int, final: bool) -> None:
        if not final or self.dp_group is None or params == 0:
            return
        w = self.w
        w.bucket_bytes += params * ACT_BYTES
        cap = (
            self.config.first_grad_bucket_bytes
            if w.bucket_index == 0
            else self.config.grad_bucket_bytes
        )
        if w.bucket_bytes >= cap:
            self._flush_bucket(producer, microbatch)

    def _flush_bucket(self, producer: int, microbatch: int) -> None:
        w = self.w
        if w.bucket_bytes <= 0 or self.dp_group is None:
            return
        w.last_bucket = w.collective(
            "all_reduce",
            self.dp_group,
            w.bucket_bytes,
            "dp",
            f"dp.bucket{w.bucket_index}",
            (producer,),
            stage=self.stage,
            axis="dp",
            phase="bwd",
            microbatch=microbatch,
        )
        w.bucket_index += 1
        w.bucket_bytes = 0.0

    # -- forward ----------------------------------------------------------------------
    def forward(self, mb: int) -> None:
        w, fwd = self.w, dict(phase="fwd", microbatch=mb)
        if self.prev is not None:
            self.waits.append(
                w.p2p(
                    Recv,
                    "pp_recv_fwd",
                    self.prev,
                    self.boundary_bytes,
                    2 * mb,
                    f"recv.act.mb{mb}",
                    (),
                    stage=self.stage,
                    axis="pp",
                    **fwd,
                )
            )
        else:
            self._run(self.embedding, f"embedding.fwd.mb{mb}", **fwd)
            self._wait_for(self._tp_all_reduce(f"embedding.ar.mb{mb}", **fwd))
        for layer in self.layers:
            self._layer_forward(layer, mb, "fwd")
        if self.next is not None:
            w.p2p(
                Send,
                "pp_send_fwd",
                self.next,
                self.boundary_bytes,
                2 * mb,
                f"send.act.mb{mb}",
                self._after_last(),
                stage=self.stage,
                axis="pp",
                **fwd,
            )
        else:
            self._run(self.final_norm, f"final_ln.fwd.mb{mb}", **fwd)
            self._run(self.logits, f"logits.fwd.mb{mb}", **fwd)
            self._run(self.loss, f"loss.fwd.mb{mb}", **fwd)

    def _wait_for(self, op: int | None) -> None:
        if op is not None:
            self.waits.append(op)

    def _layer_forward(self, layer: int, mb: int, phase: str) -> None:
        tags = dict(layer=layer, microbatch=mb, phase=phase)
        for cost in self.fwd_ops:
            self._run(cost, f"L{layer}.{cost.name}.{phase}.mb{mb}", **tags)
            if cost.name in ("proj", "fc2"):
                self._wait_for(
                    self._tp_all_reduce(f"L{layer}.{cost.name}.ar.{phase}.mb{mb}", **tags)
                )

    # -- backward ---------------------------------------------------------------------
    def backward(self, mb: int, final: bool) -> None:
        w, bwd = self.w, dict(phase="bwd", microbatch=mb)
        if self.next is not None:
            self.waits.append(
                w.p2p(
                    Recv,
                    "pp_recv_bwd",
                    self.next,
                    self.boundary_bytes,
                    2 * mb + 1,
                    f"recv.grad.mb{mb}",
                    (),
                    stage=self.stage,
                    axis="pp",
                    **bwd,
                )
            )
        else:
            # The logits and embedding weights are tied when one stage holds both.
            tied = self.pp == 1
            self._grads(backward_of(self.loss), "", mb, final, bwd)
            self._grads(backward_of(self.logits), "", mb, final, bwd, tied=tied)
            self._grads(backward_of(self.final_norm), "", mb, final, bwd)
        for layer in reversed(self.layers):
            self._layer_backward(layer, mb, final)
        if self.prev is not None:
            w.p2p(
                Send,
                "pp_send_bwd",
                self.prev,
                self.boundary_bytes,
                2 * mb + 1,
                f"send.grad.mb{mb}",
                self._after_last(),
                stage=self.stage,
                axis="pp",
                **bwd,
            )
        else:
            self._grads(backward_of(self.embedding), "", mb, final, bwd)

    def _grads(
        self,
        grads: list[OpCost],
        prefix: str,
        mb: int,
        final: bool,
        tags: dict[str, Any],
        tied: bool = False,
    ) -> None:
        """Run backward ops. After the input gradient (``dgrad``) of a column-parallel
        GEMM (logits, QKV, first MLP) its TP all-reduce starts and overlaps the weight
        gradient; the op after the weight gradient waits for it."""
        pending = None
        for grad in grads:
            op = self._run(grad, f"{prefix}{grad.name}.mb{mb}", **tags)
            self._grad_ready(0 if tied else grad.weight_params, op, mb, final)
            if grad.name in ("logits.dgrad", "qkv.dgrad", "fc1.dgrad"):
                pending = self._tp_all_reduce(f"{prefix}{grad.name[:-6]}.ar.bwd.mb{mb}", **tags)
        self._wait_for(pending)

    def _layer_backward(self, layer: int, mb: int, final: bool) -> None:
        recompute = self.config.recompute
        if recompute == "full":
            self._layer_forward(layer, mb, "recompute")
        tags = dict(layer=layer, microbatch=mb, phase="bwd")
        for cost, grads in self.bwd_ops:
            if recompute == "selective" and cost.kind == "attention":
                self._run(
                    cost,
                    f"L{layer}.{cost.name}.recompute.mb{mb}",
                    layer=layer,
                    microbatch=mb,
                    phase="recompute",
                )
            self._grads(grads, f"L{layer}.", mb, final, tags)

    # -- whole step -------------------------------------------------------------------
    def build(self, order: list[Action]) -> Program:
        last_backward = max(i for i, a in enumerate(order) if a.type == "B")
        for index, action in enumerate(order):
            if action.type == "F":
                self.forward(action.microbatch)
            elif action.type == "B":
                self.backward(action.microbatch, final=index == last_backward)
            else:
                raise ValueError(f"unsupported pipeline action {action}")
        self._flush_bucket(self.last, order[last_backward].microbatch)
        total = stage_parameter_count(self.model, self.layout, self.stage)
        optimizer = OpCost(
            "optimizer",
            "optimizer",
            ADAM_FLOPS_PER_PARAM * total,
            ADAM_BYTES_PER_PARAM * total,
            0.0,
        )
        self._wait_for(self.w.last_bucket)
        self._run(optimizer, "optimizer.step", phase="optimizer")
        return Program(self.rank, self.w.ops)


def _retarget(op: Op, rank: int, layout: Layout) -> Op:
    """``op`` of a stage's template rank, as ``rank`` of the same stage runs it: the same
    compute (shared, not copied), collectives on ``rank``'s groups, sends and receives
    to ``rank``'s neighbours."""
    if type(op) is Compute:
        return op
    if type(op) is Collective:
        return replace(op, group=layout.group_name(layout.axis_of_group(op.group), rank))
    peer_stage = layout.coords(op.peer)["pp"]
    return replace(op, peer=layout.stage_rank(rank, peer_stage))


def build_step(config: StepConfig, fold: bool = False) -> Schedule:
    """The Schedule of one training step for every rank of ``config.layout``.

    Ranks of one pipeline stage run the same program up to their process groups and
    neighbours, so each stage is built once, for its rank with TP and DP coordinate 0,
    and the other ranks of the stage share its compute ops. With ``fold`` only those
    representative ranks get a program: the others are symmetric to them.
    """
    layout = config.layout
    orders = pipeline_order(config.schedule, layout.pp, config.microbatches)
    templates: dict[int, tuple[int, list[Op]]] = {}
    for stage in range(layout.pp):
        rank = layout.rank_of(pp=stage)
        templates[stage] = (rank, _RankBuilder(rank, config).build(orders[stage]).ops)
    programs = {}
    ranks = sorted(rank for rank, _ in templates.values()) if fold else range(layout.world)
    for rank in ranks:
        template_rank, ops = templates[layout.coords(rank)["pp"]]
        if rank == template_rank:
            programs[rank] = Program(rank, ops)
        else:
            programs[rank] = Program(rank, [_retarget(op, rank, layout) for op in ops])
    used = {
        op.group for program in programs.values() for op in program.ops if type(op) is Collective
    }
    groups = {name: members for name, members in layout.groups.items() if name in used}
    meta = {
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "placement": list(layout.placement),
        },
        "schedule": config.schedule,
        "microbatches": config.microbatches,
        "pipeline_orders": {str(s): [str(a) for a in actions] for s, actions in orders.items()},
    }
    return Schedule(programs=programs, groups=groups, meta=meta)
