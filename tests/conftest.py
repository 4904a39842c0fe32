"""Shared fixtures: paths to the shipped scenarios and small helpers to run them.

Markers (registered in pyproject.toml): ``slow`` for tests that take seconds,
``hardware`` for real torch.distributed runs on gloo CPU processes, ``browser`` for
headless Chromium. Every hardware and browser test is slow as well, so
``python -m pytest -m "not slow"`` leaves them all out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("hardware") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def scenarios_dir() -> Path:
    return SCENARIOS
