"""The size guard (:mod:`simulator.run.simulate`): a step is estimated before it is built,
the modelled cluster's GPUs counted beside the simulated ranks' ops, and one too large
for this machine is refused in one line before any rank is laid out; and an interrupted
console command ends at once instead of freeing what it built."""

from __future__ import annotations

import contextlib
import io
import os

import pytest

import simulator.request.scenario as scenario_module
from simulator.cli import main as cli_main
from simulator.common import collector
from simulator.common.errors import ParasimError
from simulator.request.scenario import apply_overrides, load_scenario, read_scenario_file
from simulator.run import simulate
from simulator.tools import explain

from .conftest import SCENARIOS

GPT3 = SCENARIOS / "gpt3-175b.yaml"
# the reproducer's million GPUs: gpt3-175b dense, analytic, one micro-batch per replica
MILLION = [
    "cluster.nodes=125000",
    "parallel.dp=null",
    "training.global_batch=15625",
    "simulation.fidelity=analytic",
]


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main.main(argv)
    return code, err.getvalue()


def _sets(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def test_a_step_costs_its_ops_and_its_clusters_gpus():
    small = simulate.scenario_size(load_scenario(SCENARIOS / "small.yaml"))
    assert small.gpus == 8 and small.ops > 0 and not small.folded  # flow, 8 ranks
    assert simulate.size_problem(small) is None
    million = simulate.request_size(
        apply_overrides(read_scenario_file(GPT3), MILLION), str(SCENARIOS)
    )
    assert million.gpus == 1_000_000 and million.folded and million.blocked
    # a few thousand ops: the cluster's GPUs are most of its cost, seconds and under a GB
    # (4.2 s and 0.65 GB measured), so it runs
    assert million.ops < 1e4
    assert million.seconds == pytest.approx(
        million.ops * simulate.SECONDS_PER_BLOCKED_OP + 1e6 * simulate.SECONDS_PER_GPU_ANALYTIC
    )
    assert million.bytes == pytest.approx(
        million.ops * simulate.BYTES_PER_OP + 1e6 * simulate.BYTES_PER_GPU
    )
    assert simulate.size_problem(million) is None
    assert "use fewer GPUs" in simulate.advice(million)
    # in flow fidelity every link's load is logged: each GPU costs more
    flow = simulate.request_size(
        apply_overrides(read_scenario_file(GPT3), [*MILLION, "simulation.fidelity=flow"]),
        str(SCENARIOS),
    )
    assert flow.seconds_per_gpu > million.seconds_per_gpu
    # the estimate from the fields agrees with the loaded scenario's
    loaded = simulate.scenario_size(load_scenario(GPT3, ["simulation.fidelity=analytic"]))
    fields = simulate.request_size(
        apply_overrides(read_scenario_file(GPT3), ["simulation.fidelity=analytic"]),
        str(SCENARIOS),
    )
    assert fields == loaded


def test_an_moe_step_costs_more_ops_and_a_split_per_ep_peer():
    mixtral = SCENARIOS / "mixtral-ep.yaml"
    moe = simulate.scenario_size(load_scenario(mixtral))
    dense = simulate.step_size(moe.gpus, 1, 1, 1, moe.folded, False)
    assert moe.ep == load_scenario(mixtral).layout.ep > 1
    per_op = simulate.BYTES_PER_OP + simulate.BYTES_PER_OP_PER_EP_RANK * moe.ep
    assert moe.bytes == pytest.approx(moe.ops * per_op + moe.gpus * simulate.BYTES_PER_GPU)
    assert simulate.OPS_PER_MOE_LAYER_PASS > simulate.OPS_PER_LAYER_PASS
    assert dense.ep == 0
    # the estimate from the fields agrees with the loaded scenario's, MoE included
    fields = simulate.request_size(read_scenario_file(mixtral), str(SCENARIOS))
    assert fields == moe


def test_fields_that_do_not_resolve_leave_the_refusal_to_the_loader():
    raw = read_scenario_file(GPT3)
    for overrides in (
        ["parallel.tp=3", "parallel.dp=null"],  # no dp fills the world
        ["cluster.nodes=200000000", "parallel.dp=null"],  # beyond the most GPUs laid out
        ["model.preset=gpt5"],
        ["cluster.preset=nothing"],
    ):
        assert simulate.request_size(apply_overrides(raw, overrides), str(SCENARIOS)) is None


@pytest.mark.parametrize("command", ["run", "explain"])
def test_a_million_ranks_are_refused_before_anything_is_laid_out(command, monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("the scenario was laid out")

    monkeypatch.setattr(scenario_module, "load_scenario", refuse)
    monkeypatch.setattr(explain, "load_scenario", refuse)
    # every one of a million ranks simulated
    unfolded = [*MILLION, "simulation.fold=false"]
    argv = [command, str(GPT3), *_sets(unfolded), "--out", str(tmp_path / "o")]
    code, err = _cli(argv)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("parasim: error: the step is too large to simulate here: ")
    assert "1,000,000 GPUs in the modelled cluster" in err and "layers or GPUs" in err
    # explain has no --force to offer
    assert ("--force" in err) == (command == "run")
    assert not (tmp_path / "o").exists()


def test_force_runs_past_the_guard(monkeypatch, tmp_path):
    # a step refused by a tiny budget runs with --force
    monkeypatch.setattr(simulate, "MAX_STEP_SECONDS", 1e-9)
    argv = ["run", str(SCENARIOS / "small.yaml"), "--outputs", "result"]
    code, err = _cli([*argv, "--out", str(tmp_path / "a")])
    assert code == 2 and "too large" in err
    code, err = _cli([*argv, "--out", str(tmp_path / "b"), "--force"])
    assert code == 0, err


def test_a_run_refused_inside_a_search_names_the_step(monkeypatch):
    monkeypatch.setattr(simulate, "MAX_STEP_SECONDS", 1e-9)
    with pytest.raises(ParasimError, match="the step is too large to simulate here"):
        simulate.check_size(load_scenario(SCENARIOS / "small.yaml"))


def test_an_interrupted_console_command_ends_at_once(monkeypatch):
    """Past the one line, the console script leaves at once: freeing what a command
    built (a million ranks' groups) took over 10 s after SIGTERM."""
    exits = []

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main.COMMANDS["run"], "command", interrupted)
    monkeypatch.setattr(cli_main.os, "_exit", exits.append)
    argv = ["run", str(SCENARIOS / "small.yaml")]
    assert _cli(argv) == (130, "parasim: interrupted\n")
    assert exits == []  # a process that goes on after its command returns
    monkeypatch.setattr(collector, "_ENDS_WITH_COMMAND", os.getpid())
    code, err = _cli(argv)
    assert exits == [130] and err == "parasim: interrupted\n"
