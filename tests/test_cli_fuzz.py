"""Odd command lines for ``sweep``, ``scale`` and ``--set`` (:mod:`benchmarks.fuzz_cli`):
each ends with exit status 0, or 2 and one clean line, never a traceback."""

from __future__ import annotations

import random
import re

import pytest

from benchmarks.fuzz_cli import BASES, FAILURES, ODD, generate, run_case

from .conftest import SCENARIOS

SMALL = str(SCENARIOS / "small.yaml")

# refused before anything is simulated: (arguments, what the line says)
REFUSED = [
    (["sweep", SMALL, "--fix", "tp=2", "--fix", "tp=4"], "--fix tp: pinned twice (2 and 4)"),
    (["sweep", SMALL, "--fix", "tp="], "--fix 'tp=': expected KEY=VALUE"),
    (["sweep", SMALL, "--fix", "="], "--fix '=': expected KEY=VALUE"),
    (["sweep", SMALL, "--gpus", "2097152"], "--gpus: 2,097,152 GPUs; parasim lays out at most"),
    (["scale", SMALL, "--gpus", "8,16,...,2097152"], "parasim lays out at most 1,048,576"),
    (["sweep", SMALL, "--batch", "tokens"], "--batch tokens: only with --gpus"),
    (["sweep", SMALL, "--scheduler", "inproc://x"], "inside this process only"),
    (["sweep", SMALL, "--workers", "100000"], "--workers: 100000 processes on"),
    (["scale", SMALL, "--gpus", "8", "--workers", "0"], "--workers: expected a positive"),
    (["scale", SMALL, "--gpus", "8", "--mode", "weak", "--batch", "fixed"], "contradicts"),
    (["sweep", SMALL, "--set", "noequals"], "--set 'noequals': expected key.path=value"),
    (["sweep", SMALL, "--cache", "/proc/parasim"], "--cache: cannot keep outcomes in /proc"),
]


@pytest.mark.parametrize("argv,expected", REFUSED, ids=[" ".join(a[2:]) for a, _ in REFUSED])
def test_an_odd_command_line_is_one_clean_line(argv, expected, tmp_path):
    case = run_case([*argv, "--out", str(tmp_path / "o")])
    assert case.outcome == "refused", case
    # argparse's own refusals read "parasim scale: error: argument --gpus: ..."
    assert expected in case.detail and re.match(r"parasim( \w+)?: error: ", case.detail)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command,odd",
    [
        (command, odd)
        for command, families in (("sweep", ("sweep", "set")), ("scale", ("scale", "set")))
        for family in families
        for odd in ODD[family]
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(a[:20] for a in value),
)
def test_every_odd_argument_alone_ends_cleanly(command, odd, tmp_path):
    (tmp_path / "plain-file").write_text("not a folder\n")
    argv = [*BASES[command], *[a.replace("{file}", str(tmp_path / "plain-file")) for a in odd]]
    case = run_case([*argv, "--out", str(tmp_path / "o")])
    assert case.outcome in ("ok", "refused"), case


def test_odd_command_lines_at_a_fixed_seed(tmp_path):
    rng = random.Random(2026)
    (tmp_path / "plain-file").write_text("not a folder\n")
    for _ in range(60):
        case = run_case(generate(rng, tmp_path))
        assert case.outcome not in FAILURES, case
