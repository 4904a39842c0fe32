"""End to end: scenarios through the builder, the engine and the accounting."""

from __future__ import annotations

import json
import re

import pytest

from simulator.analysis.metrics import CATEGORIES
from simulator.cli.main import main
from simulator.common.files import dumps_result
from simulator.request.recipe import Recipe
from simulator.request.scenario import load_scenario
from simulator.run.simulate import build_schedule, run_scenario
from simulator.schedule.ir import Collective, Schedule

from .conftest import SCENARIOS

VARIANTS = [
    ("small.yaml", []),
    ("pipeline-demo.yaml", []),
    ("pipeline-demo.yaml", ["parallel.schedule=gpipe"]),
    ("small.yaml", ["parallel.tp=1", "parallel.dp=8", "training.global_batch=32"]),
    (
        "small.yaml",
        [
            "parallel.tp=4",
            "parallel.pp=2",
            "parallel.dp=1",
            "training.micro_batch=1",
            "training.recompute=full",
        ],
    ),
    ("pipeline-demo.yaml", ["parallel.placement=[pp, tp, dp]", "training.recompute=selective"]),
]


@pytest.mark.parametrize("name,overrides", VARIANTS)
def test_categories_add_up_to_the_step_time_on_every_rank(name, overrides):
    run = run_scenario(load_scenario(SCENARIOS / name, overrides))
    step = run.result.step_time_s
    assert step > 0
    for row in run.result.per_rank:
        parts = row.breakdown
        assert set(parts) == set(CATEGORIES)
        assert all(value >= -1e-15 for value in parts.values())
        assert sum(parts.values()) == pytest.approx(step, rel=1e-12, abs=1e-15)
    mean = run.result.breakdown.mean
    assert sum(mean.values()) == pytest.approx(step, rel=1e-12)


def test_headline_figures_are_consistent():
    run = run_scenario(load_scenario(SCENARIOS / "pipeline-demo.yaml"))
    r = run.result
    gpus = r.cluster.gpus
    assert r.tflops_per_gpu == pytest.approx(r.model_flops_per_step / r.step_time_s / gpus / 1e12)
    assert r.mfu == pytest.approx(r.tflops_per_gpu * 1e12 / r.cluster.peak_flops_per_gpu)
    assert r.tokens_per_s == pytest.approx(8 * 2048 / r.step_time_s)
    assert 0 < r.mfu < 1
    # Full recompute would run one more forward: hardware FLOPs exceed model FLOPs only by
    # the non-matmul work here.
    assert r.hardware_flops_per_step >= r.model_flops_per_step


def test_pipeline_stages_have_a_bubble_and_tp_has_exposed_comm():
    run = run_scenario(load_scenario(SCENARIOS / "pipeline-demo.yaml"))
    mean = run.result.breakdown.mean
    assert mean["bubble"] > 0
    assert mean["exposed_comm"] > 0
    first = run.result.per_rank[0]
    assert first.exposed_comm_by_axis.keys() == {"tp"}


def test_dp_all_reduce_overlaps_backward():
    """Most of the gradient all-reduce hides behind the backward pass."""
    run = run_scenario(
        load_scenario(
            SCENARIOS / "small.yaml",
            [
                "parallel.tp=1",
                "parallel.dp=8",
                "training.global_batch=64",
                "training.micro_batch=8",
            ],
        )
    )
    schedule, times = run.schedule, run.times
    buckets = [
        op
        for op in schedule.programs[0].ops
        if isinstance(op, Collective) and op.tags["axis"] == "dp"
    ]
    assert len(buckets) > 3
    # DDP closes a bucket once it reaches its cap: 1 MiB for the first, 25 MiB after.
    assert 1024**2 <= buckets[0].bytes < 25 * 1024**2
    assert all(op.bytes >= 25 * 1024**2 for op in buckets[1:-1])
    comm_time = sum(times.end[0][op.id] - times.start[0][op.id] for op in buckets)
    exposed = run.result.per_rank[0].exposed_comm_by_axis.get("dp", 0.0)
    assert exposed < 0.5 * comm_time


# pipeline-demo cut from 24 layers to 4: every op kind of the full step (TP all-reduces,
# stage sends and receives, recomputed GEMMs, the optimizer) across the same 16 ranks and
# 2 nodes, in a fraction of the ops and the time
SHORT_PIPELINE = ["model.layers=4"]


def test_schedule_json_round_trip_is_lossless():
    schedule = build_schedule(
        load_scenario(
            SCENARIOS / "pipeline-demo.yaml",
            [*SHORT_PIPELINE, "training.global_batch=4", "training.recompute=full"],
        )
    )
    text = schedule.to_json()
    again = Schedule.from_json(text)
    assert again == schedule
    assert again.to_json() == text


def test_two_runs_write_byte_identical_results(tmp_path):
    sets = [f"--set={o}" for o in SHORT_PIPELINE]
    for out in ("a", "b"):
        argv = ["run", str(SCENARIOS / "pipeline-demo.yaml"), *sets, "--out", str(tmp_path / out)]
        assert main(argv) == 0
    for name in ("result.json", "trace.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    result = json.loads((tmp_path / "a" / "result.json").read_text())
    for key in (
        "step_time_s",
        "tokens_per_s",
        "model_flops_per_step",
        "tflops_per_gpu",
        "mfu",
        "breakdown",
        "per_rank",
        "memory",
        "warnings",
    ):
        assert key in result
    assert {"peak_bytes_per_gpu", "capacity_bytes", "oom"} <= set(result["memory"])


def test_a_run_for_its_result_alone_writes_the_same_result(tmp_path):
    """A run whose only output is result.json builds its step unlabelled (the stages of
    one shape share their lowering): its result.json is the full run's, byte for byte."""
    sets = [f"--set={o}" for o in SHORT_PIPELINE]
    scenario = str(SCENARIOS / "pipeline-demo.yaml")
    assert main(["run", scenario, *sets, "--out", str(tmp_path / "all")]) == 0
    alone = ["run", scenario, *sets, "--outputs", "result", "--out", str(tmp_path / "alone")]
    assert main(alone) == 0
    written = {p.name for p in (tmp_path / "alone").iterdir()}
    assert "result.json" in written and not {"trace.json", "report.html"} & written
    full = (tmp_path / "all" / "result.json").read_bytes()
    assert (tmp_path / "alone" / "result.json").read_bytes() == full


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("gpt3-175b.yaml", ["simulation.fidelity=analytic"]),
        ("gpt3-175b-interleaved.yaml", ["simulation.fidelity=analytic"]),
        ("mixtral-ep-skewed.yaml", ["simulation.fidelity=analytic"]),
        ("pipeline-demo.yaml", ["simulation.fidelity=flow", "parallel.schedule=zb-h1"]),
        ("llama3-70b-3d.yaml", ["simulation.fidelity=analytic"]),
    ],
)
def test_an_unlabelled_step_gives_the_labelled_one_s_result_to_the_last_digit(name, overrides):
    def result(labelled: bool) -> str:
        scenario = load_scenario(SCENARIOS / name, overrides)
        return dumps_result(run_scenario(scenario, labelled=labelled).result.to_json())

    assert result(labelled=False) == result(labelled=True)


def test_the_summary_prints_a_name_as_written(capsys, tmp_path):
    """rich would turn ``:fire:`` into an emoji: a name is printed as the user wrote it."""
    out = tmp_path / "out"
    argv = ["run", str(SCENARIOS / "small.yaml"), "--set", 'name="small :fire:"', "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "small :fire:" in printed
    assert "\N{FIRE}" not in printed


def test_json_flag_prints_the_result(capsys, tmp_path):
    assert main(["run", str(SCENARIOS / "small.yaml"), "--out", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "result.json").read_text())


def test_tp_group_across_nodes_is_legal_but_warned():
    scenario = load_scenario(SCENARIOS / "pipeline-demo.yaml", ["parallel.placement=[pp, tp, dp]"])
    run = run_scenario(scenario)
    assert any("span nodes" in w for w in run.result.warnings)
    inside = run_scenario(load_scenario(SCENARIOS / "pipeline-demo.yaml"))
    assert not any("span nodes" in w for w in inside.result.warnings)
    assert run.result.step_time_s > 1.3 * inside.result.step_time_s


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3-8b-128k-cp.yaml", "llama3-70b-fsdp.yaml"])
def test_todays_recipes_run_in_both_fidelities(name):
    times = {
        fidelity: run_scenario(
            load_scenario(SCENARIOS / name, [f"simulation.fidelity={fidelity}"])
        ).result
        for fidelity in ("analytic", "flow")
    }
    assert not times["analytic"].memory.oom
    assert times["flow"].step_time_s == pytest.approx(times["analytic"].step_time_s, rel=0.05)


def test_the_summary_names_every_layout_knob(capsys, tmp_path):
    lines = {}
    for name in ("layering-mistake", "layering-fix"):
        assert (
            main(
                ["run", str(SCENARIOS / "teaching" / f"{name}.yaml"), "--out", str(tmp_path / name)]
            )
            == 0
        )
        out = capsys.readouterr().out
        lines[name] = next(line for line in out.splitlines() if "layout" in line)
    assert lines["layering-mistake"] != lines["layering-fix"]
    assert "[pp,dp,tp]" in lines["layering-mistake"] and "[tp,pp,dp]" in lines["layering-fix"]
    result = json.loads((tmp_path / "layering-fix" / "result.json").read_text())
    assert Recipe.parse(result["layout"]["recipe"]).layout.placement == ("tp", "pp", "dp")


def test_every_command_describes_itself_and_shows_its_defaults():
    import argparse

    from simulator.cli.main import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in commands.choices.items():
        assert command.description, f"parasim {name} --help has no description"
        for action in command._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            assert action.help, f"parasim {name} {action.option_strings[0]} has no help"
            if action.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in action.help, f"{name} {action.option_strings[0]}: no default"


def test_compare_of_two_predictions_is_a_what_if(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(SCENARIOS / "small.yaml"), "--out", str(a)]) == 0
    sets = ["--set", "parallel.tp=2", "--set", "parallel.dp=4", "--set", "parallel.sp=true"]
    assert main(["run", str(SCENARIOS / "small.yaml"), *sets, "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "ab")]) == 0
    out = capsys.readouterr().out
    assert "a what-if" in out and "A against B" in out
    assert "measured" not in out and "error" not in out
    report = json.loads((tmp_path / "ab" / "compare.json").read_text())
    assert report["mode"] == "what-if" and report["labels"] == ["A", "B"]
    page = (tmp_path / "ab" / "compare.html").read_text()
    assert "A (upper lanes) over B" in page
    # the page holds the table the command prints: step time, then each op class
    table = page[page.index("<table id='parasim-compare-table'>") :]
    assert "<th>A against B</th>" in table and "<th>error</th>" not in table
    cells = re.findall(r"<tr><td>([^<]+)</td>", table)
    assert cells[:2] == ["step time", "peak memory per GPU"]
    assert cells[2:] == [row["class"] for row in report["op_classes"]]
