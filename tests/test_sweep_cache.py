"""The sweep's result cache (:mod:`simulator.tools.cache`): a rerun reads what it
checked and simulated before, byte for byte, and a changed input is simulated afresh."""

from __future__ import annotations

import json

import pytest
import yaml

import simulator.tools.sweep as sweep
from simulator.tools.cache import ResultCache

from .conftest import SCENARIOS

FIXED = {"tp": 2, "recompute": "none"}


def _sweep(path, cache, **kwargs):
    return sweep.run_sweep(path, fixed=dict(FIXED), workers=1, cache=cache, **kwargs)


def test_a_cached_rerun_is_identical_and_simulates_nothing(tmp_path, monkeypatch):
    cache = ResultCache(tmp_path / "cache")
    first = _sweep(SCENARIOS / "small.yaml", cache)
    assert first.rows and first.timing_s["cached"] == 0
    uncached = _sweep(SCENARIOS / "small.yaml", None)

    def refuse(*args, **kwargs):
        raise AssertionError("a cached candidate was simulated or checked again")

    monkeypatch.setattr(sweep, "simulate_overrides", refuse)
    monkeypatch.setattr(sweep, "_check", refuse)
    again = _sweep(SCENARIOS / "small.yaml", ResultCache(tmp_path / "cache"))
    text = json.dumps(first.to_json(), sort_keys=True)
    assert json.dumps(again.to_json(), sort_keys=True) == text
    assert json.dumps(uncached.to_json(), sort_keys=True) == text
    checked = first.counts["enumerated"]
    assert again.timing_s["cached"] == checked + len(first.rows) + first.counts["failed"]


def test_a_changed_scenario_or_file_is_simulated_afresh(tmp_path):
    raw = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    folder = tmp_path / "cache"
    first = _sweep(path, ResultCache(folder))
    # one more layer: every candidate is new
    raw["model"]["layers"] = 14  # the preset has 12
    path.write_text(yaml.safe_dump(raw))
    changed = _sweep(path, ResultCache(folder))
    assert changed.timing_s["cached"] == 0
    assert changed.rows[0]["step_time_s"] != first.rows[0]["step_time_s"]
    # the same scenario, with a profile file that then changes: its outcomes go stale
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"gpu": {"matmul_efficiency": 0.5}}))
    raw["cluster"]["profile"] = "profile.json"
    cache = ResultCache(folder)
    key = cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"])
    assert cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"]) == key
    profile.write_text(json.dumps({"gpu": {"matmul_efficiency": 0.25}}))
    assert cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"]) != key
    # a profile named by an override counts too
    other = tmp_path / "other.json"
    other.write_text("{}")
    named = cache.key("simulate", raw, str(tmp_path), ["cluster.profile=other.json"])
    other.write_text('{"changed": true}')
    assert cache.key("simulate", raw, str(tmp_path), ["cluster.profile=other.json"]) != named


@pytest.mark.parametrize("overrides", [["parallel.tp=2"], ["parallel.tp=4"]])
def test_keys_differ_by_candidate_and_kind(overrides, tmp_path):
    raw = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    cache = ResultCache(tmp_path)
    keys = {
        cache.key(kind, raw, str(SCENARIOS), o)
        for kind in ("check", "simulate")
        for o in (overrides, [])
    }
    assert len(keys) == 4


@pytest.mark.slow
def test_the_command_keeps_its_cache_beside_the_output_folder(tmp_path):
    from simulator.cli.main import main

    argv = ["sweep", str(SCENARIOS / "small.yaml"), "--fix", "tp=2", "--fix", "recompute=none"]
    assert main([*argv, "--workers", "1", "--out", str(tmp_path / "a")]) == 0
    assert any((tmp_path / ".parasim-cache").rglob("*.json"))
    assert main([*argv, "--workers", "1", "--no-cache", "--out", str(tmp_path / "b" / "c")]) == 0
    assert not (tmp_path / "b" / ".parasim-cache").exists()
    mine = tmp_path / "mine"
    assert main([*argv, "--workers", "1", "--cache", str(mine), "--out", str(tmp_path / "d")]) == 0
    assert any(mine.rglob("*.json"))
    first = (tmp_path / "a" / "sweep.json").read_bytes()
    assert (tmp_path / "b" / "c" / "sweep.json").read_bytes() == first
    assert (tmp_path / "d" / "sweep.json").read_bytes() == first
