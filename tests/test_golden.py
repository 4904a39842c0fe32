"""The golden-output check names every scenario output that moved, and nothing else."""

from __future__ import annotations

from benchmarks.golden import differences, shipped_scenarios


def test_differences_name_each_moved_output():
    kept = {
        "a.yaml": {"exit": 0, "result.json": "1", "trace.json": "2"},
        "b.yaml": {"exit": 0, "result.json": "3"},
        "gone.yaml": {"exit": 0},
    }
    now = {
        "a.yaml": {"exit": 0, "result.json": "1", "trace.json": "9"},
        "b.yaml": {"exit": 3, "result.json": "3"},
        "new.yaml": {"exit": 0},
    }
    assert differences(kept, now) == [
        "a.yaml: trace.json differs",
        "b.yaml: exit differs",
        "gone.yaml: not run",
        "new.yaml: new",
    ]
    assert differences(kept, kept) == []


def test_every_shipped_scenario_is_checked():
    names = {path.name for path in shipped_scenarios()}
    assert {"small.yaml", "gpt3-175b.yaml", "layering-mistake.yaml"} <= names
