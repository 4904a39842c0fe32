"""trace.json checked against the rules of the Chrome trace event format, and the
per-rank files checked against what Holistic Trace Analysis (HTA) reads.

The format checks need no optional package: every event has a phase, complete events
have numeric times in microseconds and integer pid/tid, every lane is named, every
flow arrow has one start and one end that each lie on a slice of their thread, the
send/recv arrows and the collective chains are both there and join the right ops, and
the file carries ``distributedInfo`` and is byte-identical when written twice. The last
test loads the per-rank files with HTA itself and is skipped when ``hta`` is absent.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from simulator.analysis.trace import Trace
from simulator.report.chrome_trace import (
    TraceFileError,
    chrome_trace_events,
    rank_trace_name,
    trace_from_chrome,
    write_chrome_trace,
    write_rank_traces,
)
from simulator.request.scenario import load_scenario
from simulator.run.simulate import make_trace, run_scenario

# Two pipeline stages (sends and recvs between ranks 0-7 and 8-15), TP all-reduces in
# groups of four and DP all-reduces in pairs: every kind of arrow the writer draws, in
# about 4000 ops (four layers, eight micro-batches).
SCENARIO = "scenarios/pipeline-demo.yaml"
OVERRIDES = ["parallel.tp=4", "parallel.dp=2", "training.global_batch=8", "model.layers=4"]

# How HTA finds a file's rank (hta/common/trace_file.py): the first line that matches.
HTA_RANK_RE = re.compile(r'"rank":\s+(\d+)')
HTA_COMM_KERNEL_RE = re.compile(r"^nccl.*Kernel")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return make_trace(run_scenario(load_scenario(SCENARIO, OVERRIDES)))


@pytest.fixture(scope="module")
def trace_file(trace: Trace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    write_chrome_trace(trace, path)
    return path


@pytest.fixture(scope="module")
def doc(trace_file: Path) -> dict[str, Any]:
    return json.loads(trace_file.read_text())


# Ranks a capped file keeps: a whole TP group of stage 0 and two stage-1 ranks, so the
# capped file still has collective chains and send/recv arrows.
SHOWN = [0, 1, 2, 3, 8, 12]


def _preferring(trace: Trace, ranks: list[int]) -> tuple[Trace, int]:
    """``trace`` preferring ``ranks`` when capped, and a cap they just fit under."""
    meta = {**trace.meta, "representative_ranks": ranks}
    budget = sum(r.rank in ranks for r in trace.records)
    assert budget < len(trace.records)
    return Trace(trace.records, trace.step_time, meta), budget


# --------------------------------------------------------------------------- validators


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _slices(events: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Complete events by (pid, tid), sorted by start."""
    lanes: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            lanes[(e["pid"], e["tid"])].append(e)
    for lane in lanes.values():
        lane.sort(key=lambda e: (e["ts"], e["dur"]))
    return lanes


def _enclosing(lanes: dict, pid: int, tid: int, ts: float) -> dict[str, Any] | None:
    """The complete event on (pid, tid) whose span holds ``ts``, if any."""
    lane = lanes.get((pid, tid), [])
    i = bisect.bisect_right([e["ts"] for e in lane], ts)
    for e in reversed(lane[:i]):
        if e["ts"] <= ts <= e["ts"] + e["dur"]:
            return e
    return None


def check_events(events: list[dict[str, Any]]) -> None:
    """Phases, times, ids and lane names of a Chrome trace's events."""
    names = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"}
    processes = {e["pid"] for e in events if e.get("name") == "process_name"}
    for e in events:
        assert isinstance(e.get("ph"), str), e
        assert type(e.get("pid")) is int, e
        assert e["pid"] in processes, f"pid {e['pid']} has no process_name"
        if e["ph"] != "X":
            continue
        assert type(e["tid"]) is int, e
        assert _is_number(e["ts"]) and _is_number(e["dur"]), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        assert (e["pid"], e["tid"]) in names, f"lane {e['pid']}/{e['tid']} has no thread_name"


def check_v1_flows(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Every flow id has one "s", one "f" (any number of "t"), each on a slice of its
    thread. Returns, per id, the slices its events lie on, in s, t..., f order."""
    lanes = _slices(events)
    flows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            assert _is_number(e["ts"]) and type(e["tid"]) is int, e
            flows[e["id"]].append(e)
    ends: dict[int, list[dict[str, Any]]] = {}
    for fid, steps in flows.items():
        phases = Counter(e["ph"] for e in steps)
        assert phases["s"] == 1 and phases["f"] == 1, (fid, phases)
        assert all(e["bp"] == "e" for e in steps if e["ph"] == "f")
        order = {"s": 0, "t": 1, "f": 2}
        on = []
        for e in sorted(steps, key=lambda e: order[e["ph"]]):
            host = _enclosing(lanes, e["pid"], e["tid"], e["ts"])
            assert host is not None, f"flow {fid} {e['ph']} at {e['ts']} lies on no slice"
            on.append(host)
        ends[fid] = on
    return ends


def check_v2_chains(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Every ``bind_id`` chains complete events: one with ``flow_out`` only, one with
    ``flow_in`` only, the others both, each on a different rank. Returns the members."""
    chains: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if "bind_id" in e:
            assert e["ph"] == "X", e
            assert type(e["bind_id"]) is int, e
            chains[e["bind_id"]].append(e)
    for bid, members in chains.items():
        kinds = Counter((e.get("flow_in", False), e.get("flow_out", False)) for e in members)
        assert kinds[(False, True)] == 1 and kinds[(True, False)] == 1, (bid, kinds)
        assert kinds[(True, True)] == len(members) - 2 and not kinds[(False, False)]
        assert len({e["pid"] for e in members}) == len(members), bid
    return chains


# --------------------------------------------------------------------------- trace.json


def test_events_follow_the_format(doc: dict[str, Any], trace: Trace):
    events = doc["traceEvents"]
    check_events(events)
    assert doc["displayTimeUnit"] == "ms"
    x = [e for e in events if e["ph"] == "X"]
    assert len(x) == len(trace.records)
    assert {e["ph"] for e in events} <= {"M", "X", "s", "t", "f"}


def test_send_recv_arrows_join_each_send_to_its_recv(doc: dict[str, Any], trace: Trace):
    ends = check_v1_flows(doc["traceEvents"])
    sends = sum(r.op == "send" for r in trace.records)
    assert sends and len(ends) == sends
    for fid, (src, dst) in ((fid, (on[0], on[-1])) for fid, on in ends.items()):
        assert src["args"]["op"] == "send" and dst["args"]["op"] == "recv", fid
        assert src["args"]["peer"] == dst["pid"] and dst["args"]["peer"] == src["pid"]
        for key in ("microbatch", "phase"):
            assert src["args"]["tags"].get(key) == dst["args"]["tags"].get(key)
    assert "unmatched_p2p" not in doc["otherData"]


def test_collective_chains_join_the_members_of_each_instance(doc: dict[str, Any], trace: Trace):
    events = doc["traceEvents"]
    chains = check_v2_chains(events)
    v1_ids = {e["id"] for e in events if e["ph"] in ("s", "t", "f")}
    assert not v1_ids & chains.keys()
    by_cat = Counter(members[0]["cat"] for members in chains.values())
    assert by_cat["comm:tp"] > 0 and by_cat["comm:dp"] > 0
    group_ranks: dict[str, set[int]] = defaultdict(set)
    for r in trace.records:
        if r.op == "collective":
            group_ranks[r.group].add(r.rank)
    for bid, members in chains.items():
        args = [m["args"] for m in members]
        # one instance: same group, kind and label on every member, all members there
        assert len({(a["group"], a["kind"], a["label"]) for a in args}) == 1, bid
        assert {m["pid"] for m in members} == group_ranks[args[0]["group"]], bid
        starts = [m["ts"] for m in sorted(members, key=lambda m: not m.get("flow_in"))]
        assert starts[0] == min(starts), bid  # the chain starts at the earliest slice
    collectives = [r for r in trace.records if r.op == "collective"]
    assert sum(len(m) for m in chains.values()) == len(collectives)


def test_distributed_info_and_ranks_in_file(doc: dict[str, Any], trace_file: Path, trace: Trace):
    info = doc["distributedInfo"]
    assert info["backend"] == "nccl"
    assert type(info["rank"]) is int and type(info["world_size"]) is int
    ranks = trace.ranks()
    assert info["rank"] == ranks[0] and info["world_size"] == trace.meta["world"]
    assert doc["otherData"]["ranks_in_file"] == ranks
    first = trace_file.read_text().splitlines()[0]
    assert int(HTA_RANK_RE.search(first).group(1)) == ranks[0]


def test_file_is_byte_identical_and_reads_back(trace: Trace, trace_file: Path, tmp_path: Path):
    again = tmp_path / "again.json"
    write_chrome_trace(trace, again)
    assert again.read_bytes() == trace_file.read_bytes()
    back = trace_from_chrome(json.loads(trace_file.read_text()))
    assert len(back.records) == len(trace.records)
    assert "ranks_in_file" not in back.meta


def test_capped_file_keeps_whole_arrows(trace: Trace, tmp_path: Path):
    capped, budget = _preferring(trace, SHOWN)
    path = tmp_path / "capped.json"
    write_chrome_trace(capped, path, max_events=budget)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    check_events(events)
    ends = check_v1_flows(events)
    chains = check_v2_chains(events)
    x = [e for e in events if e["ph"] == "X"]
    assert doc["otherData"]["capped"]["ranks_shown"] == SHOWN
    assert len(x) <= budget and sorted({e["pid"] for e in x}) == SHOWN
    assert doc["distributedInfo"]["rank"] == SHOWN[0]
    assert doc["otherData"]["ranks_in_file"] == SHOWN
    assert {(on[0]["pid"], on[-1]["pid"]) for on in ends.values()} >= {(0, 8), (8, 0)}
    group_ranks: dict[str, set[int]] = defaultdict(set)
    for r in trace.records:
        if r.op == "collective" and r.rank in SHOWN:
            group_ranks[r.group].add(r.rank)
    assert chains
    for members in chains.values():
        assert len({(m["args"]["group"], m["args"]["label"]) for m in members}) == 1
        assert {m["pid"] for m in members} == group_ranks[members[0]["args"]["group"]]
    assert {m["pid"] for c in chains.values() for m in c} == set(SHOWN)


# --------------------------------------------------------------------------- per-rank files


def test_rank_files_have_what_hta_reads(trace: Trace, tmp_path: Path):
    paths = write_rank_traces(trace, tmp_path)
    ranks = trace.ranks()
    assert paths == [tmp_path / rank_trace_name(r) for r in ranks]
    gpus = trace.meta["gpus_per_node"]
    for rank, path in zip(ranks, paths, strict=True):
        text = path.read_text()
        assert int(HTA_RANK_RE.search(text.splitlines()[0]).group(1)) == rank
        doc = json.loads(text)
        assert doc["distributedInfo"] == {
            "backend": "nccl",
            "rank": rank,
            "world_size": trace.meta["world"],
        }
        events = doc["traceEvents"]
        check_events(events)
        kernels = [e for e in events if e["ph"] == "X"]
        assert kernels and {e["pid"] for e in kernels} == {rank}
        assert {e["ph"] for e in events} == {"M", "X"}
        correlations = [e["args"]["correlation"] for e in kernels]
        assert len(set(correlations)) == len(kernels) and min(correlations) >= 1
        for e in kernels:
            assert e["cat"] == "kernel" and type(e["ts"]) is int and type(e["dur"]) is int
            assert e["args"]["device"] == rank % gpus and e["args"]["stream"] == e["tid"] >= 1
            comm = e["args"]["op"] != "compute"
            assert bool(HTA_COMM_KERNEL_RE.match(e["name"])) == comm, e["name"]
    again = tmp_path / "again"
    write_rank_traces(trace, again)
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in paths)


@pytest.mark.hta
@pytest.mark.filterwarnings("ignore::Warning:hta")  # HTA's own pandas deprecations
def test_hta_reads_the_rank_files(trace: Trace, tmp_path: Path):
    trace_analysis = pytest.importorskip(
        "hta.trace_analysis", reason="needs Holistic Trace Analysis: pip install '.[hta]'"
    )
    capped, budget = _preferring(trace, SHOWN)
    paths = write_rank_traces(capped, tmp_path, max_events=budget)
    assert paths == [tmp_path / rank_trace_name(r) for r in SHOWN]
    written = SHOWN

    analysis = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path))
    assert sorted(analysis.t.get_ranks()) == written

    temporal = analysis.get_temporal_breakdown(visualize=False)
    assert sorted(temporal["rank"]) == written
    assert (temporal["compute_time(us)"] > 0).all()
    assert (temporal["non_compute_time(us)"] > 0).all()  # communication not hidden
    step_us = trace.step_time * 1e6
    assert (temporal["kernel_time(us)"] <= step_us + 1).all()

    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert sorted(overlap["rank"]) == written
    assert overlap["comp_comm_overlap_pctg"].between(0, 100).all()

    kinds, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    by_type = dict(zip(kinds["kernel_type"], kinds["sum"], strict=True))
    assert by_type["COMMUNICATION"] > 0 and by_type["COMPUTATION"] > 0


@pytest.mark.parametrize(
    "scenario, overrides",
    [
        (SCENARIO, OVERRIDES),
        ("scenarios/small.yaml", []),
        (
            "scenarios/cpu-tiny.yaml",
            ["parallel.tp=1", "parallel.dp=2", "parallel.ep=2", "model.moe={experts: 4, top_k: 2}"],
        ),
    ],
)
def test_the_fast_event_encoding_is_the_json_encoder_s_byte_for_byte(scenario, overrides):
    """The writer encodes op events key by key (``_encode_complete``); each must read
    exactly as ``json`` (sorted keys, no spaces) would write the event dict."""
    from simulator.report.chrome_trace import _ENCODER, _Plan

    run = run_scenario(load_scenario(scenario, overrides))
    plan = _Plan(make_trace(run), None)
    events = [_ENCODER.encode(event) for event in plan.op_events()]
    assert list(plan.op_event_texts()) == events
    if scenario == SCENARIO:  # collective chains and send/recv peers are in there
        assert any('"bind_id"' in e for e in events) and any('"peer"' in e for e in events)


def test_the_fast_encoding_escapes_and_names_numbers_as_json_does():
    from simulator.analysis.trace import OpRecord
    from simulator.report.chrome_trace import _ENCODER, _complete_event, _encode_complete

    odd = OpRecord(
        rank=3,
        op_id=7,
        stream="comm",
        op="send",
        kind="send",
        label='é "quoted"\n</x>',
        tags={"phase": "bwd", "layer": 2, "weird": float("nan"), "obj": object},
        ready=1e-9,
        start=2.5e-6,
        end=float("inf"),
        bytes=float("nan"),
        flops=1e300,
        group="pp0",
        peer=4,
    )
    bind = {"bind_id": 9, "flow_in": True}
    expected = _ENCODER.encode({**_complete_event(odd, 2), **bind})
    assert _encode_complete(odd, 2, bind) == expected


def test_tags_equal_in_python_but_not_in_json_are_encoded_apart():
    from dataclasses import replace

    from simulator.analysis.trace import OpRecord
    from simulator.report.chrome_trace import (
        _ENCODER,
        _complete_event,
        _encode_complete,
        _TextCache,
    )

    base = OpRecord(0, 1, "compute", "compute", "gemm", "x", {}, 0.0, 0.0, 1e-3)
    cache = _TextCache()
    for value in (1, 1.0, True):
        rec = replace(base, tags={"layer": value})
        assert _encode_complete(rec, 1, None, cache) == _ENCODER.encode(_complete_event(rec, 1))


def test_ops_of_one_shape_share_their_fixed_text_and_still_encode_as_json_does():
    """One writer's cache keeps the text around each shape of op (rank, thread, op,
    kind, bytes, FLOPs, group, peer) and each tags dict's category: ops of one shape
    with other labels, ops without a label, and ops of two types sharing one tags dict
    each read as ``json`` writes their dicts."""
    from simulator.analysis.trace import OpRecord
    from simulator.report.chrome_trace import (
        _ENCODER,
        _complete_event,
        _encode_complete,
        _TextCache,
    )

    shared = {"axis": "pp", "phase": "bwd", "microbatch": 3}
    records = [
        OpRecord(0, 1, "compute", "compute", "gemm", "fc1.mb3", shared, 0.0, 0.0, 1e-3, 8.0, 9.0),
        OpRecord(0, 2, "compute", "compute", "gemm", "fc2.mb3", shared, 1e-3, 1e-3, 2e-3, 8.0, 9.0),
        OpRecord(0, 3, "compute", "compute", "gemm", "", shared, 2e-3, 2e-3, 3e-3, 8.0, 9.0),
        OpRecord(0, 4, "pp", "send", "send", 'act"q\u00e9', shared, 3e-3, 4e-3, 5e-3, 64.0, peer=5),
        OpRecord(0, 5, "pp", "send", "send", "", shared, 5e-3, 5e-3, 6e-3, 64.0, peer=5),
        OpRecord(
            0, 6, "tp", "collective", "all_reduce", "", {}, 6e-3, 6e-3, 7e-3, 32.0, group="tp0"
        ),
        OpRecord(
            0, 7, "tp", "collective", "all_reduce", "ar", {}, 7e-3, 7e-3, 8e-3, 32.0, group="tp0"
        ),
        OpRecord(
            2, 7, "tp", "collective", "all_reduce", "ar", {}, 7e-3, 7e-3, 8e-3, 32.0, group="tp0"
        ),
    ]
    cache = _TextCache()
    for tid in (1, 2):
        for rec in records:
            expected = _ENCODER.encode(_complete_event(rec, tid))
            assert _encode_complete(rec, tid, None, cache) == expected
    assert len(cache.ops) == 2 * 4  # two threads; gemm, send, rank 0's and 2's all-reduce


def test_the_written_file_is_the_event_dicts_and_arrows_encode_as_json_does(tmp_path):
    """The writer's direct encoding of the send/recv arrows reads exactly as ``json``
    would write their dicts, and the whole file holds the dict form's document."""
    from simulator.report.chrome_trace import (
        _ENCODER,
        _flow_events,
        _flow_texts,
        _Plan,
        chrome_trace_events,
    )

    trace = make_trace(run_scenario(load_scenario(SCENARIO, OVERRIDES)))
    plan = _Plan(trace, None)
    assert plan.arrows  # the pipeline's sends and receives
    assert list(_flow_texts(plan.arrows)) == [_ENCODER.encode(e) for e in _flow_events(plan.arrows)]
    path = tmp_path / "trace.json"
    assert write_chrome_trace(trace, path) is False  # small: written plain
    assert json.loads(path.read_text()) == json.loads(_ENCODER.encode(chrome_trace_events(trace)))


def test_rounded_text_is_repr_of_round_to_the_nanosecond():
    """The writer's fast ``"%.3f"`` path names every number exactly as
    ``repr(round(x, 3))`` (and JSON's names for the rest) would."""
    import random

    from simulator.report.chrome_trace import _number, _rounded_text

    rng = random.Random(7)
    values = [rng.uniform(-1e9, 1e9) for _ in range(20_000)]
    values += [rng.uniform(0, 1e3) for _ in range(20_000)]
    values += [k / 2000 for k in range(-4000, 4000)]  # exact halves of the last place
    values += [rng.randint(0, 10**9) / 1000 + d for d in (5e-4, -5e-4, 1e-12) for _ in range(3000)]
    values += [0.0, -0.0, -1e-5, 1e-5, 5e-4, 1.5e-3, 1e12, -1e12, 1e17, 2.5e-300]
    values += [float("nan"), float("inf"), float("-inf")]
    assert [_rounded_text(v) for v in values] == [_number(round(v, 3)) for v in values]


def test_a_duration_the_encoder_cannot_name_is_zero_as_json_writes_it():
    from simulator.analysis.trace import OpRecord
    from simulator.report.chrome_trace import _ENCODER, _complete_event, _encode_complete

    for start, end in ((1e-3, float("nan")), (1e-3, 1e-3 - 1e-13), (1e-3, float("-inf"))):
        rec = OpRecord(0, 1, "compute", "compute", "gemm", "x", {}, 0.0, start, end)
        assert _encode_complete(rec, 1, None) == _ENCODER.encode(_complete_event(rec, 1))


def test_sends_and_receives_pair_by_ranks_micro_batch_and_phase_as_their_reprs_read():
    """A send and a receive pair when their ranks, micro-batch and phase match, the tags
    read as their ``repr``s (1, 1.0 and True are three micro-batches); arrows come in
    key order, micro-batches by ``repr`` (10 before 2), and ends left without a match
    are counted."""
    from simulator.analysis.trace import OpRecord
    from simulator.report.chrome_trace import _flow_arrows

    def p2p(rank, op, peer, microbatch, start):
        tags = {"axis": "pp", "microbatch": microbatch, "phase": "fwd"}
        return OpRecord(
            rank, 0, "pp", op, op, f"{op}{microbatch}", tags, start, start, start + 1e-3, peer=peer
        )

    records = [
        p2p(0, "send", 1, 2, 0.0),
        p2p(0, "send", 1, 10, 1e-3),
        p2p(0, "send", 1, 1, 2e-3),
        p2p(1, "recv", 0, 10, 3e-3),
        p2p(1, "recv", 0, 2, 4e-3),
        p2p(1, "recv", 0, 1.0, 5e-3),
    ]
    arrows, unmatched = _flow_arrows(records, {"pp": 2})
    assert unmatched == 2  # micro-batch 1 sent, 1.0 received: no pair
    assert [(arrow[3], arrow[6]) for arrow in arrows] == [(1500.0, 3500.0), (500.0, 4500.0)]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_the_hta_folder_has_the_permissions_the_umask_gives(tmp_path: Path, umask: int, capsys):
    """``hta/`` is made like every other output folder, ``0777 & ~umask``, and its
    files ``0666 & ~umask`` (not the 0700 of a private temporary folder)."""
    import os

    from simulator.cli.main import main

    out = tmp_path / "run"
    previous = os.umask(umask)
    try:
        scenario = str(Path(__file__).parent.parent / "scenarios" / "cpu-tiny.yaml")
        assert main(["run", scenario, "--outputs", "result", "--hta", "--out", str(out)]) == 0
    finally:
        os.umask(previous)
    capsys.readouterr()
    assert (out / "hta").stat().st_mode & 0o777 == 0o777 & ~umask
    files = sorted((out / "hta").iterdir())
    assert files and all(f.stat().st_mode & 0o777 == 0o666 & ~umask for f in files)


def test_the_quick_reading_of_an_event_and_the_checked_one_agree(trace: Trace):
    """Reading a trace back takes each event by the quick path, and the field-by-field
    one only to say what is wrong: both give the same record."""
    from simulator.report.chrome_trace import _plain_record, _record, _thread_names

    events = chrome_trace_events(trace)["traceEvents"]
    names = _thread_names(events)
    ops = [event for event in events if event["ph"] == "X"]
    assert ops
    for event in ops:
        quick = _plain_record(event, names)
        assert quick is not None and quick == _record(event, "trace", names)
    odd = dict(ops[0], ts="1")
    assert _plain_record(odd, names) is None
    with pytest.raises(TraceFileError, match="^trace: ts is '1', not a number$"):
        _record(odd, "trace", names)
