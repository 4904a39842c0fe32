"""Fuzzing parasim's front door: scenarios generated from the schema itself.

Each case starts from a shipped scenario and changes one to four of its fields. The
fields come from the schema parasim validates with (:class:`ScenarioSpec` and the
cluster's :class:`~topologies.spec.ClusterSpec`, walked leaf by leaf), and each new
value is either one the field's schema allows (an enum member, a number inside its
bounds, a boolean) or garbage (zero, negative, huge and non-finite numbers, booleans for
numbers, strings, lists, mappings, null). Every case must end in one of two ways:

* a **result** whose invariants hold: every number finite, the time categories of each
  rank summing to the step time, ``0 ≤ MFU ≤ HFU ≤ 1``, memory terms ``≥ 0``, and
  ``tokens/s = global batch · sequence / step time``;
* a **one-line error** (:class:`~simulator.common.errors.ParasimError` or
  :class:`~topologies.TopologyError`) naming what is wrong.

Anything else is counted: a *traceback* (any other exception), an *invariant* violation,
a *multi-line* error, or a *timeout* (the case ran past its limit).

``python -m benchmarks.fuzz --cases 10000`` runs that many cases and prints the counts by
outcome, with the first examples of each failure (``benchmarks/RESULTS.md`` records
them); ``tests/test_fuzz.py`` runs a bounded number at a fixed seed with hypothesis.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import signal
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator.common.errors import ParasimError
from simulator.request.scenario import ScenarioSpec, scenario_from_dict
from simulator.run.simulate import RunResult, executed_flops_per_step, run_scenario
from topologies import TopologyError
from topologies.spec import ClusterSpec

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

#: Shipped scenarios small enough to simulate a few hundred times (at most 64 GPUs,
#: dense or small MoE): the starting points of every case.
BASES = (
    "small.yaml",
    "pipeline-demo.yaml",
    "teaching/pipeline-bubble-mistake.yaml",
    "teaching/moe-imbalance-mistake.yaml",
    "teaching/sp-memory-fix.yaml",
    "teaching/dp-oom-mistake.yaml",
    "teaching/fsdp-across-nodes-fix.yaml",
    "teaching/cp-across-nodes-fix.yaml",
    "teaching/ep-routing-fix.yaml",
    "teaching/layering-fix.yaml",
)

#: Values no field should take quietly.
GARBAGE: tuple[Any, ...] = (
    0,
    -1,
    2**63,
    1e200,
    -1e-300,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    "",
    "x",
    "../../outside",
    "450",
    [],
    [1, 2],
    {},
    {"a": 1},
    None,
)

OUTCOMES = ("result", "error", "traceback", "invariant", "multi-line", "timeout")


# ------------------------------------------------------------------ the schema's leaves


@dataclass(frozen=True)
class Leaf:
    """A field of the schema: its path in a scenario and what its schema says."""

    path: tuple[str, ...]
    schema: dict[str, Any] = field(hash=False, compare=False)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if ref else node


def _walk(node: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...]) -> Iterator[Leaf]:
    node = _resolve(node, defs)
    options = [_resolve(o, defs) for o in node.get("anyOf", [])]
    objects = [o for o in options if o.get("properties")]
    if node.get("properties") or objects:
        for part in [node, *objects]:
            for name, child in part.get("properties", {}).items():
                yield from _walk(child, defs, (*path, name))
        return
    yield Leaf(path, node)


def schema_leaves() -> list[Leaf]:
    """Every leaf field of a scenario: the scenario schema's, and the cluster's."""
    scenario = ScenarioSpec.model_json_schema()
    cluster = ClusterSpec.model_json_schema()
    leaves = [
        leaf
        for name, child in scenario["properties"].items()
        if name != "cluster"
        for leaf in _walk(child, scenario.get("$defs", {}), (name,))
    ]
    leaves += list(_walk(cluster, cluster.get("$defs", {}), ("cluster",)))
    leaves.append(Leaf(("cluster", "preset"), {"type": "string"}))
    return sorted(set(leaves), key=lambda leaf: leaf.path)


def _types(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return schema.get("anyOf", [schema])


def valid_values(schema: dict[str, Any]) -> list[Any]:
    """A few values the leaf's schema allows."""
    values: list[Any] = []
    for option in _types(schema):
        kind = option.get("type")
        if "enum" in option:
            values += list(option["enum"])
        elif "const" in option:
            values.append(option["const"])
        elif kind == "boolean":
            values += [True, False]
        elif kind == "null":
            values.append(None)
        elif kind in ("integer", "number"):
            low = option.get("minimum", option.get("exclusiveMinimum", 0))
            low = low + (1 if "exclusiveMinimum" in option else 0)
            high = option.get("maximum", option.get("exclusiveMaximum", low + 64))
            numbers = {low, high, (low + high) // 2, low + 1, low * 2, 2, 8}
            picked = [n for n in numbers if low <= n <= high]
            values += picked if kind == "integer" else [float(n) for n in picked] + [0.5]
        elif kind == "string":
            values += ["dgx-h100", "dgx-a100", "gpt2-small", "llama3-8b"]
        elif kind == "array":
            values += [[], [1], ["tp", "dp", "pp"]]
    return values or [None]


# ------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """A base scenario and the field changes applied to it."""

    base: str
    changes: tuple[tuple[tuple[str, ...], Any], ...]

    def raw(self) -> dict[str, Any]:
        scenario = copy.deepcopy(_base(self.base))
        for path, value in self.changes:
            _assign(scenario, path, copy.deepcopy(value))
        return scenario

    def describe(self) -> str:
        sets = " ".join(f"--set {'.'.join(p)}={_text(v)}" for p, v in self.changes)
        return f"scenarios/{self.base} {sets}"


def _text(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _assign(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = raw
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _present(raw: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether the section holding ``path``'s field exists in ``raw``."""
    node: Any = raw
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return isinstance(node, dict)


def random_case(rng: random.Random, leaves: list[Leaf]) -> Case:
    """A case drawn with ``rng``: half of the values valid, half garbage; three fields
    in four from sections the base scenario has (a mixture of experts' fields on a
    dense model mostly fail on the missing expert count)."""
    base = rng.choice(BASES)
    raw = _base(base)
    present = [leaf for leaf in leaves if _present(raw, leaf.path)]
    changes = []
    for _ in range(rng.randint(1, 4)):
        leaf = rng.choice(present if rng.random() < 0.75 else leaves)
        pool = valid_values(leaf.schema) if rng.random() < 0.5 else list(GARBAGE)
        changes.append((leaf.path, rng.choice(pool)))
    return Case(base, tuple(changes))


_BASES: dict[str, dict[str, Any]] = {}


def _base(name: str) -> dict[str, Any]:
    if name not in _BASES:
        _BASES[name] = yaml.safe_load((SCENARIOS / name).read_text())
    return _BASES[name]


# --------------------------------------------------------------------- running a case


class CaseTimeout(Exception):
    """The case ran past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the main thread after ``seconds`` (SIGALRM)."""

    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _non_finite(value: Any, where: str = "result") -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} = {value}"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{where}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _non_finite(item, f"{where}[{index}]")
            if found:
                return found
    return None


def violations(run: RunResult) -> list[str]:
    """The invariants a simulated step breaks (empty when it is sound)."""
    result, seq_len = run.result, run.scenario.model.seq_len
    broken = []
    found = _non_finite(result.to_json())
    if found:
        broken.append(f"non-finite number: {found}")
    step = result.step_time_s
    if not step > 0:
        broken.append(f"step time {step}")
    for row in result.per_rank:
        total = sum(row.breakdown.values())
        if not math.isclose(total, step, rel_tol=1e-6, abs_tol=1e-12):
            broken.append(f"rank {row.rank}: categories sum to {total}, step {step}")
            break
    # MFU and HFU count causal attention's full s² (docs/modelling.md); what the kernels run,
    # the masked half skipped, must fit in the GPUs' peak; and MFU and HFU are the
    # TFLOP/s per GPU the result states over the peak it states
    world = run.scenario.layout.world
    executed = executed_flops_per_step(run.schedule) * world / len(run.schedule.programs)
    utilisation = executed / (step * world * run.scenario.cluster_spec.gpu.peak_flops)
    peak = result.cluster.peak_flops_per_gpu
    agree = math.isclose(
        result.mfu * peak, result.tflops_per_gpu * 1e12, rel_tol=1e-9
    ) and math.isclose(result.hfu * peak, result.hardware_tflops_per_gpu * 1e12, rel_tol=1e-9)
    if not (0 <= result.mfu <= result.hfu + 1e-9 and utilisation <= 1 + 1e-9 and agree):
        broken.append(
            f"MFU {result.mfu:.4f}, HFU {result.hfu:.4f}, executed {utilisation:.4f} of peak; "
            f"{result.tflops_per_gpu:.4g} model and {result.hardware_tflops_per_gpu:.4g} "
            f"hardware TFLOP/s per GPU of a {peak / 1e12:.4g} TFLOP/s peak"
        )
    memory = result.memory
    if memory.peak_bytes_per_gpu < 0 or any(
        value < 0 for stage in memory.per_stage for value in stage.terms_bytes.values()
    ):
        broken.append("negative memory")
    expected = result.layout.global_batch * seq_len / step if step > 0 else math.nan
    if not math.isclose(result.tokens_per_s, expected, rel_tol=1e-9):
        broken.append(f"tokens/s {result.tokens_per_s} against {expected}")
    return broken


def run_case(case: Case, seconds: float = 20.0) -> tuple[str, str]:
    """``(outcome, detail)`` of one case (:data:`OUTCOMES`)."""
    try:
        with time_limit(seconds):
            scenario = scenario_from_dict(case.raw(), source="fuzz", base_dir=SCENARIOS)
            run = run_scenario(scenario)
    except CaseTimeout:
        return "timeout", f"over {seconds:g} s"
    except (ParasimError, TopologyError) as exc:
        message = str(exc)
        if "\n" in message.strip():
            return "multi-line", message
        return "error", message
    except Exception as exc:  # noqa: BLE001 - a traceback is what is being counted
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        return "traceback", f"{type(exc).__name__} at {where}: {exc}"
    broken = violations(run)
    if broken:
        return "invariant", "; ".join(broken)
    return "result", ""


# ------------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=1000, help="cases to run (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--limit", type=float, default=20.0, help="seconds per case before a timeout (20)"
    )
    parser.add_argument("--examples", type=int, default=3, help="examples per failure kind")
    parser.add_argument(
        "--family",
        choices=("schema", "text"),
        default="schema",
        help="schema: fields of parsed scenarios (default); text: the files' bytes, the "
        "files they name and the output folder (benchmarks.fuzz_text)",
    )
    args = parser.parse_args(argv)
    if args.family == "text":
        from benchmarks.fuzz_text import run_family

        limit = args.limit if args.limit != 20.0 else None
        return run_family(args.cases, args.seed, args.examples, limit)
    rng = random.Random(args.seed)
    leaves = schema_leaves()
    counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    kinds: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    started = time.perf_counter()
    for _ in range(args.cases):
        case = random_case(rng, leaves)
        outcome, detail = run_case(case, args.limit)
        counts[outcome] += 1
        if outcome == "error":
            errors[detail.split(":")[0]] += 1
        if outcome in ("traceback", "invariant", "multi-line", "timeout"):
            kind = detail.split(":")[0] if outcome != "invariant" else detail[:60]
            kinds[f"{outcome}: {kind}"] += 1
            shown = examples.setdefault(outcome, [])
            if len(shown) < args.examples:
                shown.append(f"{case.describe()}\n      -> {detail[:300]}")
    wall = time.perf_counter() - started
    print(f"{args.cases} cases (seed {args.seed}, {len(leaves)} fields) in {wall:.0f} s")
    for outcome in OUTCOMES:
        print(f"  {outcome:<11} {counts[outcome]}")
    for kind, n in kinds.most_common(20):
        print(f"    {n:>5} x {kind}")
    print("most frequent one-line errors, by the field they name:")
    for kind, n in errors.most_common(8):
        print(f"    {n:>5} x {kind}")
    for outcome, shown in examples.items():
        print(f"examples of {outcome}:")
        for line in shown:
            print(f"  {line}")
    bad = sum(counts[o] for o in ("traceback", "invariant", "multi-line"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
