"""The rank grid and its process groups."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.common.errors import ScenarioError
from simulator.request.layout import Layout


def test_default_placement_puts_tp_innermost():
    layout = Layout(tp=8, pp=4, dp=2)
    assert layout.world == 64
    assert layout.group_members("tp", 0) == tuple(range(8))
    assert layout.group_members("dp", 0) == (0, 8)
    assert layout.group_members("pp", 0) == (0, 16, 32, 48)
    assert layout.coords(27) == {"tp": 3, "dp": 1, "pp": 1}


@pytest.mark.parametrize("placement", [("tp", "dp", "pp"), ("pp", "tp", "dp"), ("dp", "pp", "tp")])
def test_groups_partition_the_ranks(placement):
    layout = Layout(tp=2, pp=3, dp=4, placement=placement)
    for axis in ("tp", "dp", "pp"):
        seen = sorted(
            r for name, members in layout.groups.items() if name.startswith(axis) for r in members
        )
        assert seen == list(range(layout.world))
    for rank in range(layout.world):
        coords = layout.coords(rank)
        assert layout.rank_of(**coords) == rank
        assert layout.stage_rank(rank, coords["pp"]) == rank


def test_placement_must_be_a_permutation():
    with pytest.raises(ScenarioError, match="parallel.placement"):
        Layout(tp=2, pp=1, dp=1, placement=("tp", "tp", "pp"))


@pytest.mark.parametrize("tp, pp, dp, cp", [(2, 4, 3, 1), (4, 2, 2, 2), (1, 8, 4, 1)])
def test_a_stage_s_ranks_are_its_grid_points_in_dp_then_tp_order(tp, pp, dp, cp):
    import itertools

    for order in itertools.permutations(("tp", "dp", "pp")):
        layout = Layout(tp=tp, pp=pp, dp=dp, placement=order, cp=cp)
        for rank in range(layout.world):
            at = layout.coords(rank)
            expected = tuple(
                layout.rank_of(tp=t, dp=d, pp=at["pp"], cp=at.get("cp", 0))
                for d in range(dp)
                for t in range(tp)
            )
            assert layout.stage_ranks(rank) == expected
    assert layout.members(layout.group_name("tp", 0)) == layout.groups[layout.group_name("tp", 0)]


def _groups_by_listing(layout: Layout) -> tuple[dict, dict]:
    """Every group and each rank's group found by walking every rank: each axis's
    groups named in the order of their lowest rank, the DP groups split into blocks
    (ep, dp_shard) and across them (edp, dp_replicate), and with cp the (dp, cp)
    ranks of each (tp, pp) point."""
    groups: dict[str, tuple[int, ...]] = {}
    group_of: dict[tuple[str, int], str] = {}
    for axis in layout.axes:
        by_lowest: dict[tuple[int, ...], str] = {}
        for rank in range(layout.world):
            coords = layout.coords(rank)
            members = tuple(layout.rank_of(**{**coords, axis: i}) for i in range(layout.size(axis)))
            name = by_lowest.setdefault(members, f"{axis}{len(by_lowest)}")
            groups[name] = members
            group_of[(axis, rank)] = name
    dp_groups = [m for name, m in groups.items() if name.rstrip("0123456789") == "dp"]
    for block, inner, outer in (
        (layout.ep, "ep", "edp"),
        (layout.dp_shard, "dp_shard", "dp_replicate"),
    ):
        if not (block > 1 or (inner == "dp_shard" and block)):
            continue
        for axis, parts in (
            (inner, [m[j : j + block] for m in dp_groups for j in range(0, len(m), block)]),
            (outer, [m[r::block] for m in dp_groups for r in range(block)]),
        ):
            for index, members in enumerate(sorted(parts, key=min)):
                groups[f"{axis}{index}"] = members
                for rank in members:
                    group_of[(axis, rank)] = f"{axis}{index}"
    if layout.cp > 1:
        found: dict[tuple[int, ...], str] = {}
        for rank in range(layout.world):
            c = layout.coords(rank)
            members = tuple(
                layout.rank_of(tp=c["tp"], pp=c["pp"], dp=d, cp=k)
                for d in range(layout.dp)
                for k in range(layout.cp)
            )
            name = found.setdefault(members, f"dp_cp{len(found)}")
            groups[name] = members
            group_of[("dp_cp", rank)] = name
    return groups, group_of


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize(
    "placement", [("tp", "dp", "pp"), ("pp", "dp", "tp"), ("dp", "tp", "pp"), ("tp", "pp", "dp")]
)
def test_groups_by_arithmetic_are_the_groups_found_by_walking_every_rank(placement, cp):
    for tp, pp, dp, ep, dp_shard in [
        (2, 3, 4, 2, 0),
        (4, 2, 8, 4, 2),
        (1, 1, 8, 1, 1),
        (2, 2, 4, 1, 4),
    ]:
        layout = Layout(tp, pp, dp, placement, ep, dp_shard, cp)
        groups, group_of = _groups_by_listing(layout)
        assert list(layout.groups.items()) == list(groups.items())
        for (axis, rank), name in group_of.items():
            assert layout.group_name(axis, rank) == name
            assert layout.group_members(axis, rank) == groups[name]
        assert sorted(groups, key=layout.group_order) == list(groups)
    with pytest.raises(KeyError):
        layout.members(f"dp{len([g for g in groups if g.startswith('dp') and g[2:].isdigit()])}")


def test_a_grid_axis_s_groups_as_rows_are_its_named_groups():
    layout = Layout(2, 3, 4, ("dp", "tp", "pp"))
    ranks = np.arange(layout.world)
    for axis in ("tp", "dp", "pp"):
        rows = layout.axis_groups(axis)
        assert [tuple(row) for row in rows.tolist()] == [
            layout.members(f"{axis}{i}") for i in range(len(rows))
        ]
        numbers = layout.axis_group_numbers(axis, ranks).tolist()
        assert [f"{axis}{n}" for n in numbers] == [layout.group_name(axis, r) for r in ranks]
