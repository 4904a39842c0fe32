"""A send/recv's images priced by class: the plans NCCL's model makes per image are made
once per class of route (in a node or not, and the slowest link's rate), and every
image keeps its own route's links; the transfers, and so the step, are the ones each
image planned on its own gives, to the bit."""

from __future__ import annotations

import pytest

from simulator.engine.alone import AloneTimes, time_alone
from simulator.engine.collectives import p2p_transfer

from .helpers import cluster


@pytest.mark.parametrize("protocol", [None, "Simple"])
def test_images_priced_by_class_are_each_image_planned_alone(protocol):
    # 6 nodes in pods of 2 behind an oversubscribed core: images inside a node, across
    # a leaf, across pods, on other rails
    machine = cluster(
        "dgx-h100",
        nodes=6,
        network={"pod_size": 2, "oversubscription": 2.0, "core_oversubscription": 2.0},
    )
    gpus = machine.num_gpus
    sources = list(range(0, gpus, 3))
    destinations = [
        (gpu + (9 if i % 2 == 0 else 3 + 16 * (i % 3))) % gpus for i, gpu in enumerate(sources)
    ]
    routes = [machine.route(a, b) for a, b in zip(sources, destinations, strict=True)]
    rates = {min(machine.links[link].bandwidth for link in route.links) for route in routes}
    in_node = {
        machine.node_of(a) == machine.node_of(b) for a, b in zip(sources, destinations, strict=True)
    }
    assert len(rates) >= 2 and in_node == {True, False}  # several classes of route
    images = {sources[0]: tuple(sources), destinations[0]: tuple(destinations)}
    alone = AloneTimes(machine, {}, None, protocol, rank_images=images)
    priced = alone.p2p_images(sources[0], destinations[0], 3.5e6)
    expected = [
        [p2p_transfer(machine, a, b, 3.5e6, protocol)]
        for a, b in zip(sources, destinations, strict=True)
    ]
    assert priced == expected
    specs = [spec for image in priced for spec in image]
    assert alone.p2p(sources[0], destinations[0], 3.5e6) == time_alone(
        machine, specs, specs[0].latency
    )
