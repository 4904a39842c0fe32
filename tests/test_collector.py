"""``fewer_collections`` raises the young generation's threshold for a block and gives
the previous thresholds back, also when the block raises; it never makes collection
more frequent, and leaves a disabled collector disabled."""

from __future__ import annotations

import gc

import pytest

from simulator.common.collector import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture(autouse=True)
def thresholds():
    before, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*before)
    if enabled:
        gc.enable()


def test_the_block_collects_less_often_and_the_thresholds_come_back():
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        with fewer_collections():  # nested: as rare already, left alone
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("the work failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_rarer_threshold_or_a_disabled_collector_is_kept():
    gc.set_threshold(500_000, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (500_000, 10, 10)
    gc.set_threshold(0, 10, 10)  # threshold 0: automatic collection off
    with fewer_collections():
        assert gc.get_threshold()[0] == 0


def test_as_a_decorator():
    gc.set_threshold(700, 10, 10)

    @fewer_collections()
    def inside() -> int:
        return gc.get_threshold()[0]

    assert inside() == YOUNG_THRESHOLD
    assert gc.get_threshold()[0] == 700


def test_a_last_block_keeps_its_pace_only_in_a_process_that_ends_with_its_command(monkeypatch):
    import os

    from simulator.common import collector

    gc.set_threshold(700, 10, 10)
    with fewer_collections(last=True):  # nothing said: the thresholds come back
        pass
    assert gc.get_threshold() == (700, 10, 10)
    monkeypatch.setattr(collector, "_ENDS_WITH_COMMAND", None)
    collector.end_with_command()
    assert collector._ENDS_WITH_COMMAND == os.getpid()
    with fewer_collections():  # not the last block: they come back
        pass
    assert gc.get_threshold() == (700, 10, 10)
    with fewer_collections(last=True):
        pass
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    gc.set_threshold(700, 10, 10)
    monkeypatch.setattr(collector, "_ENDS_WITH_COMMAND", os.getpid() + 1)  # a forked worker
    with fewer_collections(last=True):
        pass
    assert gc.get_threshold() == (700, 10, 10)
