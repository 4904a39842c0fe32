"""Write one training step of a GPT model into the Schedule IR.

For every rank the builder walks its action list (GPipe, 1F1B, interleaved 1F1B,
ZB-H1/H2 or a custom order, see :mod:`simulator.schedule.pipeline`). An action names
a *global* stage ``s``: with ``v`` virtual stages rank ``r`` holds stages
``r, r+p, …``, each with ``L/(p·v)`` layers. Per action it emits:

* **forward** ``sFm``: receive the activation from stage ``s−1``, run the embedding
  (stage 0), the stage's layers, the final norm, logits and loss (last stage), and
  send the activation to stage ``s+1``. Tensor parallelism (Megatron-LM) puts two
  all-reduces in each layer's forward, after the attention projection and after the
  second MLP GEMM, on the ``tp`` stream; the next op waits for them. With sequence
  parallelism each becomes a reduce-scatter, and an all-gather precedes the QKV and
  first MLP GEMMs: the same bytes, while norms, dropout and residuals work on ``1/t``
  of the sequence and stage boundaries carry ``1/t`` of the activation.
* **backward** ``sBm`` (or ``sIm`` then ``sWm`` when a zero-bubble schedule splits it):
  receive the output gradient, recompute the forward when ``recompute`` says so, run
  the layers' backward in reverse and send the input gradient back. ``I`` runs the
  input-gradient half (every ``dgrad`` and the communication); ``W`` runs the weight
  gradients later. What the TP communication overlaps is the recipe's
  ``tp_comm_overlap``: with ``async`` the all-reduces (SP: reduce-scatters) of the input
  gradients of the QKV and first MLP GEMMs run beside the weight-gradient GEMM that
  follows (Megatron-LM's asynchronous TP communication), with ``none`` they are waited
  for at once, and with ``pipelined`` (Transformer Engine's userbuffers) the forward's
  SP all-gathers and reduce-scatters also run beside their GEMMs. With SP, each
  column-parallel GEMM's saved input shard is all-gathered again for its weight
  gradient. Compute that runs beside a collective by construction is marked
  ``beside_comm`` (the engine slows it for the SMs NCCL takes).
* **data-parallel gradients**: during a stage's last backward, each weight gradient
  joins a bucket in the order backward produces them; a bucket is all-reduced (ZeRO-1:
  reduce-scattered) on the ``dp`` stream once it holds its cap (1 MiB for the first,
  then 25 MiB: PyTorch DDP's defaults), overlapping the rest of the backward; with
  ``grad_reduce_overlap: false`` every gradient is reduced once after the backward.
  Gradients are ``grad_reduce_dtype`` (fp32 by default). The optimizer step (after the
  gradient norm) waits for the last bucket; with ZeRO-1 it updates ``1/dp`` of the
  parameters and all-gathers them back, after it or, with ``param_gather_overlap``,
  beside the step's forward.
* **the host**: every compute op records how many ops the host issued before it in its
  action (``host_index``), so the engine can hold it until the host has issued it.

Sends and receives use one stream per direction, neighbour and chunk, so each stream
pairs with exactly one stream of the neighbour in the same micro-batch order and
matching cannot deadlock. Receives are posted eagerly (like pre-posted ``irecv``); the
compute that needs the data waits for them. Tags are ``(stage·m + mb)·2 + direction``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator.arithmetic.layer_ops import (
    ACT_BYTES,
    OpCost,
    attention_core_names,
    backward_of,
    embedding_op,
    final_norm_op,
    layer_forward_ops,
    logits_forward_op,
    loss_op,
)
from simulator.arithmetic.moe import (
    MoELayerTraffic,
    expert_backward_of,
    expert_ops,
    moe_layer_parameters_per_rank,
    moe_layer_traffic,
)
from simulator.common.vocabulary import PHASE_OF_PART
from simulator.request.layout import Layout
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec, is_moe_layer
from simulator.request.orders import Action
from simulator.request.recipe import Recipe
from simulator.schedule.ir import Block, Collective, Compute, Op, Program, Recv, Schedule, Send
from simulator.schedule.pipeline import pipeline_order

__all__ = ["StepConfig", "build_step", "stage_parameter_count", "STREAMS"]

STREAMS = ("compute", "tp", "dp", "pp_recv_fwd", "pp_send_fwd", "pp_recv_bwd", "pp_send_bwd")

# Adam with mixed precision (Apex/Megatron-LM's fused multi-tensor Adam) reads the fp32
# master weight, momentum and variance (12 B) and the gradient, and writes the three
# fp32 states (12 B) and the bf16 weight (2 B): 26 bytes plus the gradient's per
# parameter, about a dozen FLOPs; the gradient buffer is zeroed for the next step
# (one more write of the gradient). Clipping first computes the gradient norm, one read
# of every gradient (Megatron-LM's multi_tensor_l2norm).
ADAM_STATE_BYTES_PER_PARAM = 26
ADAM_FLOPS_PER_PARAM = 12


class StepConfig:
    """The builder's view of one step: the recipe, the model (and its experts), and the
    MoE routing drawn for it, memoised (every rank of an EP group, and its TP peers,
    see the same routing)."""

    def __init__(self, recipe: Recipe, model: ModelSpec, moe: MoESpec | None = None, seed: int = 0):
        if recipe.layers != model.layers:
            raise ValueError(f"recipe splits {recipe.layers} layers; the model has {model.layers}")
        self.recipe = recipe
        self.model = model
        self.moe = moe
        self.seed = seed
        self._traffic: dict[tuple[int, int, int], MoELayerTraffic] = {}

    # the recipe's settings the builder and memory read
    @property
    def layout(self) -> Layout:
        return self.recipe.layout

    @property
    def micro_batch(self) -> int:
        return self.recipe.micro_batch

    @property
    def microbatches(self) -> int:
        return self.recipe.microbatches

    @property
    def stages(self) -> int:
        return self.recipe.stages

    @property
    def sp(self) -> bool:
        return self.recipe.sp

    @property
    def zero1(self) -> bool:
        return self.recipe.shards_optimizer

    @property
    def grad_bytes(self) -> int:
        return self.recipe.grad_bytes

    def layers_of(self, stage: int) -> range:
        return self.recipe.layers_of(stage)

    def moe_traffic(self, layer: int, microbatch: int, group: int) -> MoELayerTraffic:
        """Routing of one MoE layer and micro-batch on EP group ``group`` (memoised)."""
        key = (layer, microbatch, group)
        traffic = self._traffic.get(key)
        if traffic is None:
            assert self.moe is not None
            tokens = self.micro_batch * self.model.seq_len
            traffic = self._traffic[key] = moe_layer_traffic(
                self.moe,
                self.layout.ep,
                tokens,
                self.model.hidden,
                ACT_BYTES,
                self.seed,
                layer,
                microbatch,
                group=group,
            )
        return traffic

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and is_moe_layer(self.moe, layer)

    def pipeline_orders(self) -> dict[int, list[Action]]:
        """Each pipeline rank's actions: the custom order, or the schedule's."""
        recipe = self.recipe
        if recipe.orders is not None:
            return {rank: list(actions) for rank, actions in enumerate(recipe.orders)}
        return pipeline_order(
            recipe.schedule, recipe.layout.pp, recipe.microbatches, recipe.virtual_stages
        )


def stage_parameter_count(config: StepConfig, pipeline_rank: int) -> int:
    """Parameters held by one rank of pipeline rank ``pipeline_rank``: its TP shard of the
    layers of every stage it holds, plus the embedding on the first stage and the norm
    and logits on the last. An MoE layer holds the router and its ``E/ep`` experts
    instead of the dense MLP."""
    model, layout, moe = config.model, config.layout, config.moe
    tp = layout.tp
    ops = layer_forward_ops(model, 1, tp)
    layers = config.recipe.rank_layers(pipeline_rank)
    count = sum(op.weight_params for op in ops) * len(layers)
    if moe is not None:
        dense_mlp = sum(op.weight_params for op in ops if op.name in ("fc1", "fc2"))
        experts = moe_layer_parameters_per_rank(
            moe, model.hidden, layout.ep, tp, model.ffn, model.mlp, model.bias
        )
        count += sum(experts - dense_mlp for layer in layers if is_moe_layer(moe, layer))
    if pipeline_rank == 0:
        count += embedding_op(model, 1, tp).weight_params
    if pipeline_rank == (config.stages - 1) % layout.pp:
        count += final_norm_op(model, 1).weight_params
        # an untied output layer, or Megatron-LM's copy of the tied word embeddings on
        # the last stage when it is not the first
        if not model.tie_embeddings or config.stages > 1:
            count += logits_forward_op(model, 1, tp).weight_params
    return count


class _ProgramWriter:
    """Appends ops to one rank's program and keeps the bucketing state."""

    def __init__(self, rank: int, config: StepConfig):
        self.rank = rank
        self.config = config
        self.ops: list[Op] = []
        self._tags: dict[tuple, dict[str, Any]] = {}
        self.issued = 0  # ops issued since the action's first compute op
        self.action_open = True  # the next compute op is its action's first
        # gradient buckets, per group that reduces them (dense: dp; experts: edp)
        self.bucket_bytes: dict[str, float] = {}
        self.bucket_index: dict[str, int] = {}
        self.last_buckets: dict[str, int] = {}

    _TAG_KEYS = ("stage", "layer", "microbatch", "phase", "axis")

    def tags(self, **values: Any) -> dict[str, Any]:
        """One shared dict per distinct tag set (ops of a program share their tags)."""
        assert values.keys() <= set(self._TAG_KEYS), values.keys()
        get = values.get
        return self.tag_set(
            get("axis"), get("layer"), get("microbatch"), get("phase"), get("stage")
        )

    def tag_set(self, axis, layer, microbatch, phase, stage) -> dict[str, Any]:
        """:meth:`tags` with every tag given (None: not set)."""
        key = (axis, layer, microbatch, phase, stage)
        cached = self._tags.get(key)
        if cached is None:
            cached = self._tags[key] = {}  # keys in sorted order
            if axis is not None:
                cached["axis"] = axis
            if layer is not None:
                cached["layer"] = layer
            if microbatch is not None:
                cached["microbatch"] = microbatch
            if phase is not None:
                cached["phase"] = phase
            if stage is not None:
                cached["stage"] = stage
        return cached

    def compute(
        self,
        cost: OpCost,
        label: str,
        deps: tuple[int, ...],
        tags: dict[str, Any],
        beside_comm: tuple[int, ...] = (),
    ) -> int:
        op_id = len(self.ops)
        if self.action_open:
            self.issued, self.action_open = 0, False
        self.ops.append(
            Compute(
                op_id,
                "compute",
                cost.flops,
                cost.bytes,
                cost.kind,
                label,
                deps,
                tags,
                cost.shape,
                cost.batch,
                beside_comm,
                self.issued,
            )
        )
        self.issued += 1
        return op_id

    def collective(
        self,
        kind: str,
        group: str,
        size: float,
        stream: str,
        label: str,
        deps: tuple[int, ...],
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        self.ops.append(Collective(op_id, stream, kind, group, size, label, deps, tags))
        self.issued += 1
        return op_id

    def block(
        self,
        body: tuple[Op, ...],
        flops: float,
        nbytes: float,
        label: str,
        deps: tuple[int, ...],
        body_microbatch: int,
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        self.ops.append(
            Block(op_id, "compute", body, flops, nbytes, label, deps, tags, body_microbatch)
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
        tags: dict[str, Any],
    ) -> int:
        op_id = len(self.ops)
        self.ops.append(op_type(op_id, stream, peer, size, tag, label, deps, tags))
        self.issued += 1
        return op_id


class _RankBuilder:
    """Builds the program of one rank."""

    def __init__(self, rank: int, config: StepConfig):
        self.config = config
        self.layout = layout = config.layout
        self.rank = rank
        self.w = _ProgramWriter(rank, config)
        self.pipeline_rank = layout.coords(rank)["pp"]
        self.pp, self.tp, self.sp = layout.pp, layout.tp, config.sp and layout.tp > 1
        self.stages = config.stages
        model = config.model
        self.model = model
        b = config.micro_batch
        self.fwd_ops = layer_forward_ops(model, b, self.tp, self.sp, config.recipe.attention)
        self.core = attention_core_names(config.recipe.attention)
        # backward TP collectives beside the GEMM that follows (async and pipelined); with
        # pipelined (Transformer Engine's userbuffers) the forward's too
        self.overlap_tp = config.recipe.tp_comm_overlap in ("async", "pipelined")
        self.pipelined = config.recipe.tp_comm_overlap == "pipelined" and self.sp
        self.gathers: list[int] = []  # in-flight all-gathers the next GEMM runs beside
        self.bwd_ops = [(op, backward_of(op)) for op in reversed(self.fwd_ops)]
        self.activation_bytes = ACT_BYTES * b * model.seq_len * model.hidden
        # SP keeps the residual stream sharded, so stage boundaries carry 1/t of it
        self.boundary_bytes = self.activation_bytes / (self.tp if self.sp else 1)
        self.tp_group = layout.group_name("tp", rank) if self.tp > 1 else None
        self.dp_group = layout.group_name("dp", rank) if layout.dp > 1 else None
        shard = self.tp if self.sp else 1
        self.embedding = embedding_op(model, b, self.tp)
        self.final_norm = final_norm_op(model, b, shard)
        self.logits = logits_forward_op(model, b, self.tp, shard)
        self.loss = loss_op(model, b, self.tp)
        self.last = 0  # the latest compute op
        self.waits: list[int] = []  # ops on other streams the next compute op must wait for
        # (stage, micro-batch) -> weight gradients an I action leaves for its W action:
        # (gradient, label, parameters, expert?)
        self.deferred: dict[tuple[int, int], list[tuple[OpCost, str, int, bool]]] = {}
        self.stage = 0  # the stage of the action being written
        self.neighbours: dict[int, int] = {}  # global stage -> rank holding it
        # (action kind, stage) -> (body, flops, bytes, micro-batch, deferred weight grads)
        self.bodies: dict[tuple[str, int], tuple] = {}
        self.moe = config.moe
        self.ep = layout.ep
        self.ep_group = layout.group_name("ep", rank) if self.ep > 1 else None
        if self.moe is None or self.ep == 1:
            self.edp_group = self.dp_group  # experts replicated like the dense layers
        else:
            edp = layout.group_name("edp", rank)
            self.edp_group = edp if len(layout.groups[edp]) > 1 else None
        dp_index = layout.coords(rank)["dp"]
        self.ep_index, self.ep_group_index = dp_index % self.ep, dp_index // self.ep

    # -- helpers ----------------------------------------------------------------------
    def _layers(self, stage: int) -> range:
        return self.config.layers_of(stage)

    def _neighbour(self, stage: int) -> int:
        """The rank (in this rank's pipeline) that holds global ``stage``."""
        rank = self.neighbours.get(stage)
        if rank is None:
            rank = self.neighbours[stage] = self.layout.stage_rank(self.rank, stage % self.pp)
        return rank

    def _stream(self, name: str, stage: int) -> str:
        return name if self.config.recipe.virtual_stages == 1 else f"{name}.c{stage // self.pp}"

    def _tag(self, stage: int, mb: int, direction: int) -> int:
        return (stage * self.config.microbatches + mb) * 2 + direction

    def _run(self, cost: OpCost, label: str, beside_comm: tuple[int, ...] = (), **tags: Any) -> int:
        """A compute op after the last one; ``beside_comm``: the collectives of this rank
        in flight beside it by construction (their NCCL kernels share the SMs).

        In-flight all-gathers (:attr:`gathers`) run beside the next GEMM, which works on
        the chunks already gathered, and the op after it waits for them; any other op
        waits for them first."""
        overlapped = False
        if self.gathers:
            if cost.kind == "gemm" and cost.batch == 1:
                overlapped = True
                beside_comm = (*beside_comm, *self.gathers)
            else:
                self.waits.extend(self.gathers)
                self.gathers = []
        deps, self.waits = tuple(self.waits), []
        get = tags.get
        tagset = self.w.tag_set(None, get("layer"), get("microbatch"), get("phase"), self.stage)
        self.last = self.w.compute(cost, label, deps, tagset, beside_comm)
        if overlapped:
            self.waits.extend(self.gathers)
            self.gathers = []
        return self.last

    def _after_last(self) -> tuple[int, ...]:
        """Deps of an op that must follow everything the compute stream has done."""
        return (*([self.last] if self.w.ops else []), *self.waits)

    def _tp_collective(self, kind: str, label: str, **tags: Any) -> int | None:
        """A TP (SP) collective of the full activation, after the last compute op."""
        if self.tp_group is None:
            return None
        get = tags.get
        tagset = self.w.tag_set(
            "sp" if self.sp else "tp", get("layer"), get("microbatch"), get("phase"), self.stage
        )
        return self.w.collective(
            kind, self.tp_group, self.activation_bytes, "tp", label, (self.last,), tagset
        )

    def _grad_ready(
        self, params: int, producer: int, microbatch: int, final: bool, expert: bool = False
    ) -> None:
        group = self.edp_group if expert else self.dp_group
        if not final or group is None or params == 0:
            return
        w = self.w
        w.bucket_bytes[group] = w.bucket_bytes.get(group, 0.0) + params * self.config.grad_bytes
        if not self.config.recipe.grad_reduce_overlap:
            return  # one reduction of every gradient after the whole backward
        first = w.bucket_index.get(group, 0) == 0
        cap = (
            self.config.recipe.first_grad_bucket_bytes
            if first
            else self.config.recipe.grad_bucket_bytes
        )
        if w.bucket_bytes[group] >= cap:
            self._flush_bucket(group, producer, microbatch)

    def _flush_bucket(self, group: str, producer: int, microbatch: int) -> None:
        w = self.w
        size = w.bucket_bytes.get(group, 0.0)
        if size <= 0:
            return
        kind = "reduce_scatter" if self.config.zero1 else "all_reduce"
        index = w.bucket_index.get(group, 0)
        label = f"{self.layout.axis_of_group(group)}.bucket{index}"
        w.last_buckets[group] = w.collective(
            kind,
            group,
            size,
            "dp",
            label,
            (producer,),
            w.tags(stage=self.stage, axis="dp", phase="bwd", microbatch=microbatch),
        )
        w.bucket_index[group] = index + 1
        w.bucket_bytes[group] = 0.0

    def _wait_for(self, op: int | None) -> None:
        if op is not None:
            self.waits.append(op)

    # -- forward ----------------------------------------------------------------------
    def forward(self, stage: int, mb: int, blocked: bool = False) -> None:
        self.stage = stage
        self.w.action_open = True
        w, pp_tags = self.w, self.w.tag_set("pp", None, mb, "fwd", stage)
        if stage > 0:
            recv = w.p2p(
                Recv,
                self._stream("pp_recv_fwd", stage),
                self._neighbour(stage - 1),
                self.boundary_bytes,
                self._tag(stage - 1, mb, 0),
                f"recv.act.s{stage}.mb{mb}",
                (),
                pp_tags,
            )
            self.waits.append(recv)
        self._action("F", stage, mb, "fwd", blocked, self._forward_body)
        if stage < self.stages - 1:
            self.w.p2p(
                Send,
                self._stream("pp_send_fwd", stage),
                self._neighbour(stage + 1),
                self.boundary_bytes,
                self._tag(stage, mb, 0),
                f"send.act.s{stage}.mb{mb}",
                self._after_last(),
                pp_tags,
            )

    def _forward_body(self, stage: int, mb: int) -> None:
        """The forward's compute and TP communication: embedding (first stage), the
        stage's layers, final norm, logits and loss (last stage)."""
        fwd = dict(phase="fwd", microbatch=mb)
        if stage == 0:
            self._run(self.embedding, f"embedding.fwd.mb{mb}", **fwd)
            kind = "reduce_scatter" if self.sp else "all_reduce"
            self._wait_for(self._tp_collective(kind, f"embedding.{kind}.mb{mb}", **fwd))
        for layer in self._layers(stage):
            self._layer_forward(layer, mb, "fwd")
        if stage == self.stages - 1:
            self._run(self.final_norm, f"final_ln.fwd.mb{mb}", **fwd)
            if self.sp:
                self._wait_for(self._tp_collective("all_gather", f"final_ln.ag.mb{mb}", **fwd))
            self._run(self.logits, f"logits.fwd.mb{mb}", **fwd)
            self._run(self.loss, f"loss.fwd.mb{mb}", **fwd)

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
            outer = self.w, self.last, self.waits
            self.w, self.last, self.waits = _ProgramWriter(self.rank, self.config), 0, []
            write(stage, mb)
            body = tuple(self.w.ops)
            self.w, self.last, self.waits = outer
            flops = sum(op.flops for op in body if type(op) is Compute)
            nbytes = sum(op.bytes for op in body if type(op) is Compute)
            deferred = tuple(self.deferred.get((stage, mb), ()))
            cached = self.bodies[key] = (body, flops, nbytes, mb, deferred)
        elif kind == "W":  # its weight gradients are in the body already
            self.deferred.pop((stage, mb), None)
        elif cached[4]:  # an I action defers the weight gradients its W will run
            self.deferred[(stage, mb)] = list(cached[4])
        body, flops, nbytes, body_mb, _ = cached
        deps, self.waits = tuple(self.waits), []
        tags = self.w.tag_set(None, None, mb, phase, stage)
        self.last = self.w.block(body, flops, nbytes, f"{stage}{kind}{mb}", deps, body_mb, tags)

    # forward op name -> the TP/SP collective that follows it
    _FWD_COMM = {False: {"proj": "all_reduce", "fc2": "all_reduce", "expert_fc2": "all_reduce"},
                 True: {"ln1": "all_gather", "proj": "reduce_scatter", "ln2": "all_gather",
                        "fc2": "reduce_scatter", "expert_fc2": "reduce_scatter"}}  # fmt: skip
    _MLP = ("fc1", "gelu", "swiglu", "fc2")

    def _layer_forward(self, layer: int, mb: int, phase: str) -> None:
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
        kind = self._FWD_COMM[self.sp].get(cost.name)
        comm_label = f"L{layer}.{cost.name}.{kind}.{phase}.mb{mb}"
        if self.pipelined and kind == "reduce_scatter" and self.tp_group is not None:
            scatter = self._tp_collective(kind, comm_label, **tags)
            self._run(cost, label, (scatter,), **tags)
            self._wait_for(scatter)
            return
        self._run(cost, label, **tags)
        if kind is None:
            return
        collective = self._tp_collective(kind, comm_label, **tags)
        if self.pipelined and kind == "all_gather" and collective is not None:
            self.gathers.append(collective)
        else:
            self._wait_for(collective)

    # -- mixture of experts -----------------------------------------------------------
    def _moe_ops(self, layer: int, mb: int) -> tuple[list[OpCost], MoELayerTraffic]:
        traffic = self.config.moe_traffic(layer, mb, self.ep_group_index)
        received = int(traffic.tokens_received[self.ep_index])
        tokens = self.config.micro_batch * self.model.seq_len
        ops = expert_ops(
            self.moe,
            self.model.hidden,
            received,
            self.tp,
            ep=self.ep,
            model_ffn=self.model.ffn,
            router_tokens=tokens,
            mlp=self.model.mlp,
            bias=self.model.bias,
        )
        return ops, traffic

    def _all_to_all(self, splits, label: str, **tags: Any) -> None:
        """An uneven all-to-all on the EP group, which the next op waits for."""
        if self.ep_group is None:
            return
        splits = tuple(float(b) for b in splits)
        op = self.w.collective(
            "all_to_all",
            self.ep_group,
            sum(splits),
            "ep",
            label,
            (self.last, *self.waits),
            self.w.tags(stage=self.stage, axis="ep", **tags),
        )
        self.w.ops[op].splits = splits
        self._wait_for(op)

    def _moe_forward(self, layer: int, mb: int, tags: dict[str, Any]) -> None:
        """Router, dispatch all-to-all, the local experts on the tokens this rank
        received, combine all-to-all (the dispatch's transpose)."""
        ops, traffic = self._moe_ops(layer, mb)
        phase = tags["phase"]
        router, experts = ops[0], ops[1:]
        self._forward_op(router, layer, mb, tags)
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        self._all_to_all(dispatch, f"L{layer}.dispatch.{phase}.mb{mb}", **tags)
        for cost in experts:
            self._forward_op(cost, layer, mb, tags)
        self._all_to_all(combine, f"L{layer}.combine.{phase}.mb{mb}", **tags)

    def _moe_backward(
        self, layer: int, mb: int, final: bool, tags: dict[str, Any], defer: bool
    ) -> None:
        """The combine's backward (an all-to-all along the dispatch), the experts'
        backward, the dispatch's backward (along the combine), the router's."""
        ops, traffic = self._moe_ops(layer, mb)
        router, experts = ops[0], ops[1:]
        local = self.moe.experts // self.ep
        phase = tags["phase"]
        dispatch, combine = traffic.splits[self.ep_index], traffic.splits[:, self.ep_index]
        self._all_to_all(dispatch, f"L{layer}.combine_grad.{phase}.mb{mb}", **tags)
        for cost in reversed(experts):
            grads = expert_backward_of(cost, local)
            self._grads(grads, f"L{layer}.", mb, final, tags, self.stage, defer)
        self._all_to_all(combine, f"L{layer}.dispatch_grad.{phase}.mb{mb}", **tags)
        self._grads(backward_of(router), f"L{layer}.", mb, final, tags, self.stage, defer)

    # -- backward ---------------------------------------------------------------------
    _PHASES = PHASE_OF_PART

    def backward(self, stage: int, mb: int, final: bool, part: str, blocked: bool = False) -> None:
        """``part``: ``B`` (all of it), ``I`` (input gradients, weight gradients
        deferred) or ``W`` (the deferred weight gradients)."""
        self.stage = stage
        self.w.action_open = True
        phase = self._PHASES[part]
        if part == "W":
            self._action(
                "W", stage, mb, phase, blocked, lambda s, m: self._weight_gradients(s, m, final)
            )
            return
        w = self.w
        pp_tags = w.tag_set("pp", None, mb, phase, stage)
        if stage < self.stages - 1:
            recv = w.p2p(
                Recv,
                self._stream("pp_recv_bwd", stage),
                self._neighbour(stage + 1),
                self.boundary_bytes,
                self._tag(stage + 1, mb, 1),
                f"recv.grad.s{stage}.mb{mb}",
                (),
                pp_tags,
            )
            self.waits.append(recv)
        self._action(
            part, stage, mb, phase, blocked, lambda s, m: self._backward_body(s, m, final, part)
        )
        if stage > 0:
            self.w.p2p(
                Send,
                self._stream("pp_send_bwd", stage),
                self._neighbour(stage - 1),
                self.boundary_bytes,
                self._tag(stage, mb, 1),
                f"send.grad.s{stage}.mb{mb}",
                self._after_last(),
                pp_tags,
            )

    def _backward_body(self, stage: int, mb: int, final: bool, part: str) -> None:
        """The backward's compute and TP communication: loss, logits and final norm
        (last stage), the layers in reverse, the embedding (first stage)."""
        phase = self._PHASES[part]
        bwd = dict(phase=phase, microbatch=mb)
        defer = part == "I"
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
                self._wait_for(self._tp_collective("all_gather", label, **bwd))
            self._grads(backward_of(self.embedding), "", mb, final, bwd, stage, defer)

    # backward op name -> the TP (SP) collective that follows it in Megatron-LM
    _BWD_COMM = {False: {"logits.dgrad": "all_reduce", "qkv.dgrad": "all_reduce",
                         "fc1.dgrad": "all_reduce", "expert_fc1.dgrad": "all_reduce"},
                 True: {"logits.dgrad": "reduce_scatter", "qkv.dgrad": "reduce_scatter",
                        "fc1.dgrad": "reduce_scatter", "expert_fc1.dgrad": "reduce_scatter",
                        "residual2.bwd": "all_gather",
                        "residual1.bwd": "all_gather"}}  # fmt: skip
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
                regather = self._tp_collective("all_gather", label, **tags)
                if self.overlap_tp:
                    self.gathers.append(regather)  # beside the dgrad; the wgrad waits
                else:
                    self._wait_for(regather)
            params = 0 if tied else grad.weight_params
            expert = name.startswith("expert_")
            if name.endswith(".wgrad") and defer:
                self.waits.extend(self.gathers)
                self.gathers = []
                entry = (grad, f"{prefix}{name}", params, expert)
                self.deferred.setdefault((stage, mb), []).append(entry)
                continue
            op = self._run(grad, f"{prefix}{name}.mb{mb}", tuple(pending), **tags)
            self._grad_ready(params, op, mb, final, expert)
            kind = comm.get(name)
            if kind is None:
                continue
            label = f"{prefix}{name.split('.')[0]}.{kind}.bwd.mb{mb}"
            collective = self._tp_collective(kind, label, **tags)
            if collective is None:
                continue
            if name.endswith(".dgrad") and self.overlap_tp:
                pending.append(collective)  # overlaps the weight gradient
            elif kind == "all_gather" and self.pipelined:
                self.gathers.append(collective)  # beside the next (row-parallel) dgrad
            else:
                self._wait_for(collective)
        for op in pending:
            self._wait_for(op)

    def _layer_backward(self, layer: int, mb: int, final: bool, phase: str, defer: bool) -> None:
        recompute = self.config.recipe.recompute
        if recompute == "full":
            self._layer_forward(layer, mb, "recompute")
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
                        self._run(
                            core,
                            f"L{layer}.{core.name}.recompute.mb{mb}",
                            layer=layer,
                            microbatch=mb,
                            phase="recompute",
                        )
            self._grads(grads, f"L{layer}.", mb, final, tags, self.stage, defer)

    def _weight_gradients(self, stage: int, mb: int, final: bool) -> None:
        for grad, label, params, expert in self.deferred.pop((stage, mb), []):
            op = self._run(grad, f"{label}.mb{mb}", phase="bwd_weight", microbatch=mb)
            self._grad_ready(params, op, mb, final, expert)

    # -- whole step -------------------------------------------------------------------
    def build(self, order: list[Action], blocks: bool = False) -> Program:
        """The rank's program for its pipeline ``order``. With ``blocks`` every action
        but those that hand gradients to data parallelism becomes one Block."""
        # a stage's gradients are complete after its last backward (B) or weight (W)
        # action; with a split backward, the gradients its input half (I) computes (the
        # norms', the embedding's) after its last I
        last_grad = {}
        for index, action in enumerate(order):
            if action.type in ("B", "W", "I"):
                last_grad[(action.stage, action.type == "I")] = index
        total = stage_parameter_count(self.config, self.pipeline_rank)
        gather = self.config.zero1 and self.dp_group is not None
        early_gather = None
        if gather and self.config.recipe.param_gather_overlap:
            # the weights the last step updated are gathered beside this step's forward
            # (Megatron-Core's --overlap-param-gather); the optimizer waits for it
            early_gather = self.w.collective(
                "all_gather",
                self.dp_group,
                total * ACT_BYTES,
                "dp",
                "dp.param_all_gather",
                (),
                self.w.tags(stage=order[0].stage, axis="dp", phase="fwd"),
            )
        for index, action in enumerate(order):
            final = last_grad.get((action.stage, action.type == "I")) == index
            blocked = blocks and not final
            if action.type == "F":
                self.forward(action.stage, action.microbatch, blocked)
            elif action.type in ("B", "I", "W"):
                self.backward(action.stage, action.microbatch, final, action.type, blocked)
            else:
                raise ValueError(f"unsupported pipeline action {action}")
        for group in list(self.w.bucket_bytes):
            self._flush_bucket(group, self.last, order[-1].microbatch)
        local = total / (self.layout.dp if self.config.zero1 else 1)
        grad_bytes = self.config.grad_bytes
        grad_norm = OpCost("grad_norm", "elementwise", 2.0 * local, grad_bytes * local, 0.0)
        optimizer = OpCost(
            "optimizer",
            "optimizer",
            ADAM_FLOPS_PER_PARAM * local,
            (ADAM_STATE_BYTES_PER_PARAM + 2 * grad_bytes) * local,
            0.0,
        )
        self.waits.extend(self.w.last_buckets.values())
        self._wait_for(early_gather)
        self.w.action_open = True
        self._run(grad_norm, "optimizer.grad_norm", phase="optimizer")
        self._run(optimizer, "optimizer.step", phase="optimizer")
        if gather and early_gather is None:
            # ZeRO-1: every rank updated 1/dp of the weights; gather the updated bf16 weights
            self.w.collective(
                "all_gather",
                self.dp_group,
                total * ACT_BYTES,
                "dp",
                "dp.param_all_gather",
                (self.last,),
                self.w.tags(stage=self.stage, axis="dp", phase="optimizer"),
            )
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


def build_step(
    recipe: Recipe,
    model: ModelSpec,
    *,
    moe: MoESpec | None = None,
    seed: int = 0,
    fold: bool = False,
    blocks: bool = False,
) -> Schedule:
    """The Schedule of one training step of ``model`` run as ``recipe``, for every rank
    of its layout (``moe``: the model's experts, routed from ``seed``).

    Ranks of one pipeline stage run the same program up to their process groups and
    neighbours, so each stage is built once, for its rank with TP and DP coordinate 0,
    and the other ranks of the stage share its compute ops. With ``fold`` only those
    representative ranks get a program: the others are symmetric to them, and the
    schedule records which ranks and groups each representative stands for. With
    ``blocks`` (analytic fidelity) each pipeline action that does not hand gradients to
    data parallelism is written as one :class:`~simulator.schedule.ir.Block`.
    """
    config = StepConfig(recipe, model, moe, seed)
    layout = config.layout
    orders = config.pipeline_orders()
    if config.moe is not None:
        # each data-parallel replica routes its own tokens, so MoE ranks differ: every
        # rank is built (and simulated), none shares or folds
        programs = {
            rank: _RankBuilder(rank, config).build(orders[layout.coords(rank)["pp"]])
            for rank in range(layout.world)
        }
        return _schedule(config, programs, orders)
    templates: dict[int, tuple[int, list[Op]]] = {}
    for pipeline_rank in range(layout.pp):
        rank = layout.rank_of(pp=pipeline_rank)
        ops = _RankBuilder(rank, config).build(orders[pipeline_rank], blocks).ops
        templates[pipeline_rank] = (rank, ops)
    programs = {}
    ranks = sorted(rank for rank, _ in templates.values()) if fold else range(layout.world)
    for rank in ranks:
        template_rank, ops = templates[layout.coords(rank)["pp"]]
        if rank == template_rank:
            programs[rank] = Program(rank, ops)
        else:
            programs[rank] = Program(rank, [_retarget(op, rank, layout) for op in ops])
    schedule = _schedule(config, programs, orders)
    if fold:
        _record_images(schedule, layout)
    return schedule


def _record_images(schedule: Schedule, layout: Layout) -> None:
    """Which ranks and groups each representative of a folded schedule stands for:
    every rank of its pipeline stage, ordered by (dp, tp) coordinate so that image
    ``i`` of a rank and image ``i`` of its pipeline neighbour are neighbours too."""
    offsets = [layout.rank_of(tp=t, dp=d) for d in range(layout.dp) for t in range(layout.tp)]
    for rank in schedule.programs:
        base = layout.rank_of(pp=layout.coords(rank)["pp"])
        schedule.rank_images[rank] = tuple(base + offset for offset in offsets)
    simulated = set(schedule.programs)
    for name, members in schedule.groups.items():
        if set(members) <= simulated:
            continue
        axis = layout.axis_of_group(name)
        representative = next(m for m in members if m in simulated)
        names = dict.fromkeys(
            layout.group_name(axis, image) for image in schedule.rank_images[representative]
        )
        schedule.images[name] = tuple(tuple(layout.groups[n]) for n in names)


def _moe_meta(config: StepConfig) -> dict[str, Any] | None:
    """Token routing over every MoE layer and micro-batch the step ran."""
    if config.moe is None or not config._traffic:
        return None
    traffic = list(config._traffic.values())
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
    config: StepConfig, programs: dict[int, Program], orders: dict[int, list[Action]]
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
    groups = {name: members for name, members in layout.groups.items() if name in used}
    meta = {
        "moe": _moe_meta(config),
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
        "pipeline_orders": {str(s): [str(a) for a in actions] for s, actions in orders.items()},
    }
    return Schedule(programs=programs, groups=groups, meta=meta)
