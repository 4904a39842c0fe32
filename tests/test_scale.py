"""``parasim scale``: resizing, the global batch at each size (``--batch``), efficiency,
the size guard and the outputs."""

from __future__ import annotations

import argparse
import csv
import json
import re
from html import unescape

import pytest

from simulator.cli import scale as scale_command
from simulator.cli.main import main
from simulator.common.errors import ParasimError
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools import scale, sweep

from .conftest import SCENARIOS
from .helpers import MARKUP, markup_args

SMALL = SCENARIOS / "small.yaml"
PIPELINE = SCENARIOS / "pipeline-demo.yaml"
# GPT-2 small, data parallel only, one sequence per GPU per micro-batch
PURE_DP = ["parallel.tp=1", "parallel.pp=1", "parallel.dp=8", "training.micro_batch=1"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parasim")
    scale_command.add_parser(parser.add_subparsers(dest="command"))
    return parser


def _efficiency(result: scale.ScaleResult) -> dict[int, float]:
    return {row["gpus"]: row["efficiency"] for row in result.rows}


def test_weak_scaling_of_pure_data_parallel_stays_near_one():
    # dgx-a100's fabric is a non-blocking fat tree: only the gradient all-reduce grows
    result = scale.run_scale(SMALL, [8, 16, 32, 64], batch="per-gpu", overrides=PURE_DP, workers=2)
    rows = result.rows
    assert [row["gpus"] for row in rows] == [8, 16, 32, 64]
    assert [row["dp"] for row in rows] == [8, 16, 32, 64]
    assert [row["global_batch"] for row in rows] == [16, 32, 64, 128]  # 2 per replica
    assert rows[0]["efficiency"] == 1.0
    # GPT-2 small's fp32 gradients (500 MB) cross the network once past one node
    assert all(row["efficiency"] > 0.85 for row in rows)
    assert [row["efficiency"] for row in rows] == sorted(
        [row["efficiency"] for row in rows], reverse=True
    )
    assert result.reference_gpus == 8

    # each row is what parasim run gives for its overrides
    last = rows[-1]
    rerun = run_scenario(load_scenario(SMALL, last["overrides"])).result
    assert rerun.step_time_s == pytest.approx(last["step_time_s"], rel=1e-12)
    assert rerun.cluster.gpus == 64


def test_tensor_parallel_across_nodes_scales_worse():
    sizes = [16, 32, 64]
    inside = scale.run_scale(PIPELINE, sizes, workers=1)
    across = scale.run_scale(
        PIPELINE, sizes, overrides=["parallel.placement=[dp,tp,pp]"], workers=1
    )
    # at 16 GPUs dp is 1, so both placements are the same rank grid
    assert across.rows[0]["step_time_s"] == pytest.approx(inside.rows[0]["step_time_s"])
    assert not any(row["warnings"] for row in inside.rows)
    assert all("span nodes" in row["warnings"][0] for row in across.rows[1:])
    good, bad = _efficiency(inside), _efficiency(across)
    assert good[64] > 0.85
    assert bad[64] < good[64] - 0.2
    assert bad[32] > bad[64]


def test_a_fixed_batch_is_strong_scaling_and_says_when_it_no_longer_divides():
    result = scale.run_scale(SMALL, [8, 16], batch="fixed", overrides=PURE_DP, workers=1)
    rows = result.rows
    assert [row["global_batch"] for row in rows] == [16, 16]
    speedup = rows[0]["step_time_s"] / rows[1]["step_time_s"]
    assert rows[1]["speedup"] == pytest.approx(speedup)
    assert rows[1]["efficiency"] == pytest.approx(speedup / 2)
    assert 0.5 < rows[1]["efficiency"] <= 1.0
    with pytest.raises(ParasimError, match=r"--batch fixed at 32 GPUs: .*global_batch\(16\)"):
        scale.run_scale(SMALL, [8, 32], batch="fixed", overrides=PURE_DP)


def test_sizes_that_are_not_whole_nodes_are_refused():
    with pytest.raises(ParasimError, match=r"--gpus: 12 GPUs .*8 GPUs per node"):
        scale.run_scale(SMALL, [8, 12])
    with pytest.raises(ParasimError, match=r"tp\(8\) \* pp\(2\) = 16 does not divide 8 GPUs"):
        scale.run_scale(PIPELINE, [8, 16])


def test_gpu_lists():
    assert scale.parse_gpus("8,16,...,128") == [8, 16, 32, 64, 128]
    assert scale.parse_gpus("64,96,...,256") == [64, 96, 128, 160, 192, 224, 256]
    assert scale.parse_gpus("32, 8,16,8") == [8, 16, 32]
    for bad in ("8,...,64", "8,16,...,100", "eight", "0", ""):
        with pytest.raises(ParasimError, match="--gpus"):
            scale.parse_gpus(bad)


def test_best_layout_per_size_and_outputs(tmp_path, capsys):
    out = tmp_path / "scale"
    args = _parser().parse_args(
        ["scale", str(SMALL), "--gpus", "8,16", "--best", "--workers", "1", "--out", str(out)]
    )
    assert scale_command.command(args) == 0
    result = json.loads((out / "scale.json").read_text())
    assert result["best"] and result["batch"]["policy"] == "per-gpu"
    rows = result["rows"]
    assert [row["global_batch"] for row in rows] == [16, 32]  # grows with the GPUs
    for row in rows:
        best = sweep.run_sweep(
            SMALL,
            overrides=[f"training.global_batch={row['global_batch']}"],
            gpus=row["gpus"],
            batch="fixed",
            fixed={
                "micro_batch": 4,
                "recompute": "none",
                "schedule": "1f1b",
                "virtual_stages": 1,
                "sp": False,
                "ep": 1,
                "placement": "tp,dp,pp",
                "cp": 1,
                "sharding": "none",
                "dp_shard": 0,
            },
            workers=1,
        ).rows[0]
        assert row["layout"] == best["layout"]
        assert row["step_time_s"] == best["step_time_s"]
    assert rows[0]["efficiency"] == 1.0
    with (out / "scale.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [int(r["gpus"]) for r in table] == [8, 16]
    html = (out / "scale.html").read_text()
    assert "ideal (linear)" in html and "scaling efficiency" in html
    assert 'src="plotly.min.js"' in html and (out / "plotly.min.js").stat().st_size > 1_000_000
    # the table below the chart, for reading: the scenario's own size (8 GPUs) marked,
    # no 16-digit floats, no speedup claimed for a batch that grows
    table = html[html.index("id='parasim-scale-table'") :]
    marked = re.findall(r"<tr class='scenario'>.*?</tr>", table)
    assert len(marked) == 1 and "<td class='gpus'>8</td>" in marked[0]
    assert "the scenario's own size" in unescape(marked[0])
    assert not re.search(r"\d\.\d{5,}", table) and "speedup" not in table
    assert "100.0%" in marked[0]  # the efficiency of the reference size
    printed = capsys.readouterr().out
    assert rows[1]["layout"] in printed and "efficiency" in printed


def test_the_older_mode_names_a_batch_policy():
    args = _parser().parse_args(["scale", str(SMALL), "--gpus", "8", "--mode", "strong"])
    assert args.mode == "strong" and args.batch is None
    assert scale.POLICY_OF_MODE == {"weak": "per-gpu", "strong": "fixed"}
    args = _parser().parse_args(
        ["scale", str(SMALL), "--gpus", "8", "--mode", "weak", "--batch", "fixed"]
    )
    with pytest.raises(ParasimError, match="--mode weak is --batch per-gpu"):
        scale_command.command(args)


def test_the_tokens_policy_keeps_each_gpus_share_and_no_speedup_is_claimed():
    result = scale.run_scale(SMALL, [8, 16], batch="tokens", overrides=PURE_DP, workers=1)
    assert [row["global_batch"] for row in result.rows] == [16, 32]
    assert result.batch == {"policy": "tokens", "scenario_gpus": 8, "scenario_global_batch": 16}
    assert "speedup" not in result.rows[1]  # a step of another batch does other work


def test_a_curve_too_large_for_the_machine_is_refused_before_anything_is_laid_out(monkeypatch):
    laid_out = []
    real = scale.scenario_from_dict

    def record(raw, **kwargs):
        laid_out.append(raw["cluster"]["nodes"])
        return real(raw, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("a size was simulated")

    monkeypatch.setattr(scale, "scenario_from_dict", record)
    monkeypatch.setattr(scale, "run_sweep", refuse)
    monkeypatch.setattr(scale, "run_chunked", refuse)
    million = scale.parse_gpus("8,16,...,1048576")
    unfolded = ["simulation.fold=false"]  # every rank of every size simulated
    for best in (False, True):
        with pytest.raises(ParasimError, match=r"1,048,576 GPUs.*too large.*--force"):
            scale.run_scale(SMALL, million, best=best, workers=1, overrides=unfolded)
    assert set(laid_out) == {1}  # the scenario at its own size, and no other


def test_a_name_and_a_folder_that_look_like_markup_print_as_written(tmp_path, capsys, monkeypatch):
    argv, out = markup_args(tmp_path, monkeypatch)
    assert main(["scale", str(SMALL), "--gpus", "8", "--workers", "1", *argv]) == 0
    printed = capsys.readouterr().out
    assert f"parasim scale · {MARKUP} · gpt2-small on dgx-a100" in printed
    assert f"wrote {out / 'scale.csv'}, {out / 'scale.json'}" in printed
