"""The sweep's result cache (:mod:`simulator.tools.cache`): a rerun reads what it
checked and simulated before, byte for byte; an edit of any file the run reads (the
scenario, a profile named relative to the working directory or in the scenario, a
topology, a pipeline order) is simulated afresh, so the cached sweep always equals a
fresh one; and an entry edited on disk is a miss, never a ranking or a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

import simulator.tools.pool as pool
import simulator.tools.sweep as sweep
from simulator.request.orders import dump_csv_order
from simulator.schedule.pipeline import gpipe_order, one_f_one_b_order
from simulator.tools.cache import ENTRY_SCHEMAS, ResultCache, named_files, valid_entry

from .conftest import ROOT, SCENARIOS
from .helpers import A100_PROFILE

FIXED = {"tp": 2, "recompute": "none"}
# a handful of candidates: enough to rank, quick to simulate
FEW = {
    "tp": 2,
    "recompute": "none",
    "sharding": "none",
    "micro_batch": 2,
    "placement": "tp,dp,pp",
    "sp": False,
}


def _sweep(path, cache, fixed=FIXED, **kwargs):
    return sweep.run_sweep(path, fixed=dict(fixed), workers=1, cache=cache, **kwargs)


def _text(result) -> str:
    return json.dumps(result.to_json(), sort_keys=True)


def test_a_cached_rerun_is_identical_and_simulates_nothing(tmp_path, monkeypatch):
    cache = ResultCache(tmp_path / "cache")
    first = _sweep(SCENARIOS / "small.yaml", cache, FEW)
    assert first.rows and first.timing_s["cached"] == 0
    uncached = _sweep(SCENARIOS / "small.yaml", None, FEW)

    def refuse(*args, **kwargs):
        raise AssertionError("a cached candidate was simulated or checked again")

    monkeypatch.setattr(pool, "simulate_overrides", refuse)
    monkeypatch.setattr(pool, "_check", refuse)
    again = _sweep(SCENARIOS / "small.yaml", ResultCache(tmp_path / "cache"), FEW)
    text = _text(first)
    assert _text(again) == text
    assert _text(uncached) == text
    checked = first.counts["enumerated"]
    # the scenario's own layout (tp2 pp1 dp4 mb4) lies outside the pinned space: it
    # was checked and simulated on its own, and read back too
    assert first.scenario_layout["unranked"] == "outside the searched space"
    simulated = len(first.rows) + first.counts["failed"]
    assert again.timing_s["cached"] == checked + simulated + 2


def test_a_changed_scenario_or_file_changes_the_key(tmp_path):
    raw = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"gpu": {"matmul_efficiency": 0.5}}))
    raw["cluster"]["profile"] = "profile.json"
    cache = ResultCache(tmp_path / "cache")
    key = cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"])
    assert cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"]) == key
    profile.write_text(json.dumps({"gpu": {"matmul_efficiency": 0.25}}))
    assert cache.key("simulate", raw, str(tmp_path), ["parallel.tp=2"]) != key
    # a profile named by an override counts too, however the override names it
    other = tmp_path / "other.json"
    other.write_text("{}")
    for override in (
        "cluster.profile=other.json",
        "cluster={preset: dgx-a100, profile: other.json}",
    ):
        named = cache.key("simulate", raw, str(tmp_path), [override])
        other.write_text(other.read_text() + " ")
        assert cache.key("simulate", raw, str(tmp_path), [override]) != named


def test_a_relative_name_is_looked_up_wherever_a_loader_may_read_it(tmp_path, monkeypatch):
    scenario_folder, working = tmp_path / "scenario", tmp_path / "work"
    scenario_folder.mkdir()
    working.mkdir()
    monkeypatch.chdir(working)
    raw = {
        "cluster": {"topology": "ring.yaml", "profile": "p.json"},
        "parallel": {"schedule_file": "order.csv"},
    }
    files = named_files(raw, str(scenario_folder))
    # the topology: beside the scenario, in the working folder, in parasim's package
    assert files == {
        "cluster.profile": [None, None],
        "cluster.topology": [None, None, None],
        "parallel.schedule_file": [None, None],
    }
    (working / "p.json").write_text("{}")
    (scenario_folder / "order.csv").write_text("0F0\n")
    files = named_files(raw, str(scenario_folder))
    assert files["cluster.profile"][0] is not None  # read from the working folder
    assert files["parallel.schedule_file"][0] is not None  # beside the scenario first
    shipped = named_files({"cluster": {"topology": "examples/switch-ring-2d.yaml"}}, "/")
    assert shipped["cluster.topology"][2] is not None


def _profile(path, efficiency):
    """A profile whose GEMMs reach ``efficiency`` (its measured table's too, which sets
    every GEMM's time where a profile has one)."""
    gpu = {
        **A100_PROFILE["gpu"],
        "matmul_efficiency": efficiency,
        "gemm_table": [[4096, 4096, 4096, efficiency]],
    }
    path.write_text(json.dumps({**A100_PROFILE, "gpu": gpu}))


def _scenario(folder, **changes):
    raw = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    for section, values in changes.items():
        raw[section] = {**raw.get(section, {}), **values}
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _profile_from_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _profile(tmp_path / "prof.json", 0.7)
    kwargs = {"overrides": ["cluster.profile=prof.json"]}
    return SCENARIOS / "small.yaml", kwargs, lambda: _profile(tmp_path / "prof.json", 0.07)


def _profile_named_in_the_scenario(tmp_path, monkeypatch):
    # the scenario in one folder, the run in another: the profile read is the one in
    # the working folder, and a file of that name beside the scenario counts as well
    scenario_folder, working = tmp_path / "scenarios", tmp_path / "work"
    scenario_folder.mkdir()
    (working / "profiles").mkdir(parents=True)
    monkeypatch.chdir(working)
    path = _scenario(scenario_folder, cluster={"profile": "profiles/p.json"})
    _profile(working / "profiles" / "p.json", 0.7)
    return path, {}, lambda: _profile(working / "profiles" / "p.json", 0.3)


def _topology(tmp_path, monkeypatch):
    ring = yaml.safe_load((ROOT / "topologies" / "examples" / "switch-ring-2d.yaml").read_text())
    ring["dimensions"][0]["size"] = 8

    def write(bandwidth):
        ring["dimensions"][1]["bandwidth"] = bandwidth
        (tmp_path / "ring.yaml").write_text(yaml.safe_dump(ring))

    write("50 GB/s")
    path = _scenario(tmp_path, cluster={"topology": "ring.yaml"})
    raw = yaml.safe_load(path.read_text())
    raw["cluster"] = {"topology": "ring.yaml"}
    path.write_text(yaml.safe_dump(raw))
    return path, {"gpus": None}, lambda: write("5 GB/s")


def _schedule_file(tmp_path, monkeypatch):
    # the candidates name built-in schedules; the scenario's own layout keeps its order
    dump_csv_order(one_f_one_b_order(2, 4), tmp_path / "order.csv")
    path = _scenario(
        tmp_path,
        training={"global_batch": 16, "micro_batch": 2},
        parallel={"tp": 2, "pp": 2, "dp": 2, "schedule": "custom", "schedule_file": "order.csv"},
    )
    return path, {}, lambda: dump_csv_order(gpipe_order(2, 4), tmp_path / "order.csv")


def _the_scenario_itself(tmp_path, monkeypatch):
    path = _scenario(tmp_path)

    def edit():
        raw = yaml.safe_load(path.read_text())
        raw["model"]["layers"] = 14  # the preset has 12
        path.write_text(yaml.safe_dump(raw))

    return path, {}, edit


@pytest.mark.parametrize(
    "setup",
    [
        _profile_from_the_working_folder,
        _profile_named_in_the_scenario,
        _topology,
        _schedule_file,
        _the_scenario_itself,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_after_an_edit_of_any_file_the_cached_sweep_equals_a_fresh_one(
    setup, tmp_path, monkeypatch
):
    path, kwargs, edit = setup(tmp_path, monkeypatch)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    folder = tmp_path / "cache"
    before = _sweep(path, ResultCache(folder), FEW, **kwargs)
    edit()
    cached = _sweep(path, ResultCache(folder), FEW, **kwargs)
    fresh = _sweep(path, None, FEW, **kwargs)
    assert _text(cached) == _text(fresh)
    assert _text(fresh) != _text(before)  # the edit matters


def _entry_path(folder, kind_status):
    """A cached entry of the given status, by reading every entry."""
    for path in sorted(folder.rglob("*.json")):
        if json.loads(path.read_text()).get("status") == kind_status:
            return path
    raise AssertionError(f"no {kind_status} entry in {folder}")


TAMPERED = {
    "negative step": lambda entry: {**entry, "step_time_s": -5.0},
    "zero step": lambda entry: {**entry, "step_time_s": 0.0},
    "empty": lambda entry: {},
    "null": lambda entry: None,
    "a string": lambda entry: "fast",
    "partial": lambda entry: {k: v for k, v in entry.items() if k != "mfu"},
    "a number as text": lambda entry: {**entry, "tokens_per_s": "1e9"},
    "infinite": lambda entry: {**entry, "step_time_s": float("inf")},
    "another kind": lambda entry: {"status": "invalid", "reason": "made up"},
    "an extra field": lambda entry: {**entry, "bonus": 1},
}


@pytest.mark.parametrize("name", [*TAMPERED, "not JSON", "deep JSON"])
def test_a_tampered_entry_is_a_miss_and_is_written_over(name, tmp_path):
    folder = tmp_path / "cache"
    pins = {**FEW, "pp": 1, "dp": 4, "placement": "tp,dp,pp"}
    first = _sweep(SCENARIOS / "small.yaml", ResultCache(folder), pins)
    path = _entry_path(folder, "simulated")
    entry = json.loads(path.read_text())
    if name == "not JSON":
        path.write_text('{"status": "simulated", "step_time_s": ')
    elif name == "deep JSON":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        path.write_text(json.dumps(TAMPERED[name](entry)))
    cache = ResultCache(folder)
    again = _sweep(SCENARIOS / "small.yaml", cache, pins)
    assert _text(again) == _text(first)
    assert cache.rejected == 1
    assert json.loads(path.read_text()) == entry  # computed afresh and written over


def test_the_entry_schemas_are_what_a_sweep_writes():
    result = _sweep(SCENARIOS / "small.yaml", None, {**FEW, "pp": 1})
    row = result.rows[0]
    simulated = {
        key: row[key]
        for key in ENTRY_SCHEMAS["simulate"].json_schema()["$defs"]["_Simulated"]["properties"]
        if key != "status"
    }
    assert valid_entry("simulate", {"status": "simulated", **simulated})
    assert valid_entry("check", {"status": "invalid", "reason": "x"})
    assert not valid_entry("check", {"status": "simulated", **simulated})
    assert not valid_entry("simulate", {"status": "pruned", "reason": "x"})


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

    argv = ["sweep", str(SCENARIOS / "small.yaml"), *("--fix", "tp=2", "--fix", "recompute=none")]
    argv += ["--fix", "sharding=none", "--fix", "micro_batch=2"]
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
    shutil.rmtree(mine)
