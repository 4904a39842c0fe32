"""Every reproducer in ``tests/repro/`` (scenario files that once broke parasim) run as
a user runs it, ``parasim run FILE``: it ends in one clean line on stderr and exit
status 2, or in a result whose invariants hold (:func:`benchmarks.fuzz.violations`)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from benchmarks.fuzz import violations
from benchmarks.fuzz_text import message_problem
from simulator.cli.main import main
from simulator.common.errors import ParasimError
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from topologies import TopologyError

REPRO = Path(__file__).resolve().parent / "repro"
FILES = sorted(REPRO.glob("*.yaml"))
#: The files a sound parasim refuses (the others it runs): malformed or impossible input.
REFUSED = {
    "deep-nesting.yaml",
    "dup-keys.yaml",
    "escape-key.yaml",
    "gemm-huge-dim.yaml",
    "gemm-negative-eff.yaml",
    "gemm-zero-dim.yaml",
    "gemm-zero-eff.yaml",
    "huge-int.yaml",
}


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_a_reproducer_ends_in_one_clean_line_or_a_sound_result(path, tmp_path):
    code, err = _cli(["run", str(path), "--outputs", "result", "--out", str(tmp_path / "o")])
    if path.name in REFUSED:
        assert code == 2, err
    if code == 2:
        assert err.startswith("parasim: error: ")
        assert message_problem(err) is None, repr(err)
        with pytest.raises((ParasimError, TopologyError)):
            run_scenario(load_scenario(str(path), []))
        return
    assert code == 0, err
    broken = violations(run_scenario(load_scenario(str(path), [])))
    assert not broken, broken


def test_every_reproducer_is_described():
    readme = (REPRO / "README.md").read_text()
    assert FILES
    for path in FILES:
        assert path.name in readme, path.name


@pytest.mark.parametrize("name", ["fidelity-gap-tp16.yaml", "fidelity-gap-cp-pp16.yaml"])
def test_an_analytic_run_far_from_flow_says_so(name):
    """Where the closed-form collectives can part from the flow model (TP beyond a
    node, a context-parallel ring through a deep pipeline), the result warns."""
    # at the microbenchmarks' tensor-core rate (the GPUs these reproducers were found
    # on computed about that fast), communication weighs most against compute
    fast = ["cluster.gpu.sustained_fraction=1.0"]
    run = run_scenario(load_scenario(str(REPRO / name), fast))
    assert any("flow" in warning for warning in run.result.warnings), run.result.warnings


def test_no_warning_where_analytic_and_flow_agree():
    """At the presets' sustained rate the context-parallel reproducer's calls weigh
    less: analytic and flow agree within a few percent, and nothing is said."""
    path = str(REPRO / "fidelity-gap-cp-pp16.yaml")
    analytic = run_scenario(load_scenario(path, [])).result
    flow = run_scenario(load_scenario(path, ["simulation.fidelity=flow"])).result
    if not any("flow" in warning for warning in analytic.warnings):
        assert abs(flow.step_time_s / analytic.step_time_s - 1) < 0.05
