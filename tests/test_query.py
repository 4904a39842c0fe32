"""``parasim query``: any rank's figures read back from the row of its class in a
folded run's result.json, and bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli.main import main

from .helpers import MARKUP, markup_args

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="module")
def folded_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("query") / "run"
    scenario = str(SCENARIOS / "pipeline-demo.yaml")
    argv = ["run", scenario, "--set", "simulation.fidelity=analytic", "--outputs", "result"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def test_a_rank_s_figures_are_its_class_s_under_its_own_place(folded_run, capsys):
    result = json.loads((folded_run / "result.json").read_text())
    assert result["simulation"]["folded"]
    rows = {row["pp"]: row for row in result["per_rank"]}
    assert sum(row["ranks"] for row in rows.values()) == result["cluster"]["gpus"]
    last = result["cluster"]["gpus"] - 1
    capsys.readouterr()
    assert main(["query", str(folded_run), "--rank", str(last), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    its_class = rows[figures["pp"]]
    assert figures["rank"] == last and figures["class_coords"] == {"pp": figures["pp"]}
    assert figures["breakdown"] == its_class["breakdown"]
    assert figures["end_s"] == its_class["end_s"]
    assert main(["query", str(folded_run / "result.json"), "--rank", "0"]) == 0
    assert "one of" in capsys.readouterr().out


@pytest.mark.parametrize("rank", ["-1", "100000"])
def test_a_rank_outside_the_run_is_one_line(folded_run, capsys, rank):
    assert main(["query", str(folded_run), f"--rank={rank}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of range" in err and "Traceback" not in err


def test_a_folder_without_a_result_is_one_line(tmp_path, capsys):
    assert main(["query", str(tmp_path), "--rank", "0"]) == 2
    assert "no result.json" in capsys.readouterr().err


def test_a_name_and_a_folder_that_look_like_markup_print_as_written(tmp_path, capsys, monkeypatch):
    argv, out = markup_args(tmp_path, monkeypatch)
    run = ["run", str(SCENARIOS / "small.yaml"), "--outputs", "result", "--json", *argv]
    assert main(run) == 0
    capsys.readouterr()
    assert main(["query", str(out), "--rank", "0"]) == 0
    assert f"rank 0 of {MARKUP}" in capsys.readouterr().out
