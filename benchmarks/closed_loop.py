"""Benchmark: the hardware loop's accuracy on this machine (gloo CPU processes).

Calibrates 2 local processes, then for each layout of ``scenarios/cpu-tiny.yaml``
(data, tensor and pipeline parallel) predicts the step with the profile, replays it
for real and compares. Prints the step-time error of each. Usage::

    python -m benchmarks.closed_loop [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import tempfile
from pathlib import Path

from simulator.cli.main import main as parasim

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = str(ROOT / "scenarios" / "cpu-tiny.yaml")
LAYOUTS = {
    "dp=2": ["parallel.tp=1", "parallel.dp=2"],
    "tp=2": ["parallel.tp=2", "parallel.dp=1"],
    "pp=2": ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1"],
}


def _quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return parasim(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="replays per layout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profile = work / "profile.json"
        assert (
            _quiet(["calibrate", "--nproc", "2", "--backend", "gloo", "--out", str(profile)]) == 0
        )
        print(f"machine: {platform.node()} · {platform.machine()} · 2 gloo processes, 1 core each")
        print("| layout | predicted | measured (median of replays) | error |")
        print("|---|---|---|---|")
        for name, overrides in LAYOUTS.items():
            sets = [x for o in overrides for x in ("--set", o)]
            predicted = work / f"pred-{name}"
            _quiet(
                [
                    "run",
                    SCENARIO,
                    *sets,
                    "--set",
                    f"cluster.profile={profile}",
                    "--out",
                    str(predicted),
                ]
            )
            measured_times = []
            for i in range(args.repeat):
                measured = work / f"meas-{name}-{i}"
                assert (
                    _quiet(["replay", SCENARIO, *sets, "--backend", "gloo", "--out", str(measured)])
                    == 0
                )
                measured_times.append(
                    json.loads((measured / "result.json").read_text())["step_time_s"]
                )
            p = json.loads((predicted / "result.json").read_text())["step_time_s"]
            m = statistics.median(measured_times)
            print(f"| {name} | {p * 1e3:.1f} ms | {m * 1e3:.1f} ms | {100 * (p - m) / m:+.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
