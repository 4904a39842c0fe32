"""Scaling curves: one scenario simulated at several cluster sizes.

``parasim scale SCENARIO --gpus 8,16,...,4096`` resizes the scenario's cluster to each
GPU count (``nodes = gpus / gpus_per_node``; the count must be a whole number of nodes)
and simulates one step there. How the layout follows the size:

* by default the scenario's rule holds: ``tp``, ``pp`` (and ``ep``, the schedule, the
  micro-batch, recompute and placement) stay as written and ``dp`` takes the rest;
* ``--best`` runs a small sweep at each size (:func:`simulator.tools.sweep.run_sweep` over
  ``tp`` and ``pp``, ``dp`` the rest, everything else pinned to the scenario's values)
  and keeps the fastest layout that fits in memory.

The global batch at each size follows ``--batch``, the policy ``parasim sweep --gpus``
shares (:func:`simulator.tools.sweep.scaled_batch`): ``per-gpu`` (the default, weak
scaling) keeps each GPU's share of the scenario's global batch, so it grows with the
GPUs; ``fixed`` (strong scaling) keeps it, and it must still divide into ``dp``
replicas of whole micro-batches; ``tokens`` keeps each GPU's share to the nearest whole
sequence. ``--mode weak`` and ``--mode strong`` are the older names of ``per-gpu`` and
``fixed``.

Each size reports its layout, step time, tokens/s, TFLOP/s per GPU, MFU, memory and the
scaling efficiency against the smallest size: the throughput per GPU relative to the
smallest size's (with a fixed batch, the speedup divided by the ratio of GPUs, the
same number), 1 for perfect linear scaling. The speedup (the smallest size's step time
over each size's) is reported with a fixed batch only: a step of a larger batch does
more work.

A scaling curve is refused before anything is laid out when one of its steps is beyond
the step guard, or all of them beyond the search's
(:func:`simulator.tools.sweep.check_search`), unless ``force``.

``--gpus`` takes a comma-separated list in which ``...`` continues the progression of
the two numbers before it up to the number after it: geometric when the second is a
multiple of the first (``8,16,...,4096`` doubles), arithmetic otherwise
(``64,96,...,256`` adds 32).

:func:`run_scale` returns a :class:`ScaleResult`: data only. The table, ``scale.csv``,
``scale.json`` and ``scale.html`` are drawn by :mod:`simulator.report.scale_report`,
and the command line lives in :mod:`simulator.cli.scale`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.common.errors import ParasimError, ScenarioError
from simulator.common.vocabulary import BATCH_POLICIES, PLACEMENT_AXES, SCALE_MODES
from simulator.request.scenario import MAX_WORLD, Scenario, apply_overrides, scenario_from_dict
from simulator.run.simulate import StepSize, request_size
from simulator.tools.pool import (
    check_search,
    process_pool,
    resolve_workers,
    run_chunked,
    simulate_chunk,
)
from simulator.tools.progress import Progress, Silent
from simulator.tools.space import Candidate
from simulator.tools.sweep import (
    SweepBase,
    no_layout_message,
    plan_sweep,
    prepare,
    run_sweep,
    scaled_batch,
    sweep_sizes,
)

__all__ = [
    "MODES",
    "POLICY_OF_MODE",
    "ScaleResult",
    "parse_gpus",
    "run_scale",
]

MODES = SCALE_MODES
#: The ``--batch`` policy each older ``--mode`` stands for.
POLICY_OF_MODE = {"weak": "per-gpu", "strong": "fixed"}


def parse_gpus(text: str) -> list[int]:
    """``'8,16,...,128'`` → ``[8, 16, 32, 64, 128]``; ``'8,16,24'`` as written.

    The result is sorted and free of repeats."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    numbers: list[int] = []
    i = 0
    while i < len(items):
        item = items[i]
        if item in ("...", "…"):
            if len(numbers) < 2 or i + 1 >= len(items):
                raise ParasimError(
                    f"--gpus {text}: '...' needs two numbers before it and one after, "
                    "e.g. 8,16,...,1024"
                )
            end = _count(items[i + 1], text)
            a, b = numbers[-2], numbers[-1]
            if b > a and b % a == 0:
                value = b * (b // a)
                while value <= end:
                    numbers.append(value)
                    value *= b // a
            elif b > a:
                value = b + (b - a)
                while value <= end:
                    numbers.append(value)
                    value += b - a
            else:
                raise ParasimError(f"--gpus {text}: the numbers before '...' must grow")
            if numbers[-1] != end:
                raise ParasimError(
                    f"--gpus {text}: the progression {a}, {b}, ... does not reach {end}"
                )
            i += 2
            continue
        numbers.append(_count(item, text))
        i += 1
    if not numbers:
        raise ParasimError(f"--gpus {text!r}: expected GPU counts such as 8,16,...,1024")
    return sorted(set(numbers))


def _count(item: str, text: str) -> int:
    try:
        value = int(item)
    except ValueError:
        raise ParasimError(f"--gpus {text}: {item!r} is not a number of GPUs") from None
    if value < 1:
        raise ParasimError(f"--gpus {text}: {value} is not a number of GPUs")
    if value > MAX_WORLD:
        raise ParasimError(f"--gpus {text}: {value:,} GPUs; parasim lays out at most {MAX_WORLD:,}")
    return value


def _whole_nodes(gpus: int, per_node: int, cluster: str) -> int:
    if gpus % per_node:
        raise ParasimError(
            f"--gpus: {gpus} GPUs is not a whole number of {cluster} nodes "
            f"({per_node} GPUs per node; {gpus} / {per_node} = {gpus / per_node:g})"
        )
    return gpus // per_node


@dataclass
class ScaleResult:
    """A scaling curve: the scenario simulated at each GPU count.

    ``cluster`` holds the cluster's ``name``, ``gpus_per_node``, ``gpu`` and per-GPU
    ``capacity_bytes``; ``batch`` the ``policy`` that set each size's global batch
    (:func:`simulator.tools.sweep.scaled_batch`) from the scenario's own
    ``scenario_global_batch`` on its ``scenario_gpus``; ``gpus`` the sizes in
    ascending order; ``reference_gpus`` the smallest size with a result (None when no
    size has one); ``rows`` one dict per size: its layout, step time, tokens/s, TFLOP/s
    per GPU, MFU, memory, ``efficiency`` (and ``speedup`` with a fixed batch) and the
    overrides that reproduce it with ``parasim run`` (``layout`` None, with a
    ``reason``, where no layout fits). ``wall_s`` varies from run to run.
    """

    scenario: str
    source: str
    model: str
    cluster: dict[str, Any]
    batch: dict[str, Any]
    best: bool
    fidelity: str
    gpus: list[int]
    reference_gpus: int | None
    rows: list[dict[str, Any]]
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        """What ``scale.json`` holds: every field but the wall time, so that the same
        inputs give the same bytes."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "wall_s"
        }


def run_scale(
    scenario_path: str | Path,
    gpus: list[int],
    batch: str | None = None,
    best: bool = False,
    overrides: list[str] | None = None,
    fidelity: str = "analytic",
    workers: int | None = None,
    progress: Progress | None = None,
    max_tp: int | None = None,
    force: bool = False,
) -> ScaleResult:
    """Simulate the scenario at each GPU count, the global batch following ``batch``
    (default ``per-gpu``); rows in ascending GPU count (:class:`ScaleResult`). A curve
    too large for this machine is refused before anything is laid out unless
    ``force``."""
    started = time.perf_counter()
    policy = batch or BATCH_POLICIES[0]
    if policy not in BATCH_POLICIES:
        raise ParasimError(f"--batch: expected one of {', '.join(BATCH_POLICIES)} (got {batch!r})")
    if fidelity not in ("analytic", "flow"):
        raise ParasimError(f"--fidelity: expected analytic or flow (got {fidelity!r})")
    if not gpus:
        raise ParasimError("--gpus: expected at least one GPU count")
    gpus = sorted(set(gpus))
    workers = resolve_workers(workers)
    overrides = list(overrides or [])
    base = prepare(scenario_path, overrides)
    for count in gpus:
        _whole_nodes(count, base.gpus_per_node, base.cluster_name)
    size = request_size(base.raw, base.base_dir)
    if not force and size is not None:  # the scenario as written is laid out first
        check_search("the scaling curve", [size], 1, reuses_cluster=False)
    try:  # the scenario at its own size sets tp, pp and each GPU's share of the batch
        written = scenario_from_dict(base.raw, source=base.source, base_dir=Path(base.base_dir))
    except ScenarioError as exc:
        raise ScenarioError(f"{base.source} as written: {exc}") from None
    args = (base, written, gpus, policy, overrides, fidelity, workers, progress)
    if best:
        rows = _best_rows(*args, max_tp, force)
    else:
        rows = _rule_rows(*args, force)
    reference = next((row for row in rows if row["layout"] is not None), None)
    for row in rows:
        if row["layout"] is None or reference is None:
            continue
        ratio = row["gpus"] / reference["gpus"]
        row["ideal_tokens_per_s"] = reference["tokens_per_s"] * ratio
        if policy == "fixed":
            row["speedup"] = reference["step_time_s"] / row["step_time_s"]
            row["efficiency"] = row["speedup"] / ratio
        else:
            per_gpu = row["tokens_per_s"] / row["gpus"]
            row["efficiency"] = per_gpu / (reference["tokens_per_s"] / reference["gpus"])
    return ScaleResult(
        scenario=base.name,
        source=base.source,
        model=base.model_name,
        cluster={
            "name": base.cluster_name,
            "gpus_per_node": base.gpus_per_node,
            "gpu": base.gpu_name,
            "capacity_bytes": base.capacity_bytes,
        },
        batch={
            "policy": policy,
            "scenario_gpus": written.layout.world,
            "scenario_global_batch": written.training.global_batch,
        },
        best=best,
        fidelity=fidelity,
        gpus=gpus,
        reference_gpus=reference["gpus"] if reference is not None else None,
        rows=rows,
        wall_s=time.perf_counter() - started,
    )


def _candidate(scenario: Scenario, dp: int) -> Candidate:
    """The scenario's layout with ``dp`` replicas."""
    return Candidate.of_recipe(scenario.recipe, dp=dp)


def _rule_rows(
    base: SweepBase,
    written: Scenario,
    gpus: list[int],
    policy: str,
    overrides: list[str],
    fidelity: str,
    workers: int,
    progress: Progress | None,
    force: bool,
) -> list[dict[str, Any]]:
    layout = written.layout
    grid = layout.tp * layout.cp * layout.pp
    grid_text = f"tp({layout.tp}) * pp({layout.pp})"
    if layout.cp > 1:
        grid_text = f"tp({layout.tp}) * cp({layout.cp}) * pp({layout.pp})"
    plans = []
    for count in gpus:
        nodes = _whole_nodes(count, base.gpus_per_node, base.cluster_name)
        if count % grid:
            raise ParasimError(
                f"--gpus: {grid_text} = {grid} does not divide {count} GPUs, "
                "so dp cannot take the rest"
            )
        dp = count // grid
        batch = _batch_at(policy, written, count)
        size = [
            f"cluster.nodes={nodes}",
            f"parallel.dp={dp}",
            f"training.global_batch={batch}",
            f"simulation.fidelity={fidelity}",
        ]
        plans.append((count, nodes, _candidate(written, dp), size))
    if not force:  # before any size is laid out: a million GPUs take seconds to
        sizes = [request_size(apply_overrides(base.raw, size), base.base_dir) for *_, size in plans]
        check_search(
            "the scaling curve",
            [s for s in sizes if s is not None],
            workers,
            reuses_cluster=False,
        )
    for count, _, _, size in plans:
        try:  # bad sizes fail here, before anything is simulated
            scenario_from_dict(
                apply_overrides(base.raw, size), source=base.source, base_dir=Path(base.base_dir)
            )
        except ParasimError as exc:
            raise ParasimError(f"--batch {policy} at {count} GPUs: {exc}") from None
    args = (base.raw, base.source, base.base_dir)
    items = [size for *_, size in plans]
    executor = process_pool(workers) if workers > 1 and len(items) > 1 else None
    try:
        with progress or Silent() as bar:
            runs = run_chunked(
                functools.partial(simulate_chunk, force=force),
                args,
                items,
                executor,
                workers,
                bar.stage(f"simulating {len(items)} sizes ({fidelity})", len(items)),
                largest=1,
            )
    finally:
        if executor is not None:
            executor.shutdown(cancel_futures=True)
    rows = []
    for (count, nodes, candidate, size), run in zip(plans, runs, strict=True):
        if run["status"] != "simulated":
            raise ParasimError(f"at {count} GPUs: {run['reason']}")
        rows.append(_row(count, nodes, candidate, run, [*overrides, *size]))
    return rows


def _batch_at(policy: str, written: Scenario, count: int) -> int:
    """The global batch at ``count`` GPUs (:func:`simulator.tools.sweep.scaled_batch`)."""
    own = written.training.global_batch
    try:
        return scaled_batch(policy, own, count, written.layout.world)
    except ParasimError as exc:
        raise ParasimError(f"at {count} GPUs: {exc}") from None


def _best_rows(
    base: SweepBase,
    written: Scenario,
    gpus: list[int],
    policy: str,
    overrides: list[str],
    fidelity: str,
    workers: int,
    progress: Progress | None,
    max_tp: int | None,
    force: bool,
) -> list[dict[str, Any]]:
    # everything but the grid's three sizes stays as the scenario has it, and the
    # pipeline's split follows from pp
    pins = Candidate.of_recipe(written.recipe).fields()
    for size in PLACEMENT_AXES:
        del pins[size]
    del pins["stage_layers"]
    if written.parallel.schedule == "custom":
        raise ParasimError(
            "--best: a custom pipeline order fits one layout only; scale it without --best"
        )
    plans = []
    for count in gpus:
        batch = _batch_at(policy, written, count)
        sweep: dict[str, Any] = {
            "overrides": [*overrides, f"training.global_batch={batch}"],
            "gpus": count,
            "fixed": pins,
            "max_tp": max_tp,
        }
        plans.append((count, batch, sweep))
    if not force:  # every size's sweep, before the first is laid out, the largest first
        searched: list[StepSize] = []
        hint = "scale fewer sizes, or without --best"
        for count, _, sweep in reversed(plans):
            sizes = sweep_sizes(*plan_sweep(base.source, **sweep, batch="fixed"), fidelity)
            check_search(f"the sweep at {count:,} GPUs", sizes, workers, hint=hint)
            searched += sizes
        check_search("the scaling curve", searched, workers, hint=hint)
    rows = []
    for count, batch, sweep in plans:
        nodes = _whole_nodes(count, base.gpus_per_node, base.cluster_name)
        result = run_sweep(
            base.source,
            **sweep,
            fidelity=fidelity,
            workers=workers,
            progress=progress,
            batch="fixed",
            force=True,  # checked above, all sizes together
            keep=1,  # the best layout is all a size needs
        )
        if not result.rows:
            rows.append(
                {
                    "gpus": count,
                    "nodes": nodes,
                    "layout": None,
                    "global_batch": batch,
                    "reason": no_layout_message(result),
                }
            )
            continue
        top = result.rows[0]
        candidate = Candidate.from_knobs(top)
        rows.append(_row(count, nodes, candidate, top, top["overrides"]))
    return rows


def _row(
    count: int, nodes: int, candidate: Candidate, run: dict[str, Any], overrides: list[str]
) -> dict[str, Any]:
    return {
        "gpus": count,
        "nodes": nodes,
        "layout": candidate.label(),
        **candidate.fields(),
        "global_batch": run["global_batch"],
        "microbatches": run["microbatches"],
        "step_time_s": run["step_time_s"],
        "tokens_per_s": run["tokens_per_s"],
        "tflops_per_gpu": run["tflops_per_gpu"],
        "mfu": run["mfu"],
        "peak_bytes_per_gpu": run["peak_bytes_per_gpu"],
        "capacity_bytes": run["capacity_bytes"],
        "oom": run["oom"],
        "breakdown_mean_s": run["breakdown_mean_s"],
        "warnings": run["warnings"],
        "overrides": list(overrides),
    }
