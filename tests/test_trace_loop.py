"""The trace loop for real, on gloo CPU processes: a replay recorded with the profiler,
a profile made from its traces alone, and the same scenario predicted with it."""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("torch")

from simulator.cli.main import main  # noqa: E402
from simulator.request.scenario import load_scenario  # noqa: E402
from simulator.run.simulate import run_scenario  # noqa: E402
from simulator.traces.labels import read_call, read_compute  # noqa: E402
from topologies.profile import load_profile  # noqa: E402

from .conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.hardware  # and so slow: see tests/conftest.py

SCENARIO = str(ROOT / "scenarios" / "cpu-tiny.yaml")


def _replay(tmp_path_factory) -> object:
    out = tmp_path_factory.mktemp("replay") / "measured"
    args = ["replay", SCENARIO, "--backend", "gloo", "--profile", "--steps", "6", "--out", str(out)]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    return _replay(tmp_path_factory)


@pytest.fixture(scope="module")
def replayed_again(tmp_path_factory):
    """A second replay, for a first one a busy machine slowed: a rank descheduled in
    the middle of a step leaves waits the profile, made of each op's own time, does not
    hold (measured twice, as the benchmarks measure, the better figure kept)."""
    return _replay(tmp_path_factory)


def test_a_profiled_replay_writes_one_labelled_trace_per_rank(replayed):
    files = sorted((replayed / "kineto").iterdir())
    assert [f.name for f in files] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    trace = json.loads(gzip.decompress(files[0].read_bytes()))
    assert trace["distributedInfo"]["rank"] == 0 and trace["parasim"]["cores"] >= 1
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [n for n in names if n.startswith("ProfilerStep#")]
    assert steps == [f"ProfilerStep#{i}" for i in range(6)]
    labelled = [n for n in names if read_compute(n) is not None]
    calls = [n for n in names if read_call(n) is not None]
    ops = run_scenario(load_scenario(SCENARIO)).schedule.programs
    assert labelled and calls
    # every compute op of every measured step is named, and every call
    assert len(labelled) == 6 * sum(1 for op in ops[0].ops if op.type == "compute")
    assert len(calls) == 6 * sum(1 for op in ops[0].ops if op.type == "collective")


def _prediction_error(replay, profile) -> tuple[float, str]:
    """The step predicted from a profile of ``replay``'s traces against its measured one."""
    assert main(["calibrate", "--from-trace", str(replay), "--out", str(profile)]) == 0
    loaded = load_profile(profile)
    assert loaded.gpu.op_table and loaded.comm["all_reduce"]["intra_node"].table
    measured = json.loads((replay / "result.json").read_text())["step_time_s"]
    predicted = run_scenario(load_scenario(SCENARIO, [f"cluster.profile={profile}"]))
    said = f"predicted {predicted.result.step_time_s:.4f} s, measured {measured:.4f} s"
    return predicted.result.step_time_s / measured - 1, said


def test_a_profile_from_the_replay_s_traces_predicts_its_step(replayed, tmp_path, request):
    error, said = _prediction_error(replayed, tmp_path / "profile.json")
    if abs(error) > 0.10:  # a busy machine's replay: measured once more
        again = request.getfixturevalue("replayed_again")
        error, said = min(
            (error, said),
            _prediction_error(again, tmp_path / "again.json"),
            key=lambda e: abs(e[0]),
        )
    assert abs(error) <= 0.10, said


def _compared(replay, folder, capsys) -> dict:
    """``parasim compare`` of a prediction made from ``replay``'s traces against them."""
    profile = folder / "profile.json"
    assert main(["calibrate", "--from-trace", str(replay), "--out", str(profile)]) == 0
    predicted = folder / "predicted"
    args = ["run", SCENARIO, "--set", f"cluster.profile={profile}", "--out", str(predicted)]
    assert main([*args, "--outputs", "result,trace"]) == 0
    capsys.readouterr()
    assert main(["compare", str(predicted), str(replay / "kineto"), "--json"]) == 0
    assert (predicted / "compare.html").exists()
    return json.loads(capsys.readouterr().out)


def test_the_prediction_set_against_the_replay_s_traces(replayed, tmp_path, capsys, request):
    report = _compared(replayed, tmp_path, capsys)
    if abs(report["step_time"]["error"]) > 0.10:  # a busy machine's replay: once more
        again = _compared(request.getfixturevalue("replayed_again"), tmp_path / "again", capsys)
        report = min(report, again, key=lambda r: abs(r["step_time"]["error"]))
    assert report["mode"] == "traces" and report["runs"]["measured"]["ranks"] == [0, 1]
    assert abs(report["step_time"]["error"]) <= 0.10
    categories = {row["category"]: row for row in report["categories"]}
    assert categories["compute"]["measured_s"] > 0 and categories["compute"]["predicted_s"] > 0
    kinds = {row["kind"] for row in report["op_kinds"]}
    assert {"gemm", "attention", "all_reduce"} <= kinds and "barrier" not in kinds
