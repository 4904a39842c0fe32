"""Benchmark: calibrate once, then predict and replay many layouts (gloo CPU processes).

Calibrates this machine once (``parasim calibrate``; with ``--scenario-shapes``, at the
shapes the layouts below run), then for each layout of ``scenarios/cpu-tiny.yaml``
predicts the step with that one profile, replays it for real ``--repeat`` times (the
replays go round-robin over the layouts, so a slow spell of a shared machine spreads
over them) and compares the prediction with the median of the replays. Layouts: data, tensor,
pipeline and expert parallelism on 2 processes, and three 4-process layouts that
combine two axes. Prints, per layout, the prediction, the measured median, the spread
of the replays (lowest to highest), the error, how much slower a fixed GEMM ran during
the replays than during the calibration (the speed probe,
:func:`hardware.microbench.speed_probe`: the machine's own drift, which no model of
the layout can predict) and the largest share of CPU time the hypervisor stole during
one, then the median and the largest |error|. Usage::

    python -m benchmarks.closed_loop [--repeat 3] [--only dp=2,tp=2] [--scenario-shapes]
        [--calibrate-on dp=2,tp=2]

With ``--scenario-shapes`` the calibration (2 processes) also runs the step of each
2-process layout it is given, so those layouts' compute ops and calls are timed in
place; the 4-process layouts' compute ops are timed alone, and their calls take the
measured calls of the same size or the fits. ``--calibrate-on`` gives it fewer layouts
than are predicted, to see how the layouts it never ran fare.

The layouts are described only with ``--set`` overrides of the scenario, so a reader
can rerun any one of them with ``parasim run`` / ``parasim replay``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from simulator.cli.main import main as parasim

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "cpu-tiny.yaml"
# cpu-tiny with a mixture of experts of 4 experts, top-2, for expert parallelism
MOE = "model.moe={experts: 4, top_k: 2}"
FOUR = "cluster.gpus_per_node=4"
LAYOUTS: dict[str, list[str]] = {
    "dp=2": ["parallel.tp=1", "parallel.dp=2"],
    "tp=2": ["parallel.tp=2", "parallel.dp=1"],
    "pp=2": ["parallel.tp=1", "parallel.pp=2", "parallel.dp=1"],
    "ep=2": ["parallel.tp=1", "parallel.dp=2", "parallel.ep=2", MOE],
    "tp=2 dp=2": [FOUR, "parallel.tp=2", "parallel.dp=2"],
    "tp=2 pp=2": [FOUR, "parallel.tp=2", "parallel.pp=2", "parallel.dp=1"],
    "pp=2 dp=2": [FOUR, "parallel.tp=1", "parallel.pp=2", "parallel.dp=2"],
}


def _quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return parasim(argv)


def _sets(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def _layout_scenarios(work: Path, names: list[str]) -> list[Path]:
    """One scenario file per layout (the scenario with the layout's overrides), for a
    calibration at the shapes they run."""
    from simulator.request.scenario import apply_overrides

    base = yaml.safe_load(SCENARIO.read_text())
    paths = []
    for i, name in enumerate(names):
        raw = apply_overrides(base, LAYOUTS[name])
        raw["name"] = f"cpu-tiny-{i}"
        path = work / f"layout-{i}.yaml"
        path.write_text(yaml.safe_dump(raw))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="replays per layout (default 3)")
    parser.add_argument("--only", help="comma-separated layouts (default: all)")
    parser.add_argument(
        "--scenario-shapes",
        action="store_true",
        help="calibrate at the shapes the layouts run (calibrate --scenario)",
    )
    parser.add_argument(
        "--calibrate-on",
        help="with --scenario-shapes: comma-separated layouts whose shapes the calibration "
        "times (default: every layout predicted), to see how layouts it never ran fare",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the profile, predictions and replays in this folder"
    )
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(LAYOUTS)
    calibrated = args.calibrate_on.split(",") if args.calibrate_on else names
    unknown = [name for name in {*names, *calibrated} if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {list(LAYOUTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        profile = work / "profile.json"
        calibrate = ["calibrate", "--nproc", "2", "--backend", "gloo", "--out", str(profile)]
        if args.scenario_shapes:
            for path in _layout_scenarios(work, calibrated):
                calibrate += ["--scenario", str(path)]
        started = time.monotonic()
        assert _quiet(calibrate) == 0, "calibration failed"
        calibration_s = time.monotonic() - started
        calibrated_probe = json.loads(profile.read_text())["device"].get("probe_s")
        print(
            f"machine: {platform.node()} · {platform.machine()} · {os.cpu_count()} cores · "
            f"calibrated once in {calibration_s:.0f} s"
            + (
                f" at the shapes of {', '.join(calibrated)}"
                if args.scenario_shapes
                else " (general sweep)"
            )
        )
        print(
            "| layout | predicted | measured median | spread of replays | error "
            "| probe vs calibration | stolen |"
        )
        print("|---|---|---|---|---|---|---|")
        predicted: dict[str, float] = {}
        for index, name in enumerate(names):
            folder = work / f"pred-{index}"
            run = [
                "run",
                str(SCENARIO),
                *_sets(LAYOUTS[name]),
                "--set",
                f"cluster.profile={profile}",
            ]
            assert _quiet([*run, "--out", str(folder)]) == 0, f"{name}: prediction failed"
            predicted[name] = json.loads((folder / "result.json").read_text())["step_time_s"]
        # replays round-robin over the layouts, so a slow spell of the machine spreads
        # over them instead of landing on one layout's replays
        measured: dict[str, list[dict]] = {name: [] for name in names}
        for i in range(args.repeat):
            for index, name in enumerate(names):
                folder = work / f"meas-{index}-{i}"
                replay = ["replay", str(SCENARIO), *_sets(LAYOUTS[name]), "--backend", "gloo"]
                assert _quiet([*replay, "--out", str(folder)]) == 0, f"{name}: replay failed"
                result = json.loads((folder / "result.json").read_text())
                measured[name].append({"step": result["step_time_s"], **result["measured"]})
        errors = []
        for name in names:
            steps = [m["step"] for m in measured[name]]
            p, m = predicted[name], statistics.median(steps)
            error = (p - m) / m
            errors.append(abs(error))
            probes = [x["probe_s"] for x in measured[name] if x.get("probe_s")]
            drift = (
                f"{100 * (statistics.median(probes) / calibrated_probe - 1):+.0f}%"
                if probes and calibrated_probe
                else "-"
            )
            stolen = [
                x["steal_fraction"] for x in measured[name] if x["steal_fraction"] is not None
            ]
            stolen_text = f"{100 * max(stolen):.1f}%" if stolen else "-"
            print(
                f"| {name} | {p * 1e3:.1f} ms | {m * 1e3:.1f} ms | "
                f"{min(steps) * 1e3:.1f}–{max(steps) * 1e3:.1f} ms | {100 * error:+.1f}% | "
                f"{drift} | {stolen_text} |",
                flush=True,
            )
        print(
            f"median |error| {100 * statistics.median(errors):.1f}%, "
            f"largest {100 * max(errors):.1f}% over {len(errors)} layouts"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
