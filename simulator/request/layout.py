"""The rank grid: how ``tp``, ``pp`` and ``dp`` map onto ranks, and the process groups.

Like torchtitan's ``ParallelDims``, a :class:`Layout` is a small dataclass of named
axes that validates itself with messages stating the numbers. ``placement`` lists the
axes innermost first: with ``[tp, dp, pp]`` consecutive ranks differ in their TP
coordinate, so a TP group of 8 fills one 8-GPU node, the DP peers come next, and the
pipeline stages are the outermost (Megatron-LM's default rank order). Rank ``r`` runs
on GPU ``r`` of the cluster.

Process groups are named ``<axis><index>`` (``tp0``, ``dp3``, ``pp1``), indexed in the
order of their lowest rank. A group's members and a rank's group are arithmetic on the
grid, never listed for every rank: a grid of 131,072 ranks costs no more than one of
eight until something asks for every group (:attr:`Layout.groups`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from simulator.common.errors import ScenarioError
from simulator.common.vocabulary import GRID_AXES, PLACEMENT_AXES

__all__ = ["Layout", "balanced_stages", "FEWEST_UNEVEN_LAYERS"]


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

    # -- process groups ----------------------------------------------------------------
    #
    # A grid axis's group is known by its lowest rank, its base (coordinate 0 on the
    # axis); numbered in the order of their bases, the group of base b = hi·(s·n) + lo
    # (stride s and size n of the axis, lo < s) is number hi·s + lo. Expert parallelism
    # splits each DP group into blocks of ep consecutive replicas (the EP groups); the
    # replicas holding the same experts form the expert-data-parallel (edp) groups that
    # reduce expert gradients. HSDP splits it the same way: shard groups of dp_shard
    # consecutive replicas, replicate groups across them (torchtitan's ParallelDims:
    # dp_replicate outside dp_shard). With context parallelism the ranks holding the same
    # weights, every (dp, cp) coordinate of a (tp, pp) one, form the dp_cp groups.

    @functools.cached_property
    def _splits(self) -> dict[str, tuple[int, bool]]:
        """The axes that split the DP groups: name → (block, whether a group is a block
        of consecutive replicas rather than one replica of each block)."""
        splits: dict[str, tuple[int, bool]] = {}
        if self.ep > 1:
            splits["ep"], splits["edp"] = (self.ep, True), (self.ep, False)
        if self.dp_shard:
            splits["dp_shard"] = (self.dp_shard, True)
            splits["dp_replicate"] = (self.dp_shard, False)
        return splits

    @functools.cached_property
    def _group_axes(self) -> tuple[str, ...]:
        """Every axis with groups, in the order :attr:`groups` lists them."""
        return (*self.axes, *self._splits, *(("dp_cp",) if self.cp > 1 else ()))

    def _group_count(self, axis: str) -> int:
        if axis == "dp_cp":
            return self.tp * self.pp
        split = self._splits.get(axis)
        if split is None:
            return self.world // self.size(axis)
        block, consecutive = split
        return self.world // self.dp * (self.dp // block if consecutive else block)

    def _cp_bases(self) -> list[int]:
        """The lowest ranks of the dp_cp groups, in order."""
        return sorted(self.rank_of(tp=t, pp=p) for t in range(self.tp) for p in range(self.pp))

    def members(self, group: str) -> tuple[int, ...]:
        """The member ranks of the group named ``group`` (ascending along its axis)."""
        axis = self.axis_of_group(group)
        digits = group[len(axis) :]
        if (
            axis not in self._group_axes
            or not digits.isdigit()
            or str(int(digits)) != digits
            or int(digits) >= self._group_count(axis)
        ):
            raise KeyError(group)
        index = int(digits)
        if axis == "dp_cp":
            coords = self.coords(self._cp_bases()[index])
            return tuple(
                self.rank_of(tp=coords["tp"], pp=coords["pp"], dp=d, cp=c)
                for d in range(self.dp)
                for c in range(self.cp)
            )
        split = self._splits.get(axis)
        stride = self._strides["dp" if split else axis]
        size = self.dp if split else self.size(axis)
        if split is None:
            base = index // stride * stride * size + index % stride
            return tuple(base + i * stride for i in range(size))
        block, consecutive = split
        per = size // block if consecutive else block  # groups per (lo, hi)
        hi, rest = divmod(index, per * stride)
        part, lo = divmod(rest, stride)
        base = hi * stride * size + lo
        if consecutive:
            return tuple(base + (part * block + i) * stride for i in range(block))
        return tuple(base + (part + k * block) * stride for k in range(size // block))

    def group_name(self, axis: str, rank: int) -> str:
        """The name of ``rank``'s group on ``axis``."""
        if not 0 <= rank < self.world:
            raise KeyError((axis, rank))
        if axis == "dp_cp" and self.cp > 1:
            coords = self.coords(rank)
            base = self.rank_of(tp=coords["tp"], pp=coords["pp"])
            return f"dp_cp{self._cp_bases().index(base)}"
        split = self._splits.get(axis)
        grid = axis if split is None else "dp"
        if grid not in self.axes:
            raise KeyError((axis, rank))
        stride, size = self._strides[grid], self.size(grid)
        hi, within = divmod(rank, stride * size)
        coord, lo = divmod(within, stride)
        if split is None:
            return f"{axis}{hi * stride + lo}"
        block, consecutive = split
        part, per = (coord // block, size // block) if consecutive else (coord % block, block)
        return f"{axis}{(hi * per + part) * stride + lo}"

    def axis_groups(self, axis: str, numbers: np.ndarray | None = None) -> np.ndarray:
        """Groups of grid axis ``axis`` as rows of member ranks: the groups numbered
        ``numbers`` (row ``i`` the group ``f"{axis}{numbers[i]}"``), every group by
        default."""
        stride, size = self._strides[axis], self.size(axis)
        index = np.arange(self.world // size) if numbers is None else np.asarray(numbers)
        base = index // stride * stride * size + index % stride
        return base[:, None] + np.arange(size) * stride

    def axis_group_numbers(self, axis: str, ranks: np.ndarray) -> np.ndarray:
        """The number of each rank's group on grid axis ``axis`` (``tp``, ``dp``, ``pp``
        or ``cp``): :meth:`group_name` for many ranks at once."""
        stride, size = self._strides[axis], self.size(axis)
        hi, within = np.divmod(np.asarray(ranks), stride * size)
        return hi * stride + within % stride

    def group_order(self, group: str) -> tuple[int, int]:
        """Where the group named ``group`` comes in :attr:`groups`: (its axis's place,
        its number)."""
        axis = self.axis_of_group(group)
        return self._group_axes.index(axis), int(group[len(axis) :])

    def group_members(self, axis: str, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group on ``axis``."""
        return self.members(self.group_name(axis, rank))

    @property
    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every process group, name → member ranks (ascending along the axis), as a
        new dict: O(world); :meth:`members` reads one group."""
        return {
            f"{axis}{index}": self.members(f"{axis}{index}")
            for axis in self._group_axes
            for index in range(self._group_count(axis))
        }

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
        grid = base + np.arange(self.dp)[:, None] * dp_stride + np.arange(self.tp) * tp_stride
        return tuple(grid.ravel().tolist())

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
