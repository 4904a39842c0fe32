"""``parasim sweep``: the layout space, its filters, the ranking and the outputs."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import html
import itertools
import json
import os
import re

import pytest

from simulator.analysis.memory import memory_per_rank
from simulator.cli import sweep as sweep_command
from simulator.cli.main import main
from simulator.common.errors import ParasimError, ScenarioError
from simulator.request.layout import balanced_stages
from simulator.request.scenario import load_scenario, read_scenario_file
from simulator.run.simulate import run_scenario
from simulator.tools import pool, sweep
from topologies.units import format_time

from .conftest import SCENARIOS
from .helpers import MARKUP, markup_args

SMALL = SCENARIOS / "small.yaml"
# one DGX A100 node, GPT-2 small (12 layers, 12 heads), global batch 16
PINNED = [
    "--fix",
    "micro_batch=1",
    "--fix",
    "schedule=1f1b",
    "--fix",
    "recompute=none",
    "--fix",
    "placement=[tp,dp,pp]",
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parasim")
    sweep_command.add_parser(parser.add_subparsers(dest="command"))
    return parser


def _command(*argv: str) -> int:
    return sweep_command.command(_parser().parse_args(["sweep", *map(str, argv)]))


def test_every_fitting_layout_is_found_and_ranked_by_step_time(tmp_path, capsys):
    # --top at least the layouts that fit: the search ranks every one of them
    assert _command(SMALL, *PINNED, "--workers", 2, "--out", tmp_path, "--top", 50) == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    rows = result["rows"]

    # an independent brute force: every tp, pp, dp whose product is the 8 GPUs, with and
    # without SP, each sharding level where there are replicas (ZeRO-2 only where ZeRO-1
    # does not fit; one node, so no HSDP), through the scenario validator and the
    # memory estimate
    expected = set()
    for tp, pp, dp in itertools.product(range(1, 9), repeat=3):
        if tp * pp * dp != 8:
            continue
        fitting = set()
        for sp, sharding in itertools.product(
            (False, True) if tp > 1 else (False,),
            ("none", "optimizer", "gradients", "full") if dp > 1 else ("none",),
        ):
            overrides = [
                f"parallel.tp={tp}",
                f"parallel.pp={pp}",
                f"parallel.dp={dp}",
                f"parallel.sp={str(sp).lower()}",
                "training.micro_batch=1",
                f"training.sharding={sharding}",
            ]
            try:
                scenario = load_scenario(SMALL, overrides)
            except ScenarioError:
                continue
            capacity = scenario.cluster_spec.gpu.hbm_capacity
            memory = memory_per_rank(scenario.recipe, scenario.model, scenario.moe, capacity)
            if not memory.oom:
                fitting.add((tp, pp, dp, sp, sharding))
        expected |= {
            key
            for key in fitting
            if key[4] != "gradients" or (*key[:4], "optimizer") not in fitting
        }
    found = {(row["tp"], row["pp"], row["dp"], row["sp"], row["sharding"]) for row in rows}
    assert found == expected
    assert len(rows) == len(expected) == result["counts"]["simulated"]

    # ranked by the simulated step time, and the top entry is what parasim run gives
    times = [row["step_time_s"] for row in rows]
    assert times == sorted(times)
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
    top = rows[0]
    rerun = run_scenario(load_scenario(SMALL, top["overrides"])).result
    assert rerun.step_time_s == pytest.approx(top["step_time_s"], rel=1e-12)
    assert rerun.fidelity == "analytic"

    # tp 8 does not divide GPT-2 small's 12 heads: invalid, with the validator's reason
    assert result["counts"]["invalid_by_reason"] == {
        "parallel.tp: heads(12) is not divisible by tp(8)": 2
    }
    out = capsys.readouterr().out
    assert top["layout"] in out and "enumerated" in out and "invalid 2" in out
    assert "\nleft out" not in out and result["counts"]["bounded"] == 0


def test_listed_layouts_are_valid_and_outputs_are_written(tmp_path):
    out = tmp_path / "sweep"
    argv = [SMALL, "--fix", "tp=2", "--fix", "recompute=none", "--workers", 1, "--out", out]
    assert _command(*argv) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert result["rows"], "something must fit"
    for row in result["rows"]:
        scenario = load_scenario(SMALL, row["overrides"])  # the validator accepts it
        layout = scenario.layout
        assert (layout.tp, layout.pp, layout.dp) == (row["tp"], row["pp"], row["dp"])
        assert list(layout.placement) == row["placement"]
        assert scenario.training.micro_batch == row["micro_batch"]
        assert scenario.parallel.schedule == row["schedule"]
        assert f"[{','.join(row['placement'])}]" in row["layout"]
    counts = result["counts"]
    assert counts["enumerated"] == (
        counts["invalid"]
        + counts["pruned_memory"]
        + counts["dominated"]
        + counts["bounded"]
        + counts["simulated"]
    )
    with (out / "sweep.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(result["rows"])
    assert table[0]["layout"] == result["rows"][0]["layout"]
    assert float(table[0]["step_time_s"]) == result["rows"][0]["step_time_s"]
    assert table[0]["overrides"] == " ".join(result["rows"][0]["overrides"])
    html = (out / "sweep.html").read_text()
    # plotly.js from the one copy beside the page: opens offline
    assert '<script charset="utf-8" src="plotly.min.js">' in html
    assert "plotly.js v" in (out / "plotly.min.js").read_text()[:2000]
    assert result["rows"][0]["layout"] in html


def test_layouts_that_do_not_fit_are_pruned_before_simulating(tmp_path):
    # GPT-3 13B on one node of 8 A100s: without TP the weights, gradients and Adam state
    # alone (16 bytes per parameter, 208 GB) exceed 80 GiB
    result = sweep.run_sweep(
        SMALL,
        overrides=["model.preset=gpt3-13b"],
        fixed={
            "pp": 1,
            "micro_batch": 1,
            "schedule": "1f1b",
            "placement": "tp,dp,pp",
            "sharding": "none",
        },
        workers=1,
    )
    counts = result.counts
    assert counts["pruned_memory"] > 0
    assert next(iter(counts["pruned_by_term"])) == "optimizer_state"
    assert result.rows, "with enough TP it fits"
    assert all(row["tp"] > 1 for row in result.rows)
    assert all(not row["oom"] for row in result.rows)
    # searching the sharding levels too, tp 1 fits once the replicas shard the fp32
    # gradients as well as the optimizer state (13B: 52 GB of gradients alone)
    sharded = sweep.run_sweep(
        SMALL,
        overrides=["model.preset=gpt3-13b"],
        fixed={"tp": 1, "pp": 1, "micro_batch": 1, "recompute": "full"},
        workers=1,
    )
    assert {row["sharding"] for row in sharded.rows} == {"gradients", "full"}

    with pytest.raises(ParasimError, match="out of memory.*optimizer_state"):
        _command(
            SMALL,
            *("--set", "model.preset=gpt3-13b", "--fix", "tp=1", "--fix", "pp=1"),
            *("--fix", "sharding=none"),
            *("--workers", 1, "--out", tmp_path),
        )
    assert not list(tmp_path.iterdir())  # nothing to write


def test_lighter_recompute_is_never_slower():
    result = sweep.run_sweep(SMALL, fixed={"tp": 2, "pp": 1}, workers=1, exhaustive=True)
    assert result.counts["dominated"] == 0
    by_layout: dict[tuple, dict[str, float]] = {}
    for row in result.rows:
        key = (row["sp"], row["micro_batch"], tuple(row["placement"]))
        by_layout.setdefault(key, {})[row["recompute"]] = row["step_time_s"]
    assert by_layout
    for times in by_layout.values():
        assert times["none"] <= times["selective"] <= times["full"]


def test_enumeration_follows_the_documented_space():
    candidates = sweep.enumerate_layouts(world=16, gpus_per_node=8, layers=24, global_batch=32)
    assert {c.tp for c in candidates} == {1, 2, 4, 8}  # TP inside a node by default
    for c in candidates:
        assert c.tp * c.pp * c.dp == 16 and 24 % c.pp == 0
        assert c.micro_batch <= 8 and (32 // c.dp) % c.micro_batch == 0
        assert not (c.sp and c.tp == 1)
        if c.pp == 1:
            assert (c.schedule, c.virtual_stages) == ("1f1b", 1)
        if c.schedule == "interleaved-1f1b":
            microbatches = 32 // (c.dp * c.micro_batch)
            assert c.virtual_stages in (2, 4)
            assert 24 % (c.pp * c.virtual_stages) == 0 and microbatches % c.pp == 0
        elif c.schedule in ("zbv", "dualpipev"):  # two chunks a rank, as a V
            assert c.pp > 1 and c.virtual_stages == 2 and 24 % (2 * c.pp) == 0
            if c.schedule == "dualpipev":  # a micro-batch per stage at least
                assert 32 // (c.dp * c.micro_batch) >= 2 * c.pp
        else:
            assert c.virtual_stages == 1
    assert {"zbv", "dualpipev"} <= {c.schedule for c in candidates}
    assert len(set(candidates)) == len(candidates)
    # placements that give the same rank grid are tried once
    grids: dict[tuple, set] = {}
    for c in candidates:
        key = dataclasses.astuple(dataclasses.replace(c, placement=()))
        grids.setdefault(key, set())
        sizes = {"tp": c.tp, "dp": c.dp, "pp": c.pp}
        grid = tuple(axis for axis in c.placement if sizes[axis] > 1)
        assert grid not in grids[key]
        grids[key].add(grid)
    assert any(c.placement == ("dp", "tp", "pp") for c in candidates)
    assert {c.recompute for c in candidates} == {"none", "selective", "full"}

    wide = sweep.enumerate_layouts(world=16, gpus_per_node=8, layers=24, global_batch=32, max_tp=16)
    assert {c.tp for c in wide} == {1, 2, 4, 8, 16}
    moe = sweep.enumerate_layouts(
        world=8, gpus_per_node=8, layers=4, global_batch=8, experts=4, fixed={"tp": 1}
    )
    assert {c.ep for c in moe} == {1, 2, 4}
    assert all(c.dp % c.ep == 0 for c in moe)


def test_bad_input_is_one_line_naming_the_numbers():
    with pytest.raises(ParasimError, match=r"--gpus: 12 GPUs .*8 GPUs per node"):
        sweep.run_sweep(SMALL, gpus=12)
    with pytest.raises(ParasimError, match=r"did you mean 'tp'"):
        sweep.parse_fixes(["tpp=8"])
    with pytest.raises(ParasimError, match="positive integer"):
        sweep.parse_fixes(["pp=two"])
    with pytest.raises(ParasimError, match="tp, dp, pp exactly once"):
        sweep.parse_fixes(["placement=[tp,tp,pp]"])
    assert sweep.parse_fixes(["mb=2", "placement=dp,tp,pp", "sp=on"]) == {
        "micro_batch": 2,
        "placement": ("dp", "tp", "pp"),
        "sp": True,
    }


def test_gpus_resizes_the_cluster():
    result = sweep.run_sweep(
        SMALL,
        gpus=16,
        fixed={"tp": 8, "micro_batch": 1, "recompute": "none", "schedule": "1f1b"},
        overrides=["model.heads=16"],
        workers=1,
    )
    assert result.gpus == 16 and result.cluster["nodes"] == 2
    assert {(row["tp"], row["pp"], row["dp"]) for row in result.rows} == {(8, 1, 2), (8, 2, 1)}
    # TP across nodes only shows up as the [dp,tp,pp] placement, and is slower
    crossing = [row for row in result.rows if row["warnings"]]
    inside = [row for row in result.rows if not row["warnings"]]
    assert crossing and inside
    assert min(r["step_time_s"] for r in inside) < min(r["step_time_s"] for r in crossing)


def test_context_parallel_and_sharding_are_kept_or_pinned():
    long = sweep.run_sweep(SCENARIOS / "llama3-8b-128k-cp.yaml", fixed={"cp": 8}, workers=1)
    assert long.rows and all(row["cp"] == 8 and row["cp_kind"] == "ring" for row in long.rows)
    assert long.rows[0]["layout"].startswith("tp1 cp8 ")
    pinned = sweep.run_sweep(
        SMALL, fixed={"tp": 2, "pp": 1, "sharding": "full", "cp": 2}, workers=1
    )
    assert pinned.rows
    for row in pinned.rows:
        assert row["sharding"] == "full" and row["cp"] == 2 and row["dp"] == 2
        assert "training.sharding=full" in row["overrides"]
    with pytest.raises(ParasimError, match="--fix sharding='zero9'"):
        sweep.check_fixed({"sharding": "zero9"})


def test_a_long_sequence_also_tries_context_parallelism_inside_the_node():
    long = sweep.run_sweep(
        SCENARIOS / "llama3-8b-128k-cp.yaml",
        overrides=["parallel.cp=1", "parallel.dp=8"],
        fixed={"tp": 2, "pp": 1, "recompute": "full", "placement": "tp,dp,pp"},
        workers=1,
    )
    cps = {(row.get("cp", 1), row.get("cp_kind", "ring")) for row in long.rows}
    assert (2, "ring") in cps and (4, "ulysses") in cps and (4, "ring") in cps
    assert all(row.get("cp", 1) * 2 <= 8 for row in long.rows)  # CP stays inside the node
    assert any(row["layout"].endswith("cp_kind=ulysses") for row in long.rows)
    short = sweep.run_sweep(SMALL, fixed={"tp": 2, "pp": 1}, workers=1)
    assert all(row["cp"] == 1 for row in short.rows)


TWO_NODES = ["model.heads=16", "cluster.nodes=2"]  # GPT-2 small on 16 A100s


def test_sharding_levels_and_hsdp_are_searched():
    pins = {"tp": 4, "pp": 1, "micro_batch": 1, "recompute": "none", "placement": "tp,dp,pp"}
    result = sweep.run_sweep(SMALL, overrides=TWO_NODES, fixed=pins, workers=1)
    found = {(row["sharding"], row["dp_shard"]) for row in result.rows}
    # dp 4 over two nodes of 2 replicas each: HSDP shards inside the node
    assert found == {("none", 0), ("optimizer", 0), ("full", 0), ("full", 2)}
    # ZeRO-2, with and without SP; full sharding that re-gathers in the backward, with
    # and without SP and HSDP, where keeping the weights gathered fits
    assert result.counts["dominated"] == 2 + 4
    assert {row["reshard_after_forward"] for row in result.rows if row["sharding"] == "full"} == {
        False
    }
    hsdp = next(row for row in result.rows if row["dp_shard"])
    assert hsdp["layout"].endswith("dp_shard=2 sharding=full reshard_after_forward=false")
    scenario = load_scenario(SMALL, hsdp["overrides"])
    assert (scenario.layout.dp_shard, scenario.recipe.sharding) == (2, "full")
    assert scenario.recipe.reshard_after_forward is False

    # ZeRO-2 is dominated because its step takes exactly ZeRO-1's time, and resharding
    # after the forward because it only adds an all-gather
    every = sweep.run_sweep(SMALL, overrides=TWO_NODES, fixed=pins, workers=1, exhaustive=True)
    times = {
        (r["sp"], r["sharding"], r["dp_shard"], r["reshard_after_forward"]): r["step_time_s"]
        for r in every.rows
    }
    for sp in (False, True):
        assert times[(sp, "gradients", 0, True)] == times[(sp, "optimizer", 0, True)]
        for shard in (0, 2):
            assert times[(sp, "full", shard, False)] <= times[(sp, "full", shard, True)]

    # pins: one level, one HSDP group, or no HSDP
    only = sweep.run_sweep(
        SMALL, overrides=TWO_NODES, fixed={**pins, "dp_shard": 2, "sp": False}, workers=1
    )
    assert [(r["sharding"], r["dp_shard"]) for r in only.rows] == [("full", 2)]
    flat = sweep.run_sweep(
        SMALL, overrides=TWO_NODES, fixed={**pins, "dp_shard": 0, "sharding": "full"}, workers=1
    )
    assert {(r["sharding"], r["dp_shard"]) for r in flat.rows} == {("full", 0)}
    with pytest.raises(ParasimError, match="--fix dp_shard=-1"):
        sweep.check_fixed({"dp_shard": -1})


def test_full_sharding_is_not_tried_where_it_is_not_modelled():
    candidates = sweep.enumerate_layouts(world=16, gpus_per_node=8, layers=24, global_batch=32)
    levels = {c.sharding for c in candidates}
    assert levels == {"none", "optimizer", "gradients", "full"}
    assert not [c for c in candidates if c.sharding == "full" and c.schedule.startswith("zb")]
    assert all(c.sharding == "none" for c in candidates if c.dp == 1)
    moe = sweep.enumerate_layouts(
        world=8, gpus_per_node=8, layers=4, global_batch=8, experts=4, fixed={"tp": 1}
    )
    assert not [c for c in moe if c.sharding == "full" and c.ep > 1]
    assert any(c.sharding == "full" and c.ep == 1 for c in moe)
    # HSDP: the replicas of one node form the shard group, whatever the placement
    hsdp = {(c.tp, c.pp, c.placement, c.dp_shard) for c in candidates if c.dp_shard}
    assert (2, 1, ("tp", "dp", "pp"), 4) in hsdp  # dp 8: 4 per node
    assert (1, 2, ("tp", "pp", "dp"), 4) in hsdp  # pp 2 comes first: 4 replicas per node
    assert not [c for c in candidates if c.dp_shard and c.placement == ("dp", "tp", "pp")]


def test_pipelines_that_do_not_divide_the_layers_split_them_evenly():
    assert balanced_stages(61, 8) == (7, 8, 8, 8, 8, 8, 7, 7)  # DeepSeek-V3's split
    assert balanced_stages(126, 16) == (7, *[8] * 14, 7)  # Llama 3 405B's
    assert balanced_stages(24, 8) == (3,) * 8
    candidates = sweep.enumerate_layouts(world=16, gpus_per_node=8, layers=10, global_batch=16)
    splits = {c.pp: c.stage_layers for c in candidates}
    assert splits[2] is None and splits[4] == (2, 3, 3, 2)  # 10 layers: 2 divides, 4 not
    assert 8 not in splits and 16 not in splits  # fewer than two layers per stage
    assert not [c for c in candidates if c.stage_layers and c.schedule == "interleaved-1f1b"]
    # the split reaches the scenario, and the ranking runs it
    result = sweep.run_sweep(
        SMALL,
        overrides=["model.layers=10"],
        fixed={"tp": 2, "pp": 4, "micro_batch": 1, "recompute": "none", "sharding": "none"},
        workers=1,
    )
    assert result.rows
    for row in result.rows:
        assert row["stage_layers"] == [2, 3, 3, 2]
        assert "stage_layers=2/3/3/2" in row["layout"]
        scenario = load_scenario(SMALL, row["overrides"])
        assert scenario.recipe.stage_layers == (2, 3, 3, 2)


def test_placements_that_tie_are_shown_as_one_entry(capsys):
    from simulator.report.sweep_report import print_sweep, top_layouts, wide_console

    pins = {"tp": 2, "pp": 2, "recompute": "none", "sharding": "none"}
    result = sweep.run_sweep(SMALL, overrides=TWO_NODES, fixed=pins, workers=1)
    shown = top_layouts(result, 4)
    assert len(shown) == 4
    assert any(also for _, also in shown)
    for row, also in shown:
        for placement in also:
            twin = next(
                r
                for r in result.rows
                if r["layout"]
                == row["layout"].replace("[" + ",".join(row["placement"]) + "]", placement)
            )
            assert twin["step_time_s"] == row["step_time_s"]
    print_sweep(result, wide_console(), top=4)
    out = capsys.readouterr().out
    assert "(also [" in out
    # the entries are numbered 1, 2, 3, 4, whatever ranks their twins hold in sweep.csv
    entries = re.findall(r"^ *(\d+)[. ]", out, flags=re.MULTILINE)
    assert [int(n) for n in entries][:4] == [1, 2, 3, 4], out


def _page_table(folder) -> str:
    page = (folder / "sweep.html").read_text()
    return page[page.index("id='parasim-sweep-table'") :]


def test_sweep_html_holds_the_table_it_charts_for_reading(tmp_path):
    assert _command(SMALL, *PINNED, "--workers", 1, "--out", tmp_path, "--top", 3) == 0
    table = _page_table(tmp_path)
    result = json.loads((tmp_path / "sweep.json").read_text())
    rows = re.findall(r"<tr[^>]*>.*?</tr>", table)
    assert len(rows) >= 1 + 3  # the header, the three layouts charted, and the scenario's
    for row in result["rows"][:3]:
        assert row["layout"] in table
    header = re.findall(r"<th[^>]*>(.*?)</th>", rows[0])
    # the decisive columns first: memory on screen beside the step time
    assert header[:5] == ["#", "layout", "step time", "memory per GPU", "MFU"]
    # numbers for reading: no 16-digit floats, times in ms, memory in GiB, shares in %
    assert not re.search(r"\d\.\d{5,}", table)
    best = result["rows"][0]
    assert f">{format_time(best['step_time_s'])}<" in table and " ms<" in table
    assert " of 80 GiB" in table and f"{100 * best['mfu']:.1f}%" in table
    # knobs that apply to no row are left out: no context parallelism, no experts, no
    # interleaving, no HSDP, no pipeline in this small space
    for absent in ("CP kind", "ep", "virtual stages", "HSDP shard", "stage layers", "schedule"):
        assert absent not in header, absent
    # the CSV keeps full precision
    with (tmp_path / "sweep.csv").open() as handle:
        first = next(csv.DictReader(handle))
    assert float(first["step_time_s"]) == best["step_time_s"]


def test_the_scenarios_own_layout_is_marked_even_below_the_top(tmp_path, capsys):
    # small.yaml's own layout (tp2 pp1 dp4 mb4) is not the fastest of this space
    argv = [SMALL, "--fix", "tp=2", "--fix", "recompute=none", "--fix", "pp=1"]
    assert _command(*argv, "--workers", 1, "--out", tmp_path, "--top", 1) == 0
    result = json.loads((tmp_path / "sweep.json").read_text())
    own = result["scenario_layout"]
    assert own["layout"] == "tp2 pp1 dp4 mb4 1f1b rc=none [tp,dp,pp]"
    assert own["status"] == "simulated" and own["rank"] > 1
    assert result["rows"][own["rank"] - 1]["layout"] == own["layout"]
    table = _page_table(tmp_path)
    marked = re.findall(r"<tr class='scenario'>.*?</tr>", table)
    assert len(marked) == 1 and own["layout"] in marked[0]
    assert "the scenario's own layout" in html.unescape(marked[0])
    assert "<tr class='gap'>" in table
    out = capsys.readouterr().out
    assert f"the scenario's own layout {own['layout']}: #{own['rank']} of" in out


def test_the_scenarios_own_layout_says_why_it_has_no_step(tmp_path):
    # at 16 GPUs tp2 pp1 keeps dp 8, which does not divide a fixed global batch of 4
    result = sweep.run_sweep(
        SMALL,
        gpus=16,
        batch="fixed",
        overrides=["training.global_batch=4", "training.micro_batch=1"],
        fixed={"tp": 8, "recompute": "none", "sharding": "none"},
        workers=1,
    )
    own = result.scenario_layout
    assert own["status"] == "invalid" and own["rank"] is None
    assert "global_batch" in own["reason"]
    from simulator.report.sweep_report import own_line

    assert own_line(result).startswith("the scenario's own layout")
    assert "not a valid layout here" in own_line(result)


def test_the_global_batch_at_another_size_follows_one_policy():
    assert sweep.scaled_batch("per-gpu", 64, 1024, 128) == 512
    assert sweep.scaled_batch("fixed", 64, 1024, 128) == 64
    assert sweep.scaled_batch("tokens", 64, 1024, 128) == 512
    assert sweep.scaled_batch("tokens", 3, 24, 16) == 4  # 4.5 rounds to the even 4
    assert sweep.scaled_batch("tokens", 1, 8, 1024) == 1  # never below one sequence
    with pytest.raises(ParasimError, match=r"global_batch\(3\) \* 24 / 16 GPUs = 4.5"):
        sweep.scaled_batch("per-gpu", 3, 24, 16)
    with pytest.raises(ParasimError, match="--batch: expected one of per-gpu, fixed, tokens"):
        sweep.scaled_batch("weak", 3, 24, 16)
    # sweep --gpus grows the batch by default, and says so
    assert sweep.prepare(SMALL, gpus=32).global_batch == 64
    assert sweep.prepare(SMALL, gpus=32, batch="fixed").global_batch == 16
    assert sweep.prepare(SMALL).batch["policy"] is None


def test_the_console_says_which_batch_policy_applies(tmp_path, capsys):
    argv = [SMALL, *("--fix", "tp=2", "--fix", "pp=1", "--fix", "recompute=none")]
    argv += ["--fix", "sharding=none", "--fix", "micro_batch=2"]
    assert _command(*argv, "--gpus", 16, "--workers", 1, "--out", tmp_path) == 0
    out = capsys.readouterr().out
    assert "global batch 32 (--batch per-gpu: each GPU keeps the scenario's 2 sequences" in out
    assert "--batch fixed keeps 16" in out
    assert _command(*argv, "--gpus", 16, "--batch", "fixed", "--workers", 1, "--out", tmp_path) == 0
    assert "global batch 16 (--batch fixed" in capsys.readouterr().out
    with pytest.raises(ParasimError, match="--batch fixed: only with --gpus"):
        _command(SMALL, "--batch", "fixed", "--out", tmp_path)


def test_a_sweep_too_large_for_the_machine_is_refused_before_anything_is_laid_out(
    monkeypatch,
):
    def refuse(*args, **kwargs):
        raise AssertionError("a candidate was laid out")

    monkeypatch.setattr(sweep, "check_chunk", refuse)
    monkeypatch.setattr(pool, "scenario_from_dict", refuse)
    monkeypatch.setattr(sweep, "scenario_from_dict", refuse)
    gpt3, batch = SCENARIOS / "gpt3-175b.yaml", ["training.global_batch=100000"]
    with pytest.raises(ParasimError, match=r"the sweep is too large .* 100,000 GPUs.*--force"):
        sweep.run_sweep(gpt3, gpus=100_000, batch="fixed", workers=1, overrides=batch)
    # growing the batch with the GPUs makes one layout alone too large, and the line
    # says how the batch was set
    too_large = r"a layout of the sweep is too large.*--batch per-gpu made"
    with pytest.raises(ParasimError, match=too_large):
        sweep.run_sweep(gpt3, gpus=100_000, workers=1, overrides=batch)


def test_workers_are_bounded():
    cores = os.cpu_count() or 1
    assert sweep.resolve_workers(None) == cores
    assert sweep.resolve_workers(4 * cores) == 4 * cores or 4 * cores > 256
    for bad in (0, -2, 10**6, min(256, 4 * cores) + 1):
        with pytest.raises(ParasimError, match="--workers"):
            sweep.resolve_workers(bad)


def test_candidates_of_one_grid_run_in_one_chunk_in_the_order_given():
    """The placements of one grid go to one worker, one after another, so that it
    relocates the grid's programs instead of lowering them again; the results still
    come back in the order of the candidates."""
    items = [
        ["parallel.tp=1", "parallel.placement=[tp,dp,pp]", "training.micro_batch=1"],
        ["parallel.tp=1", "parallel.placement=[tp,dp,pp]", "training.micro_batch=2"],
        ["parallel.tp=2", "parallel.placement=[tp,dp,pp]", "training.micro_batch=1"],
        ["parallel.tp=1", "parallel.placement=[tp,pp,dp]", "training.micro_batch=1"],
        ["parallel.tp=1", "parallel.placement=[tp,pp,dp]", "training.micro_batch=2"],
        ["parallel.tp=1", "parallel.placement=[dp,tp,pp]", "training.micro_batch=1"],
    ]
    chunks = pool._chunks(items, workers=1, largest=4, together=pool.same_grid)
    assert chunks == [[0, 3, 5], [1, 4], [2]]
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(items)))
    assert pool._chunks(items, workers=1, largest=2) == [[0, 1], [2, 3], [4, 5]]
    # a grid with more placements than a chunk holds stays whole
    assert pool._chunks(items, workers=1, largest=2, together=pool.same_grid)[0] == [0, 3, 5]
    seen = []

    def label(_, chunk):
        seen.append([item[2] for item in chunk])
        return [{"row": " ".join(item)} for item in chunk]

    rows = sweep.run_chunked(label, (None,), items, None, 1, lambda n: None, 4, pool.same_grid)
    assert [row["row"] for row in rows] == [" ".join(item) for item in items]
    assert [row for chunk in seen for row in chunk][:3] == ["training.micro_batch=1"] * 3


@pytest.mark.parametrize(
    "scenario, overrides",
    [
        ("gpt3-175b.yaml", ["parallel.tp=4", "parallel.pp=8", "parallel.dp=4"]),
        (
            "mixtral-ep.yaml",
            ["parallel.tp=2", "parallel.pp=2", "parallel.dp=4", "parallel.ep=4"],
        ),
        (
            "llama3-70b-fsdp.yaml",
            ["parallel.tp=2", "parallel.pp=2", "parallel.dp=64", "training.sharding=full"]
            + ["parallel.dp_shard=8"],
        ),
        (
            "llama3-8b-128k-cp.yaml",
            ["cluster.nodes=4", "parallel.cp=4", "parallel.tp=2", "parallel.pp=2"]
            + ["parallel.dp=2", "training.global_batch=8"],
        ),
    ],
)
def test_a_placement_moves_ranks_not_bytes(scenario, overrides):
    """The sweep's check estimates the memory of one placement of a grid for all of
    them (``check_chunk``): every placement of these grids (dense, MoE with experts,
    HSDP, context parallel) holds the same bytes per rank, and a chunk's results are
    those of checking each candidate alone."""
    estimates = []
    for placement in sweep.PLACEMENTS:
        chosen = f"parallel.placement=[{','.join(placement)}]"
        loaded = load_scenario(SCENARIOS / scenario, [*overrides, chosen])
        capacity = loaded.cluster_spec.gpu.hbm_capacity
        estimates.append(memory_per_rank(loaded.recipe, loaded.model, loaded.moe, capacity))
    assert all(estimate == estimates[0] for estimate in estimates)
    assert estimates[0].peak_bytes_per_gpu > 0

    raw = read_scenario_file(SCENARIOS / scenario)
    items = [
        [*overrides, f"parallel.placement=[{','.join(p)}]", f"training.micro_batch={m}"]
        for m in (1, 2)
        for p in sweep.PLACEMENTS
    ]
    args = (raw, str(SCENARIOS / scenario), str(SCENARIOS))
    alone = [pool._check(*args, item) for item in items]
    assert pool.check_chunk(*args, items) == alone
    assert {row["status"] for row in alone} <= {"fits", "pruned"}


def test_a_name_and_a_folder_that_look_like_markup_print_as_written(tmp_path, capsys, monkeypatch):
    argv, out = markup_args(tmp_path, monkeypatch)
    fixed = [SMALL, *("--fix", "tp=2", "--fix", "pp=1", "--fix", "recompute=none")]
    fixed += ["--fix", "sharding=none", "--fix", "micro_batch=2", "--workers", 1]
    assert main(["sweep", *map(str, fixed), *argv]) == 0
    printed = capsys.readouterr().out
    assert f"parasim sweep · {MARKUP} · gpt2-small" in printed
    assert f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}" in printed
