"""Tests of ``parasim explain`` and the teaching pairs built on it.

Each teaching pair in ``scenarios/teaching/`` is a mistake and its fix: explain must find
the mistake in the first file and nothing in the second, propose exactly the second as
its fix, and that fix must simulate faster (or, for a layout that does not fit, fit).
``docs/teaching.md`` is regenerated and compared with the checked-in page, so it never
drifts from the simulator. The pairs are explained once per module (a few seconds).
The mistakes are a registry (:data:`simulator.tools.mistakes.MISTAKES`): the tests check
that it agrees with the teaching files, the teaching page and the ids explain reports,
and that a new entry is all explain needs to report a new mistake.
``--out`` writes ``explain.json`` and an offline ``explain.html`` with one chart per
finding; every test runs in its own temporary folder, where the default ``out/`` lands.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from pathlib import Path

import pytest
import yaml

from simulator.analysis.metrics import CATEGORIES
from simulator.cli.explain import add_parser, command
from simulator.cli.main import main as parasim_main
from simulator.common.errors import ParasimError
from simulator.report import explain_report, teaching_page
from simulator.report.explain_report import (
    TERM_COLORS,
    finding_sentence,
    memory_is_the_point,
    render_explain_html,
)
from simulator.report.style import BREAKDOWN_COLORS
from simulator.request.scenario import apply_overrides, scenario_from_dict
from simulator.tools import explain as explain_module
from simulator.tools.explain import (
    FINDING_IDS,
    Explanation,
    Finding,
    diagnose,
    explain,
)
from simulator.tools.mistakes import (
    MEMORY_FINDINGS,
    MISTAKE_BY_ID,
    MISTAKES,
    Mistake,
    Remedy,
    Symptom,
    changes_recipe,
)

from .helpers import MARKUP, markup_args

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
TEACHING = SCENARIOS / "teaching"
KEYS = [pair.key for pair in teaching_page.PAIRS]

# The category each pair's fix moves most, as (category, axis); memory pairs fit instead.
MOVES = {
    "tp-across-nodes": ("exposed_comm", "tp"),
    "pipeline-bubble": ("bubble", None),
    "moe-imbalance": ("imbalance_stall", None),
    "layering": ("exposed_comm", "tp"),
    "fsdp-across-nodes": ("exposed_comm", "dp"),
    "cp-across-nodes": ("exposed_comm", "cp"),
    "ep-routing": ("exposed_comm", "ep"),
}
FINDING_KEYS = {
    "id",
    "also",
    "title",
    "problem",
    "fix",
    "fix_set",
    "fix_summary",
    "before",
    "after",
    "cost_s",
    "cost_pct",
    "moved",
    "notes",
    "alternatives",
    "set_apart",
}


@pytest.fixture(scope="module")
def teaching() -> dict[str, teaching_page.PairResult]:
    return {result.pair.key: result for result in teaching_page.collect()}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in its own folder, so the default ``out/`` never lands in the tree."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _charts(page: str) -> dict[str, list[dict]]:
    """The traces of every ``Plotly.newPlot`` call in a page, by div id, in page order."""
    charts = {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        charts[match.group(1)], _ = json.JSONDecoder().raw_decode(page, match.end())
    return charts


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="parasim")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["explain", *argv])


def test_the_registry_is_consistent():
    assert FINDING_IDS == tuple(m.id for m in MISTAKES)
    assert len(set(FINDING_IDS)) == len(MISTAKES) and set(MISTAKE_BY_ID) == set(FINDING_IDS)
    for index, mistake in enumerate(MISTAKES):
        assert mistake.title and callable(mistake.check) and callable(mistake.fix)
        assert mistake.when and "|" not in mistake.when  # a cell of the docs' table
        assert mistake.choose in ("first", "fastest")
        assert set(mistake.also) <= set(FINDING_IDS) - {mistake.id}
        # a mistake is skipped after one checked before it: unless looks backwards only
        assert set(mistake.unless) <= set(FINDING_IDS[:index]), mistake.id
    assert MEMORY_FINDINGS == tuple(m.id for m in MISTAKES if m.memory)
    assert explain_report.MEMORY_FINDINGS == MEMORY_FINDINGS


def test_the_registry_names_every_teaching_pair():
    taught = {m.teaching: m.id for m in MISTAKES if m.teaching is not None}
    assert taught == {pair.key: pair.finding for pair in teaching_page.PAIRS}
    for mistake in MISTAKES:
        if mistake.teaching is not None:
            assert mistake.teaching_files == (
                f"{mistake.teaching}-mistake.yaml",
                f"{mistake.teaching}-fix.yaml",
            )
        else:
            assert mistake.teaching_files is None


def test_the_teaching_page_lists_every_mistake_of_the_registry():
    page = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    table = page.split("## What explain looks for", 1)[1]
    assert re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.MULTILINE) == list(FINDING_IDS)


def test_a_new_registry_entry_is_all_explain_needs(monkeypatch, scenarios_dir):
    def check(case):
        if case.scenario.training.recompute == "full":
            return None
        return Symptom(f"recompute {case.scenario.training.recompute}")

    def fix(case):
        return Remedy(case.options([({"training.recompute": "full"}, "full recompute")]))

    extra = Mistake("recompute-not-full", "recompute is not full", check, fix, choose="first")
    monkeypatch.setattr(explain_module, "MISTAKES", (*MISTAKES, extra))
    (finding,) = explain(scenarios_dir / "small.yaml")
    assert (finding.id, finding.title) == ("recompute-not-full", "recompute is not full")
    assert finding.problem == f"recompute {finding.before['layout']['recompute']}"
    assert finding.fix == {"training.recompute": "full"} and finding.fix_summary == "full recompute"
    assert finding.after["layout"]["recompute"] == "full"
    skipped = Mistake("never", "never checked", check, fix, unless=("recompute-not-full",))
    monkeypatch.setattr(explain_module, "MISTAKES", (*MISTAKES, extra, skipped))
    assert [f.id for f in explain(scenarios_dir / "small.yaml")] == ["recompute-not-full"]


def test_every_teaching_file_is_paired_and_says_what_it_teaches():
    files = sorted(p.name for p in TEACHING.glob("*.yaml"))
    expected = sorted(name for m in MISTAKES if m.teaching_files for name in m.teaching_files)
    assert files == expected
    assert sorted(KEYS) == sorted(m.teaching for m in MISTAKES if m.teaching)
    for name in files:
        text = (TEACHING / name).read_text()
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert text.startswith("# Teaching pair"), name
        assert len(header) >= 4, f"{name}: the header comment should say what it teaches"
        assert yaml.safe_load(text)["simulation"]["fidelity"] == "analytic"


@pytest.mark.parametrize("key", KEYS)
def test_explain_finds_the_mistake_and_nothing_in_the_fix(teaching, key):
    result = teaching[key]
    ids = [i for finding in result.mistake.findings for i in finding.ids]
    assert result.pair.finding in ids
    assert all(finding.id in FINDING_IDS for finding in result.mistake.findings)
    assert result.fix.findings == [], [f.id for f in result.fix.findings]
    assert result.fix.ok and not result.mistake.ok


@pytest.mark.parametrize("key", KEYS)
def test_the_fix_file_is_the_fix_explain_proposes(teaching, key):
    finding = teaching[key].finding
    mistake = yaml.safe_load((TEACHING / f"{key}-mistake.yaml").read_text())
    fixed = scenario_from_dict(apply_overrides(mistake, finding.set_args))
    expected = scenario_from_dict(yaml.safe_load((TEACHING / f"{key}-fix.yaml").read_text()))
    ignore = {"name", "description"}
    assert fixed.spec.model_dump(exclude=ignore) == expected.spec.model_dump(exclude=ignore)


@pytest.mark.parametrize("key", KEYS)
def test_the_proposed_fix_is_faster_or_fits(teaching, key):
    finding = teaching[key].finding
    before, after = finding.before, finding.after
    assert after is not None and not after["memory"]["oom"]
    assert after == teaching[key].fix.result  # the fix simulated by explain = the fix file
    if before["memory"]["oom"]:
        assert finding.cost_s is None
        memory = [m for m in finding.moved if m["category"] == "memory"]
        assert memory and memory[0]["after"] < memory[0]["before"]
        assert memory[0]["after"] <= after["memory"]["capacity_bytes"] < memory[0]["before"]
        return
    assert after["step_time_s"] < before["step_time_s"]
    assert finding.cost_s == pytest.approx(before["step_time_s"] - after["step_time_s"])
    assert finding.cost_pct == pytest.approx(100 * finding.cost_s / before["step_time_s"])
    category, axis = MOVES[key]
    largest = finding.moved[0]
    assert (largest["category"], largest["axis"]) == (category, axis)
    assert largest["after"] < largest["before"]
    label = category + (f" ({axis})" if axis else "")
    assert largest["text"].startswith(label) and "→" in largest["text"]


def test_teaching_mistakes_and_fixes_show_their_failure_modes(teaching):
    def share(snap, category):
        return snap["breakdown"]["critical"][category] / snap["step_time_s"]

    dp = teaching["dp-oom"]
    assert dp.mistake.result["memory"]["oom"] and not dp.fix.result["memory"]["oom"]
    assert dp.mistake.result["memory"]["dominant_term"] in ("optimizer_state", "weights")
    bubble = teaching["pipeline-bubble"]
    assert share(bubble.mistake.result, "bubble") > 0.3
    assert share(bubble.fix.result, "bubble") < 0.10
    sp = teaching["sp-memory"]
    assert sp.mistake.result["memory"]["dominant_term"] == "activations"
    assert sp.mistake.result["memory"]["oom"] and not sp.fix.result["memory"]["oom"]
    moe = teaching["moe-imbalance"]
    assert share(moe.mistake.result, "imbalance_stall") > 0.10
    assert share(moe.fix.result, "imbalance_stall") < 0.10
    assert moe.mistake.result["moe"]["dropped_fraction"] == 0
    assert moe.fix.result["moe"]["dropped_fraction"] > 0
    tp = teaching["tp-across-nodes"].finding
    assert tp.id == "tp-beyond-nvlink" and tp.also == ["tp-across-nodes"]
    assert tp.after["layout"]["tp"] == 8 and tp.after["layout"]["pp"] == 2
    assert any("out of memory" in note for note in tp.notes)  # tp 8 x dp 2 does not fit
    layering = teaching["layering"].finding
    assert layering.after["layout"]["placement"][0] == "tp"
    assert layering.after["layout"]["tp"] == layering.before["layout"]["tp"]
    routing = teaching["ep-routing"]
    finding = routing.finding
    assert finding.also == ["ep-across-nodes"]
    assert finding.fix == {"model.moe.max_nodes_per_token": 2}
    exposed = routing.mistake.result["exposed_comm_by_axis"]["critical"]["ep"]
    assert exposed > 0.4 * routing.mistake.result["step_time_s"]
    # the network carries about a quarter of the bytes: the exposed EP time falls as much
    fixed = routing.fix.result["exposed_comm_by_axis"]["critical"]["ep"]
    assert 0.15 < fixed / exposed < 0.35
    # EP inside one node would not fit: that is why the groups span nodes
    assert any("out of memory: parallel.ep=8" in note for note in finding.notes)


def test_teaching_page_is_up_to_date(teaching, tmp_path):
    results = [teaching[key] for key in KEYS]
    teaching_page.write(results, tmp_path)
    page = (tmp_path / "teaching.md").read_text(encoding="utf-8")
    checked_in = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    assert page == checked_in, "docs/teaching.md is stale: run python -m benchmarks.make_teaching"
    # the chart page is built, not kept: every pair's charts, plotly.js embedded
    charts = (tmp_path / "teaching" / "charts.html").read_text(encoding="utf-8")
    assert "Plotly.newPlot" in charts and "cdn" not in teaching_page.strip_plotly(charts)
    for key in KEYS:
        assert f'id="{key}"' in charts and f"teaching/charts.html#{key}" in page


def test_ep_across_nodes_is_found_and_fixed_inside_the_node():
    path = TEACHING / "moe-imbalance-fix.yaml"
    findings = explain(path, ["cluster.nodes=2", "parallel.tp=2"])
    finding = next(f for f in findings if f.id == "ep-across-nodes")
    after = finding.after["layout"]
    assert after["ep"] * after["tp"] <= 8 and after["ep"] < finding.before["layout"]["ep"]
    assert finding.after["step_time_s"] < finding.before["step_time_s"]
    assert finding.moved[0]["category"] == "exposed_comm" and finding.moved[0]["axis"] == "ep"


def test_exposed_expert_all_to_alls_under_one_micro_batch_at_a_time_find_dualpipev():
    """EP across the two nodes under a 1F1B pipeline: DualPipeV overlaps one micro-batch's
    all-to-alls with another's compute, and the exposed EP time falls."""
    path = SCENARIOS / "mixtral-ep.yaml"
    sets = ["parallel.pp=2", "parallel.dp=4", "parallel.ep=4", "parallel.placement=[tp,pp,dp]"]
    findings = explain(path, sets)
    finding = next(f for f in findings if f.id == "ep-comm-not-overlapped")
    assert finding.fix == {"parallel.schedule": "dualpipev", "parallel.virtual_stages": 2}
    before, after = finding.before, finding.after
    assert after["step_time_s"] < before["step_time_s"]
    ep = {"before": before, "after": after}
    exposed = {k: v["exposed_comm_by_axis"]["critical"]["ep"] for k, v in ep.items()}
    assert exposed["after"] < 0.7 * exposed["before"]
    # under DualPipeV itself, nothing is left to overlap
    overlapped = [*sets, "parallel.schedule=dualpipev", "parallel.virtual_stages=2"]
    assert "ep-comm-not-overlapped" not in [f.id for f in explain(path, overlapped)]


def test_node_limited_routing_is_not_reported_whatever_its_limit():
    path = TEACHING / "ep-routing-mistake.yaml"
    # 4 nodes and a limit of 4: a token may reach every node, but crosses to each once
    assert explain(path, ["model.moe.max_nodes_per_token=4"]) == []
    # DeepEP's dispatch crosses to each node once too
    assert "ep-routing-spread" not in [f.id for f in explain(path, ["model.moe.dispatcher=deepep"])]
    # with top-2 routing a token reaches 2 nodes at most: nothing to limit
    assert [f.id for f in explain(path, ["model.moe.top_k=2"])] == []


def test_tp_across_nodes_when_tp_does_not_tile_the_node(scenarios_dir):
    overrides = [
        "cluster.nodes=2",
        "cluster.gpus_per_node=6",
        "cluster.nic.per_node=6",
        "parallel.tp=4",
        "parallel.dp=3",
        "training.global_batch=12",
        "training.micro_batch=1",
    ]
    (finding,) = explain(scenarios_dir / "small.yaml", overrides)
    assert finding.id == "tp-across-nodes" and finding.also == []
    assert 6 % finding.after["layout"]["tp"] == 0
    assert finding.cost_s > 0
    # the exposed tensor-parallel communication is one of what moved, and it shrank
    (tp,) = [moved for moved in finding.moved if moved["axis"] == "tp"]
    assert tp["after"] < 0.5 * tp["before"]


def test_shipped_scenarios(scenarios_dir):
    assert explain(scenarios_dir / "small.yaml") == []
    (oom,) = explain(scenarios_dir / "dp-only-oom.yaml")
    assert oom.id == "dp-only-oom" and oom.after["layout"]["tp"] <= 8
    assert oom.before["memory"]["oom"] and not oom.after["memory"]["oom"]
    (bubble,) = explain(scenarios_dir / "pipeline-demo.yaml")
    assert bubble.id == "too-few-microbatches"
    assert bubble.fix == {"parallel.schedule": "interleaved-1f1b", "parallel.virtual_stages": 2}
    assert bubble.cost_s > 0


def test_a_larger_global_batch_is_set_apart_as_a_change_of_the_recipe():
    """At micro-batch 1 only a larger global batch gives the pipeline more micro-batches:
    that changes what the run trains, so it is shown apart with its numbers, never
    proposed as the fix."""
    overrides = ["parallel.schedule=zb-h1", "training.micro_batch=1", "training.global_batch=2"]
    (finding,) = explain(TEACHING / "pipeline-bubble-mistake.yaml", overrides)
    assert finding.fix == {} and finding.after is None and finding.cost_s is None
    assert finding.fix_summary.startswith("no change of layout brings the bubble down")
    (apart,) = finding.set_apart
    assert apart["fix"] == {"training.global_batch": 10}  # 9(p - 1) = 9, rounded up to p
    assert apart["reason"] == "changes the recipe" and apart["changes"] == ["training.global_batch"]
    assert apart["same_work_step_s"] == pytest.approx(apart["step_time_s"] * 2 / 10)
    assert apart["same_work_step_s"] < finding.before["step_time_s"] and not apart["oom"]
    text = explain_report.set_apart_text(apart, finding.before)
    assert text.startswith("would change the recipe (global_batch 2 → 10): ")
    assert "training.global_batch=10" in text and "per 2 sequences" in text


@pytest.mark.slow
def test_no_fix_changes_the_recipe_or_runs_out_of_memory_on_llama3_405b(scenarios_dir):
    """Meta's recipe has too few micro-batches for its 16 stages, and FSDP across 64
    nodes: the batch Meta trains with stays (4.5 times it is set apart), and HSDP shards
    over as few nodes as fit (two or four nodes do not: they are noted, not proposed)."""
    explanation = diagnose(scenarios_dir / "llama3-405b.yaml")
    bubble, fsdp = explanation.findings
    assert bubble.id == "too-few-microbatches" and bubble.after is None
    assert [e["fix"] for e in bubble.set_apart] == [{"training.global_batch": 9216}]
    assert fsdp.id == "fsdp-across-nodes" and fsdp.fix == {"parallel.dp_shard": 8}
    assert not fsdp.after["memory"]["oom"] and fsdp.cost_s > 0
    assert all(not a["oom"] for a in fsdp.alternatives)
    for shard in (2, 4):
        assert any(f"out of memory: parallel.dp_shard={shard} " in n for n in fsdp.notes)
    for finding in explanation.findings:
        assert not changes_recipe(finding.fix)
        assert finding.after is None or not finding.after["memory"]["oom"]


def test_what_changes_the_recipe():
    assert changes_recipe({"training.global_batch": 9216}) == ["training.global_batch"]
    assert changes_recipe({"model.seq_len": 4096, "parallel.tp": 8}) == ["model.seq_len"]
    assert changes_recipe({"training.dtype": "fp8", "model": {"preset": "x"}}) == [
        "training.dtype",
        "model",
    ]
    layout = {
        "parallel.dp_shard": 8,
        "training.micro_batch": 1,
        "training.recompute": "full",
        "training.sharding": "optimizer",
        "model.moe.capacity_factor": 1.25,
        "model.moe.max_nodes_per_token": 2,
    }
    assert changes_recipe(layout) == []


def test_a_fix_that_does_not_fit_is_set_apart_with_its_memory(monkeypatch, scenarios_dir):
    """A remedy whose every candidate runs out of memory proposes nothing: the
    candidates are shown apart with their memory against the capacity."""

    def fix(case):
        return Remedy(case.options([({"training.recompute": "none"}, "no recompute")]))

    def check(case):
        return Symptom("recompute is on")

    extra = Mistake("recompute-on", "recompute is on", check, fix, choose="first")
    monkeypatch.setattr(explain_module, "MISTAKES", (extra,))
    overrides = ["training.recompute=full", "cluster.gpu.hbm_capacity=3 GiB"]
    (finding,) = explain(scenarios_dir / "pipeline-demo.yaml", overrides)
    assert finding.after is None and finding.fix == {}
    (apart,) = finding.set_apart
    assert apart["reason"] == "does not fit" and apart["oom"]
    assert apart["peak_bytes_per_gpu"] > apart["capacity_bytes"] == 3 * 2**30
    text = explain_report.set_apart_text(apart, finding.before)
    assert text.startswith("does not fit: training.recompute=none (no recompute) needs ")
    assert text.endswith("per GPU of 3.0 GiB (does not fit)")
    assert "set apart below" in explain_report.cost_text(finding)
    explanation = diagnose(scenarios_dir / "pipeline-demo.yaml", overrides)
    page = render_explain_html(explanation)
    assert html.escape(f"set apart: {text}", quote=False) in page
    assert explanation.to_dict()["findings"][0]["set_apart"] == [apart]


def test_out_of_memory_that_is_not_data_parallel_only():
    path = TEACHING / "dp-oom-fix.yaml"
    findings = explain(path, ["parallel.tp=2", "parallel.dp=4"])
    assert [f.id for f in findings] == ["out-of-memory"]
    (finding,) = findings
    assert finding.fix == {"training.sharding": "optimizer"}
    assert not finding.after["memory"]["oom"]


def test_json_output_and_exit_codes(capsys):
    assert command(_args(str(TEACHING / "pipeline-bubble-mistake.yaml"), "--json")) == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"scenario", "fidelity", "ok", "result", "findings"}
    assert report["ok"] is False and report["fidelity"] == "analytic"
    (finding,) = report["findings"]
    assert set(finding) == FINDING_KEYS
    assert finding["id"] == "too-few-microbatches"
    assert finding["fix"] == {"training.micro_batch": 1}
    assert finding["fix_set"] == ["training.micro_batch=1"]
    assert finding["after"]["step_time_s"] < finding["before"]["step_time_s"]
    assert set(finding["before"]["breakdown"]["critical"]) == {
        "compute",
        "exposed_comm",
        "bubble",
        "imbalance_stall",
        "other",
    }
    assert command(_args(str(TEACHING / "pipeline-bubble-fix.yaml"), "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["findings"] == []


def test_human_output_and_fidelity(capsys, scenarios_dir):
    assert command(_args(str(TEACHING / "layering-mistake.yaml"))) == 1
    out = capsys.readouterr().out
    assert "layering-backwards" in out and "parallel.placement=[tp,pp,dp]" in out
    assert "exposed_comm (tp)" in out
    args = _args(str(scenarios_dir / "small.yaml"), "--fidelity", "flow", "--json")
    assert command(args) == 0
    assert json.loads(capsys.readouterr().out)["fidelity"] == "flow"
    assert command(_args(str(scenarios_dir / "small.yaml"))) == 0
    assert "No layering mistakes found" in capsys.readouterr().out


def test_bad_input(capsys, tmp_path):
    with pytest.raises(ParasimError):
        command(_args(str(tmp_path / "missing.yaml")))
    with pytest.raises(ParasimError, match="parallel"):
        command(_args(str(TEACHING / "layering-fix.yaml"), "--set", "parallel.tp=3"))
    assert parasim_main(["explain", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.startswith("parasim: error:")
    with pytest.raises(SystemExit):
        _args("x.yaml", "--fidelity", "exact")


def test_library_api_returns_findings(teaching):
    finding = teaching["layering"].finding
    assert isinstance(finding, Finding)
    assert json.loads(json.dumps(finding.to_dict()))["id"] == "layering-backwards"
    explanation = diagnose(TEACHING / "moe-imbalance-fix.yaml")
    assert explanation.ok and explanation.to_dict()["findings"] == []


# ---------------------------------------------------------------- explain.json, explain.html


def _check_page(page: str, explanation: Explanation, plotly_js: str) -> None:
    """One chart per finding, ``finding-N``, with a mistake and a fix bar per category."""
    assert plotly_js[:200] not in page  # plotly.js is the one copy beside the page
    assert re.findall(r'<script[^>]*src="([^"]+)"', page) == ["plotly.min.js"]
    rest = page
    assert "cdn" not in rest  # opens offline
    charts = _charts(rest)
    ids = [f"finding-{n}" for n in range(1, len(explanation.findings) + 1)]
    assert list(charts) == ids
    for id, finding, traces in zip(ids, explanation.findings, charts.values(), strict=True):
        assert f'<div id="{id}"' in rest
        time = {t["name"]: t for t in traces if t["legendgroup"] == "time"}
        assert list(time) == list(CATEGORIES)
        for category, trace in time.items():
            assert trace["type"] == "bar" and trace["y"] == ["mistake", "fix"]
            assert trace["marker"]["color"] == BREAKDOWN_COLORS[category]
            assert trace["x"] == [
                finding.before["breakdown"]["critical"][category],
                finding.after["breakdown"]["critical"][category],
            ]
        memory = [t for t in traces if t["legendgroup"] == "memory"]
        assert bool(memory) == memory_is_the_point(finding)
        assert [t["name"] for t in memory] == (list(TERM_COLORS) if memory else [])
        assert html.escape(finding_sentence(finding), quote=False) in rest


def test_out_writes_the_json_and_one_chart_per_finding(capsys, tmp_path, plotly_js):
    path = TEACHING / "pipeline-bubble-mistake.yaml"
    placement = "parallel.placement=[pp,dp,tp]"  # a second finding: layering backwards
    args = _args(str(path), "--set", placement, "--json", "--out", str(tmp_path / "x"))
    assert command(args) == 1
    printed = capsys.readouterr().out
    assert (tmp_path / "x" / "explain.json").read_text() == printed  # what --json prints
    explanation = diagnose(path, [placement])
    assert [f.id for f in explanation.findings] == ["layering-backwards", "too-few-microbatches"]
    page = (tmp_path / "x" / "explain.html").read_text(encoding="utf-8")
    _check_page(page, explanation, plotly_js)
    assert 'id="finding-1"' in page and 'id="finding-2"' in page
    assert "2 problems found" in page and "No layering mistakes" not in page
    assert "--set parallel.placement=[tp,pp,dp]" in page
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [
        ".parasim",
        "explain.html",
        "explain.json",
        "plotly.min.js",
    ]
    assert (tmp_path / "x" / "plotly.min.js").read_text() == plotly_js


def test_every_teaching_mistake_gets_its_page(teaching, plotly_js):
    for key in KEYS:
        mistake = teaching[key].mistake
        page = render_explain_html(mistake)
        _check_page(page, mistake, plotly_js)
        assert page == render_explain_html(mistake)  # same bytes
    sp = _charts(render_explain_html(teaching["sp-memory"].mistake))
    (traces,) = sp.values()
    activations = next(t for t in traces if t["name"] == "activations")
    assert activations["x"][1] < activations["x"][0]  # SP splits the activations


def test_a_scenario_without_findings_writes_a_page_that_says_so(scenarios_dir, tmp_path):
    assert command(_args(str(scenarios_dir / "small.yaml"), "--out", str(tmp_path / "ok"))) == 0
    page = (tmp_path / "ok" / "explain.html").read_text(encoding="utf-8")
    assert "No layering mistakes found" in page
    assert "finding-" not in page and "Plotly" not in page
    report = json.loads((tmp_path / "ok" / "explain.json").read_text())
    assert report["ok"] is True and report["findings"] == []


def test_out_defaults_to_the_scenario_folder_and_bad_out_is_bad_input(capsys, tmp_path):
    path = str(TEACHING / "dp-oom-mistake.yaml")
    assert command(_args(path)) == 1
    out = tmp_path / "out" / "dp-oom-mistake-explain"
    assert (out / "explain.json").exists() and (out / "explain.html").exists()
    assert "explain.html" in capsys.readouterr().out
    (tmp_path / "file").write_text("")
    with pytest.raises(ParasimError, match="--out"):
        command(_args(path, "--out", str(tmp_path / "file")))
    assert parasim_main(["explain", path, "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("parasim: error: --out") and err.count("\n") == 1


def test_a_name_and_paths_that_look_like_markup_print_as_written(tmp_path, capsys, monkeypatch):
    argv, out = markup_args(tmp_path, monkeypatch)
    scenario = tmp_path / f"{MARKUP}.yaml"  # in the status line while it works
    scenario.parent.mkdir()  # "s[": [/] holds a slash
    scenario.write_text((SCENARIOS / "small.yaml").read_text())
    assert parasim_main(["explain", str(scenario), *argv]) == 0
    printed = capsys.readouterr().out
    assert f"parasim explain · {MARKUP} (analytic)" in printed
    assert f"wrote {out / 'explain.json'}, {out / 'explain.html'}" in printed
