"""A folded call's images made from one plan per class, in arrays, price and merge to
the bit what planning every image on its own gives; images that are not placed alike
are planned one by one."""

from __future__ import annotations

import pytest

from simulator.engine.alone import AloneTimes, ListedImages, time_alone, with_images
from simulator.engine.collectives import collective_transfers
from simulator.engine.images import ImageLoads, collective_image_loads
from simulator.schedule.ir import Collective

from .helpers import cluster

KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def _machine(preset: str = "dgx-h100"):
    # pods of 2 nodes behind an oversubscribed core: images inside a pod and across
    return cluster(
        preset,
        nodes=6,
        network={"pod_size": 2, "oversubscription": 2.0, "core_oversubscription": 2.0},
    )


def _one_by_one(alone: AloneTimes, group: str, kind: str, size: float) -> tuple:
    choice, specs = collective_transfers(
        alone.cluster, kind, alone.group_gpus[group], size, None, alone.algorithm, alone.protocol
    )
    listed = alone.image_transfers(group, kind, size, choice, specs)
    return choice, specs, listed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-l40s"])
def test_collective_images_in_arrays_are_each_image_planned(kind, preset):
    machine = _machine(preset)
    per_node = machine.gpus_per_node
    # a data-parallel group per local GPU: one GPU on each of nodes 0, 1, 3 and 4
    groups = {f"dp{i}": [node * per_node + i for node in (0, 1, 3, 4)] for i in range(per_node)}
    images = {"dp0": [groups[f"dp{i}"] for i in range(per_node)]}
    for protocol in (None, "Simple"):
        alone = AloneTimes(machine, groups, None, protocol, images=images)
        for size in (4e3, 3.5e7):
            choice, specs, listed = _one_by_one(alone, "dp0", kind, size)
            made = alone.collective_images("dp0", kind, size, choice, specs)
            assert isinstance(made, ImageLoads), (kind, size)
            every = [spec for image in listed for spec in image]
            assert made.seconds(machine) == time_alone(machine, every, choice.latency)
            assert made.merged() == with_images(specs, listed)


def test_images_placed_unlike_the_simulated_group_are_planned_one_by_one():
    machine = _machine()
    # the simulated group on two nodes, an image of it on one
    groups = {"a": [0, 8], "b": [1, 2]}
    alone = AloneTimes(machine, groups, None, None, images={"a": [[0, 8], [1, 2]]})
    choice, specs, listed = _one_by_one(alone, "a", "all_reduce", 1e6)
    own, images = [0, 8], [[0, 8], [1, 2]]
    assert collective_image_loads(machine, "all_reduce", own, images, 1e6, choice, specs) is None
    made = alone.collective_images("a", "all_reduce", 1e6, choice, specs)
    assert isinstance(made, ListedImages)
    every = [spec for image in listed for spec in image]
    assert made.seconds(machine) == time_alone(machine, every, choice.latency)


@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-l40s"])
def test_send_images_in_arrays_are_each_image_planned(preset):
    machine = _machine(preset)
    gpus, per_node = machine.num_gpus, machine.gpus_per_node
    # a pipeline send from every GPU of nodes 0-2 to the same GPU three nodes on
    sources = list(range(3 * per_node))
    destinations = [gpu + 3 * per_node for gpu in sources]
    assert destinations[-1] < gpus
    alone = AloneTimes(
        machine, {}, None, None, rank_images={0: sources, 3 * per_node: destinations}
    )
    made = alone.p2p_images_of(0, 3 * per_node, 2.5e6)
    assert isinstance(made, ImageLoads)
    listed = alone.p2p_images(0, 3 * per_node, 2.5e6)
    every = [spec for image in listed for spec in image]
    assert made.seconds(machine) == time_alone(machine, every, every[0].latency)
    assert made.merged() == with_images(listed[0], listed)


def _priced(machine, groups, images, rank_images, kind, size, pair):
    """A fresh pricing (no plan shared with another) of ``groups``' first collective
    and of the send ``pair``, each with its images."""
    alone = AloneTimes(machine, groups, None, None, images=images, rank_images=rank_images)
    name = next(iter(groups))
    return alone.collective(_op(name, kind, size))[0], alone.p2p(*pair, size)


def _op(group, kind, size):
    return Collective(id=0, stream="comm", group=group, kind=kind, bytes=size)


def _moved_by(shift, groups, images, rank_images, pair):
    def move(gpus):
        return [gpu + shift for gpu in gpus]

    return (
        {name: move(members) for name, members in groups.items()},
        {name: [move(image) for image in found] for name, found in images.items()},
        {rank + shift: move(ranks) for rank, ranks in rank_images.items()},
        (pair[0] + shift, pair[1] + shift),
    )


@pytest.mark.parametrize(
    ("network", "nodes", "step"),
    [({}, 8, 1), ({"pod_size": 2, "oversubscription": 2.0, "core_oversubscription": 2.0}, 8, 2)],
)
@pytest.mark.parametrize("kind", KINDS)
def test_calls_moved_as_the_fabric_allows_cost_the_same(network, nodes, step, kind):
    """A call and its images moved by whole nodes in one pod, by whole pods where the
    pods are alike, cost what they cost where they were: each priced afresh on its own
    cluster, and through the key that lets one price stand for the other."""
    per_node = 8
    # a data-parallel group per local GPU of nodes 0 and 1, and a send from node 0 to 1
    groups = {f"dp{i}": [i, per_node + i] for i in range(per_node)}
    images = {"dp0": [groups[f"dp{i}"] for i in range(per_node)]}
    sources = list(range(per_node))
    rank_images = {0: sources, per_node: [gpu + per_node for gpu in sources]}
    pair = (0, per_node)
    for size in (4e3, 3.5e7):
        where = _priced(
            cluster("dgx-h100", nodes, network=network),
            groups,
            images,
            rank_images,
            kind,
            size,
            pair,
        )
        for nodes_moved in range(step, nodes - 1, step):
            machine = cluster("dgx-h100", nodes, network=network)
            assert machine.symmetric_shift(nodes_moved * per_node) == nodes_moved * per_node
            moved = _moved_by(nodes_moved * per_node, groups, images, rank_images, pair)
            assert _priced(machine, *moved[:3], kind, size, moved[3]) == where


def test_a_fabric_says_how_far_a_call_may_move():
    one_pod = cluster("dgx-h100", 4)
    assert [one_pod.symmetric_shift(gpu) for gpu in (0, 7, 8, 31)] == [0, 0, 8, 24]
    alike = cluster("dgx-h100", 6, network={"pod_size": 2})
    assert [alike.symmetric_shift(gpu) for gpu in (8, 16, 47)] == [0, 16, 32]
    # the last pod smaller: its spine's links are slower, so nothing moves
    unlike = cluster("dgx-h100", 5, network={"pod_size": 2})
    assert [unlike.symmetric_shift(gpu) for gpu in (8, 16, 39)] == [0, 0, 0]
    # a send from one pod to the next costs more where the next is the smaller pod
    slower = cluster("dgx-h100", 5, network={"pod_size": 2, "oversubscription": 4.0})
    times = [AloneTimes(slower, {}).p2p(src, src + 16, 1e8) for src in (8, 16)]
    assert times[0] < times[1]
