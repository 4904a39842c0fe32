"""The open validation suite: parasim's predictions against published training runs.

Every case in ``benchmarks/validation/cases/`` is one published measurement: a
scenario describing the run with what its source states (or, for a collective, the
nccl-tests configuration), the published figure with its unit, and where it was
published (``SOURCES.md`` beside the cases lists the sources). This command predicts
each figure and prints one row per case: predicted, published and the relative
error, then the mean and max |error| over the verified cases, overall and per GPU
type. Cases marked ``verified: false`` (a figure read only in a secondary copy) are
predicted and shown but left out of the statistics; cases that parasim cannot yet
describe are listed as skipped with the reason.

    python -m benchmarks.validate             # the table
    python -m benchmarks.validate --json      # the same as JSON
    python -m benchmarks.validate --case narayanan21  # only ids containing that text

Metrics: ``model_tflops_per_gpu`` and ``hardware_tflops_per_gpu`` (TFLOP/s per GPU of
model or hardware FLOPs, the latter counting recompute), ``mfu`` and ``hfu`` (as
fractions; a published percentage is divided by 100), ``step_time_s``,
``tokens_per_s_per_gpu`` and ``busbw`` (nccl-tests bus bandwidth, GB/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

CASES = Path(__file__).parent / "validation" / "cases"

__all__ = ["CaseResult", "load_cases", "predict", "summarise", "main"]


@dataclass
class CaseResult:
    id: str
    gpu: str
    metric: str
    published: float
    predicted: float | None
    error: float | None  # (predicted - published) / published
    verified: bool
    source: str
    where: str
    skipped: str | None = None


def load_cases(pattern: str | None = None) -> list[dict[str, Any]]:
    cases = []
    for path in sorted(CASES.glob("*.yaml")):
        case = yaml.safe_load(path.read_text())
        if pattern and pattern not in case["id"]:
            continue
        cases.append(case)
    return cases


def _published(case: dict[str, Any]) -> float:
    published = case["published"]
    value = float(published["value"])
    if published["metric"] in ("mfu", "hfu") and str(published.get("unit", "")).startswith("%"):
        value /= 100.0
    return value


def _scenario_metric(result: Any, metric: str) -> float:
    """``metric`` of a :class:`~simulator.analysis.result.StepResult`."""
    gpus = result.cluster.gpus
    return {
        "model_tflops_per_gpu": lambda: result.tflops_per_gpu,
        "hardware_tflops_per_gpu": lambda: result.hardware_tflops_per_gpu,
        "mfu": lambda: result.mfu,
        "hfu": lambda: result.hfu,
        "step_time_s": lambda: result.step_time_s,
        "tokens_per_s_per_gpu": lambda: result.tokens_per_s / gpus,
    }[metric]()


def _predict_collective(spec: dict[str, Any]) -> float:
    from simulator.tools.collbench import collbench_cluster, collbench_rows
    from topologies import parse_bytes

    cluster = collbench_cluster(spec["preset"], spec["nodes"], spec.get("gpus_per_node"))
    (row,) = collbench_rows(cluster, spec["op"], [parse_bytes(spec["size"])])
    return row.busbw_GBps


def predict(case: dict[str, Any]) -> CaseResult:
    """One case's prediction (or the reason parasim cannot describe it)."""
    from simulator.common.errors import ParasimError
    from simulator.request.scenario import scenario_from_dict
    from simulator.run.simulate import run_scenario

    metric = case["published"]["metric"]
    published = _published(case)
    base = dict(
        id=case["id"],
        gpu=case.get("gpu", "?"),
        metric=metric,
        published=published,
        verified=bool(case.get("verified", True)),
        source=case.get("source", ""),
        where=case.get("where", ""),
    )
    try:
        if "collective" in case:
            predicted = _predict_collective(case["collective"])
        else:
            scenario = scenario_from_dict(case["scenario"], source=case["id"])
            predicted = _scenario_metric(run_scenario(scenario).result, metric)
    except ParasimError as exc:
        return CaseResult(**base, predicted=None, error=None, skipped=str(exc))
    return CaseResult(**base, predicted=predicted, error=(predicted - published) / published)


def summarise(results: list[CaseResult]) -> dict[str, Any]:
    """Mean and max |error| over the verified, predicted cases: all, and per GPU type."""

    def stats(rows: list[CaseResult]) -> dict[str, Any]:
        errors = [abs(r.error) for r in rows]
        if not errors:
            return {"cases": 0, "mean_abs_error": None, "max_abs_error": None}
        return {
            "cases": len(errors),
            "mean_abs_error": sum(errors) / len(errors),
            "max_abs_error": max(errors),
        }

    scored = [r for r in results if r.verified and r.error is not None]
    by_gpu = {
        gpu: stats([r for r in scored if r.gpu == gpu]) for gpu in sorted({r.gpu for r in scored})
    }
    return {
        "all": stats(scored),
        "by_gpu": by_gpu,
        "sources": len({r.source for r in scored}),
        "unverified": [r.id for r in results if not r.verified],
        "skipped": {r.id: r.skipped for r in results if r.skipped},
    }


def _print_table(results: list[CaseResult], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="parasim against published runs (benchmarks/validation)")
    for column in ("case", "gpu", "metric", "predicted", "published", "error"):
        table.add_column(
            column, justify="right" if column in ("predicted", "published", "error") else "left"
        )
    for r in results:
        if r.skipped:
            table.add_row(r.id, r.gpu, r.metric, "—", f"{r.published:.4g}", f"skipped: {r.skipped}")
            continue
        mark = "" if r.verified else " (unverified)"
        table.add_row(
            r.id,
            r.gpu,
            r.metric,
            f"{r.predicted:.4g}",
            f"{r.published:.4g}",
            f"{r.error:+.1%}{mark}",
        )
    console = Console(width=160)
    console.print(table)
    overall = summary["all"]
    if overall["cases"]:
        console.print(
            f"verified cases: {overall['cases']} from {summary['sources']} sources; "
            f"mean |error| {overall['mean_abs_error']:.1%}, "
            f"max |error| {overall['max_abs_error']:.1%}"
        )
    for gpu, row in summary["by_gpu"].items():
        console.print(
            f"  {gpu}: {row['cases']} cases, mean |error| {row['mean_abs_error']:.1%}, "
            f"max {row['max_abs_error']:.1%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.validate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--case", help="only the cases whose id contains this text")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    cases = load_cases(args.case)
    if not cases:
        print(f"python -m benchmarks.validate: no case matches {args.case!r}", file=sys.stderr)
        return 2
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(predict, cases))
    else:
        results = [predict(case) for case in cases]
    summary = summarise(results)
    if args.json:
        print(json.dumps({"cases": [asdict(r) for r in results], "summary": summary}, indent=1))
    else:
        _print_table(results, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
