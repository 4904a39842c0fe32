"""Whole runs as published against ``parasim plan``: ``python -m benchmarks.validate_runs``.

Each case of ``benchmarks/validation_runs/`` names its source, where in it each figure
stands, the validation suite's step case it trains at (``base_case``, a file of
``benchmarks/validation/cases/``: the layout as the source states it) and the ``run:`` it
adds (the tokens, failures and checkpoints the source states). The plan is made as
``parasim plan`` makes it, and each published figure is set beside its prediction:

- ``gpu_hours``: the run's GPU-hours of wall time (a value: the relative error);
- ``goodput``: useful training time over wall time (``at_least``: whether it holds);
- ``checkpoint_bytes``: the checkpoint's size (a value);
- ``checkpoint_rank_bytes``: what the busiest rank writes (``between``: whether it lies
  in the published range).

Usage::

    python -m benchmarks.validate_runs [--only ID] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from simulator.tools.plan import RunPlan, plan_run

ROOT = Path(__file__).resolve().parent
CASES = ROOT / "validation_runs"
STEP_CASES = ROOT / "validation" / "cases"


def load_cases(only: str | None = None) -> list[dict[str, Any]]:
    """Every case (or the one ``only`` names), in file order."""
    cases = [yaml.safe_load(path.read_text()) for path in sorted(CASES.glob("*.yaml"))]
    return [case for case in cases if only is None or case["id"] == only]


def _predicted(plan: RunPlan, metric: str) -> float:
    if metric == "gpu_hours":
        return plan.gpu_hours
    if metric == "goodput":
        return plan.goodput
    checkpoint = plan.phases[0].checkpoint
    if metric == "checkpoint_bytes":
        return float(checkpoint.bytes)
    if metric == "checkpoint_rank_bytes":
        return float(checkpoint.rank_bytes)
    raise ValueError(f"unknown metric {metric!r}")


def run_case(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's plan and each published figure beside its prediction."""
    step_case = yaml.safe_load((STEP_CASES / f"{case['base_case']}.yaml").read_text())
    scenario = {**step_case["scenario"], "name": case["id"], "run": case["run"]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{case['id']}.yaml"
        path.write_text(yaml.safe_dump(scenario))
        plan = plan_run(str(path))
    rows = []
    for figure in case["published"]:
        predicted = _predicted(plan, figure["metric"])
        row: dict[str, Any] = {
            "case": case["id"],
            "metric": figure["metric"],
            "predicted": predicted,
        }
        # YAML reads 2.3e12 (no sign in the exponent) as text: every figure is a number
        if "value" in figure:
            row["published"] = float(figure["value"])
            row["error"] = predicted / row["published"] - 1
        elif "at_least" in figure:
            row["published"] = f">= {float(figure['at_least']):g}"
            row["holds"] = predicted >= float(figure["at_least"])
        else:
            low, high = (float(v) for v in figure["between"])
            row["published"] = f"{low:g} to {high:g}"
            row["holds"] = low <= predicted <= high
        rows.append(row)
    return rows


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one case, by id")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = [row for case in load_cases(args.only) for row in run_case(case)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| case | metric | predicted | published | error or holds |")
    print("|---|---|---|---|---|")
    for row in rows:
        verdict = (
            f"{100 * row['error']:+.1f}%"
            if "error" in row
            else ("holds" if row["holds"] else "FAILS")
        )
        print(
            f"| {row['case']} | {row['metric']} | {_shown(row['predicted'])} | "
            f"{_shown(row['published'])} | {verdict} |"
        )
    errors = [abs(row["error"]) for row in rows if "error" in row]
    if errors:
        print(f"mean |error| {100 * sum(errors) / len(errors):.1f}% over {len(errors)} figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
