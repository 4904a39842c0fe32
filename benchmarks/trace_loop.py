"""Benchmark: the trace loop on gloo CPU processes, each layout's own round trip and the
profile of one layout's traces predicting the others.

For each 2-process layout of ``scenarios/cpu-tiny.yaml`` (data, tensor, pipeline and
expert parallelism, as in :mod:`benchmarks.closed_loop`): replay it with the profiler
(``parasim replay --profile``), make a profile from its traces alone (``parasim
calibrate --from-trace``), predict the same layout with it and compare with the
replay's median (the round trip). Then the profile of the first layout's traces
predicts every other layout, each against its own replay (what a trace of one run
carries to another). Prints a table per part and the median and largest |error|.
Usage::

    python -m benchmarks.trace_loop [--steps 10] [--only dp=2,tp=2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from benchmarks.closed_loop import LAYOUTS, SCENARIO, _quiet, _sets

#: The 2-process layouts (the 4-process ones need 4 cores to replay fairly).
TWO = [name for name, sets in LAYOUTS.items() if not any("gpus_per_node" in s for s in sets)]


def _step(folder: Path) -> float:
    return json.loads((folder / "result.json").read_text())["step_time_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="profiled steps per replay")
    parser.add_argument("--only", help=f"comma-separated layouts (default: {','.join(TWO)})")
    parser.add_argument("--keep", type=Path, help="keep every folder in this one")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else TWO
    unknown = [name for name in names if name not in TWO]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {TWO}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        print(f"machine: {platform.node()} · {platform.machine()} · {os.cpu_count()} cores")
        measured, profiles = {}, {}
        for index, name in enumerate(names):
            folder = work / f"meas-{index}"
            replay = ["replay", str(SCENARIO), *_sets(LAYOUTS[name]), "--backend", "gloo"]
            replay += ["--profile", "--steps", str(args.steps), "--out", str(folder)]
            assert _quiet(replay) == 0, f"{name}: replay failed"
            measured[name] = _step(folder)
            profiles[name] = work / f"profile-{index}.json"
            calibrate = ["calibrate", "--from-trace", str(folder), "--out", str(profiles[name])]
            assert _quiet(calibrate) == 0, f"{name}: calibration from its traces failed"

        def predict(name: str, profile: Path, tag: str) -> float:
            folder = work / f"pred-{tag}"
            run = ["run", str(SCENARIO), *_sets(LAYOUTS[name]), "--outputs", "result"]
            run += ["--set", f"cluster.profile={profile}", "--out", str(folder)]
            assert _quiet(run) == 0, f"{name}: prediction failed"
            return _step(folder)

        parts = [("its own traces", {name: profiles[name] for name in names})]
        if len(names) > 1:
            parts.append((f"{names[0]}'s traces", {name: profiles[names[0]] for name in names[1:]}))
        for title, chosen in parts:
            print(f"\nprofile from {title}")
            print("| layout | predicted | measured (median of the replay) | error |")
            print("|---|---|---|---|")
            errors = []
            for name, profile in chosen.items():
                predicted = predict(name, profile, f"{name}-{profile.stem}".replace("=", ""))
                error = predicted / measured[name] - 1
                errors.append(abs(error))
                print(
                    f"| {name} | {predicted * 1e3:.1f} ms | {measured[name] * 1e3:.1f} ms | "
                    f"{100 * error:+.1f}% |",
                    flush=True,
                )
            print(
                f"median |error| {100 * statistics.median(errors):.1f}%, largest "
                f"{100 * max(errors):.1f}% over {len(errors)} layouts"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
