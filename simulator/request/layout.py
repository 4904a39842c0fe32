"""The rank grid: how ``tp``, ``pp`` and ``dp`` map onto ranks, and the process groups.

Like torchtitan's ``ParallelDims``, a :class:`Layout` is a small dataclass of named
axes that validates itself with messages stating the numbers. ``placement`` lists the
axes innermost first: with ``[tp, dp, pp]`` consecutive ranks differ in their TP
coordinate, so a TP group of 8 fills one 8-GPU node, the DP peers come next, and the
pipeline stages are the outermost (Megatron-LM's default rank order). Rank ``r`` runs
on GPU ``r`` of the cluster.

Process groups are named ``<axis><index>`` (``tp0``, ``dp3``, ``pp1``), indexed in the
order of their lowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import GRID_AXES, PLACEMENT_AXES

__all__ = ["Layout", "balanced_stages", "FEWEST_UNEVEN_LAYERS"]

# grid → (groups, group_of), shared by equal layouts; never mutated after building
_GROUPS: dict[tuple, tuple[dict, dict]] = {}
_GROUPS_KEPT = 64


@dataclass(frozen=True)
class Layout:
    """A validated ``tp × pp × dp`` grid with a placement order."""

    tp: int
    pp: int
    dp: int
    placement: tuple[str, ...] = ("tp", "dp", "pp")
    ep: int = 1
    # HSDP: the DP replicas split into shard groups of dp_shard consecutive replicas (the
    # weights are sharded inside one) and replicate groups across them (0: no split)
    dp_shard: int = 0
    # context parallelism: each sequence split over cp ranks (placed right after tp
    # unless the placement names it)
    cp: int = 1
    _strides: dict[str, int] = field(init=False, repr=False, compare=False)
    _groups: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _group_of: dict[tuple[str, int], str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for axis in GRID_AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size < 1:
                raise ScenarioError(f"parallel.{axis}: must be a positive integer (got {size!r})")
        named = [axis for axis in self.placement if axis != "cp"]
        if sorted(named) != sorted(PLACEMENT_AXES) or list(self.placement).count("cp") > 1:
            raise ScenarioError(
                f"parallel.placement: must order each of tp, dp, pp exactly once, and cp at "
                f"most once (got {list(self.placement)})"
            )
        if self.cp == 1 and "cp" in self.placement:
            object.__setattr__(self, "placement", tuple(named))
        elif self.cp > 1 and "cp" not in self.placement:
            # Megatron-LM's and torchtitan's order: the CP ranks right outside TP
            at = self.placement.index("tp") + 1
            object.__setattr__(
                self, "placement", (*self.placement[:at], "cp", *self.placement[at:])
            )
        strides: dict[str, int] = {}
        stride = 1
        for axis in self.placement:
            strides[axis] = stride
            stride *= self.size(axis)
        object.__setattr__(self, "_strides", strides)
        if self.ep < 1 or self.dp % self.ep:
            raise ScenarioError(f"parallel.ep: ep({self.ep}) must divide dp({self.dp})")
        if self.dp_shard and (self.dp_shard < 1 or self.dp % self.dp_shard):
            raise ScenarioError(
                f"parallel.dp_shard: dp_shard({self.dp_shard}) must divide dp({self.dp})"
            )
        # the groups depend on the grid alone: a search builds the same grid for many
        # recipes, so they are computed once per grid (O(world) each)
        key = (self.tp, self.pp, self.dp, self.placement, self.ep, self.dp_shard, self.cp)
        built = _GROUPS.get(key)
        if built is None:
            if len(_GROUPS) >= _GROUPS_KEPT:
                _GROUPS.clear()
            built = _GROUPS[key] = self._build_groups()
        groups, group_of = built
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_group_of", group_of)

    def _build_groups(self) -> tuple[dict[str, tuple[int, ...]], dict[tuple[str, int], str]]:
        """Every process group (name → members) and each rank's group on each axis."""
        strides = self._strides
        groups: dict[str, tuple[int, ...]] = {}
        group_of: dict[tuple[str, int], str] = {}
        for axis in self.axes:
            # a group is known by its lowest rank (coordinate 0 on the axis): O(world)
            stride, size = strides[axis], self.size(axis)
            by_base: dict[int, str] = {}
            for rank in range(self.world):
                base = rank - ((rank // stride) % size) * stride
                name = by_base.get(base)
                if name is None:
                    name = by_base[base] = f"{axis}{len(by_base)}"
                    groups[name] = tuple(base + i * stride for i in range(size))
                group_of[(axis, rank)] = name
        # expert parallelism splits each DP group into blocks of ep consecutive replicas
        # (the EP groups); the replicas holding the same experts form the
        # expert-data-parallel (edp) groups that reduce expert gradients. HSDP splits it
        # the same way: shard groups of dp_shard consecutive replicas, replicate groups
        # across them (torchtitan's ParallelDims: dp_replicate outside dp_shard).
        for block, inner, outer in (
            (self.ep, "ep", "edp"),
            (self.dp_shard, "dp_shard", "dp_replicate"),
        ):
            if block > 1 or (inner == "dp_shard" and block):
                self._split_dp(block, inner, outer, groups, group_of)
        if self.cp > 1:
            # the ranks that hold the same weights: every (dp, cp) coordinate of a (tp, pp)
            # one; data-parallel gradients are reduced over them
            seen_dpcp: dict[tuple[int, ...], str] = {}
            for rank in range(self.world):
                coords = self.coords(rank)
                members = tuple(
                    self.rank_of(tp=coords["tp"], pp=coords["pp"], dp=d, cp=c)
                    for d in range(self.dp)
                    for c in range(self.cp)
                )
                name = seen_dpcp.get(members)
                if name is None:
                    name = seen_dpcp[members] = f"dp_cp{len(seen_dpcp)}"
                    groups[name] = members
                group_of[("dp_cp", rank)] = name
        return groups, group_of

    def _split_dp(
        self,
        block: int,
        inner: str,
        outer: str,
        groups: dict[str, tuple[int, ...]],
        group_of: dict[tuple[str, int], str],
    ) -> None:
        """Name the groups of ``block`` consecutive DP replicas (``inner``) and of the
        replicas at the same position across those blocks (``outer``), each axis's
        groups indexed in the order of their lowest rank, like every other group."""
        dp_groups = [m for name, m in groups.items() if self.axis_of_group(name) == "dp"]
        for axis, split in (
            (inner, lambda m: [m[j : j + block] for j in range(0, len(m), block)]),
            (outer, lambda m: [m[r::block] for r in range(block)]),
        ):
            found = [part for members in dp_groups for part in split(members)]
            for index, members in enumerate(sorted(found, key=min)):
                name = f"{axis}{index}"
                groups[name] = members
                for rank in members:
                    group_of[(axis, rank)] = name

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def axes(self) -> tuple[str, ...]:
        """The grid's axes: tp, dp, pp, and cp when the sequence is split."""
        return GRID_AXES if self.cp > 1 else PLACEMENT_AXES

    @property
    def gradient_axis(self) -> str:
        """The axis whose groups reduce the weights' gradients: dp, or with context
        parallelism dp_cp (every rank holding the same weights)."""
        return "dp_cp" if self.cp > 1 else "dp"

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights: ``dp``, times ``cp``."""
        return self.dp * self.cp

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    def coords(self, rank: int) -> dict[str, int]:
        """``{'tp': i, 'dp': j, 'pp': k}`` of a rank (and ``'cp'`` when cp > 1)."""
        return {axis: (rank // self._strides[axis]) % self.size(axis) for axis in self.axes}

    def rank_of(self, tp: int = 0, dp: int = 0, pp: int = 0, cp: int = 0) -> int:
        coords = {"tp": tp, "dp": dp, "pp": pp, "cp": cp}
        return sum(coords[axis] * self._strides[axis] for axis in self.axes)

    def stage_ranks(self, rank: int) -> tuple[int, ...]:
        """Every rank of ``rank``'s pipeline stage with its context-parallel coordinate,
        ordered by (dp, tp) coordinate: ``rank_of(tp=t, dp=d, pp=.., cp=..)`` for each d,
        then each t."""
        strides = self._strides
        base = rank - sum(
            ((rank // strides[axis]) % self.size(axis)) * strides[axis] for axis in ("tp", "dp")
        )
        dp_stride, tp_stride = strides["dp"], strides["tp"]
        return tuple(
            base + d * dp_stride + t * tp_stride for d in range(self.dp) for t in range(self.tp)
        )

    @property
    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every process group, name → member ranks (ascending along the axis), as a
        new dict (:meth:`members` reads one group without copying them all)."""
        return dict(self._groups)

    def members(self, group: str) -> tuple[int, ...]:
        """The member ranks of the group named ``group``."""
        return self._groups[group]

    def group_name(self, axis: str, rank: int) -> str:
        return self._group_of[(axis, rank)]

    def axis_of_group(self, name: str) -> str:
        """The axis a group belongs to (``'tp'`` for ``'tp3'``)."""
        return name.rstrip("0123456789")

    @property
    def shard_degree(self) -> int:
        """Ranks a sharded weight or optimizer state is split over: ``dp_shard`` with
        HSDP, else every rank holding the same weights (``dp``, times ``cp``)."""
        return self.dp_shard or self.replicas

    @property
    def expert_shard_degree(self) -> int:
        """Ranks a routed expert's sharded weight or optimizer state is split over: its
        expert-data-parallel group, ``shard_degree / ep`` (1 when EP spans it)."""
        return max(1, self.shard_degree // self.ep)

    def group_members(self, axis: str, rank: int) -> tuple[int, ...]:
        return self._groups[self._group_of[(axis, rank)]]

    def stage_rank(self, rank: int, pipeline_rank: int) -> int:
        """The rank at ``pipeline_rank`` of ``rank``'s pipeline (which global stages it
        holds is the recipe's :class:`~simulator.request.placement.Placement`)."""
        coords = self.coords(rank)
        return self.rank_of(
            tp=coords["tp"], dp=coords["dp"], pp=pipeline_rank, cp=coords.get("cp", 0)
        )

    def describe(self) -> str:
        order = "·".join(f"{axis}{self.size(axis)}" for axis in self.placement)
        return f"tp={self.tp} pp={self.pp} dp={self.dp} (placement {order}, innermost first)"


#: The fewest layers a pipeline stage holds where the layers do not divide over the
#: stages: ``parasim sweep`` tries such pipelines and ``parasim run`` splits them only
#: from this many a stage (a one-layer stage beside the embedding's or the output
#: layer's would make a pipeline of mostly imbalance).
FEWEST_UNEVEN_LAYERS = 2


def balanced_stages(layers: int, pp: int) -> tuple[int, ...]:
    """``layers`` over ``pp`` stages as evenly as they go, the heavier stages in the
    middle (the first holds the embedding, the last the output layer): 61 layers over 8
    stages are 7/8/8/8/8/8/7/7, as DeepSeek-V3 splits them, and Llama 3 405B's 126 over
    16 are 7/8/.../8/7. ``parasim run`` and ``parasim sweep`` split an uneven model so."""
    base, heavier = divmod(layers, pp)
    first = (pp - heavier) // 2
    return tuple(base + (first <= stage < first + heavier) for stage in range(pp))
