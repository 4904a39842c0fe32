"""Tests of the Chrome trace and HTML timeline writers on small hand-built traces."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from simulator.analysis.trace import OpRecord, Trace
from simulator.report import (
    chrome_trace_events,
    timeline_figure,
    write_chrome_trace,
    write_timeline_html,
)
from simulator.report.chrome_trace import select_ranks

MS = 1e-3


def rec(
    rank: int,
    op_id: int,
    stream: str,
    op: str,
    kind: str,
    label: str,
    start: float,
    end: float,
    ready: float | None = None,
    **kw: Any,
) -> OpRecord:
    """One op record; ``ready`` defaults to ``start``."""
    tags = kw.pop("tags", {})
    return OpRecord(
        rank=rank,
        op_id=op_id,
        stream=stream,
        op=op,
        kind=kind,
        label=label,
        tags=tags,
        ready=start if ready is None else ready,
        start=start,
        end=end,
        **kw,
    )


def small_trace() -> Trace:
    """Two pipeline stages (ranks 0 and 1, with rank 2 as rank 0's TP peer) doing one
    micro-batch forward and backward, a TP all-reduce, a DP all-reduce and an optimizer."""
    fwd = {"phase": "fwd", "microbatch": 0}
    bwd = {"phase": "bwd", "microbatch": 0}
    tp = {**fwd, "layer": 0, "axis": "tp"}
    dp = {"phase": "bwd", "axis": "dp"}
    # fmt: off
    records = [
        # rank 0: stage 0
        rec(0, 0, "compute", "compute", "gemm", "L0.fc1.fwd", 0.0, 1 * MS,
            tags={**fwd, "layer": 0, "stage": 0}, flops=2e12, bytes=3e8),
        rec(0, 1, "tp", "collective", "all_reduce", "L0.tp.fwd", 1.2 * MS, 1.5 * MS,
            ready=1 * MS, tags=tp, bytes=1.6e7, group="tp0"),
        rec(0, 2, "pp_send_fwd", "send", "send", "send.fwd.mb0", 1.5 * MS, 1.8 * MS,
            tags={**fwd, "axis": "pp"}, bytes=8e6, peer=1),
        rec(0, 3, "pp_recv_bwd", "recv", "recv", "recv.bwd.mb0", 3.0 * MS, 3.3 * MS,
            ready=1.8 * MS, tags={**bwd, "axis": "pp"}, bytes=8e6, peer=1),
        rec(0, 4, "compute", "compute", "gemm", "L0.fc1.bwd", 3.3 * MS, 5.3 * MS,
            tags={**bwd, "layer": 0}, flops=4e12),
        rec(0, 5, "compute", "compute", "gemm", "L0.fc1.recompute", 3.3 * MS, 3.3 * MS,
            tags={"phase": "recompute", "layer": 0, "microbatch": 0}),
        rec(0, 6, "dp", "collective", "all_reduce", "grads.dp", 5.3 * MS, 6.0 * MS,
            tags=dp, bytes=1e9, group="dp0"),
        rec(0, 7, "compute", "compute", "optimizer", "adam", 6.0 * MS, 6.4 * MS,
            tags={"phase": "optimizer"}),
        # rank 1: stage 1
        rec(1, 0, "pp_recv_fwd", "recv", "recv", "recv.fwd.mb0", 1.5 * MS, 1.8 * MS,
            ready=0.0, tags={**fwd, "axis": "pp"}, bytes=8e6, peer=0),
        rec(1, 1, "compute", "compute", "gemm", "L1.fc1.fwd", 1.8 * MS, 2.8 * MS,
            tags={**fwd, "layer": 1, "stage": 1}),
        rec(1, 2, "compute", "compute", "gemm", "L1.fc1.bwd", 2.8 * MS, 3.0 * MS,
            tags={**bwd, "layer": 1}),
        rec(1, 3, "pp_send_bwd", "send", "send", "send.bwd.mb0", 3.0 * MS, 3.3 * MS,
            tags={**bwd, "axis": "pp"}, bytes=8e6, peer=0),
        rec(1, 4, "dp", "collective", "all_reduce", "grads.dp", 5.3 * MS, 6.0 * MS,
            ready=3.3 * MS, tags=dp, bytes=1e9, group="dp0"),
        # rank 2: rank 0's TP peer
        rec(2, 0, "compute", "compute", "gemm", "L0.fc1.fwd", 0.0, 1.2 * MS,
            tags={**fwd, "layer": 0}),
        rec(2, 1, "tp", "collective", "all_reduce", "L0.tp.fwd", 1.2 * MS, 1.5 * MS,
            tags=tp, bytes=1.6e7, group="tp0"),
    ]
    # fmt: on
    meta = {"scenario": "toy-pp2-tp2", "gpus_per_node": 2, "fidelity": "flow"}
    return Trace(records=records, step_time=6.4 * MS, meta=meta)


def big_trace(ranks: int = 64, ops: int = 100, meta: dict[str, Any] | None = None) -> Trace:
    """``ranks`` ranks with ``ops`` back-to-back compute ops each."""
    records = []
    for r in range(ranks):
        for i in range(ops):
            phase = "fwd" if i < ops // 2 else "bwd"
            tags = {"phase": phase, "layer": i}
            op = rec(r, i, "compute", "compute", "gemm", f"L{i}", i * MS, (i + 0.9) * MS, tags=tags)
            records.append(op)
    return Trace(records=records, step_time=ops * MS, meta=dict(meta or {}))


def thin_train_and_wide_ops() -> Trace:
    """Rank 0: a forward train of 300 ops 0.1 µs long and 0.1 µs apart (thinner than a
    pixel: merged to fit a small chart), and five TP all-reduces 0.1 ms long (never)."""
    fwd = {"phase": "fwd", "microbatch": 0}
    records = [
        rec(0, i, "compute", "compute", "gemm", f"f{i}", i * 2e-7, i * 2e-7 + 1e-7, tags=fwd)
        for i in range(300)
    ]
    records += [
        rec(0, 300 + i, "tp", "collective", "all_reduce", f"ar{i}", 1e-4 + i * 2e-4,
            2e-4 + i * 2e-4, tags={**fwd, "axis": "tp"}, group="tp0")
        for i in range(5)
    ]  # fmt: skip
    return Trace(records=records, step_time=1.2e-3)


# --------------------------------------------------------------------------- chrome trace


def test_chrome_trace_events_are_valid():
    trace = small_trace()
    doc = chrome_trace_events(trace)
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"]["scenario"] == "toy-pp2-tp2"
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"X", "M", "s", "f"}
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= e.keys()
        assert type(e["pid"]) is int and type(e["tid"]) is int

    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(trace.records)
    for e, r in zip(complete, trace.records, strict=True):
        assert e["pid"] == r.rank
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        assert e["ts"] == pytest.approx(r.start * 1e6, abs=1e-3)
        assert e["dur"] == pytest.approx((r.end - r.start) * 1e6, abs=1e-3)
        assert e["args"]["ready_us"] == pytest.approx(r.ready * 1e6, abs=1e-3)
        assert e["args"]["label"] == r.label
        assert e["args"]["tags"] == r.tags
        assert {"op", "kind", "bytes", "flops"} <= e["args"].keys()
        if r.op == "compute":
            assert e["name"] == r.label
        else:
            assert e["name"].startswith(f"nccl:{r.kind}")
        if r.op == "collective":
            assert e["args"]["group"] == r.group
        if r.op in ("send", "recv"):
            assert e["args"]["peer"] == r.peer

    cats = {e["cat"] for e in complete}
    assert cats == {
        "forward",
        "backward",
        "recompute",
        "optimizer",
        "comm:tp",
        "comm:dp",
        "comm:pp",
    }


def test_chrome_trace_metadata_names_processes_and_threads():
    trace = small_trace()
    events = chrome_trace_events(trace)["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (node 0)", 1: "rank 1 (node 0)", 2: "rank 2 (node 1)"}
    sort_idx = {
        e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"
    }
    assert sort_idx == {0: 0, 1: 1, 2: 2}

    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    lanes = {(r.rank, r.stream) for r in trace.records}
    assert set(threads.values()) == {s for _, s in lanes}
    assert {(pid, name) for (pid, _), name in threads.items()} == lanes
    # one tid per stream, the same on every rank, compute first then sorted
    tid_of = {}
    for (_, tid), name in threads.items():
        assert tid_of.setdefault(name, tid) == tid
    assert tid_of["compute"] == 1  # Perfetto reads tid 0 as "tid = pid"
    others = sorted(s for s in tid_of if s != "compute")
    assert [tid_of[s] for s in others] == list(range(2, len(others) + 2))
    assert {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_sort_index"} == set(threads)
    # every op event sits on a named thread
    stream_of = {(r.rank, r.op_id): r.stream for r in trace.records}
    for e in events:
        if e["ph"] == "X":
            assert threads[(e["pid"], e["tid"])] == stream_of[(e["pid"], e["args"]["op_id"])]


def test_process_name_without_gpus_per_node():
    trace = small_trace()
    trace.meta.pop("gpus_per_node")
    events = chrome_trace_events(trace)["traceEvents"]
    names = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert names == ["rank 0", "rank 1", "rank 2"]


def test_flow_arrows_join_each_send_to_its_recv():
    trace = small_trace()
    events = chrome_trace_events(trace)["traceEvents"]
    tid_name = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 2 and starts.keys() == finishes.keys()
    pairs = set()
    for fid, s in starts.items():
        f = finishes[fid]
        assert f["bp"] == "e"
        assert s["name"] == f["name"] and s["cat"] == f["cat"] == "comm:pp"
        pairs.add(
            (s["pid"], tid_name[(s["pid"], s["tid"])], f["pid"], tid_name[(f["pid"], f["tid"])])
        )
    assert pairs == {(0, "pp_send_fwd", 1, "pp_recv_fwd"), (1, "pp_send_bwd", 0, "pp_recv_bwd")}
    assert "unmatched_p2p" not in chrome_trace_events(trace)["otherData"]


def test_flow_matching_in_program_order_and_unmatched_counted():
    tags = {"phase": "fwd", "microbatch": 0, "axis": "pp"}
    records = [
        # two chunks of micro-batch 0 go from rank 0 to rank 1 (interleaved schedule)
        rec(0, 5, "pp_send_fwd", "send", "send", "send.c0", 1 * MS, 2 * MS, tags=tags, peer=1),
        rec(0, 9, "pp_send_fwd", "send", "send", "send.c1", 4 * MS, 5 * MS, tags=tags, peer=1),
        rec(1, 3, "pp_recv_fwd", "recv", "recv", "recv.c0", 1 * MS, 2 * MS, tags=tags, peer=0),
        rec(1, 7, "pp_recv_fwd", "recv", "recv", "recv.c1", 4 * MS, 5 * MS, tags=tags, peer=0),
        # a send nobody receives
        rec(1, 8, "pp_send_fwd", "send", "send", "send.lost", 6 * MS, 7 * MS, tags=tags, peer=0),
    ]
    doc = chrome_trace_events(Trace(records=records, step_time=7 * MS))
    s = sorted((e for e in doc["traceEvents"] if e["ph"] == "s"), key=lambda e: e["ts"])
    f = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert [(e["ts"], f[e["id"]]["ts"]) for e in s] == [(1500.0, 1500.0), (4500.0, 4500.0)]
    assert doc["otherData"]["unmatched_p2p"] == 1


def test_chrome_trace_file_loads_and_is_deterministic(tmp_path: Path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_chrome_trace(small_trace(), a)
    write_chrome_trace(small_trace(), b)
    assert a.read_bytes() == b.read_bytes()
    loaded = json.loads(a.read_text())
    assert loaded == json.loads(json.dumps(chrome_trace_events(small_trace()), default=str))
    assert loaded["displayTimeUnit"] == "ms"


def test_chrome_trace_cap_keeps_whole_evenly_spaced_ranks(tmp_path: Path):
    trace = big_trace(ranks=16, ops=50)
    doc = chrome_trace_events(trace, max_events=200)
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(x) <= 200
    pids = Counter(e["pid"] for e in x)
    assert 0 in pids and 15 in pids and set(pids.values()) == {50}
    capped = doc["otherData"]["capped"]
    assert capped["ranks_total"] == 16 and capped["events_total"] == 800
    assert capped["ranks_shown"] == sorted(pids)
    path = tmp_path / "capped.json"
    write_chrome_trace(trace, path, max_events=200)
    assert json.loads(path.read_text())["otherData"]["capped"]["events_shown"] == len(x)


def test_select_ranks():
    counts = dict.fromkeys(range(10), 10)
    assert select_ranks(counts, 1000) == list(range(10))
    assert select_ranks(counts, 40) == [0, 3, 6, 9]
    assert select_ranks(counts, 30, preferred=[7, 2, 99, 4]) == [2, 4, 7]
    assert select_ranks(counts, 25, preferred=[7, 2, 99, 4]) == [4, 7]  # first and last
    assert select_ranks(counts, 40, preferred=list(range(10))) == [0, 3, 6, 9]
    assert select_ranks(counts, 5) == [0]
    assert select_ranks({}, 5) == []


# --------------------------------------------------------------------------- timeline


def test_timeline_html_opens_offline_with_the_bundle_beside_it(tmp_path: Path):
    path = tmp_path / "timeline.html"
    info = write_timeline_html(small_trace(), path, title="toy run")
    html = path.read_text()
    assert 'src="https://cdn.plot.ly' not in html and "cdn.plot.ly/plotly" not in html
    # plotly.js is loaded from the one copy beside the page, by a relative path
    assert re.search(r'<script[^>]*src="plotly.min.js"', html) and "plotly.js v" not in html
    assert "plotly.js v" in (tmp_path / "plotly.min.js").read_text()[:2000]
    assert "toy-pp2-tp2" in html and "r0 compute" in html
    assert info["capped"] is False and info["ranks_shown"] == [0, 1, 2]
    assert info["bars"] == info["bars_total"] == len(small_trace().records)
    assert info["path"] == str(path)
    again = tmp_path / "again.html"
    write_timeline_html(small_trace(), again, title="toy run")
    assert again.read_bytes() == path.read_bytes()


def test_timeline_one_trace_per_category_and_lanes():
    trace = small_trace()
    fig, info = timeline_figure(trace, title="toy run")
    names = [t.name for t in fig.data if t.type == "bar"]
    assert names == [
        "forward",
        "backward",
        "recompute",
        "optimizer",
        "comm:tp",
        "comm:dp",
        "comm:pp",
    ]
    assert info["categories"] == names
    assert sum(len(t.x) for t in fig.data if t.type == "bar") == len(trace.records)
    *bars, axis = fig.data
    for t in bars:
        assert t.orientation == "h" and t.type == "bar"
        assert len(t.base) == len(t.x) == len(t.y) == len(t.hovertext)
    # the empty trace that draws the time axis at the bottom too
    assert axis.xaxis == "x2" and fig.layout.xaxis2.matches == "x" and not axis.showlegend
    assert fig.layout.xaxis2.side == "bottom" and fig.layout.xaxis.side == "top"
    assert fig.layout.barmode == "overlay"
    lanes = list(fig.layout.yaxis.ticktext)
    assert lanes == [
        "r0 compute",
        "r0 dp",
        "r0 pp_recv_bwd",
        "r0 pp_send_fwd",
        "r0 tp",
        "r1 compute",
        "r1 dp",
        "r1 pp_recv_fwd",
        "r1 pp_send_bwd",
        "r2 compute",
        "r2 tp",
    ]
    assert info["lanes"] == len(lanes)
    # bars are in milliseconds
    fwd = fig.data[0]
    assert fwd.base[0] == pytest.approx(0.0) and fwd.x[0] == pytest.approx(1.0)
    hover = fig.data[4].hovertext[0]
    assert "L0.tp.fwd" in hover and "comm:tp" in hover and "layer 0" in hover
    assert "micro-batch 0" in hover and "MiB" in hover
    assert "6.4 ms" in fig.layout.title.text
    notes = [a.text for a in fig.layout.annotations]
    assert not any(note.startswith("Showing") for note in notes)  # every rank is drawn


def test_timeline_colours_are_fixed_per_category():
    fig_a, _ = timeline_figure(small_trace(), title="a")
    only_dp = Trace([r for r in small_trace().records if r.tags.get("axis") == "dp"], 6.4 * MS)
    fig_b, _ = timeline_figure(only_dp, title="b")
    colour = {t.name: t.marker.color for t in fig_a.data}
    assert [t.name for t in fig_b.data if t.type == "bar"] == ["comm:dp"]
    assert fig_b.data[0].marker.color == colour["comm:dp"]


def test_timeline_caps_large_traces_with_annotation(tmp_path: Path):
    trace = big_trace(ranks=64, ops=100)
    path = tmp_path / "big.html"
    info = write_timeline_html(trace, path, title="big", max_bars=1000)
    assert info["capped"] is True and info["bars"] <= 1000
    assert info["ranks_total"] == 64
    shown = info["ranks_shown"]
    assert shown[0] == 0 and shown[-1] == 63 and len(shown) == 10
    note = f"Showing {len(shown)} of 64 ranks, evenly spaced ranks"
    assert note in path.read_text()
    fig, _ = timeline_figure(trace, title="big", max_bars=1000)
    assert any(note in a.text for a in fig.layout.annotations)


def test_timeline_prefers_representative_ranks():
    trace = big_trace(ranks=32, ops=100, meta={"representative_ranks": [5, 17, 31]})
    fig, info = timeline_figure(trace, title="rep", max_bars=1000)
    assert info["ranks_shown"] == [5, 17, 31]
    assert [lane.split()[0] for lane in fig.layout.yaxis.ticktext] == ["r5", "r17", "r31"]
    assert "Showing 3 of 32 ranks, representative ranks" in fig.layout.annotations[0].text
    assert info["selection"] == "representative ranks"


def test_timeline_truncates_a_single_huge_rank():
    # alternating categories, each op wider than two pixels (1.2 ms of a 600 ms step):
    # merging cannot shrink it, so the cap must cut it
    records = [
        rec(
            0,
            i,
            "compute",
            "compute",
            "gemm",
            f"L{i}",
            3 * i * MS,
            (3 * i + 2.7) * MS,
            tags={"phase": "fwd" if i % 2 else "bwd"},
        )
        for i in range(200)
    ]
    trace = Trace(records=records, step_time=600 * MS, meta={})
    fig, info = timeline_figure(trace, title="one", max_bars=100)
    assert info["truncated"] and info["bars"] == 100
    assert sum(len(t.x) for t in fig.data if t.type == "bar") == 100
    assert "first 100 of 200 ops" in fig.layout.annotations[0].text


def test_timeline_merges_ops_before_dropping_any():
    fig, info = timeline_figure(big_trace(ranks=1, ops=500), title="one", max_bars=100)
    assert not info["truncated"] and info["coalesced_from"] == 500 and info["bars"] <= 100
    assert "drawn as one bar" in fig.layout.annotations[0].text
    opacities = [o for t in fig.data if t.type == "bar" for o in t.marker.opacity]
    assert all(0.25 <= o <= 1.0 for o in opacities) and min(opacities) < 1.0


def test_timeline_notes_a_trace_that_holds_only_some_ranks():
    trace = small_trace()
    trace.meta.update(world=64, representative_ranks=[0, 1, 2])
    fig, info = timeline_figure(trace, title="toy run")
    assert info["capped"] and info["bars"] == info["bars_total"]
    assert info["ranks_total"] == 64 and info["ranks_shown"] == [0, 1, 2]
    assert fig.layout.annotations[0].text == "Showing 3 of 64 ranks, representative ranks"


def test_timeline_thins_representative_ranks_that_do_not_fit():
    reps = [0, 4, 8, 12, 16, 20, 24, 31]
    trace = big_trace(ranks=32, ops=100, meta={"representative_ranks": reps})
    _, info = timeline_figure(trace, title="rep", max_bars=400)
    assert info["ranks_shown"] == [0, 8, 20, 31]
    assert info["selection"] == "evenly spaced representative ranks"
    # every rank listed as representative is no preference at all
    trace.meta["representative_ranks"] = list(range(32))
    _, info = timeline_figure(trace, title="rep", max_bars=400)
    assert info["ranks_shown"] == [0, 10, 21, 31]
    assert info["selection"] == "evenly spaced ranks"


def test_coalesce_merges_only_adjacent_ops_of_one_category_in_one_lane():
    from simulator.analysis.trace import OpRecord
    from simulator.report.coalesce import coalesce

    def op(i, start, end, phase="fwd", stream="compute"):
        return OpRecord(
            0,
            i,
            stream,
            "compute",
            "gemm",
            f"op{i}",
            {"phase": phase, "layer": i},
            start,
            start,
            end,
            bytes=1.0,
            flops=2.0,
        )

    records = [
        op(0, 0.0, 1.0),
        op(1, 1.0, 2.0),
        op(2, 2.0, 3.0, phase="bwd"),
        op(3, 5.0, 6.0, phase="bwd"),
        op(4, 0.0, 1.0, stream="tp"),
    ]
    merged = coalesce(records, resolution=0.5)
    compute = sorted((r for r in merged if r.stream == "compute"), key=lambda r: r.start)
    assert [(r.start, r.end) for r in compute] == [(0.0, 2.0), (2.0, 3.0), (5.0, 6.0)]
    assert compute[0].flops == 4.0 and compute[0].label.startswith("2 ops: op0")
    assert "layer" not in compute[0].tags and compute[0].tags["phase"] == "fwd"
    assert len(merged) == 4


def test_chrome_trace_reads_back_into_the_same_records():
    from simulator.report.chrome_trace import trace_from_chrome

    trace = small_trace()
    again = trace_from_chrome(chrome_trace_events(trace))
    assert again.step_time == pytest.approx(trace.step_time)
    originals = {(r.rank, r.op_id): r for r in trace.records}
    assert len(again.records) == len(trace.records)
    for record in again.records:
        original = originals[(record.rank, record.op_id)]
        assert (record.stream, record.kind, record.label, record.tags) == (
            original.stream,
            original.kind,
            original.label,
            original.tags,
        )
        assert record.start == pytest.approx(original.start, abs=1e-9)
        assert record.end == pytest.approx(original.end, abs=1e-9)


@pytest.mark.parametrize("scenario", ["scenarios/small.yaml", "scenarios/pipeline-demo.yaml"])
def test_the_timeline_s_unvalidated_bars_draw_the_validated_figure(scenario):
    from simulator.report.timeline import timeline_figure
    from simulator.request.scenario import load_scenario
    from simulator.run.simulate import make_trace, run_scenario

    trace = make_trace(run_scenario(load_scenario(scenario)))
    figures = [  # the same figure; a validated one may order a dict's keys its own way
        json.loads(timeline_figure(trace, "t", zoom_detail=True, validate=v)[0].to_json())
        for v in (True, False)
    ]
    assert figures[0] == figures[1]


@pytest.mark.parametrize("scenario", ["scenarios/small.yaml", "scenarios/pipeline-demo.yaml"])
def test_the_pages_plain_timeline_dict_is_the_validated_plotly_figure(scenario):
    """timeline.html and report.html draw :func:`timeline_spec`'s dict unvalidated:
    a figure plotly builds and checks from it writes the same JSON, template included."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from simulator.report.timeline import timeline_spec
    from simulator.request.scenario import load_scenario
    from simulator.run.simulate import make_trace, run_scenario

    trace = make_trace(run_scenario(load_scenario(scenario)))
    for bars, detail in ((30000, True), (50, True), (50, False)):
        spec, _ = timeline_spec(trace, "t", max_bars=bars, zoom_detail=detail)
        drawn = json.loads(pio.to_json(spec, validate=False))
        checked = json.loads(go.Figure(spec).to_json())
        assert drawn == checked
        assert drawn["layout"]["template"]["layout"]["plot_bgcolor"] == "white"


def test_charts_of_one_trace_share_their_common_steps_and_draw_what_they_would_alone():
    """``timeline.html`` and ``report.html`` fit one trace to their own budgets and
    reuse what the two have in common (``Trace.derived``): each chart is the one its
    trace alone, drawn first, gives, whichever goes first."""

    def fresh() -> Trace:
        return big_trace(ranks=16, ops=200, meta={"representative_ranks": [0, 5, 15]})

    alone = {
        bars: timeline_figure(fresh(), title="t", max_bars=bars, zoom_detail=True)[0].to_json()
        for bars in (300, 800, 5000)
    }
    for order in ((300, 800, 5000), (5000, 800, 300)):
        shared = fresh()
        for bars in order:
            fig, _ = timeline_figure(shared, title="t", max_bars=bars, zoom_detail=True)
            assert fig.to_json() == alone[bars]
        assert shared.derived  # the steps were kept, for the next chart


def test_the_zoom_carries_only_the_categories_whose_ops_were_merged():
    """A forward train of thin ops merges to fit; five wide TP all-reduces do not: the
    page's zoom data holds the forward ops alone, and its bar budget leaves room for the
    all-reduces it keeps drawing."""
    from simulator.report.timeline import timeline_spec

    trace = thin_train_and_wide_ops()
    spec, info = timeline_spec(trace, "t", max_bars=50, zoom_detail=True)
    detail = info["detail"]
    assert [entry["name"] for entry in detail["traces"]] == ["forward"]
    assert len(detail["traces"][0]["x"]) == 300
    drawn = {bar["name"]: len(bar["x"]) for bar in spec["data"] if bar["type"] == "bar"}
    assert drawn["comm:tp"] == 5 and drawn["forward"] < 300
    assert detail["max_bars"] == 50 - 5


def test_an_moe_summary_has_a_routing_line_and_a_dense_one_none():
    from rich.console import Console

    from simulator.report.summary import draw_summary, routing_line, summarise
    from simulator.request.scenario import load_scenario
    from simulator.run.simulate import run_scenario

    from .conftest import SCENARIOS

    skewed = "model.moe={experts: 4, top_k: 2, routing: {kind: zipf, exponent: 1.2}}"
    overrides = ["parallel.tp=1", "parallel.dp=2", "parallel.ep=2", skewed]
    result = run_scenario(load_scenario(SCENARIOS / "cpu-tiny.yaml", overrides)).result
    moe, step = result.moe, result.step_time_s
    stall = result.breakdown.mean["imbalance_stall"]
    assert moe is not None and moe.imbalance_mean > 1 and stall > 0
    line = routing_line(result)
    assert line.startswith("zipf router, 4 experts top-2 over ep 2: the busiest EP rank takes")
    assert f"{moe.imbalance_mean:.2f}× the mean load (at worst {moe.imbalance_max:.2f}×)" in line
    assert f"for it on average ({100 * stall / step:.1f}% of the step)" in line
    console = Console(width=300, record=True)
    draw_summary(summarise(result, []), console)
    (row,) = [text for text in console.export_text().splitlines() if "routing" in text]
    assert line in row
    dense = run_scenario(load_scenario(SCENARIOS / "cpu-tiny.yaml", [])).result
    assert routing_line(dense) is None
    console = Console(width=300, record=True)
    draw_summary(summarise(dense, []), console)
    assert "routing" not in console.export_text()
