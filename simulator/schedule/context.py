"""The lowering passes' shared view of one step: the recipe, the model and its
experts, and the MoE routing drawn for the step (memoised, so every rank of an EP group
and its TP peers see the same tokens)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator.arithmetic.layer_ops import ACT_BYTES
from simulator.arithmetic.moe import MoELayerTraffic, moe_layer_traffic
from simulator.request.layout import Layout
from simulator.request.model import ModelSpec
from simulator.request.moe import MoESpec, is_moe_layer
from simulator.request.orders import Step
from simulator.request.recipe import Recipe
from simulator.schedule.bodies import ActionBody, LayerBody, SharedBody
from simulator.schedule.pipeline import pipeline_order

__all__ = ["StepConfig"]


class StepConfig:
    """The builder's view of one step: the recipe, the model (and its experts), and the
    MoE routing drawn for it, memoised (every rank of an EP group, and its TP peers,
    see the same routing)."""

    def __init__(
        self,
        recipe: Recipe,
        model: ModelSpec,
        moe: MoESpec | None = None,
        seed: int = 0,
        gpus_per_node: int | None = None,
    ):
        if recipe.layers != model.layers:
            raise ValueError(f"recipe splits {recipe.layers} layers; the model has {model.layers}")
        self.recipe = recipe
        self.model = model
        # the model as one rank sees it: with context parallelism, 1/cp of each sequence
        cp = recipe.layout.cp
        self.local = model.model_copy(update={"seq_len": model.seq_len // cp}) if cp > 1 else model
        self.moe = moe
        self.seed = seed
        # the cluster's node size: which EP ranks share a node, for node-limited routing
        self.gpus_per_node = gpus_per_node
        self._traffic: dict[tuple[int, int, int], MoELayerTraffic] = {}
        # with blocks, for a step whose numbers alone are wanted (no trace): block bodies
        # by their shape, lowered once for every stage of that shape
        # (:meth:`RankLowering._action`); None builds every stage's bodies
        self.shared_bodies: dict[tuple, SharedBody[ActionBody]] | None = None
        self.body_templates: dict[int, tuple[tuple, tuple]] = {}  # Schedule.body_templates
        # with blocks, for a step whose numbers alone are wanted: a stage's last backward
        # written in blocks of layers (RankLowering._layer_block)
        self.layer_blocks = False
        # (phase, deferred?, MoE?, recomputed?) -> a layer's body and the rank that lowered it
        self.layer_bodies: dict[tuple[str, bool, bool, bool], SharedBody[LayerBody]] = {}

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
            tokens = self.micro_batch * self.local.seq_len
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
                nodes=self._ep_nodes(group),
            )
        return traffic

    def _ep_nodes(self, group: int) -> list[int] | None:
        """The node of each rank of EP group ``group`` (of the first TP and pipeline
        rank: the others sit alike), when the routing is node-limited or the dispatcher
        sends a token once per node."""
        moe = self.moe
        if self.gpus_per_node is None or moe is None:
            return None
        if not moe.max_nodes_per_token and moe.dispatcher != "deepep":
            return None
        layout, ep = self.layout, self.layout.ep
        ranks = [layout.rank_of(dp=group * ep + j) for j in range(ep)]
        return [rank // self.gpus_per_node for rank in ranks]

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and is_moe_layer(self.moe, layer)

    def pipeline_orders(self) -> Mapping[int, Sequence[Step]]:
        """Each pipeline rank's actions: the custom order, or the schedule's."""
        recipe = self.recipe
        if recipe.orders is not None:
            return {rank: list(actions) for rank, actions in enumerate(recipe.orders)}
        return pipeline_order(
            recipe.schedule, recipe.layout.pp, recipe.microbatches, recipe.virtual_stages
        )
