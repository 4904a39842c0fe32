"""The rank grid and its process groups."""

from __future__ import annotations

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
