"""Tests of ``report.html``: the one-page report ``parasim run`` writes beside result.json."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from simulator.analysis.metrics import CATEGORIES
from simulator.report import run_report as report
from simulator.report.outputs import write_run_outputs
from simulator.report.run_report import (
    LINK_BINS,
    LINK_ROWS,
    REPORT_MAX_BARS,
    breakdown_figure,
    breakdown_rows,
    exposed_comm_figure,
    link_heatmap,
    memory_figure,
    run_report_html,
)
from simulator.report.style import AXIS_COLORS, BREAKDOWN_COLORS
from simulator.report.timeline import fit_trace, timeline_figure
from simulator.request.scenario import load_scenario
from simulator.run.simulate import make_trace, representative_ranks, run_scenario
from topologies.units import format_time

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
GIB = 2.0**30
OUTPUTS = ["result.json", "trace.json", "timeline.html", "report.html", "plotly.min.js"]


def _run(name: str, *overrides: str):
    return run_scenario(load_scenario(SCENARIOS / name, list(overrides)))


@pytest.fixture(scope="module")
def flow_run():
    """pipeline-demo in flow fidelity: 16 ranks, tp 8 x pp 2, link utilisation recorded."""
    return _run("pipeline-demo.yaml")


@pytest.fixture(scope="module")
def analytic_run():
    """pipeline-demo in analytic fidelity: folded to one rank per stage, no link data."""
    return _run("pipeline-demo.yaml", "simulation.fidelity=analytic")


@pytest.fixture(scope="module")
def flow_out(flow_run, tmp_path_factory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("flow")
    return out, write_run_outputs(flow_run, out, title="pipeline-demo: one training step")


@pytest.fixture(scope="module")
def flow_page(flow_out) -> str:
    return (flow_out[0] / "report.html").read_text()


@pytest.fixture(scope="module")
def analytic_page(analytic_run) -> str:
    page, _ = run_report_html(analytic_run, "pipeline-demo: analytic")
    return page


def _plot_ids(page: str) -> list[str]:
    return re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', page)


# -- the file and the page -----------------------------------------------------------------


def test_run_outputs_write_the_report_and_nothing_else(flow_out):
    out, paths = flow_out
    assert [p.name for p in paths] == OUTPUTS
    assert all(p.parent == out for p in paths)
    # atomic writes leave no temporary files behind
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


def test_outputs_names_the_files_written(analytic_run, tmp_path):
    from simulator.cli.options import OUTPUT_NAMES
    from simulator.report.outputs import OUTPUTS as WRITTEN

    assert tuple(WRITTEN) == OUTPUT_NAMES  # the CLI's list is the writer's
    only = write_run_outputs(analytic_run, tmp_path / "r", title="x", outputs=["result"])
    assert [p.name for p in only] == ["result.json"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["result.json"]
    pages = write_run_outputs(analytic_run, tmp_path / "p", title="x", outputs=["report"])
    assert [p.name for p in pages] == ["report.html", "plotly.min.js"]


def test_a_trace_over_the_limit_is_written_gzipped(analytic_run, tmp_path, monkeypatch):
    import gzip

    import simulator.report.outputs

    plain = write_run_outputs(analytic_run, tmp_path / "a", title="x", outputs=["trace"])
    monkeypatch.setattr(simulator.report.outputs, "TRACE_GZIP_BYTES", 1000)
    zipped = write_run_outputs(analytic_run, tmp_path / "b", title="x", outputs=["trace"])
    assert [p.name for p in zipped] == ["trace.json.gz"]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["trace.json.gz"]
    assert gzip.decompress(zipped[0].read_bytes()) == plain[0].read_bytes()


def test_a_gzipped_trace_is_the_same_bytes_each_time(analytic_run, tmp_path, monkeypatch):
    import simulator.report.outputs

    monkeypatch.setattr(simulator.report.outputs, "TRACE_GZIP_BYTES", 1000)
    first = write_run_outputs(analytic_run, tmp_path / "a", title="x", outputs=["trace"])
    again = write_run_outputs(analytic_run, tmp_path / "b", title="x", outputs=["trace"])
    assert first[0].read_bytes() == again[0].read_bytes()  # no time stamp in the header


def test_a_trace_written_in_a_forked_process_is_the_same_file(analytic_run, tmp_path, monkeypatch):
    import simulator.report.outputs

    here = write_run_outputs(analytic_run, tmp_path / "here", title="x")
    monkeypatch.setattr(simulator.report.outputs, "FORK_TRACE_RECORDS", 0)
    forked = write_run_outputs(analytic_run, tmp_path / "forked", title="x")
    assert [p.name for p in forked] == [p.name for p in here]
    for a, b in zip(here, forked, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert sorted(p.name for p in (tmp_path / "forked").iterdir()) == sorted(p.name for p in forked)


def test_a_forked_trace_writer_s_failure_reaches_the_command(analytic_run, tmp_path, monkeypatch):
    import simulator.report.outputs

    def broken(trace, path, max_events=None, gzip_over=None):
        Path(path).write_text('{"traceEvents": [')
        raise RuntimeError("disk full")

    monkeypatch.setattr(simulator.report.outputs, "FORK_TRACE_RECORDS", 0)
    monkeypatch.setattr(simulator.report.outputs, "write_chrome_trace", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_run_outputs(analytic_run, tmp_path, title="x")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "trace.json" not in names and not any(n.startswith(".trace") for n in names)
    assert "report.html" in names  # the others were written meanwhile


def test_a_failed_report_leaves_no_partial_file(analytic_run, tmp_path, monkeypatch):
    import simulator.report.run_report

    def broken(run, path, title, trace=None):
        Path(path).write_text("<!DOCTYPE html><html>half a page")
        raise RuntimeError("disk full")

    # the outputs import the report's writer where they write it
    monkeypatch.setattr(simulator.report.run_report, "write_run_report", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_run_outputs(analytic_run, tmp_path, title="x")
    # the timeline wrote the plotly.js bundle beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*OUTPUTS[:3], OUTPUTS[4]])


def test_plotly_js_is_loaded_from_the_one_copy_beside_the_page(flow_out, flow_page):
    js = get_plotlyjs()
    out, _ = flow_out
    assert (out / "plotly.min.js").read_text() == js
    for page in (flow_page, (out / "timeline.html").read_text()):
        assert js[:300] not in page and js[-300:] not in page  # not inlined
        sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page)
        assert sources == ["plotly.min.js"]  # relative: nothing from a CDN
    assert flow_page.startswith("<!DOCTYPE html>") and flow_page.rstrip().endswith("</html>")


def test_every_chart_has_its_id(flow_page, analytic_page):
    assert _plot_ids(flow_page) == ["breakdown", "exposed-comm", "memory", "links", "timeline"]
    # analytic fidelity has no link data: one line says so instead of an empty chart
    assert _plot_ids(analytic_page) == ["breakdown", "exposed-comm", "memory", "timeline"]
    assert "Link utilisation needs flow fidelity" in analytic_page
    assert "needs flow fidelity" not in flow_page


def test_summary_numbers_are_in_human_units(flow_run, flow_page):
    result = flow_run.result
    assert format_time(result.step_time_s) in flow_page  # step time
    assert f"{result.tokens_per_s:,.0f}" in flow_page
    assert f"{result.tflops_per_gpu:.1f} TFLOP/s" in flow_page
    assert f"{100 * result.mfu:.1f}%" in flow_page
    critical = result.breakdown.critical
    step = result.step_time_s
    for category in ("bubble", "exposed_comm"):
        assert f"{100 * critical[category] / step:.1f}%" in flow_page
    peak = result.memory.peak_bytes_per_gpu / 2**30
    assert f"{peak:.1f} GiB" in flow_page and "79.6 GiB" in flow_page  # peak vs capacity
    assert "tp 8 · pp 2 · dp 1 · ep 1" in flow_page
    assert "1f1b · 8 micro-batches of 1" in flow_page
    # every chart has a caption
    assert flow_page.count('<p class="caption">') == 5


def test_the_same_run_gives_the_same_bytes(analytic_run, analytic_page):
    again, _ = run_report_html(analytic_run, "pipeline-demo: analytic")
    assert again == analytic_page


# -- the charts ----------------------------------------------------------------------------


def test_breakdown_has_one_trace_per_category_and_one_bar_per_rank(flow_run):
    result = flow_run.result
    fig = breakdown_figure(result)
    assert [t.name for t in fig.data] == list(CATEGORIES)
    assert [t.marker.color for t in fig.data] == [BREAKDOWN_COLORS[c] for c in CATEGORIES]
    assert all(len(t.y) == 16 for t in fig.data)
    assert fig.data[0].y[0] == "r0 · pp0 ★"  # the critical rank, first on top
    # each rank's bars add up to the step, in milliseconds
    for i in range(16):
        total = sum(t.x[i] for t in fig.data)
        assert total == pytest.approx(result.step_time_s * 1e3)


def test_many_ranks_are_drawn_per_stage(flow_run, monkeypatch):
    monkeypatch.setattr(report, "MAX_BREAKDOWN_ROWS", 8)
    result = flow_run.result
    rows, kind = breakdown_rows(result)
    assert kind == "stage"
    assert [row["label"] for row in rows] == ["stage 0 ★", "stage 1"]
    stage1 = [row for row in result.per_rank if row.pp == 1]
    mean = sum(row.breakdown["compute"] for row in stage1) / len(stage1)
    assert rows[1]["breakdown"]["compute"] == pytest.approx(mean)
    assert all(len(t.y) == 2 for t in breakdown_figure(result).data)


def test_folded_rows_name_their_stage(analytic_run):
    rows, kind = breakdown_rows(analytic_run.result)
    assert kind == "rank"
    assert [row["label"] for row in rows] == ["stage 0 · r0 ★", "stage 1 · r8"]
    assert "stands for 8 ranks" in rows[0]["detail"]


def test_exposed_comm_is_split_by_axis():
    run = _run(
        "mixtral-ep-skewed.yaml", "model.layers=2", "model.seq_len=1024", "training.global_batch=16"
    )
    fig = exposed_comm_figure(run.result)
    names = [t.name for t in fig.data]
    assert names == [a for a in AXIS_COLORS if a in names]  # in axis order
    assert "ep" in names and "tp" in names
    assert [t.marker.color for t in fig.data] == [AXIS_COLORS[n] for n in names]
    page, _ = run_report_html(run, "moe")
    assert "imbalance stall" in page  # the MoE step's stalls get a number at the top
    assert "8 experts, top-2" in page


def test_memory_chart_shows_every_term_and_the_capacity(flow_run):
    memory = flow_run.result.memory
    fig = memory_figure(memory)
    bars = [t for t in fig.data if t.type == "bar"]
    terms = list(memory.per_stage[0].terms_bytes)
    assert [t.name for t in bars] == [term.replace("_", " ") for term in terms]
    for bar, term in zip(bars, terms, strict=True):
        expected = [stage.terms_bytes[term] / GIB for stage in memory.per_stage]
        assert list(bar.y) == pytest.approx(expected)
    (capacity,) = [t for t in fig.data if t.type == "scatter"]
    assert capacity.name.startswith("capacity")
    assert list(capacity.y) == pytest.approx([memory.capacity_bytes / GIB] * 2)
    assert fig.layout.yaxis.range[1] > memory.capacity_bytes / GIB  # the line is in view
    assert not fig.layout.annotations


def test_out_of_memory_is_obvious():
    run = _run("dp-only-oom.yaml")
    memory = run.result.memory
    assert memory.oom
    fig = memory_figure(memory)
    (capacity,) = [t for t in fig.data if t.type == "scatter"]
    assert capacity.line.color == "#B3261E"
    assert "OUT OF MEMORY" in fig.layout.annotations[0].text
    assert fig.layout.yaxis.range[1] >= memory.peak_bytes_per_gpu / GIB
    page, _ = run_report_html(run, "oom")
    needs = memory.peak_bytes_per_gpu / 2**30
    assert f'<li class="oom">out of memory: stage 0 needs {needs:.1f} GiB' in page
    assert '<div class="card bad">' in page


def test_link_heatmap_only_in_flow_fidelity(flow_run, analytic_run):
    assert link_heatmap(analytic_run) is None
    fig = link_heatmap(flow_run)
    (heatmap,) = fig.data
    assert heatmap.type == "heatmap"
    assert len(heatmap.z) == LINK_ROWS  # 64 links carry traffic; the busiest 30 are drawn
    assert all(len(row) == LINK_BINS for row in heatmap.z)
    assert all(0.0 <= v <= 1.0 for row in heatmap.z for v in row)
    assert (heatmap.zmin, heatmap.zmax) == (0, 1)
    # busiest first; a row's mean over the bins is the link's mean utilisation
    bandwidth = {row.link: row.bandwidth_Bps for row in flow_run.result.busiest_links}
    carried = [
        sum(row) * bandwidth.get(name.replace(" → ", "->"), 0.0)
        for name, row in zip(heatmap.y, heatmap.z, strict=True)
    ]
    assert carried[0] == pytest.approx(max(carried), rel=1e-3)
    summary = {row.link: row for row in flow_run.result.busiest_links}
    first = summary[heatmap.y[0].replace(" → ", "->")]
    assert sum(heatmap.z[0]) / LINK_BINS == pytest.approx(first.mean_utilisation, abs=1e-3)


def test_large_traces_are_drawn_with_representative_ranks(flow_run):
    trace = make_trace(flow_run)
    assert len(trace.records) > 3000
    reps = representative_ranks(flow_run.scenario, flow_run.result.breakdown.critical_rank)
    assert trace.meta["representative_ranks"] == reps
    shown, info = fit_trace(trace, max_bars=3000)
    assert {rec.rank for rec in shown.records} <= set(reps)
    assert len(shown.records) <= 3000 and not info["truncated"]
    # touching ops, or trains of ops thinner than half a pixel: nothing else merged
    assert info["merge_gap_s"] <= flow_run.result.step_time_s / 2000
    # the report draws the representative ranks; timeline.html, with its larger
    # budget, every rank once touching ops are merged (so those same ranks too)
    _, page = timeline_figure(trace, "t", max_bars=REPORT_MAX_BARS)
    _, full = timeline_figure(trace, "t")
    assert page["ranks_shown"] == info["ranks_shown"] == reps
    assert full["ranks_shown"] == sorted({rec.rank for rec in trace.records})
    small = make_trace(_run("small.yaml"))
    assert fit_trace(small, max_bars=10**6)[0].records == small.records


def test_timeline_caption_says_what_is_left_out(flow_page):
    assert "only 3 representative ranks are drawn" in flow_page
    assert "timeline.html beside it draws more" in flow_page


def test_the_page_draws_each_chart_as_the_styled_figure_would(flow_run):
    """report.html builds its charts without a template object and adds the
    template's JSON when it draws them: the same JSON a styled figure writes."""
    import json

    import plotly.io as pio

    from simulator.report.style import page_figure

    result = flow_run.result
    pairs = [
        (breakdown_figure(result), breakdown_figure(result, with_template=False)),
        (exposed_comm_figure(result), exposed_comm_figure(result, with_template=False)),
        (memory_figure(result.memory), memory_figure(result.memory, with_template=False)),
        (link_heatmap(flow_run), link_heatmap(flow_run, with_template=False)),
    ]
    for styled, bare in pairs:
        assert "plot_bgcolor" not in bare.layout.template.to_plotly_json().get("layout", {})
        drawn = json.loads(pio.to_json(page_figure(bare), validate=False))
        assert drawn == json.loads(styled.to_json())
        assert drawn["layout"]["template"]["layout"]["plot_bgcolor"] == "white"
