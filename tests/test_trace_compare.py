"""``parasim compare PREDICTED TRACE_DIR``: a prediction against a run's profiler traces.

The traces here are written from the prediction itself, as a GPU run of it would
record them (each op a kernel of its family's name, each collective an NCCL kernel of
the algorithm and protocol the model chose, with the communication record Kineto
attaches): compared as they are, nothing stands out; made slower in one known place
(one rank's kernels, or the all-reduces run by another algorithm), that place is named
first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli.main import main

from .conftest import ROOT
from .helpers import MARKUP, write_traces

SCENARIO = str(ROOT / "scenarios" / "small.yaml")


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("predicted") / "run"
    assert main(["run", SCENARIO, "--outputs", "result,trace", "--out", str(out)]) == 0
    return out


def _compare(predicted: Path, traces: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["compare", str(predicted), str(traces), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_prediction_against_traces_of_itself_finds_nothing_large(predicted, tmp_path, capsys):
    report = _compare(predicted, write_traces(predicted, tmp_path / "as-predicted"), capsys)
    step = report["step_time"]
    assert step["error"] == pytest.approx(0.0, abs=0.02)
    compute = next(r for r in report["categories"] if r["category"] == "compute")
    assert compute["error"] == pytest.approx(0.0, abs=0.02)
    gemm = next(r for r in report["op_kinds"] if r["kind"] == "gemm")
    assert gemm["error"] == pytest.approx(0.0, abs=1e-6)
    for difference in report["differences"]:
        assert abs(difference["seconds"]) < 0.02 * step["measured_s"], difference
    assert (predicted / "compare.html").exists()


def test_a_delayed_rank_is_named_first(predicted, tmp_path, capsys):
    traces = write_traces(predicted, tmp_path / "slow", slow_rank=3, slower=1.6)
    first = _compare(predicted, traces, capsys)["differences"][0]
    assert first["place"] == "rank 3" and "slow rank" in first["mechanism"]
    assert first["field"] == "gpu.jitter" and first["seconds"] > 0


def test_an_all_reduce_run_by_another_algorithm_is_named_first(predicted, tmp_path, capsys):
    traces = write_traces(predicted, tmp_path / "tree", algorithm=("TREE", "LL"), longer=2.0)
    report = _compare(predicted, traces, capsys)
    first = report["differences"][0]
    assert first["place"] == "all_reduce calls"
    assert "as tree/LL where the model chose ring/" in first["mechanism"]
    assert first["field"].startswith("comm.all_reduce.") and first["seconds"] > 0
    assert report["collective_choices"]["all_reduce"]["measured"] == "tree/LL"


def test_the_console_names_the_differences_and_writes_the_pages(predicted, tmp_path, capsys):
    traces = write_traces(predicted, tmp_path / "slow", slow_rank=5, slower=1.5)
    out = tmp_path / "compared"
    capsys.readouterr()
    assert main(["compare", str(predicted), str(traces), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "where they part ways" in printed and "1. rank 5" in printed
    page = (out / "compare.html").read_text()
    assert "parasim-differences" in page and "rank 5" in page
    assert json.loads((out / "compare.json").read_text())["mode"] == "traces"
    assert not any(p.name.startswith("compare") for p in traces.iterdir())  # theirs, untouched


def test_folders_that_look_like_markup_print_as_written(predicted, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no line wrapped
    traces = write_traces(predicted, tmp_path / f"t{MARKUP}")
    out = tmp_path / MARKUP
    capsys.readouterr()
    assert main(["compare", str(predicted), str(traces), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"  measured   {traces}  ranks " in printed
    assert f"{out / 'compare.json'}, {out / 'compare.html'}" in printed
