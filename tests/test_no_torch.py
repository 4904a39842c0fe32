"""``simulator/`` imports and runs with torch unavailable."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT, SCENARIOS

BLOCK_TORCH = """
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch is blocked in this test')
sys.meta_path.insert(0, NoTorch())
import pkgutil, importlib, simulator
for module in pkgutil.walk_packages(simulator.__path__, 'simulator.'):
    importlib.import_module(module.name)
from simulator.cli.main import main
raise SystemExit(main(['run', sys.argv[1], '--out', sys.argv[2], '--json']))
"""


def test_simulator_runs_without_torch(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, str(SCENARIOS / "small.yaml"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"step_time_s"' in proc.stdout
