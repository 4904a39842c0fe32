"""Byte-for-byte outputs of every shipped scenario, kept as hashes, to show that a
change of structure changes no number.

Runs ``parasim run`` (the CLI, as a user does) on each scenario under ``scenarios/``
and its ``teaching/`` folder, and hashes the ``result.json`` and ``trace.json`` it
writes. ``--write`` keeps the hashes in ``benchmarks/measurements/golden-outputs.json``;
``--check`` (the default) runs them again and names every output that differs. A change
that is meant to move a number rewrites the file and says why in its commit. Usage::

    python -m benchmarks.golden [--write | --check] [--workers N] [--only TEXT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
GOLDEN = ROOT / "benchmarks" / "measurements" / "golden-outputs.json"
OUTPUTS = ("result.json", "trace.json")


def shipped_scenarios() -> list[Path]:
    """Every scenario the repository ships, in a stable order."""
    return sorted(SCENARIOS.glob("*.yaml")) + sorted((SCENARIOS / "teaching").glob("*.yaml"))


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_one(scenario: Path) -> dict[str, object]:
    """The exit code and the outputs' hashes of ``parasim run`` on ``scenario``."""
    with tempfile.TemporaryDirectory(prefix="parasim-golden-") as folder:
        out = Path(folder) / "out"
        done = subprocess.run(
            [sys.executable, "-m", "simulator.cli.main", "run", str(scenario), "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        hashes = {name: _hash(out / name) for name in OUTPUTS if (out / name).is_file()}
    return {"exit": done.returncode, **hashes}


def collect(scenarios: list[Path], workers: int) -> dict[str, dict[str, object]]:
    """Each scenario's :func:`run_one`, keyed by its path under ``scenarios/``."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run_one, scenarios))
    return {
        str(path.relative_to(SCENARIOS)): result
        for path, result in zip(scenarios, results, strict=True)
    }


def differences(kept: dict, now: dict) -> list[str]:
    """One line per scenario output that is not what was kept."""
    lines = []
    for name in sorted(set(kept) | set(now)):
        before, after = kept.get(name), now.get(name)
        if before is None or after is None:
            lines.append(f"{name}: {'new' if before is None else 'not run'}")
            continue
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                lines.append(f"{name}: {key} differs")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="keep the hashes")
    mode.add_argument("--check", action="store_true", help="compare with the kept hashes")
    parser.add_argument("--workers", type=int, default=2, help="scenarios run at once")
    parser.add_argument("--only", default="", help="only the scenarios whose path has this")
    args = parser.parse_args(argv)
    scenarios = [path for path in shipped_scenarios() if args.only in str(path)]
    now = collect(scenarios, max(1, args.workers))
    if args.write:
        kept = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() and args.only else {}
        GOLDEN.write_text(json.dumps({**kept, **now}, indent=1, sort_keys=True) + "\n")
        print(f"kept the outputs of {len(now)} scenarios in {GOLDEN.relative_to(ROOT)}")
        return 0
    kept = json.loads(GOLDEN.read_text())
    if args.only:
        kept = {name: value for name, value in kept.items() if name in now}
    lines = differences(kept, now)
    for line in lines:
        print(line)
    print(f"{len(now)} scenarios, {len(lines)} outputs differ from the kept ones")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
