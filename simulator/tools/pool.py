"""The pool a search runs on, shared by ``parasim sweep`` and ``parasim scale``: the work
each worker does on one candidate (check it, estimate its memory, simulate it), the
process pool or Dask cluster that runs the candidates in chunks, and the guard that
refuses a search too large for this machine before anything is laid out.

A candidate travels as plain, picklable inputs: the scenario's raw YAML, its source
and folder, and the ``--set`` overrides that make it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import sys
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from operator import attrgetter
from pathlib import Path
from typing import Any, cast

from simulator.analysis.memory import memory_per_rank
from simulator.analysis.metrics import CATEGORIES
from simulator.common.collector import fewer_collections
from simulator.common.errors import ParasimError
from simulator.common.machine import machine_memory
from simulator.request.scenario import Scenario, apply_overrides, scenario_from_dict
from simulator.run.simulate import (
    StepSize,
    advice,
    finish_step,
    simulate_step,
    size_problem,
)
from simulator.tools.scheduler import open_dask

__all__ = [
    "load_overridden",
    "check_chunk",
    "simulate_overrides",
    "simulate_chunk",
    "process_pool",
    "run_chunked",
    "open_executor",
    "same_grid",
    "resolve_workers",
    "check_search",
    "WORKERS_PER_CORE",
    "MAX_WORKERS",
    "MAX_SEARCH_SECONDS",
]


# -- work done in worker processes (plain, picklable inputs) ----------------------------

_CLUSTERS: dict[str, Any] = {}


def load_overridden(
    raw: dict[str, Any], source: str, base_dir: str, overrides: list[str]
) -> Scenario:
    """The scenario of ``raw`` with ``overrides``, validated."""
    return scenario_from_dict(
        apply_overrides(raw, overrides), source=source, base_dir=Path(base_dir)
    )


def _check(
    raw: dict[str, Any],
    source: str,
    base_dir: str,
    overrides: list[str],
    estimates: dict[tuple[str, ...], Any] | None = None,
) -> dict:
    """Validate one candidate and estimate its memory. ``estimates`` holds the memory
    of the candidates already checked, by :func:`same_grid`: a placement decides which
    ranks a group joins, not what a rank holds, so the candidates that differ only in
    placement share one estimate (``tests/test_sweep.py`` holds them equal)."""
    try:
        scenario = load_overridden(raw, source, base_dir, overrides)
        estimates = {} if estimates is None else estimates
        key = same_grid(overrides)
        memory = estimates.get(key)
        if memory is None:
            capacity = scenario.cluster_spec.gpu.hbm_capacity
            memory = estimates[key] = memory_per_rank(
                scenario.recipe, scenario.model, scenario.moe, capacity
            )
    except ParasimError as exc:
        return {"status": "invalid", "reason": (str(exc).splitlines() or [""])[0]}
    return {
        "status": "pruned" if memory.oom else "fits",
        "peak_bytes_per_gpu": memory.peak_bytes_per_gpu,
        "capacity_bytes": memory.capacity_bytes,
        "dominant_term": memory.dominant_term,
    }


def check_chunk(
    raw: dict[str, Any], source: str, base_dir: str, chunk: list[list[str]]
) -> list[dict]:
    """:func:`_check` of several candidates (one task of the process pool); those that
    differ only in placement share one memory estimate."""
    estimates: dict[tuple[str, ...], Any] = {}
    return [_check(raw, source, base_dir, overrides, estimates) for overrides in chunk]


@fewer_collections()
def simulate_overrides(
    raw: dict[str, Any],
    source: str,
    base_dir: str,
    overrides: list[str],
    force: bool = False,
    slower_than: float = math.inf,
) -> dict[str, Any]:
    """Simulate one candidate; the headline numbers of its ``result.json`` (``force``:
    past the step guard, as the search itself was forced), or, where its step takes
    longer than ``slower_than`` (a ranking's slowest: it cannot rank), its step time
    alone, unaccounted (status ``slower``). The
    collector's slower pace lasts until the candidate's schedule and times are dropped,
    so the collection that follows finds little left to walk (run_scenario's own block,
    which ends while its result is alive, is then inside this one)."""
    try:
        raw = apply_overrides(raw, overrides)
        scenario = scenario_from_dict(raw, source=source, base_dir=Path(base_dir))
        key = json.dumps([raw.get("cluster"), base_dir], sort_keys=True, default=str)
        cluster = _CLUSTERS.get(key)
        spec = scenario.cluster_spec
        if cluster is None or cluster.spec is not spec and cluster.spec != spec:
            # first here, or a file the cluster names (a profile, a topology) has changed
            # since a search in this process built it
            _CLUSTERS.clear()  # one cluster at a time: a sweep has one, a scale run one per size
            _CLUSTERS[key] = scenario.cluster
        else:  # the network graph and its routes do not depend on the layout: reuse them
            scenario = dataclasses.replace(scenario, _cluster=cluster)
        # a search keeps numbers, not traces: stages of one shape share their lowering
        simulated = simulate_step(scenario, force=force, numbers_only=True)
        if simulated.times.step_time > slower_than:
            return {"status": "slower", "step_time_s": simulated.times.step_time}
        result = finish_step(scenario, simulated, timeline=False).result
    except ParasimError as exc:
        return {"status": "failed", "reason": (str(exc).splitlines() or [""])[0]}
    step = result.step_time_s
    mean = result.breakdown.mean
    memory = result.memory
    return {
        "status": "simulated",
        "step_time_s": step,
        "tokens_per_s": result.tokens_per_s,
        "tflops_per_gpu": result.tflops_per_gpu,
        "mfu": result.mfu,
        "microbatches": result.layout.microbatches,
        "global_batch": result.layout.global_batch,
        "peak_bytes_per_gpu": memory.peak_bytes_per_gpu,
        "capacity_bytes": memory.capacity_bytes,
        "memory_fraction": memory.peak_bytes_per_gpu / memory.capacity_bytes,
        "oom": memory.oom,
        "dominant_memory_term": memory.dominant_term,
        "breakdown_mean_s": {c: mean[c] for c in CATEGORIES},
        "bubble_fraction": mean["bubble"] / step,
        "exposed_comm_fraction": mean["exposed_comm"] / step,
        "stall_fraction": mean["imbalance_stall"] / step,
        "warnings": result.warnings,
        "interval": result.interval,
    }


def simulate_chunk(
    raw: dict[str, Any],
    source: str,
    base_dir: str,
    chunk: list[list[str]],
    force: bool = False,
    slower_than: float = math.inf,
) -> list[dict]:
    """:func:`simulate_overrides` of several candidates (one task of the process pool)."""
    return [
        simulate_overrides(raw, source, base_dir, overrides, force, slower_than)
        for overrides in chunk
    ]


# -- running tasks on every core --------------------------------------------------------


def process_pool(workers: int) -> ProcessPoolExecutor:
    # fork starts workers in milliseconds and they inherit the imported modules; the
    # progress bar refreshes by hand, so no thread is running when they start
    method = "fork" if sys.platform.startswith("linux") else None
    context = multiprocessing.get_context(method)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def _chunks(
    items: list, workers: int, largest: int, together: Callable[[Any], Hashable] | None = None
) -> list[list[int]]:
    """Indices of ``items`` in chunks of at most ``largest`` (fewer, for four chunks a
    worker at least); items of one ``together`` key go in one chunk, whole, in the
    order their keys first appear, so that one worker runs them one after another."""
    size = max(1, min(largest, math.ceil(len(items) / (4 * workers))))
    if together is None:
        return [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
    runs: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        runs.setdefault(together(item), []).append(index)
    chunks: list[list[int]] = []
    for run in runs.values():
        if chunks and len(chunks[-1]) + len(run) <= size:
            chunks[-1].extend(run)
        else:
            chunks.append(list(run))
    return chunks


def run_chunked(
    function: Callable[..., list[dict]],
    args: tuple,
    items: list,
    executor: Executor | None,
    workers: int,
    advance: Callable[[int], None],
    largest: int = 16,
    together: Callable[[Any], Hashable] | None = None,
) -> list[dict]:
    """``function(*args, chunk)`` over chunks of ``items``, in the pool when there is one;
    the results in the order of ``items``. Items of one ``together`` key run in one
    chunk (:func:`_chunks`), and so one after another in one process, which may reuse
    what the first of them built."""
    chunks = _chunks(items, workers if executor is not None else 1, largest, together)
    results: list[dict | None] = [None] * len(items)

    def keep(chunk: list[int], rows: list[dict]) -> None:
        for index, row in zip(chunk, rows, strict=True):
            results[index] = row
        advance(len(chunk))

    if executor is None:  # here, chunk by chunk in order, as a worker would run them
        for chunk in chunks:
            keep(chunk, function(*args, [items[i] for i in chunk]))
        return cast("list[dict]", results)  # every chunk ran
    futures = {
        executor.submit(function, *args, [items[i] for i in chunk]): chunk for chunk in chunks
    }
    for future in as_completed(futures):
        keep(futures[future], future.result())
    return cast("list[dict]", results)  # every future completed


def open_executor(scheduler: str | None, workers: int, tasks: int) -> tuple[Executor | None, int]:
    """The executor a search runs on, and how many tasks it runs at once: a Dask
    cluster when ``scheduler`` names one, else a process pool of ``workers`` (none for
    one worker or one task)."""
    if scheduler is not None:
        dask = open_dask(scheduler, workers)
        return dask, dask.threads
    if workers > 1 and tasks > 1:
        return process_pool(workers), workers
    return None, workers


def same_grid(overrides: list[str]) -> tuple[str, ...]:
    """A candidate's overrides but its placement: the candidates that differ only in
    placement lower the same programs (:mod:`simulator.schedule.relocate`)."""
    return tuple(o for o in overrides if not o.startswith("parallel.placement="))


#: The most processes a search runs per core, and in all: each holds its own copy of
#: the cluster and of the candidate it simulates, and more than a few per core only take
#: turns on them (Python's process pool starts them all with the first task).
WORKERS_PER_CORE = 4
MAX_WORKERS = 256


def resolve_workers(workers: int | None) -> int:
    """``--workers``: every core by default; refused below one and above
    :data:`WORKERS_PER_CORE` per core or :data:`MAX_WORKERS`."""
    cores = os.cpu_count() or 1
    if workers is None:
        return cores
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParasimError(f"--workers: expected a positive number (got {workers})")
    limit = min(MAX_WORKERS, WORKERS_PER_CORE * cores)
    if workers > limit:
        raise ParasimError(
            f"--workers: {workers} processes on {cores} cores; at most {limit} "
            f"({WORKERS_PER_CORE} a core, {MAX_WORKERS} in all): more only take turns on "
            "the cores, each with its own copy of the cluster"
        )
    return workers


# -- how large a search is ---------------------------------------------------------------

#: The longest a search may be estimated to take (s), as if every candidate it lists
#: were simulated: a search beyond it is a mistake more often than not (pin dimensions).
MAX_SEARCH_SECONDS = 8 * 3600.0


def check_search(
    what: str,
    sizes: list[StepSize],
    workers: int,
    shared: bool = True,
    reuses_cluster: bool = True,
    hint: str = "use fewer GPUs",
) -> None:
    """Refuse a search (``what``: ``the sweep``...) of steps of ``sizes`` on ``workers``
    processes before it starts: one step beyond the step guard
    (:func:`simulator.run.simulate.size_problem`), the workers' steps together beyond
    half the machine's memory (with ``shared``: they run on this machine), or all the
    steps estimated above :data:`MAX_SEARCH_SECONDS`. ``reuses_cluster``: the steps
    are layouts of one cluster (a sweep), rather than one step per cluster size (a scale
    run), which only changes the words of the error line."""
    if not sizes:
        return
    running = min(workers, len(sizes))
    slowest = max(sizes, key=attrgetter("seconds"))
    largest = max(sizes, key=attrgetter("bytes"))
    problem = None
    for size in (slowest, largest):
        step = f"a layout of {what}" if reuses_cluster else f"the step at {size.gpus:,} GPUs"
        alone = size_problem(size, step)
        if problem is None and alone is not None:
            problem = f"{alone}; {advice(size)}"
            if reuses_cluster:
                problem += f", {hint}"
    available = machine_memory()
    if problem is None and shared and available is not None and running > 1:
        if running * largest.bytes > available / 2:
            problem = (
                f"{what} is too large to run here: {running} workers holding about "
                f"{largest.bytes / 2**30:.3g} GiB each, beyond half the machine's "
                f"{available / 2**30:.0f} GiB; use fewer --workers"
            )
    wall = sum(size.seconds for size in sizes) / running
    if problem is None and wall > MAX_SEARCH_SECONDS:
        steps = "layouts" if reuses_cluster else "steps"
        problem = (
            f"{what} is too large to simulate here: up to {len(sizes):,} {steps} on up to "
            f"{largest.gpus:,} GPUs, about {wall / 3600:.3g} hours on {running} "
            f"worker{'s' * (running > 1)}, beyond {MAX_SEARCH_SECONDS / 3600:.0f} hours; "
            f"{hint}"
        )
    if problem is not None:
        raise ParasimError(f"{problem}, or pass --force to run it anyway")
