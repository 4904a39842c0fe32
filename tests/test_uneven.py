"""An uneven all-to-all priced in arrays, its pairs planned by class, takes to the bit
the time of planning every pair as a send/recv of its own and timing them alone."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine.alone import time_alone
from simulator.engine.collectives import collective_transfers
from simulator.engine.uneven import uneven_all_to_all

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
