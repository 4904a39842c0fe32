"""Lowering pass: a rank's pipeline actions into layer ops with their TP/SP
collectives, the rank's program in the Schedule IR.

For every rank the pass walks its actions, with the sends and receives
:func:`~simulator.schedule.actions.with_communication` adds. An action names a *global*
stage ``s``: with ``v`` virtual stages rank ``r`` holds stages ``r, r+p, …``, with the
layers :meth:`Recipe.layers_of <simulator.request.recipe.Recipe.layers_of>` gives. Per
action it emits:

* **forward** ``sFm``: the embedding (stage 0), the stage's layers, the final norm,
  logits and loss (last stage). Tensor parallelism (Megatron-LM) puts two all-reduces
  in each layer's forward, after the attention projection and after the second MLP
  GEMM, on the ``tp`` stream; the next op waits for them. With sequence parallelism
  each becomes a reduce-scatter, and an all-gather precedes the QKV and first MLP
  GEMMs: the same bytes, while norms, dropout and residuals work on ``1/t`` of the
  sequence and stage boundaries carry ``1/t`` of the activation.
* **backward** ``sBm`` (or ``sIm`` then ``sWm`` when a zero-bubble schedule splits it):
  recompute the forward when ``recompute`` says so, run the layers' backward in reverse.
  ``I`` runs the input-gradient half (every ``dgrad`` and the communication); ``W``
  runs the weight gradients later. What the TP communication overlaps is the recipe's
  ``tp_comm_overlap``: with ``async`` the all-reduces (SP: reduce-scatters) of the input
  gradients of the QKV and first MLP GEMMs run beside the weight-gradient GEMM that
  follows (Megatron-LM's asynchronous TP communication), with ``none`` they are waited
  for at once, and with ``pipelined`` (Transformer Engine's userbuffers) the forward's
  SP all-gathers and reduce-scatters also run beside their GEMMs. With SP, each
  column-parallel GEMM's saved input shard is all-gathered again for its weight
  gradient. Compute that runs beside a collective by construction is marked
  ``beside_comm`` (the engine slows it for the SMs NCCL takes).
* **sends and receives** of activations and gradients between stages. They use one
  stream per direction, neighbour and chunk, so each stream pairs with exactly one
  stream of the neighbour in the same micro-batch order and matching cannot deadlock.
  Receives are posted eagerly (like pre-posted ``irecv``); the compute that needs the
  data waits for them. Tags are ``(stage·m + mb)·2 + direction``.

MoE layers are lowered by :mod:`simulator.schedule.experts`; every completed weight
gradient, the step's start and its end go to the gradient pass
(:mod:`simulator.schedule.gradients`). Every compute op records how many ops the host
issued before it in its action (``host_index``), so the engine can hold it until the
host has issued it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

from simulator.arithmetic.layer_ops import (
    ACT_BYTES,
    OpCost,
    attention_core_names,
    backward_of,
    embedding_op,
    final_norm_op,
    kv_heads_per_rank,
    layer_forward_ops,
    logits_forward_op,
    loss_op,
)
from simulator.arithmetic.stacks import restack, stack_of
from simulator.common.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ATTENTION,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    PHASE_OF_PART,
    RECV_B,
    RECV_F,
    REDUCE_SCATTER,
    SEND_B,
    SEND_F,
    CollectiveKind,
)
from simulator.request.orders import Action, Overlap, Step, compute_actions
from simulator.schedule.actions import with_communication
from simulator.schedule.bodies import ActionBody, LayerBody, SharedBody
from simulator.schedule.context import StepConfig
from simulator.schedule.context_parallel import ContextParallelLowering
from simulator.schedule.experts import ExpertLowering
from simulator.schedule.gradients import DataParallelGradients
from simulator.schedule.ir import Collective, Compute, Program, Recv, Send, retargeter
from simulator.schedule.writer import Writing

__all__ = ["RankLowering"]


class _GradientEvents:
    """Stands in for the gradient pass while a layer's body is lowered: it records the
    gradients the layer completes, which each block of the body hands on."""

    def __init__(self) -> None:
        self.ready: list[tuple[int, int, bool]] = []

    def grad_ready(
        self, params: int, producer: int, microbatch: int, final: bool, expert: bool = False
    ) -> None:
        self.ready.append((params, producer, expert))


class RankLowering(ExpertLowering, ContextParallelLowering):
    """Lowers one rank's pipeline actions into its program (see the module docstring)."""

    def __init__(self, rank: int, config: StepConfig, envelope: bool = False):
        self.config = config
        self.layout = layout = config.layout
        self.rank = rank
        # a folded MoE rank: it stands for its EP group's ranks, running the busiest's
        # experts in each layer and micro-batch (ExpertLowering._moe_ops)
        self.envelope = envelope
        self.out = Writing(rank)
        self.run = self.out.run
        self.wait_for = self.out.wait_for
        self.pipeline_rank = layout.coords(rank)["pp"]
        self.pp, self.tp, self.sp = layout.pp, layout.tp, config.recipe.sequence_parallel
        self.stages = config.stages
        model = config.local  # the rank's view: with CP, 1/cp of each sequence
        self.model = model
        b = config.micro_batch
        recipe = config.recipe
        cp, cp_kind = layout.cp, recipe.cp_kind
        stack = stack_of(recipe.framework, recipe.compile, recipe.cross_entropy)
        self.fwd_ops = layer_forward_ops(
            model, b, self.tp, self.sp, recipe.attention, cp, cp_kind, recipe.fp8, stack
        )
        self.core = attention_core_names(recipe.attention, cp, cp_kind)
        # backward TP collectives beside the GEMM that follows (async and pipelined); with
        # pipelined (Transformer Engine's userbuffers) the forward's too
        self.overlap_tp = config.recipe.tp_comm_overlap in ("async", "pipelined")
        self.pipelined = config.recipe.tp_comm_overlap == "pipelined" and self.sp
        self.bwd_ops = [(op, backward_of(op)) for op in reversed(self.fwd_ops)]
        self.activation_bytes = ACT_BYTES * b * model.seq_len * model.hidden
        # SP keeps the residual stream sharded, so stage boundaries carry 1/t of it
        self.boundary_bytes = self.activation_bytes / (self.tp if self.sp else 1)
        self.tp_group = layout.group_name("tp", rank) if self.tp > 1 else None
        # the ranks holding the same weights reduce their gradients: dp, with CP dp × cp
        replicas = layout.replicas > 1
        self.dp_group = layout.group_name(layout.gradient_axis, rank) if replicas else None
        shard = self.tp if self.sp else 1
        self.embedding = embedding_op(model, b, self.tp)
        self.final_norm, self.loss = restack(
            [final_norm_op(model, b, shard), loss_op(model, b, self.tp)], stack
        )
        self.logits = logits_forward_op(model, b, self.tp, shard)
        # (stage, micro-batch) -> weight gradients an I action leaves for its W action:
        # (gradient, label, parameters, expert?)
        self.deferred: dict[tuple[int, int], list[tuple[OpCost, str, int, bool]]] = {}
        self.neighbours: dict[int, int] = {}  # global stage -> rank holding it
        # (action kind, stage) -> its block's body; ("O", forward stage, backward stage):
        # an overlapped pair's
        self.bodies: dict[tuple[str, int] | tuple[str, int, int], ActionBody] = {}
        # (phase, deferred?, MoE?) -> a layer's backward in a stage's last backward, as a body
        # (:meth:`_layer_block`; None: written op by op)
        self.layer_bodies: dict[tuple[str, bool, bool, bool], LayerBody | None] = {}
        self._retarget = retargeter(rank, layout)  # another rank's ops, as this one runs them
        self.moe = config.moe
        self.ep = layout.ep
        self.ep_group = layout.group_name("ep", rank) if self.ep > 1 else None
        if self.moe is None or self.ep == 1:
            self.edp_group = self.dp_group  # experts replicated like the dense layers
        else:
            edp = layout.group_name("edp", rank)
            self.edp_group = edp if len(layout.members(edp)) > 1 else None
        dp_index = layout.coords(rank)["dp"]
        self.ep_index, self.ep_group_index = dp_index % self.ep, dp_index // self.ep
        self._kv_local = kv_heads_per_rank(model, self.tp)
        self._cp_setup()
        self.gradients = DataParallelGradients(
            config, self.out, self.pipeline_rank, self.dp_group, self.edp_group
        )

    # -- helpers ----------------------------------------------------------------------
    def _layers(self, stage: int) -> range:
        return self.config.layers_of(stage)

    def _neighbour(self, stage: int) -> int:
        """The rank (in this rank's pipeline) that holds global ``stage``."""
        rank = self.neighbours.get(stage)
        if rank is None:
            pipeline_rank = self.config.recipe.placement.rank_of(stage)
            rank = self.neighbours[stage] = self.layout.stage_rank(self.rank, pipeline_rank)
        return rank

    def _stream(self, name: str, stage: int) -> str:
        placement = self.config.recipe.placement
        return name if placement.chunks == 1 else f"{name}.c{placement.chunk_of(stage)}"

    def _tag(self, stage: int, mb: int, direction: int) -> int:
        return (stage * self.config.microbatches + mb) * 2 + direction

    def _tp_collective(self, kind: CollectiveKind, label: str, **tags: Any) -> int | None:
        """A TP (SP) collective of the full activation, after the last compute op."""
        if self.tp_group is None:
            return None
        get = tags.get
        tagset = self.out.w.tag_set(
            "sp" if self.sp else "tp", get("layer"), get("microbatch"), get("phase"), self.out.stage
        )
        return self.out.w.collective(
            kind, self.tp_group, self.activation_bytes, "tp", label, (self.out.last,), tagset
        )

    # -- pipeline actions -------------------------------------------------------------
    def receive(self, action: Action, phase: str) -> None:
        """``RECV_F`` (the input activation from the previous stage) or ``RECV_B`` (the
        output gradient from the next), posted eagerly; the action's compute waits."""
        stage, mb = action.stage, action.microbatch
        out = self.out
        w = out.w
        out.stage = stage
        w.action_open = True
        forward = action.type == RECV_F
        peer = stage - 1 if forward else stage + 1
        recv = w.p2p(
            Recv,
            self._stream("pp_recv_fwd" if forward else "pp_recv_bwd", stage),
            self._neighbour(peer),
            self.boundary_bytes,
            self._tag(peer, mb, 0 if forward else 1),
            f"recv.{'act' if forward else 'grad'}.s{stage}.mb{mb}",
            (),
            w.tag_set("pp", None, mb, phase, stage),
        )
        out.waits.append(recv)

    def send(self, action: Action, phase: str) -> None:
        """``SEND_F`` (the output activation to the next stage) or ``SEND_B`` (the input
        gradient to the previous), after everything the action computed."""
        stage, mb = action.stage, action.microbatch
        forward = action.type == SEND_F
        out = self.out
        w = out.w
        w.p2p(
            Send,
            self._stream("pp_send_fwd" if forward else "pp_send_bwd", stage),
            self._neighbour(stage + 1 if forward else stage - 1),
            self.boundary_bytes,
            self._tag(stage, mb, 0 if forward else 1),
            f"send.{'act' if forward else 'grad'}.s{stage}.mb{mb}",
            out.after_last(),
            w.tag_set("pp", None, mb, phase, stage),
        )

    def forward(self, stage: int, mb: int, blocked: bool = False) -> None:
        """An ``F`` action's compute and TP communication."""
        out = self.out
        out.stage = stage
        out.w.action_open = True
        self._action(FORWARD, stage, mb, "fwd", blocked, self._forward_body)

    def backward(self, stage: int, mb: int, final: bool, part: str, blocked: bool = False) -> None:
        """A ``B`` (all of it), ``I`` (input gradients, weight gradients deferred) or ``W``
        (the deferred weight gradients) action's compute and TP communication."""
        out = self.out
        out.stage = stage
        out.w.action_open = True
        phase = self._PHASES[part]
        if part == BACKWARD_WEIGHT:
            body = lambda s, m: self._weight_gradients(s, m, final)  # noqa: E731
        else:
            body = lambda s, m: self._backward_body(s, m, final, part)  # noqa: E731
        self._action(part, stage, mb, phase, blocked, body)

    def _forward_body(self, stage: int, mb: int) -> None:
        """The forward's compute and TP communication: embedding (first stage), the
        stage's layers, final norm, logits and loss (last stage)."""
        fwd: dict[str, Any] = dict(phase="fwd", microbatch=mb)
        if stage == 0:
            self.run(self.embedding, f"embedding.fwd.mb{mb}", **fwd)
            kind = REDUCE_SCATTER if self.sp else ALL_REDUCE
            self.wait_for(self._tp_collective(kind, f"embedding.{kind}.mb{mb}", **fwd))
        for layer in self._layers(stage):
            self._layer_forward(layer, mb, "fwd")
        if stage == self.stages - 1:
            self.run(self.final_norm, f"final_ln.fwd.mb{mb}", **fwd)
            if self.sp:
                self.wait_for(self._tp_collective(ALL_GATHER, f"final_ln.ag.mb{mb}", **fwd))
            self.run(self.logits, f"logits.fwd.mb{mb}", **fwd)
            self.run(self.loss, f"loss.fwd.mb{mb}", **fwd)

    def _action(self, kind: str, stage: int, mb: int, phase: str, blocked: bool, write) -> None:
        """Write an action's inner ops (``write(stage, mb)``), or, ``blocked``, one
        :class:`~simulator.schedule.ir.Block` of them: every action of a kind and stage
        runs the same ops, so the body is written once and shared."""
        if not blocked:
            write(stage, mb)
            return
        key = (kind, stage)
        cached = self.bodies.get(key)
        if cached is None:
            shared = self.config.shared_bodies
            if shared is None:
                cached = self.bodies[key] = self._lowered(stage, mb, write)
            else:
                shape = self._body_shape(kind, stage)
                known = shared.get(shape)
                if known is not None and known.body is not None:
                    cached = self.bodies[key] = self._retargeted(known.body, known.rank)
                else:
                    cached = self.bodies[key] = self._lowered(stage, mb, write)
                    shared[shape] = SharedBody(cached, self.rank)
        # a reused body does to the deferred weight gradients what writing it did (for a
        # body written just now, doing it again changes nothing)
        if kind == BACKWARD_WEIGHT:  # its weight gradients are in the body already
            self.deferred.pop((stage, mb), None)
        elif cached.deferred:  # an I action defers the weight gradients its W will run
            self.deferred[(stage, mb)] = list(cached.deferred)
        out = self.out
        w = out.w
        deps, out.waits = tuple(out.waits), []
        tags = w.tag_set(None, None, mb, phase, stage)
        out.last = w.block(
            cached.ops,
            cached.flops,
            cached.bytes,
            f"{stage}{kind}{mb}",
            deps,
            cached.microbatch,
            tags,
        )

    def _lowered(self, stage: int, mb: int, write) -> ActionBody:
        """``write(stage, mb)`` into a body of its own."""
        with self.out.body() as writer:
            write(stage, mb)
            body = tuple(writer.ops)
        flops = sum(op.flops for op in body if type(op) is Compute)
        nbytes = sum(op.bytes for op in body if type(op) is Compute)
        return ActionBody(body, flops, nbytes, mb, tuple(self.deferred.get((stage, mb), ())))

    def _body_shape(self, kind: str, stage: int) -> tuple:
        """What a block body of ``kind`` on ``stage`` is made of, but for the layer and
        stage numbers in its labels and tags and the process groups of its rank: the
        stage's count of layers, whether it is the first or last stage, whether it holds
        the model's first or last layer (whose sharding units also hold the embedding
        or the output layer) and which of its layers are MoE layers."""
        layers = self._layers(stage)
        return (
            kind,
            len(layers),
            stage == 0,
            stage == self.stages - 1,
            len(layers) > 0 and layers[0] == 0,
            len(layers) > 0 and layers[-1] == self.config.recipe.layers - 1,
            tuple(self.config.is_moe_layer(layer) for layer in layers),
        )

    def _retargeted(self, cached: ActionBody, rank: int) -> ActionBody:
        """A body ``rank`` lowered, as this rank runs it (``retarget``): the same compute
        ops, its collectives on this rank's groups of the same axes."""
        if rank == self.rank:
            return cached
        ops = tuple(map(self._retarget, cached.ops))
        self.config.body_templates[id(ops)] = (ops, cached.ops)
        return replace(cached, ops=ops)

    # forward op name -> the TP/SP collective that follows it
    _FWD_COMM: dict[bool, dict[str, CollectiveKind]] = {
        False: {
            "proj": ALL_REDUCE,
            "fc2": ALL_REDUCE,
            "expert_fc2": ALL_REDUCE,
            "shared_fc2": ALL_REDUCE,
        },
        True: {
            "ln1": ALL_GATHER,
            "proj": REDUCE_SCATTER,
            "ln2": ALL_GATHER,
            "fc2": REDUCE_SCATTER,
            "expert_fc2": REDUCE_SCATTER,
            "shared_fc2": REDUCE_SCATTER,
        },
    }
    _MLP = ("fc1.cast", "fc1", "gelu", "swiglu", "fc2.cast", "fc2")

    def _layer_forward(self, layer: int, mb: int, phase: str) -> None:
        self.gradients.before_layer(layer, mb, phase)
        self._layer_forward_ops(layer, mb, phase)

    def _layer_forward_ops(self, layer: int, mb: int, phase: str) -> None:
        tags = dict(layer=layer, microbatch=mb, phase=phase)
        moe = self.config.is_moe_layer(layer)
        for cost in self.fwd_ops:
            if moe and cost.name in self._MLP:
                if cost.name == "fc1":
                    self._moe_forward(layer, mb, tags)
                continue
            self._forward_op(cost, layer, mb, tags)

    def _forward_op(self, cost: OpCost, layer: int, mb: int, tags: dict[str, Any]) -> None:
        """A forward op and the TP (SP) collective after it. With pipelined TP overlap,
        an all-gather runs beside the GEMM that consumes it, and a reduce-scatter beside
        the GEMM that produces it, chunk by chunk (Transformer Engine's userbuffers)."""
        phase = tags["phase"]
        label = f"L{layer}.{cost.name}.{phase}.mb{mb}"
        if self.cp_group is not None and cost.kind == ATTENTION:
            self._cp_before(cost, layer, mb, phase)
            self.run(cost, label, **tags)
            self._cp_after(cost, layer, mb, phase)
            return
        kind = self._FWD_COMM[self.sp].get(cost.name)
        comm_label = f"L{layer}.{cost.name}.{kind}.{phase}.mb{mb}"
        if self.pipelined and kind == REDUCE_SCATTER and self.tp_group is not None:
            scatter = cast(int, self._tp_collective(kind, comm_label, **tags))  # a TP group
            self.run(cost, label, (scatter,), **tags)
            self.wait_for(scatter)
            return
        self.run(cost, label, **tags)
        if kind is None:
            return
        collective = self._tp_collective(kind, comm_label, **tags)
        if self.pipelined and kind == ALL_GATHER and collective is not None:
            self.out.gathers.append(collective)
        else:
            self.wait_for(collective)

    # -- backward ---------------------------------------------------------------------
    _PHASES = PHASE_OF_PART
    _BACKWARD = PHASE_OF_PART[FULL_BACKWARD]

    def _backward_body(self, stage: int, mb: int, final: bool, part: str) -> None:
        """The backward's compute and TP communication: loss, logits and final norm
        (last stage), the layers in reverse, the embedding (first stage)."""
        phase = self._PHASES[part]
        bwd = dict(phase=phase, microbatch=mb)
        defer = part == BACKWARD_INPUT
        if stage == self.stages - 1:
            # logits and embedding weights tied on one stage: one gradient, counted once
            tied = self.stages == 1 and self.model.tie_embeddings
            self._grads(backward_of(self.loss), "", mb, final, bwd, stage, defer)
            self._grads(backward_of(self.logits), "", mb, final, bwd, stage, defer, tied=tied)
            self._grads(backward_of(self.final_norm), "", mb, final, bwd, stage, defer)
        for layer in reversed(self._layers(stage)):
            self._layer_backward(layer, mb, final, phase, defer)
        if stage == 0:
            if self.sp:  # the backward of the embedding's reduce-scatter
                label = f"embedding.all_gather.bwd.mb{mb}"
                self.wait_for(self._tp_collective(ALL_GATHER, label, **bwd))
            self._grads(backward_of(self.embedding), "", mb, final, bwd, stage, defer)

    # backward op name -> the TP (SP) collective that follows it in Megatron-LM
    _BWD_COMM: dict[bool, dict[str, CollectiveKind]] = {
        False: {
            "logits.dgrad": ALL_REDUCE,
            "qkv.dgrad": ALL_REDUCE,
            "fc1.dgrad": ALL_REDUCE,
            "expert_fc1.dgrad": ALL_REDUCE,
            "shared_fc1.dgrad": ALL_REDUCE,
        },
        True: {
            "logits.dgrad": REDUCE_SCATTER,
            "qkv.dgrad": REDUCE_SCATTER,
            "fc1.dgrad": REDUCE_SCATTER,
            "expert_fc1.dgrad": REDUCE_SCATTER,
            "shared_fc1.dgrad": REDUCE_SCATTER,
            "residual2.bwd": ALL_GATHER,
            "residual1.bwd": ALL_GATHER,
        },
    }
    # column-parallel GEMMs whose SP-sharded input Megatron-LM all-gathers again in the
    # backward, for the weight gradient
    _REGATHER = ("logits.dgrad", "qkv.dgrad", "fc1.dgrad")

    def _grads(
        self,
        grads: list[OpCost],
        prefix: str,
        mb: int,
        final: bool,
        tags: dict[str, Any],
        stage: int,
        defer: bool,
        tied: bool = False,
    ) -> None:
        """Run backward ops and their TP communication, as Megatron-LM issues it.

        With SP, a column-parallel GEMM's backward first all-gathers its saved input
        shard again; the gather overlaps the input gradient (``dgrad``) and the weight
        gradient (``wgrad``) waits for it. The collective after a ``dgrad`` overlaps the
        ``wgrad`` that follows (``tp_comm_overlap: async``) or is waited for at once
        (``none``). An all-gather before a row-parallel GEMM's backward (SP) is waited
        for at once. With ``defer`` the weight gradients are kept for the ``W`` action."""
        pending: list[int] = []  # dgrad collectives the weight gradient overlaps
        comm = self._BWD_COMM[self.sp]
        for grad in grads:
            name = grad.name
            if self.sp and name in self._REGATHER:
                label = f"{prefix}{name.split('.')[0]}.input_ag.bwd.mb{mb}"
                # SP is on with more than one TP rank only: there is a TP group
                regather = cast(int, self._tp_collective(ALL_GATHER, label, **tags))
                if self.overlap_tp:
                    self.out.gathers.append(regather)  # beside the dgrad; the wgrad waits
                else:
                    self.wait_for(regather)
            params = 0 if tied else grad.weight_params
            expert = name.startswith("expert_")
            if name.endswith(".wgrad") and defer:
                self.out.waits.extend(self.out.gathers)
                self.out.gathers = []
                entry = (grad, f"{prefix}{name}", params, expert)
                self.deferred.setdefault((stage, mb), []).append(entry)
                continue
            attention = self.cp_group is not None and grad.kind == ATTENTION
            if attention:
                self._cp_before(grad, tags["layer"], mb, tags["phase"])
            op = self.run(grad, f"{prefix}{name}.mb{mb}", tuple(pending), **tags)
            if attention:
                self._cp_after(grad, tags["layer"], mb, tags["phase"])
            (self.out.sink or self.gradients).grad_ready(params, op, mb, final, expert)
            kind = comm.get(name)
            if kind is None:
                continue
            label = f"{prefix}{name.split('.')[0]}.{kind}.bwd.mb{mb}"
            collective = self._tp_collective(kind, label, **tags)
            if collective is None:
                continue
            if name.endswith(".dgrad") and self.overlap_tp:
                pending.append(collective)  # overlaps the weight gradient
            elif kind == ALL_GATHER and self.pipelined:
                self.out.gathers.append(collective)  # beside the next (row-parallel) dgrad
            else:
                self.wait_for(collective)
        for op in pending:
            self.wait_for(op)

    def _layer_backward(self, layer: int, mb: int, final: bool, phase: str, defer: bool) -> None:
        """A layer's backward (after its forward again, with full recompute), with what
        the gradient pass puts around it; in a stage's last backward, as one block
        where :meth:`_layer_block` can."""
        if final and self.config.layer_blocks and not self.out.gathers:
            if self._layer_block(layer, mb, final, phase, defer):
                return
        recomputes = self.config.recipe.recomputes(layer)
        self.gradients.before_layer(layer, mb, "recompute" if recomputes else phase)
        self._layer_backward_ops(layer, mb, final, phase, defer)
        self.gradients.after_layer_backward(layer, mb, final)

    def _layer_block(self, layer: int, mb: int, final: bool, phase: str, defer: bool) -> bool:
        """A layer's backward in a stage's last backward as one block, for a search's
        numbers (``StepConfig.layer_blocks``): every layer of the stage runs the same ops,
        so their body is lowered once (on one stage, retargeted to the others' groups,
        as :meth:`_retargeted` does), and what the gradient pass does with the layer's
        gradients (buckets, FSDP's gathers and reduce-scatters) stays in the program,
        waiting for points inside the block. False where a block would not keep the
        op-by-op times: the layer's first op is not compute, or an all-gather is still
        in flight at its end (pipelined SP's, beside the next layer's first GEMM)."""
        key = (phase, defer, self.config.is_moe_layer(layer), self.config.recipe.recomputes(layer))
        if key in self.layer_bodies:
            entry = self.layer_bodies[key]
        else:
            entry = self.layer_bodies[key] = self._layer_body(layer, mb, final, phase, defer)
        if entry is None:
            return False
        recomputes = self.config.recipe.recomputes(layer)
        self.gradients.before_layer(layer, mb, "recompute" if recomputes else phase)
        deps, self.out.waits = tuple(self.out.waits), []
        self.out.w.refs = True
        tags = self.out.w.tag_set(None, layer, mb, phase, self.out.stage)
        label = f"L{layer}.{phase}.mb{mb}"
        block = self.out.w.block(entry.ops, entry.flops, entry.bytes, label, deps, mb, tags)
        self.out.last = (block, entry.last)  # an op inside the block
        for params, producer, expert in entry.ready:
            (self.out.sink or self.gradients).grad_ready(
                params, (block, producer), mb, final, expert
            )
        if entry.deferred:
            self.deferred.setdefault((self.out.stage, mb), []).extend(entry.deferred)
        self.gradients.after_layer_backward(layer, mb, final)
        self.out.waits = [(block, op) for op in entry.exits]
        return True

    def _layer_body(
        self, layer: int, mb: int, final: bool, phase: str, defer: bool
    ) -> LayerBody | None:
        """``layer``'s backward ops as a body for :meth:`_layer_block` (another rank's,
        retargeted, where one lowered it); None where a block would not keep the
        times."""
        shared = self.config.layer_bodies
        key = (phase, defer, self.config.is_moe_layer(layer), self.config.recipe.recomputes(layer))
        known = shared.get(key)
        if known is not None and known.body is not None and known.rank != self.rank:
            ops = tuple(map(self._retarget, known.body.ops))
            if any(a is not b for a, b in zip(ops, known.body.ops, strict=True)):
                self.config.body_templates[id(ops)] = (ops, known.body.ops)
                return replace(known.body, ops=ops)
            return known.body
        if known is not None:
            return known.body
        events = _GradientEvents()
        deferred = self.deferred.setdefault((self.out.stage, mb), [])
        before = len(deferred)
        try:
            with self.out.body(sink=events) as writer:
                self._layer_backward_ops(layer, mb, final, phase, defer)
                body, last, exits, gathers = (
                    tuple(writer.ops),
                    self.out.last,
                    tuple(self.out.waits),
                    self.out.gathers,
                )
        finally:
            self.out.gathers = []
        deferred_here = tuple(deferred[before:])
        del deferred[before:]  # the block's use of the body defers them, as every use does
        first = body[0] if body else None
        entry = None
        if not gathers and type(first) is Compute and not first.deps:
            flops = sum(op.flops for op in body if type(op) is Compute)
            nbytes = sum(op.bytes for op in body if type(op) is Compute)
            entry = LayerBody(body, flops, nbytes, last, tuple(events.ready), deferred_here, exits)
        shared[key] = SharedBody(entry, self.rank)
        return entry

    def _layer_backward_ops(
        self, layer: int, mb: int, final: bool, phase: str, defer: bool
    ) -> None:
        """A layer's backward ops (after its forward ops again, with full recompute)."""
        recompute = self.config.recipe.recompute
        if self.config.recipe.recomputes(layer):
            self._layer_forward_ops(layer, mb, "recompute")
        tags = dict(layer=layer, microbatch=mb, phase=phase)
        moe = self.config.is_moe_layer(layer)
        for cost, grads in self.bwd_ops:
            if moe and cost.name in self._MLP:
                if cost.name == "fc2":  # the first MLP op the backward meets
                    self._moe_backward(layer, mb, final, tags, defer)
                continue
            if recompute == "selective" and cost.name == self.core[-1]:
                # the backward meets the attention core's last op first: rerun the core
                for core in self.fwd_ops:
                    if core.name in self.core:
                        if self.cp_group is not None:
                            self._cp_before(core, layer, mb, "recompute")
                        self.run(
                            core,
                            f"L{layer}.{core.name}.recompute.mb{mb}",
                            layer=layer,
                            microbatch=mb,
                            phase="recompute",
                        )
                        if self.cp_group is not None:
                            self._cp_after(core, layer, mb, "recompute")
            self._grads(grads, f"L{layer}.", mb, final, tags, self.out.stage, defer)

    def _weight_gradients(self, stage: int, mb: int, final: bool) -> None:
        for grad, label, params, expert in self.deferred.pop((stage, mb), []):
            op = self.run(grad, f"{label}.mb{mb}", phase="bwd_weight", microbatch=mb)
            (self.out.sink or self.gradients).grad_ready(params, op, mb, final, expert)

    # -- an overlapped forward and backward --------------------------------------------
    def overlapped(self, pair: Overlap, blocked: bool) -> None:
        """An ``OVERLAP_F_B`` action (DualPipeV): the forward and the backward written as
        two strands of ops, then interleaved at each strand's communication (one
        strand's computes up to a collective, then the other's) so that each
        collective runs behind the other strand's compute, as DualPipe's
        ``overlapped_forward_backward`` orders the kernels; blocked, as one block."""
        forward, backward = pair.forward, pair.backward
        key = ("O", forward.stage, backward.stage)
        cached = self.bodies.get(key) if blocked else None
        if cached is None:
            strands = []
            for action, write in (
                (forward, self._forward_body),
                (backward, lambda s, m: self._backward_body(s, m, False, FULL_BACKWARD)),
            ):
                with self.out.strand(action.stage) as writer:
                    write(action.stage, action.microbatch)
                    strands.append((writer.ops, (self.out.last, *self.out.waits)))
            merged, exits = _interleave(strands)
            flops = sum(op.flops for op in merged if type(op) is Compute)
            nbytes = sum(op.bytes for op in merged if type(op) is Compute)
            cached = ActionBody(tuple(merged), flops, nbytes, forward.microbatch)
            if blocked:
                self.bodies[key] = cached
        self.out.stage = forward.stage
        self.out.w.action_open = True
        deps, self.out.waits = tuple(self.out.waits), []
        tags = self.out.w.tag_set(None, None, forward.microbatch, "fwd", forward.stage)
        if blocked:
            self.out.last = self.out.w.block(
                cached.ops, cached.flops, cached.bytes, str(pair), deps, cached.microbatch, tags
            )
            return
        last, waits = self.out.w.inline(cached.ops, deps, exits)
        self.out.last, self.out.waits = last, list(waits)

    # -- whole step -------------------------------------------------------------------
    def build(self, order: Sequence[Step], blocks: bool = False) -> Program:
        """The rank's program for its pipeline ``order`` (compute actions), lowered with
        its sends and receives (:func:`~simulator.schedule.actions.with_communication`).
        With ``blocks`` every action but those that hand gradients to data parallelism
        becomes one Block."""
        # a stage's gradients are complete after its last backward (B) or weight (W)
        # action; with a split backward, the gradients its input half (I) computes (the
        # norms', the embedding's) after its last I
        last_grad = {}
        actions = list(compute_actions(order))
        for act in actions:
            if act.type in (FULL_BACKWARD, BACKWARD_WEIGHT, BACKWARD_INPUT):
                last_grad[(act.stage, act.type == BACKWARD_INPUT)] = act
        finals = set(last_grad.values())
        self.gradients.begin_step(actions[0].stage)
        lowered = with_communication(order, self.config.recipe.placement)
        for action in lowered:
            kind = action.type
            if type(action) is Overlap:
                if action.backward in finals:
                    raise ValueError(
                        f"{action}: a stage's last backward hands its gradients to data "
                        "parallelism and is not overlapped"
                    )
                self.overlapped(action, blocks)
            elif kind in (RECV_F, RECV_B):
                self.receive(action, "fwd" if kind == RECV_F else self._PHASES[FULL_BACKWARD])
            elif kind in (SEND_F, SEND_B):
                self.send(action, "fwd" if kind == SEND_F else self._PHASES[FULL_BACKWARD])
            else:
                final = action in finals
                blocked = blocks and not final
                if kind == FORWARD:
                    self.forward(action.stage, action.microbatch, blocked)
                else:
                    self.backward(action.stage, action.microbatch, final, kind, blocked)
        self.gradients.end_step(actions[-1].microbatch)
        return Program(self.rank, self.out.w.ops)


def _interleave(strands: list[tuple[list, tuple]]) -> tuple[list, tuple[int, ...]]:
    """Two strands of ops (ids local to each) as one list: each cut after every op that
    is not compute (a collective, a send or a receive, which the strand's next compute
    may wait for), the pieces taken in turn; ids renumbered to the list's positions.
    The first compute op of a piece that follows the other strand's collective runs
    beside it by construction (``beside_comm``: NCCL's kernels take some of its SMs).
    Also the ops the next op after both must wait for (each strand's last and its
    waits)."""
    pieces = []
    for ops, _ in strands:
        cut, current = [], []
        for op in ops:
            current.append(op)
            if type(op) is not Compute:
                cut.append(current)
                current = []
        if current:
            cut.append(current)
        pieces.append(cut)
    order: list[tuple[int, Any]] = []
    beside: dict[int, int] = {}  # position of a piece's first compute -> the collective's
    for turn in range(max(len(cut) for cut in pieces)):
        for strand, cut in enumerate(pieces):
            if turn >= len(cut):
                continue
            before = order[-1] if order else None
            if before is not None and before[0] != strand and type(before[1]) is Collective:
                first = next((i for i, op in enumerate(cut[turn]) if type(op) is Compute), None)
                if first is not None:
                    beside[len(order) + first] = len(order) - 1
            order += [(strand, op) for op in cut[turn]]
    where = {(strand, op.id): position for position, (strand, op) in enumerate(order)}
    merged = []
    for position, (strand, op) in enumerate(order):
        changes: dict[str, Any] = {
            "id": position,
            "deps": tuple(where[(strand, dep)] for dep in op.deps),
        }
        if type(op) is Compute:
            alongside = tuple(where[(strand, i)] for i in op.beside_comm)
            if position in beside:
                alongside = (*alongside, beside[position])
            if alongside:
                changes["beside_comm"] = alongside
        merged.append(replace(op, **changes))
    exits = tuple(
        where[(strand, op)] for strand, (ops, ends) in enumerate(strands) for op in ends if ops
    )
    return merged, exits
