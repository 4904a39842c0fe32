"""``benchmarks/gpu_check.sh --device cpu`` runs the whole one-device loop from a wheel
folder with ``pip --no-index``: the script a GPU node without network runs, checked
every step of the way on a CPU (the wheel folder made with ``benchmarks/gpu_wheels.sh``,
which needs PyPI or pip's cache). Both scripts run with the Python running the tests
(``PYTHON``), a venv's or the system's, and the check's environment uses its torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.hardware  # and so slow: see tests/conftest.py


def test_gpu_check_runs_on_a_cpu_from_a_wheel_folder(tmp_path):
    torch = pytest.importorskip("torch")
    env = dict(os.environ, PYTHON=sys.executable)  # python3 on PATH may be another one
    wheels = tmp_path / "wheels"
    made = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_wheels.sh"), str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if made.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"gpu_wheels.sh could not fetch the wheels: {made.stderr[-500:]}")
        pytest.skip("no wheels without PyPI or pip's cache")
    checkout = tmp_path / "checkout"  # a clean copy: nothing built in the working tree
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(".git", "out", "build", "*.egg-info", "__pycache__", ".venv"),
    )
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--wheels", str(wheels)]
        + ["--out", str(out)],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = (out / "gpu_check.txt").read_text()
    assert "ops measured at the scenario's shapes:" in summary and "error" in summary
    for name in ("profile.json", "predicted/result.json", "measured/result.json"):
        assert (out / name).exists(), name
    assert (out / "compared" / "compare.json").exists()
    # the trace loop: the profiled replay's traces made a profile that predicts its step
    assert sorted(p.name for p in (out / "traced" / "kineto").iterdir()) == [
        "rank0.pt.trace.json.gz"
    ]
    assert "trace loop: predicted" in summary
    assert json.loads((out / "trace-compared" / "compare.json").read_text())["mode"] == "traces"
    # parasim came from the checkout into the script's own environment
    site = list((out / "venv").glob("lib/python*/site-packages/simulator"))
    assert site, "parasim is not installed in the check's environment"
    # and its torch is the one of the Python that ran the script
    seen = subprocess.run(
        [str(out / "venv" / "bin" / "python"), "-c", "import torch; print(torch.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert seen.stdout.strip() == torch.__file__
