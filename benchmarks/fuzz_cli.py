"""Fuzzing ``parasim sweep``, ``parasim scale`` and ``--set`` with odd command lines.

:mod:`benchmarks.fuzz` mutates scenarios and :mod:`benchmarks.fuzz_text` their bytes;
this family mutates the command line a user types around a sound scenario: each case
takes a small, quick command (``sweep`` or ``scale`` of ``scenarios/small.yaml`` with
most dimensions pinned, or ``run``) and adds one to three odd arguments from
:data:`ODD`:

* values a flag's type refuses or should (``--gpus 0``, ``-8``, ``12``, ``1e3``, a
  ``10**30``, ``nan``; ``--top 0``; ``--workers 0``, ``-1``, ``100000``; ``--max-tp 0``);
* pins and lists that make no sense (``--fix tp``, ``--fix =``, ``--fix tp=[1,2]``,
  ``--fix placement=[]``, ``--fix dp_shard=3``; ``--gpus 8,,16``, ``8,16,...,7``,
  ``8,16,...,1048576``);
* ``--set`` without ``=``, with an empty key or path segment, deep or huge YAML, a
  section replaced by a scalar, non-finite and huge numbers, control characters;
* policies, schedulers and caches that cannot work (``--batch`` without ``--gpus``,
  ``--mode`` against ``--batch``, ``--scheduler inproc://x`` or ``tcp://h:0``, ``--cache``
  on a file or where no folder can be made), and flags given twice.

Every case must end with exit status 0, or 2 with one line on stderr that holds no
control character (:func:`benchmarks.fuzz_text.message_problem`) — argparse's own
usage errors, which print the usage before that line, count as refused — within
:data:`CASE_LIMIT_S`. Anything else is counted: a *traceback* (an exception out of
``main``), a *multi-line* or *unsafe-message* error, another exit status, a *timeout*.

``python -m benchmarks.fuzz_cli --cases 300 --seed 0`` runs the family and prints the
counts with the first examples of each failure; ``tests/test_cli_fuzz.py`` runs a
bounded number of cases at a fixed seed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fuzz import CaseTimeout, time_limit
from benchmarks.fuzz_text import message_problem

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "scenarios" / "small.yaml")

#: The seconds a case may take: the commands below run in well under it.
CASE_LIMIT_S = 30.0

# one quick layout: what the odd arguments are added to
_PINS = ["--fix", "pp=1", "--fix", "recompute=none", "--fix", "sharding=none"]
_PINS += ["--fix", "micro_batch=4", "--fix", "placement=[tp,dp,pp]", "--fix", "sp=false"]
#: The command each case starts from, by name.
BASES: dict[str, list[str]] = {
    "sweep": ["sweep", SMALL, *_PINS, "--workers", "1"],
    "scale": ["scale", SMALL, "--gpus", "8,16", "--workers", "1"],
    "run": ["run", SMALL, "--outputs", "result"],
}

_DEEP = "[" * 5000 + "]" * 5000
_NESTED = "{a: " * 300 + "1" + "}" * 300
#: Odd arguments, by the commands that take them.
ODD: dict[str, list[list[str]]] = {
    "sweep": [
        ["--gpus", "0"],
        ["--gpus", "-8"],
        ["--gpus", "12"],
        ["--gpus", "1e3"],
        ["--gpus", str(10**30)],
        ["--gpus", "nan"],
        ["--gpus", "16", "--gpus", "8"],
        ["--gpus", "1048576"],
        ["--top", "0"],
        ["--top", "-3"],
        ["--top", str(10**9)],
        ["--max-tp", "0"],
        ["--max-tp", "-1"],
        ["--max-tp", str(10**12)],
        ["--fix", "tp"],
        ["--fix", "="],
        ["--fix", "tp="],
        ["--fix", "tp=0"],
        ["--fix", "tp=-2"],
        ["--fix", "tp=1e300"],
        ["--fix", "tp=[1,2]"],
        ["--fix", "tp={a: 1}"],
        ["--fix", "tp=" + _DEEP],
        ["--fix", "placement=[]"],
        ["--fix", "placement=[tp,dp,pp,cp]"],
        ["--fix", "cp_kind=zigzag"],
        ["--fix", "schedule=custom"],
        ["--fix", "dp_shard=3"],
        ["--fix", "dp_shard=-1"],
        ["--fix", "virtual_stages=0"],
        ["--fix", "ep=4"],
        ["--fix", "tp=2", "--fix", "tp=4"],
        ["--batch", "fixed"],
        ["--gpus", "24", "--batch", "per-gpu"],
        ["--gpus", "24", "--batch", "tokens"],
        ["--scheduler", "inproc://x"],
        ["--scheduler", "tcp://h:0"],
        ["--scheduler", "tcp://"],
        ["--scheduler", "nonsense"],
        ["--scheduler", ""],
        ["--cache", "{file}"],
        ["--cache", "/dev/null"],
        ["--cache", "/dev/null/cache"],
        ["--cache", "/proc/parasim-cache"],
        ["--no-cache", "--cache", "{file}"],
        ["--exhaustive", "--exhaustive"],
    ],
    "scale": [
        ["--gpus", "0"],
        ["--gpus", "-8"],
        ["--gpus", "8,,16"],
        ["--gpus", "8,16,...,7"],
        ["--gpus", "8,...,64"],
        ["--gpus", "8,16,...,1048576"],
        ["--gpus", "…"],
        ["--gpus", "8,x"],
        ["--gpus", str(10**30)],
        ["--gpus", "1e3"],
        ["--gpus", "12"],
        ["--batch", "fixed", "--gpus", "8,16,32"],
        ["--batch", "tokens"],
        ["--mode", "weak", "--batch", "fixed"],
        ["--mode", "strong"],
        ["--best", "--max-tp", "0"],
        ["--best", "--max-tp", "-5"],
        ["--workers", "0"],
        ["--workers", "100000"],
    ],
    "set": [
        ["--set", "noequals"],
        ["--set", "=1"],
        ["--set", ".=1"],
        ["--set", "training..global_batch=1"],
        ["--set", "training.global_batch="],
        ["--set", "training=5"],
        ["--set", "cluster=[1,2]"],
        ["--set", "cluster.nodes=1e400"],
        ["--set", "cluster.nodes=.nan"],
        ["--set", f"cluster.nodes={10**40}"],
        ["--set", "training.global_batch=" + _DEEP],
        ["--set", "model.moe=" + _NESTED],
        ["--set", "name=" + "x" * 100_000],
        ["--set", "name=\x1b[2J\x1b]0;owned\x07"],
        ["--set", "\x1b[31mkey=1"],
        ["--set", "training.global_batch=&a [*a]"],
        ["--set", "training.global_batch=!!python/object:os.system ls"],
        ["--set", "training.global_batch=32", "--set", "training.global_batch=8"],
        ["--set", "parallel={tp: 2, pp: 1, dp: 4}", "--set", "parallel.dp=null"],
        ["--set", "cluster.profile=/dev/zero"],
        ["--set", "cluster.profile=."],
        ["--set", "cluster.topology=/etc/passwd"],
        ["--set", "parallel.schedule_file=/proc/self/status"],
    ],
}
_ALL = {"sweep": ("sweep", "set"), "scale": ("scale", "set"), "run": ("set",)}


@dataclass
class Case:
    """One command line and how it ended."""

    argv: list[str]
    outcome: str = ""
    detail: str = ""


def generate(rng: random.Random, folder: Path) -> list[str]:
    """A command line: a base command and one to three odd arguments it takes."""
    command = rng.choice(list(BASES))
    argv = list(BASES[command])
    pool = [odd for family in _ALL[command] for odd in ODD[family]]
    for odd in rng.sample(pool, rng.randint(1, 3)):
        argv += [arg.replace("{file}", str(folder / "plain-file")) for arg in odd]
    return [*argv, "--out", str(folder / f"out-{rng.randrange(10**9)}")]


def run_case(argv: list[str], limit: float = CASE_LIMIT_S) -> Case:
    """Run ``parasim argv`` in this process and judge how it ended."""
    from simulator.cli.main import main

    case = Case(argv)
    out, err = io.StringIO(), io.StringIO()
    try:
        with time_limit(limit), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: usage, then one line
                code = exc.code if isinstance(exc.code, int) else 2
                lines = err.getvalue().strip().splitlines()
                err = io.StringIO((lines[-1] + "\n") if lines else "")
    except CaseTimeout:
        case.outcome = "timeout"
        return case
    except BaseException as exc:  # noqa: BLE001 (what escaped main is the finding)
        case.outcome = "traceback"
        case.detail = "".join(traceback.format_exception_only(exc)).strip()[:300]
        return case
    text = err.getvalue()
    if code == 0:
        case.outcome = "ok"
    elif code == 2:
        case.outcome = message_problem(text) or "refused"
        case.detail = text.strip()[:300]
    else:
        case.outcome = f"exit {code}"
        case.detail = text.strip()[:300]
    return case


#: The outcomes that are findings.
FAILURES = ("traceback", "multi-line", "unsafe-message", "timeout")


def run_family(cases: int, seed: int, examples: int = 3) -> Counter:
    """Run ``cases`` odd command lines from ``seed``; print the counts and examples."""
    rng = random.Random(seed)
    counts: Counter = Counter()
    shown: Counter = Counter()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "plain-file").write_text("not a folder\n")
        for _ in range(cases):
            case = run_case(generate(rng, Path(folder)))
            counts[case.outcome] += 1
            if case.outcome not in ("ok", "refused") and shown[case.outcome] < examples:
                shown[case.outcome] += 1
                print(f"{case.outcome}: {' '.join(a[:60] for a in case.argv[1:])}")
                print(f"    {case.detail}")
    elapsed = time.perf_counter() - started
    summary = ", ".join(f"{name} {n}" for name, n in counts.most_common())
    print(f"{cases} command lines in {elapsed:.0f} s: {summary}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_cli", description=__doc__)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=3)
    args = parser.parse_args(argv)
    counts = run_family(args.cases, args.seed, args.examples)
    return 1 if any(counts[name] for name in FAILURES) else 0


if __name__ == "__main__":
    raise SystemExit(main())
