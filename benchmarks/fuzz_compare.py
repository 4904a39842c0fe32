"""Fuzzing ``parasim compare`` from the command line, with the folders a user has.

``parasim compare A B`` reads two run folders. This fuzz builds two predictions and a
measurement (a prediction's folder whose ``result.json`` says it was measured, as
``parasim replay`` writes it) of a tiny scenario once, then, case after case, copies
them, spoils them one of these ways and runs the command:

* **folders**: a folder missing, empty, a file, a dangling symlink or a symlink loop;
  the same folder twice (by name, through a symlink); ``result.json`` or the trace a
  folder, a symlink to a device, a named pipe, missing; both ``trace.json`` and
  ``trace.json.gz``; ``--out`` a file, a nested new folder, one of the inputs;
* **trace text**: empty, ``null``, a number, a string, an object without events, the
  events as a bare array (a valid Chrome trace: it must be read), cut short, invalid
  UTF-8, random bytes, nested a hundred thousand levels deep, ``NaN`` and ``Infinity``
  literals, an integer of thousands of digits, gzipped (valid, corrupt, empty);
* **events**: a field of some op events (``pid``, ``ts``, ``dur``, ``args.op``,
  ``args.tags.phase``...) set to null, a string, a negative, huge or odd number, a list
  or an object, or removed; events that are not objects; metadata and ``otherData``
  fields of the wrong type; no op event at all;
* **results**: a field ``compare`` reads (``step_time_s``, ``memory.oom``,
  ``breakdown.mean.compute``, ``overrides``, ``measured``...) or one it does not
  (``per_rank``, ``layout``) set to such values or removed, ``NaN`` written into the
  text, the whole file replaced by odd JSON.

Every case must end with exit status 0 and strict JSON in ``compare.json`` (and on
stdout with ``--json``: no ``NaN``), or with exit status 2 and one line on stderr that
holds no control character (:func:`benchmarks.fuzz_text.message_problem`). Anything
else is counted: a *traceback* (an exception, or another exit status), *bad-json*, a
*multi-line* or *unsafe-message* error, or a *timeout* (over :data:`CASE_LIMIT_S`).

``python -m benchmarks.fuzz_compare --cases 500`` runs it (about 0.1 s a case).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import io
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fuzz import CaseTimeout, time_limit
from benchmarks.fuzz_tally import Tally, traceback_detail
from benchmarks.fuzz_text import message_problem

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "cpu-tiny.yaml"
#: The tiny step every case starts from: two layers, two micro-batches (about 300 ops).
BASE_OVERRIDES = ("model.layers=2", "training.global_batch=4")
#: The second prediction's change (a what-if).
WHAT_IF = ("training.recompute=full",)
#: The seconds a case may take: reading and refusing is well within it.
CASE_LIMIT_S = 20.0

OUTCOMES = (
    "result",
    "error",
    "traceback",
    "bad-json",
    "multi-line",
    "unsafe-message",
    "timeout",
)
FAILURES = OUTCOMES[2:]

#: Values a field of a file is set to.
ODD_VALUES: tuple[Any, ...] = (
    None,
    "x",
    "",
    -1,
    -1e300,
    1e308,
    10**30,
    10**400,
    0,
    0.5,
    True,
    [],
    [1, 2],
    {},
    {"a": 1},
    "\x1b]0;PWNED\x07",
)
#: Fields of an op event (a dotted path into the event).
EVENT_FIELDS = (
    "ph",
    "pid",
    "tid",
    "ts",
    "dur",
    "name",
    "args",
    "args.op",
    "args.kind",
    "args.op_id",
    "args.label",
    "args.tags",
    "args.tags.phase",
    "args.tags.axis",
    "args.tags.layer",
    "args.tags.busy_s",
    "args.ready_us",
    "args.bytes",
    "args.flops",
    "args.group",
    "args.peer",
)
#: Fields of otherData the charts read.
OTHER_FIELDS = (
    "step_time_s",
    "idle",
    "world",
    "gpus_per_node",
    "representative_ranks",
    "stage_of_rank",
    "scenario",
    "fidelity",
)
#: Fields of result.json (compare reads the first ones, the others only go through).
RESULT_FIELDS = (
    "step_time_s",
    "scenario",
    "fidelity",
    "overrides",
    "measured",
    "memory",
    "memory.oom",
    "memory.peak_bytes_per_gpu",
    "memory.capacity_bytes",
    "memory.per_stage",
    "breakdown",
    "breakdown.mean",
    "breakdown.mean.compute",
    "breakdown.critical",
    "per_rank",
    "layout",
    "layout.tp",
    "moe",
    "warnings",
    "network",
    "simulation",
    "cluster",
)
TEXTS: tuple[bytes, ...] = (
    b"",
    b"null",
    b"1",
    b'"x"',
    b"{}",
    b"[]",
    b'{"traceEvents": 5}',
    b'{"traceEvents": []}',
    b"[1, 2, 3]",
    b"[null]",
    b"\xff\xfe\x00garbage",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "ts": NaN, "dur": 1, "args": {}}]}',
    b'{"step_time_s": Infinity}',
    b"[" + b"9" * 5000 + b"]",
)


# ------------------------------------------------------------------ the base folders


@dataclass
class Bases:
    """The folders every case copies: two predictions and a measurement."""

    a: Path
    b: Path
    measured: Path


def make_bases(where: Path) -> Bases:
    """Simulate the tiny step twice (the second a what-if) and make a measurement of
    the first: its folder, with ``result.json`` marked measured as a replay marks it."""
    from simulator.cli.main import main

    a, b, measured = where / "a", where / "b", where / "measured"
    common = ["--fidelity", "analytic", "--outputs", "result,trace"]
    sets = [arg for o in BASE_OVERRIDES for arg in ("--set", o)]
    what_if = [arg for o in WHAT_IF for arg in ("--set", o)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(SCENARIO), *sets, *common, "--out", str(a)]) == 0
        assert main(["run", str(SCENARIO), *sets, *what_if, *common, "--out", str(b)]) == 0
    shutil.copytree(a, measured)
    result = json.loads((measured / "result.json").read_text())
    result["fidelity"] = "measured"
    result["measured"] = {
        "backend": "gloo",
        "device": "cpu",
        "torch": "2.13.0",
        "warmup_steps": 2,
        "step_times_s": [result["step_time_s"]] * 3,
        "step_shown": 0,
        "verified_collectives": True,
    }
    (measured / "result.json").write_text(json.dumps(result))
    return Bases(a, b, measured)


# ---------------------------------------------------------------------- mutations


def _set_path(data: Any, dotted: str, value: Any, remove: bool) -> None:
    """Set (or remove) ``dotted`` in ``data`` where its parents are objects."""
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return
        node = node[part]
    if remove:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def _odd(rng: random.Random) -> tuple[Any, bool]:
    """An odd value, or the removal of the field."""
    return rng.choice(ODD_VALUES), rng.random() < 0.15


def _events(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "trace.json").read_text())


def _write_trace(folder: Path, document: Any, rng: random.Random) -> None:
    text = json.dumps(document)
    if rng.random() < 0.2:  # as a large run writes it
        (folder / "trace.json").unlink()
        (folder / "trace.json.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (folder / "trace.json").write_text(text)


def event_field(rng: random.Random, folder: Path) -> str:
    document = _events(folder)
    ops = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    field = rng.choice(EVENT_FIELDS)
    value, remove = _odd(rng)
    for event in rng.sample(ops, rng.randint(1, 3)):
        _set_path(event, field, value, remove)
    _write_trace(folder, document, rng)
    return f"{'removed' if remove else f'set to {value!r:.40}'}: {field}"


def other_events(rng: random.Random, folder: Path) -> str:
    document = _events(folder)
    events = document["traceEvents"]
    choice = rng.randrange(5)
    if choice == 0:
        events.insert(rng.randrange(len(events)), rng.choice(ODD_VALUES))
        what = "an event that is not an object"
    elif choice == 1:
        for event in events:
            if event.get("ph") == "M":
                event["args"] = rng.choice(ODD_VALUES)
        what = "metadata args odd"
    elif choice == 2:
        document["traceEvents"] = [e for e in events if e.get("ph") != "X"]
        what = "no op event"
    elif choice == 3:
        document["otherData"] = rng.choice(ODD_VALUES)
        what = "otherData odd"
    else:
        field = rng.choice(OTHER_FIELDS)
        value, remove = _odd(rng)
        _set_path(document["otherData"], field, value, remove)
        what = f"otherData.{field} {'removed' if remove else f'= {value!r:.40}'}"
    _write_trace(folder, document, rng)
    return what


def bare_array(rng: random.Random, folder: Path) -> str:
    _write_trace(folder, _events(folder)["traceEvents"], rng)
    return "the events as a bare array"


def trace_text(rng: random.Random, folder: Path) -> str:
    original = (folder / "trace.json").read_bytes()
    choice = rng.randrange(4)
    if choice == 0:
        data, what = rng.choice(TEXTS), "odd text"
    elif choice == 1:
        data, what = original[: rng.randrange(len(original))], "cut short"
    elif choice == 2:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
        what = "random bytes"
    else:
        text = original.decode()
        at = text.index('"ts":') + 5
        end = text.index(",", at)
        literal = rng.choice(("NaN", "Infinity", "-Infinity", "1e999", "9" * 5000))
        data, what = (text[:at] + literal + text[end:]).encode(), f"ts {literal[:12]}"
    if rng.random() < 0.3:
        (folder / "trace.json").unlink()
        name = folder / "trace.json.gz"
        zipped = rng.random() < 0.7
        name.write_bytes(gzip.compress(data) if zipped else data)
        what += " in trace.json.gz" + ("" if zipped else " (not gzipped)")
    else:
        (folder / "trace.json").write_bytes(data)
    return what


def result_field(rng: random.Random, folder: Path) -> str:
    data = json.loads((folder / "result.json").read_text())
    field = rng.choice(RESULT_FIELDS)
    value, remove = _odd(rng)
    _set_path(data, field, value, remove)
    (folder / "result.json").write_text(json.dumps(data))
    return f"result.json {field} {'removed' if remove else f'= {value!r:.40}'}"


def result_text(rng: random.Random, folder: Path) -> str:
    text = (folder / "result.json").read_text()
    choice = rng.randrange(3)
    if choice == 0:
        at = text.index('"step_time_s": ') + len('"step_time_s": ')
        end = text.index(",", at)
        literal = rng.choice(("NaN", "Infinity", "-Infinity", "1e999", "-0.0", "9" * 5000))
        (folder / "result.json").write_text(text[:at] + literal + text[end:])
        return f"result.json step_time_s {literal[:12]}"
    if choice == 1:
        (folder / "result.json").write_bytes(rng.choice(TEXTS))
        return "result.json odd text"
    (folder / "result.json").write_text(text[: rng.randrange(len(text))])
    return "result.json cut short"


def folder_shape(rng: random.Random, folder: Path) -> str:
    """Spoil the folder itself (what a case's command line then names)."""
    choice = rng.randrange(9)
    if choice in (0, 1):
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder)
    if choice == 0:
        return "missing"
    if choice == 1:
        folder.write_text("a file")
        return "a file"
    if choice == 2:
        for item in folder.iterdir():
            item.unlink()
        return "empty"
    name = rng.choice(("result.json", "trace.json"))
    target = folder / name
    target.unlink()
    if choice == 3:
        return f"no {name}"
    if choice == 4:
        target.mkdir()
        return f"{name} a folder"
    if choice == 5:
        target.symlink_to("/dev/zero" if rng.random() < 0.5 else "/dev/null")
        return f"{name} a device"
    if choice == 6:
        os.mkfifo(target)
        return f"{name} a named pipe"
    if choice == 7:
        target.symlink_to(folder / "missing")
        return f"{name} a dangling symlink"
    target.symlink_to(target)
    return f"{name} a symlink loop"


MUTATIONS: dict[str, Callable[[random.Random, Path], str]] = {
    "event-field": event_field,
    "other-events": other_events,
    "bare-array": bare_array,
    "trace-text": trace_text,
    "result-field": result_field,
    "result-text": result_text,
    "folder": folder_shape,
}
WEIGHTS = {
    "event-field": 5,
    "other-events": 2,
    "bare-array": 1,
    "trace-text": 3,
    "result-field": 4,
    "result-text": 2,
    "folder": 2,
}
#: How the two folders and ``--out`` are named on the command line, with their weights.
LAYOUTS = {
    "plain": 6,
    "swap": 2,
    "measured": 3,
    "same": 1,
    "symlink-same": 1,
    "out-file": 1,
    "out-nested": 1,
    "out-a": 1,
}


@dataclass(frozen=True)
class Case:
    """A mutation of one of the two folders, how the command line names them, and the
    seed that drew the details."""

    mutation: str
    layout: str
    seed: int

    def describe(self) -> str:
        return f"{self.mutation} / {self.layout} (seed {self.seed})"


def random_case(rng: random.Random) -> Case:
    names = list(MUTATIONS)
    mutation = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
    layout = rng.choices(list(LAYOUTS), weights=list(LAYOUTS.values()))[0]
    return Case(mutation, layout, rng.randrange(2**32))


# ------------------------------------------------------------------- running a case


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the JSON")

    return json.loads(text, parse_constant=refuse)


def _command_line(case: Case, rng: random.Random, work: Path, bases: Bases) -> list[str]:
    """Copy the bases into ``work``, spoil one and return the arguments."""
    a, b = work / "a", work / "b"
    shutil.copytree(bases.measured if case.layout == "measured" else bases.a, a)
    shutil.copytree(bases.b, b)
    out: list[str] = ["--out", str(work / "out")]
    if case.layout == "same":
        b = a
    elif case.layout == "symlink-same":
        shutil.rmtree(b)
        b.symlink_to(a)
    elif case.layout == "swap":
        a, b = b, a
    elif case.layout == "out-file":
        (work / "out").write_text("a file")
    elif case.layout == "out-nested":
        out = ["--out", str(work / "new" / "deeper" / "out")]
    elif case.layout == "out-a":
        out = ["--out", str(a)]
    detail = MUTATIONS[case.mutation](rng, rng.choice((a, b)))
    argv = ["compare", str(a), str(b), *out]
    if rng.random() < 0.3:
        argv.append("--json")
    return argv + [f"#{detail}"]


def run_case(case: Case, bases: Bases, seconds: float = CASE_LIMIT_S) -> tuple[str, str]:
    """``(outcome, detail)`` of one case (:data:`OUTCOMES`)."""
    from simulator.cli.main import main

    rng = random.Random(case.seed)
    work = Path(tempfile.mkdtemp(prefix="parasim-fuzz-compare-"))
    out, err = io.StringIO(), io.StringIO()
    try:
        argv = _command_line(case, rng, work, bases)
        detail = argv.pop()[1:]
        with time_limit(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = int(exc.code or 0)
        if code == 2:
            err = io.StringIO(err.getvalue().replace(str(work), "<work>"))
            problem = message_problem(err.getvalue())
            return (
                (problem, f"{detail}: {err.getvalue()[:300]}")
                if problem
                else (
                    "error",
                    err.getvalue().strip(),
                )
            )
        if code != 0:
            return "traceback", f"{detail}: exit {code}: {err.getvalue()[-300:]}"
        target = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[2])
        try:
            _strict_json((target / "compare.json").read_text())
            if "--json" in argv:
                _strict_json(out.getvalue())
        except (OSError, ValueError) as exc:
            return "bad-json", f"{detail}: {exc}"
        return "result", detail
    except CaseTimeout:
        return "timeout", f"over {seconds:g} s"
    except RecursionError:
        return "traceback", "RecursionError"
    except Exception as exc:  # noqa: BLE001 - a traceback is what is being counted
        return "traceback", traceback_detail(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_fuzz(cases: int, seed: int, examples: int, limit: float = CASE_LIMIT_S) -> int:
    """Run ``cases`` cases and print the counts; 1 when any failed."""
    rng = random.Random(seed)
    tally = Tally(OUTCOMES, FAILURES, list(MUTATIONS), examples)
    errors: Counter[str] = Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="parasim-fuzz-bases-") as where:
        bases = make_bases(Path(where))
        for _ in range(cases):
            case = random_case(rng)
            outcome, detail = run_case(case, bases, limit)
            tally.add(case.describe(), case.mutation, outcome, detail)
            if outcome == "error":
                errors[detail.split(":", 2)[-1].strip()[:70]] += 1
    wall = time.perf_counter() - started
    tally.print_counts(f"{cases} compare cases (seed {seed}) in {wall:.0f} s")
    print("most frequent one-line errors:")
    for text, n in errors.most_common(10):
        print(f"  {n:>5} x {text}")
    tally.print_examples()
    return 1 if tally.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_compare", description=__doc__)
    parser.add_argument("--cases", type=int, default=500, help="cases to run (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--limit", type=float, default=CASE_LIMIT_S, help="seconds per case (default 20)"
    )
    parser.add_argument("--examples", type=int, default=3, help="examples per failure kind")
    args = parser.parse_args(argv)
    return run_fuzz(args.cases, args.seed, args.examples, args.limit)


if __name__ == "__main__":
    raise SystemExit(main())
