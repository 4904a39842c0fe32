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
    python -m benchmarks.validate --cross-validate    # fit without each source, predict it

``--cross-validate`` fits the global parameters (:mod:`benchmarks.crossval`) on every
source but one and predicts that one, for each source, and prints per source and
overall the in-sample error (fitted on every case, the figure the table above shows
once the presets carry the fit) beside the cross-validated one, and how often the 80%
trust interval (:mod:`simulator.analysis.trust`), made without the left-out source,
holds its published values. ``--write-trust`` saves the cross-validated residuals that
every prediction's interval is made from.

A case that parasim estimates to take longer than ``--budget`` seconds (30) to simulate
is skipped and listed with its estimate (``--budget 1e9`` runs every case).

A case may carry ``inconsistent:`` (its stated settings contradict its own figure, the
arithmetic given): it is predicted and shown, and left out of the statistics.

Metrics: ``model_tflops_per_gpu`` and ``hardware_tflops_per_gpu`` (TFLOP/s per GPU of
model or hardware FLOPs, the latter counting recompute; a published figure with
``attention_flops: causal`` counts the attention core's FLOPs at half, for the causal
mask, and parasim's model FLOPs are counted the same way for it), ``mfu`` and ``hfu`` (as
fractions; a published percentage is divided by 100), ``step_time_s``,
``tokens_per_s_per_gpu``, ``gpu_hours_per_1t_tokens`` (GPU-hours per trillion tokens),
``peak_memory_per_gpu`` (bytes; a published figure in GiB, GB or MiB is converted) and
``busbw`` (nccl-tests bus bandwidth, GB/s).
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
    inconsistent: str | None = None
    descriptor: dict[str, Any] | None = None  # what makes it comparable (trust interval)
    oom: bool = False  # predicted out of memory (every case is a run that ran)

    @property
    def scored(self) -> bool:
        """In the statistics: verified, predicted and consistent."""
        return self.verified and self.error is not None and self.inconsistent is None


def load_cases(pattern: str | None = None) -> list[dict[str, Any]]:
    cases = []
    for path in sorted(CASES.glob("*.yaml")):
        case = yaml.safe_load(path.read_text())
        if pattern and pattern not in case["id"]:
            continue
        cases.append(case)
    return cases


# metrics that grow with the step time (the others are rates: they shrink with it)
TIME_METRICS = ("step_time_s", "gpu_hours_per_1t_tokens")
MEMORY_UNITS = {"GiB": 2.0**30, "GB": 1e9, "MiB": 2.0**20, "MB": 1e6}


def _published(case: dict[str, Any]) -> float:
    published = case["published"]
    value = float(published["value"])
    unit = str(published.get("unit", ""))
    if published["metric"] in ("mfu", "hfu") and unit.startswith("%"):
        value /= 100.0
    if published["metric"] == "peak_memory_per_gpu":
        value *= MEMORY_UNITS[unit.split()[0]]
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
        "gpu_hours_per_1t_tokens": lambda: 1e12 / (result.tokens_per_s / gpus) / 3600.0,
        "peak_memory_per_gpu": lambda: result.memory.peak_bytes_per_gpu,
    }[metric]()


# Metrics counted in model FLOPs, whose attention core a source may count halved
MODEL_FLOP_METRICS = ("model_tflops_per_gpu", "mfu")


def _causal_model_flops_share(scenario: Any) -> float:
    """The share of parasim's model FLOPs (which count the attention core's full
    ``s²`` scores) that a source counting the core at half for the causal mask counts:
    Megatron-LM's ``num_floating_point_operations`` since October 2025 (dev branch,
    "causal mask (only half of the mask is non-zero)")."""
    from simulator.arithmetic.counts import attention_core_flops_per_step, model_flops_per_step

    model = scenario.model  # per sequence: the share is the same for any batch
    core = attention_core_flops_per_step(model, 1, scenario.recipe.attention)
    return 1.0 - 0.5 * core / model_flops_per_step(model, 1, scenario.moe)


def _predict_collective(spec: dict[str, Any]) -> float:
    from simulator.tools.collbench import collbench_cluster, collbench_rows
    from topologies import parse_bytes

    cluster = collbench_cluster(spec["preset"], spec["nodes"], spec.get("gpus_per_node"))
    (row,) = collbench_rows(cluster, spec["op"], [parse_bytes(spec["size"])])
    return row.busbw_GBps


def _scaled(scenario: Any, scales: dict[str, float]) -> Any:
    """``scenario`` with GPU fields multiplied (a global parameter's trial value)."""
    if not scales:
        return scenario
    from dataclasses import replace

    spec = scenario.cluster_spec
    gpu = spec.gpu
    update = {name: min(1.0, getattr(gpu, name) * factor) for name, factor in scales.items()}
    cluster_spec = spec.model_copy(update={"gpu": gpu.model_copy(update=update)})
    return replace(scenario, cluster_spec=cluster_spec, _cluster=None)


# The longest a case may take to simulate, by parasim's own estimate, before the suite
# leaves it out (``--budget``; a cross-validation runs each case five times).
BUDGET_S = 30.0


def predict(
    case: dict[str, Any], scales: dict[str, float] | None = None, budget_s: float = BUDGET_S
) -> CaseResult:
    """One case's prediction (or the reason parasim cannot describe it), with the GPU
    fields in ``scales`` multiplied by their factors; a case estimated to take longer
    than ``budget_s`` to simulate is skipped with its estimate."""
    from simulator.analysis.trust import describe
    from simulator.common.errors import ParasimError
    from simulator.request.scenario import scenario_from_dict
    from simulator.run.simulate import run_scenario, scenario_size

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
        inconsistent=case.get("inconsistent"),
    )
    descriptor, oom = None, False
    try:
        if "collective" in case:
            predicted = _predict_collective(case["collective"])
        else:
            scenario = _scaled(
                scenario_from_dict(case["scenario"], source=case["id"]), scales or {}
            )
            estimate = scenario_size(scenario).seconds
            if estimate > budget_s:
                return CaseResult(
                    **base,
                    predicted=None,
                    error=None,
                    skipped=f"estimated {estimate:.0f} s to simulate, over the suite's "
                    f"{budget_s:g} s budget (--budget)",
                )
            result = run_scenario(scenario).result
            predicted = _scenario_metric(result, metric)
            if (
                case["published"].get("attention_flops") == "causal"
                and metric in MODEL_FLOP_METRICS
            ):
                predicted *= _causal_model_flops_share(scenario)
            framework = scenario.recipe.framework
            descriptor = describe(result, framework, scenario.model.seq_len).to_json()
            descriptor["time_like"] = metric in TIME_METRICS
            oom = result.memory.oom
    except ParasimError as exc:
        return CaseResult(**base, predicted=None, error=None, skipped=str(exc))
    return CaseResult(
        **base,
        predicted=predicted,
        error=(predicted - published) / published,
        descriptor=descriptor,
        oom=oom,
    )


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

    scored = [r for r in results if r.scored]
    by_gpu = {
        gpu: stats([r for r in scored if r.gpu == gpu]) for gpu in sorted({r.gpu for r in scored})
    }
    return {
        "all": stats(scored),
        "by_gpu": by_gpu,
        "sources": len({r.source for r in scored}),
        "unverified": [r.id for r in results if not r.verified],
        "inconsistent": [r.id for r in results if r.inconsistent],
        # runs that ran, predicted not to fit
        "predicted_oom": [r.id for r in results if r.oom],
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
        mark = " (unverified)" if not r.verified else " (inconsistent)" if r.inconsistent else ""
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
    if summary["predicted_oom"]:
        console.print(
            f"predicted out of memory, though they ran: {len(summary['predicted_oom'])} "
            f"({', '.join(summary['predicted_oom'])})"
        )
    for gpu, row in summary["by_gpu"].items():
        console.print(
            f"  {gpu}: {row['cases']} cases, mean |error| {row['mean_abs_error']:.1%}, "
            f"max {row['max_abs_error']:.1%}"
        )


def _predict_at(job: tuple[dict[str, Any], str, float, float]) -> CaseResult:
    case, field, factor, budget = job
    return predict(case, {field: factor} if factor != 1.0 else None, budget)


def _cross_validation(
    cases: list[dict[str, Any]], scheme: str, workers: int, budget: float = BUDGET_S
) -> tuple[list[CaseResult], dict[str, Any], list[dict[str, Any]]]:
    """Every case at every grid value of the global parameter, then the fits: the
    results at the presets' values, the cross-validation summary, and the rows for the
    trust residuals."""
    from benchmarks.crossval import PARAMETERS, cross_validate, interval_coverage, time_residual
    from simulator.analysis.trust import interval

    (parameter,) = PARAMETERS
    at_one = parameter.grid.index(1.0)
    others = [factor for factor in parameter.grid if factor != 1.0]

    def run(jobs: list) -> list[CaseResult]:
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                return list(pool.map(_predict_at, jobs, chunksize=2))
        return [_predict_at(job) for job in jobs]

    nominal = run([(case, parameter.field, 1.0, budget) for case in cases])
    # only the scored cases whose figure the parameter moves are run at the other values
    moved = [
        i
        for i, r in enumerate(nominal)
        if r.scored and r.descriptor is not None and r.metric != "peak_memory_per_gpu"
    ]
    flat = run([(cases[i], parameter.field, f, budget) for i in moved for f in others])
    grids = [[r] * len(parameter.grid) for r in nominal]
    for n, i in enumerate(moved):
        trial = flat[n * len(others) : (n + 1) * len(others)]
        grids[i] = [*trial[:at_one], nominal[i], *trial[at_one:]]
    rows = [
        {
            "case": case,
            "grid": [g.predicted for g in grid],
            "published": grid[at_one].published,
            "result": grid[at_one],
        }
        for case, grid in zip(cases, grids, strict=True)
        if grid[at_one].scored
    ]
    in_values, in_errors, folds = cross_validate(rows, parameter, scheme)
    cv_errors = {case: error for fold in folds for case, error in fold.errors.items()}
    descriptors = {r["case"]["id"]: r["result"].descriptor for r in rows}
    timed = {case for case, d in descriptors.items() if d is not None}

    def timed_folds():
        for fold in folds:
            errors = {c: e for c, e in fold.errors.items() if c in timed}
            if errors:
                yield type(fold)(fold.source, fold.values, errors)

    coverage = interval_coverage(
        list(timed_folds()),
        descriptors,
        lambda d, residuals: (lambda t: (t.low, t.high))(interval(d, residuals)),
    )

    def stats(ids: list[str], errors: dict[str, float]) -> dict[str, Any]:
        values = [abs(errors[i]) for i in ids]
        return {
            "cases": len(values),
            "mean_abs_error": sum(values) / len(values) if values else None,
            "max_abs_error": max(values) if values else None,
        }

    by_source = {}
    for fold in folds:
        ids = list(fold.errors)
        by_source[fold.source] = {
            "in_sample": stats(ids, in_errors),
            "cross_validated": stats(ids, cv_errors),
            "fitted_without": fold.values,
        }
    everything = list(in_errors)
    summary = {
        "parameter": parameter.name,
        "field": parameter.field,
        "scheme": scheme,
        "fitted": in_values,
        "in_sample": stats(everything, in_errors),
        "cross_validated": stats(everything, cv_errors),
        "sources": by_source,
        "interval_coverage": coverage,
        "case_errors": {
            i: {"in_sample": in_errors[i], "cross_validated": cv_errors[i]} for i in everything
        },
    }
    trust_rows = [
        {
            "id": r["case"]["id"],
            "source": r["case"]["source"],
            "descriptor": descriptors[r["case"]["id"]],
            "residual": time_residual(
                cv_errors[r["case"]["id"]], descriptors[r["case"]["id"]]["time_like"]
            ),
        }
        for r in rows
        if r["case"]["id"] in timed
    ]
    return nominal, summary, trust_rows


def _print_cross_validation(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value:.1%}"

    table = Table(
        title=f"cross-validation: {summary['parameter']} ({summary['field']}), "
        f"scheme {summary['scheme']}, one source left out at a time"
    )
    for column in (
        "source",
        "cases",
        "in-sample mean",
        "in-sample max",
        "CV mean",
        "CV max",
        "fitted without it",
    ):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, row in summary["sources"].items():
        fitted = ", ".join(
            f"{k} {'—' if v is None else f'{v:.3f}'}" for k, v in row["fitted_without"].items()
        )
        table.add_row(
            source[:70],
            str(row["in_sample"]["cases"]),
            pct(row["in_sample"]["mean_abs_error"]),
            pct(row["in_sample"]["max_abs_error"]),
            pct(row["cross_validated"]["mean_abs_error"]),
            pct(row["cross_validated"]["max_abs_error"]),
            fitted,
        )
    console = Console(width=200)
    console.print(table)
    inside, cv = summary["in_sample"], summary["cross_validated"]
    fitted = ", ".join(
        f"{k} {'—' if v is None else f'{v:.3f}'}" for k, v in summary["fitted"].items()
    )
    console.print(
        f"{inside['cases']} cases from {len(summary['sources'])} sources. In-sample (fitted on "
        f"every case: {fitted}): mean |error| {pct(inside['mean_abs_error'])}, max "
        f"{pct(inside['max_abs_error'])}. Cross-validated (each source fitted without it): "
        f"mean {pct(cv['mean_abs_error'])}, max {pct(cv['max_abs_error'])}."
    )
    coverage = summary["interval_coverage"]
    console.print(
        f"80% interval coverage on the left-out sources: {pct(coverage['coverage'])} of "
        f"{coverage['cases']} cases (target 70%-90%)."
    )


def _write_trust(rows: list[dict[str, Any]], summary: dict[str, Any]) -> Path:
    import datetime

    from simulator.analysis.trust import RESIDUALS_FILE

    data = {
        "made_by": "python -m benchmarks.validate --cross-validate --write-trust",
        "date": datetime.date.today().isoformat(),
        "parameter": summary["parameter"],
        "scheme": summary["scheme"],
        "fitted": summary["fitted"],
        "residual": (
            "log(true step time / predicted step time), the case's source left out of the fit"
        ),
        "cases": rows,
    }
    RESIDUALS_FILE.write_text(json.dumps(data, indent=1) + "\n")
    return RESIDUALS_FILE


def main(argv: list[str] | None = None) -> int:
    from benchmarks.crossval import SCHEMES

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.validate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--case", help="only the cases whose id contains this text")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--cross-validate",
        action="store_true",
        help="fit the global parameters without each source in turn and predict it",
    )
    parser.add_argument(
        "--scheme",
        choices=SCHEMES,
        default="global",
        help="how the fitted parameter is shared: one value for every GPU (global, the "
        "default) or one per GPU type (per-gpu)",
    )
    parser.add_argument(
        "--write-trust",
        action="store_true",
        help="with --cross-validate: save the residuals the trust interval is made from",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help=f"skip a case parasim estimates to take longer than this to simulate, in "
        f"seconds (default {BUDGET_S:g})",
    )
    args = parser.parse_args(argv)
    cases = load_cases(args.case)
    if not cases:
        print(f"python -m benchmarks.validate: no case matches {args.case!r}", file=sys.stderr)
        return 2
    crossval = None
    if args.cross_validate:
        results, crossval, trust_rows = _cross_validation(
            cases, args.scheme, args.workers, args.budget
        )
        if args.write_trust:
            _write_trust(trust_rows, crossval)
    else:
        jobs = [(case, "", 1.0, args.budget) for case in cases]
        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                results = list(pool.map(_predict_at, jobs))
        else:
            results = [_predict_at(job) for job in jobs]
    summary = summarise(results)
    if args.json:
        data = {"cases": [asdict(r) for r in results], "summary": summary}
        if crossval is not None:
            data["cross_validation"] = crossval
        print(json.dumps(data, indent=1))
    else:
        _print_table(results, summary)
        if crossval is not None:
            _print_cross_validation(crossval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
