"""An uneven all-to-all priced in arrays, its pairs planned by class, takes to the bit
the time of planning every pair as a send/recv of its own and timing them alone; as one
coflow on the flow network it takes that time alone and shares links beside others."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.engine.alone import time_alone
from simulator.engine.collectives import collective_transfers
from simulator.engine.network import FlowNetwork
from simulator.engine.uneven import uneven_all_to_all, uneven_coflow

from .helpers import cluster


@pytest.mark.parametrize("protocol", [None, "Simple", "LL"])
@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-l40s"])
def test_an_uneven_all_to_all_in_arrays_is_every_pair_planned(preset, protocol):
    machine = cluster(preset, nodes=4, network={"pod_size": 2, "oversubscription": 2.0})
    rng = np.random.default_rng(5)
    gpus = sorted(rng.choice(machine.num_gpus, size=12, replace=False).tolist())
    for scale in (1e3, 1e5, 1e8):  # sizes where each protocol is the cheapest
        matrix = rng.integers(0, 4, size=(12, 12)) * rng.uniform(0.5, 2.0, size=(12, 12)) * scale
        splits = {gpu: tuple(matrix[i].tolist()) for i, gpu in enumerate(gpus)}
        choice, specs = collective_transfers(
            machine, "all_to_all", gpus, float(matrix.sum()), splits, None, protocol
        )
        priced = uneven_all_to_all(machine, gpus, splits, protocol)
        assert priced is not None
        made, seconds = priced
        assert (made.algorithm, made.protocol) == (choice.algorithm, choice.protocol)
        assert seconds == time_alone(machine, specs, choice.latency)


def test_nothing_to_move_is_left_to_the_plan_of_every_pair():
    machine = cluster("dgx-h100", nodes=2)
    splits = {gpu: (0.0,) * 4 for gpu in range(4)}
    assert uneven_all_to_all(machine, list(range(4)), splits) is None


def _finish_times(machine, specs) -> list[float]:
    """When each of ``specs``, started together on the flow network, ends."""
    env = simpy.Environment()
    network = FlowNetwork(env, machine.bandwidths.tolist())
    ended = [0.0] * len(specs)
    for index, spec in enumerate(specs):
        network.transfer(
            spec.usage, spec.volume, spec.latency, lambda i=index: ended.__setitem__(i, env.now)
        )
    env.run()
    return ended


@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-l40s"])
def test_an_uneven_all_to_all_as_one_coflow_takes_its_priced_time_alone(preset):
    machine = cluster(preset, nodes=4, network={"pod_size": 2, "oversubscription": 2.0})
    rng = np.random.default_rng(7)
    gpus = sorted(rng.choice(machine.num_gpus, size=12, replace=False).tolist())
    for scale in (1e3, 1e5, 1e8):
        matrix = rng.integers(0, 4, size=(12, 12)) * rng.uniform(0.5, 2.0, size=(12, 12)) * scale
        splits = {gpu: tuple(matrix[i].tolist()) for i, gpu in enumerate(gpus)}
        priced = uneven_all_to_all(machine, gpus, splits)
        coflow = uneven_coflow(machine, gpus, splits)
        assert priced is not None and coflow is not None
        assert coflow[0] == priced[0]
        (alone,) = _finish_times(machine, [coflow[1]])
        assert alone == pytest.approx(priced[1], rel=1e-12)


def test_a_coflow_weighs_on_a_shared_link_as_the_pairs_that_cross_it():
    # two GPUs of one node send to two of another through their NICs: a send of the
    # same size on one sender's NIC beside the coflow gets what one more pair would
    machine = cluster("dgx-h100", nodes=2)
    gpus = [0, 1, 8, 9]
    size = 1e9
    splits = {0: (0, 0, size, size), 1: (0, 0, size, size), 8: (0,) * 4, 9: (0,) * 4}
    coflow = uneven_coflow(machine, gpus, splits)
    assert coflow is not None
    spec = coflow[1]
    nic = machine.links_of_gpu(0)
    crossed = [link for link in spec.usage if link in nic]
    assert crossed and all(spec.usage[link] == pytest.approx(2.0) for link in crossed)
    (alone,) = _finish_times(machine, [spec])
    other = collective_transfers(machine, "p2p", [0, 8], size, None, None, None)[1][0]
    together = _finish_times(machine, [spec, other])
    # the coflow slows beside the send, and the send gets about a third of the NIC
    assert together[0] > alone * 1.2
    assert together[1] > 2.5 * _finish_times(machine, [other])[0]
