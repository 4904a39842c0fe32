"""``parasim compare A B``: what it reads, what it says about each side, and the one
line it ends with when a folder is not what ``parasim run`` or ``parasim replay``
writes.

The folders are a tiny step simulated twice (the second with full recompute, a
what-if) and a measurement made of the first as ``parasim replay`` writes one
(``result.json`` with a ``measured`` section), built once per module by
:func:`benchmarks.fuzz_compare.make_bases`; every test spoils copies of them.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import fuzz_compare
from simulator.analysis.trust import difference_within
from simulator.cli.main import main
from simulator.report import chrome_trace
from simulator.report.chrome_trace import TraceFileError, read_trace_file, trace_from_chrome

from .helpers import MARKUP


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> fuzz_compare.Bases:
    return fuzz_compare.make_bases(tmp_path_factory.mktemp("bases"))


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that no line the tests look for is wrapped."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def runs(bases: fuzz_compare.Bases, tmp_path: Path) -> dict[str, Path]:
    """Fresh copies of the two predictions and the measurement."""
    copies = {}
    for name in ("a", "b", "measured"):
        copies[name] = tmp_path / name
        shutil.copytree(getattr(bases, name), copies[name])
    return copies


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in compare's JSON")

    return json.loads(text, parse_constant=refuse)


def _compare(capsys: pytest.CaptureFixture, *argv: Any) -> tuple[int, str, str]:
    code = main(["compare", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _result(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "result.json").read_text())


# ------------------------------------------------------------------------ two sides


def test_two_predictions_are_a_and_b_with_their_overrides_and_memory(runs, capsys, tmp_path):
    a, b, out = runs["a"], runs["b"], tmp_path / "ab"
    code, printed, _ = _compare(capsys, a, b, "--out", out)
    assert code == 0
    report = _strict((out / "compare.json").read_text())
    assert report["mode"] == "what-if" and report["labels"] == ["A", "B"]
    assert set(report["step_time"]) == {"a_s", "b_s", "a_against_b", "within_interval"}
    assert all(set(row) == {"class", "a_s", "b_s", "a_against_b"} for row in report["op_classes"])
    assert all(set(row) == {"category", "a_s", "b_s"} for row in report["breakdown_mean"])
    text = json.dumps(report)
    assert "predicted" not in text and "measured" not in text and '"error"' not in text
    ra, rb = _result(a), _result(b)
    assert report["runs"]["a"]["overrides"] == ra["overrides"]
    assert report["runs"]["b"]["overrides"] == rb["overrides"]
    assert "training.recompute=full" in rb["overrides"]
    assert report["runs"]["a"]["folder"] == str(a) and report["runs"]["b"]["kind"] == "prediction"
    memory = report["peak_memory_per_gpu"]
    peak_a, peak_b = ra["memory"]["peak_bytes_per_gpu"], rb["memory"]["peak_bytes_per_gpu"]
    assert (memory["a_bytes"], memory["b_bytes"]) == (peak_a, peak_b) and peak_a > peak_b
    assert memory["a_against_b"] == pytest.approx(peak_a / peak_b - 1)
    step = report["step_time"]
    assert step["a_against_b"] == pytest.approx(step["a_s"] / step["b_s"] - 1)
    # whether the difference is inside the two predictions' trust intervals
    inside = difference_within(ra["step_time_s"], ra["interval"], rb["step_time_s"], rb["interval"])
    assert isinstance(step["within_interval"], bool) and step["within_interval"] == inside
    assert ("inside the predictions' trust intervals" in printed) == inside
    # the console names each side by its folder and overrides, and has the memory row
    assert "a what-if: A against B" in printed and "--set training.recompute=full" in printed
    assert "peak memory per GPU" in printed and "measured" not in printed
    page = (out / "compare.html").read_text()
    assert "A (upper lanes) over B" in page and "r0 A compute" in page
    runs_table = page[page.index("<table id='parasim-compare-runs'>") :]
    assert "--set training.recompute=full" in runs_table.split("</table>")[0]
    assert "<td>peak memory per GPU</td>" in page


@pytest.mark.parametrize("order", ["predicted first", "measured first"])
def test_a_prediction_and_a_measurement_in_either_order(runs, capsys, tmp_path, order):
    a, measured, out = runs["a"], runs["measured"], tmp_path / "out"
    first, second = (a, measured) if order == "predicted first" else (measured, a)
    code, printed, _ = _compare(capsys, first, second, "--out", out)
    assert code == 0
    report = _strict((out / "compare.json").read_text())
    assert report["mode"] == "measured" and report["labels"] == ["predicted", "measured"]
    assert set(report["step_time"]) == {"predicted_s", "measured_s", "error"}
    assert report["runs"]["predicted"]["folder"] == str(a)
    assert report["runs"]["measured"]["folder"] == str(measured)
    assert report["runs"]["measured"]["kind"] == "measurement"
    # a replay does not measure memory: the measured side has none
    memory = report["peak_memory_per_gpu"]
    assert memory["predicted_bytes"] == _result(a)["memory"]["peak_bytes_per_gpu"]
    assert memory["measured_bytes"] is None and memory["error"] is None
    assert "not measured" in printed and "A against B" not in printed
    page = (out / "compare.html").read_text()
    assert "predicted (upper lanes) over measured" in page
    assert "r0 predicted compute" in page and "r0 measured compute" in page


def test_a_gzipped_trace_and_a_bare_array_of_events_are_read(runs, capsys, tmp_path):
    a, b = runs["a"], runs["b"]
    assert _compare(capsys, a, b, "--out", tmp_path / "plain")[0] == 0
    plain = _strict((tmp_path / "plain" / "compare.json").read_text())
    # b's trace as a large run writes it, a's as the bare array of its events
    (b / "trace.json.gz").write_bytes(gzip.compress((b / "trace.json").read_bytes()))
    (b / "trace.json").unlink()
    events = json.loads((a / "trace.json").read_text())["traceEvents"]
    (a / "trace.json").write_text(json.dumps(events))
    assert _compare(capsys, a, b, "--out", tmp_path / "odd")[0] == 0
    odd = _strict((tmp_path / "odd" / "compare.json").read_text())
    assert odd["op_classes"] == plain["op_classes"]
    assert odd["step_time"] == plain["step_time"]


def test_a_difference_against_nothing_is_null_not_nan(runs, capsys, tmp_path):
    a, b = runs["a"], runs["b"]
    result = _result(b)
    result["step_time_s"] = 0.0
    (b / "result.json").write_text(json.dumps(result))
    code, printed, _ = _compare(capsys, a, b, "--json", "--out", tmp_path / "out")
    assert code == 0
    report = _strict(printed)
    assert report["step_time"]["b_s"] == 0.0 and report["step_time"]["a_against_b"] is None
    assert report == _strict((tmp_path / "out" / "compare.json").read_text())


def test_the_same_folder_twice_is_refused(runs, capsys, tmp_path):
    a = runs["a"]
    (tmp_path / "again").symlink_to(a)
    for other in (a, tmp_path / "again", Path(str(a) + "/")):
        code, _, err = _compare(capsys, a, other)
        assert code == 2 and err.startswith("parasim: error: A and B are the same folder")
        assert err.count("\n") == 1


# ---------------------------------------------------------------- what is refused


def _edit_json(name: str, edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    def spoil(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))

    return spoil


def _first_op(edit: Callable[[dict], None]) -> Callable[[Any], Any]:
    def change(document: Any) -> Any:
        edit(next(e for e in document["traceEvents"] if e.get("ph") == "X"))
        return document

    return change


def _text(name: str, text: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(text)


def _replace(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def spoil(folder: Path) -> None:
        (folder / name).unlink()
        make(folder / name)

    return spoil


def _nan_step(folder: Path) -> None:
    text = (folder / "result.json").read_text()
    at = text.index('"step_time_s": ') + len('"step_time_s": ')
    (folder / "result.json").write_text(text[:at] + "NaN" + text[text.index(",", at) :])


SPOILED: dict[str, tuple[Callable[[Path], None], str]] = {
    "a NaN step time": (_nan_step, "result.json: not JSON parasim reads (NaN"),
    "a NaN op start": (
        _text("trace.json", b'[{"ph": "X", "pid": 0, "ts": NaN}]'),
        "trace.json: not JSON parasim reads (NaN",
    ),
    "a null args": (
        _edit_json("trace.json", _first_op(lambda e: e.update(args=None))),
        "event 6: args is null, not an object",
    ),
    "a string ts": (
        _edit_json("trace.json", _first_op(lambda e: e.update(ts="10"))),
        "ts is '10', not a number",
    ),
    "no args.op": (
        _edit_json("trace.json", _first_op(lambda e: e["args"].pop("op"))),
        "args.op is null, not a string",
    ),
    "a negative duration": (
        _edit_json("trace.json", _first_op(lambda e: e.update(dur=-1))),
        "dur is -1, not a time between 0 and",
    ),
    "a huge ts": (
        _edit_json("trace.json", _first_op(lambda e: e.update(ts=10**400))),
        "ts is 1000000000000000000000000000000000000..., not a time",
    ),
    "a phase that is a number": (
        _edit_json("trace.json", _first_op(lambda e: e["args"]["tags"].update(phase=3))),
        "args.tags.phase is 3, not a string",
    ),
    "a string rank": (
        _edit_json("trace.json", _first_op(lambda e: e.update(pid="0"))),
        "pid (the rank) is '0', not an integer",
    ),
    "events that are not objects": (
        _text("trace.json", b"[1, 2]"),
        "trace.json: event 0 is 1, not an object",
    ),
    "no op event": (
        _edit_json("trace.json", lambda d: [e for e in d["traceEvents"] if e["ph"] != "X"]),
        "trace.json: no op events",
    ),
    "an empty trace": (_text("trace.json", b""), "trace.json: not JSON (line 1"),
    "a trace that is null": (_text("trace.json", b"null"), "trace.json: null; a Chrome trace"),
    "a trace nested deep": (
        _text("trace.json", b"[" * 200_000 + b"]" * 200_000),
        "trace.json: JSON nested deeper than parasim reads",
    ),
    "invalid UTF-8": (_text("trace.json", b"\xff\xfe{}"), "trace.json: not UTF-8 text"),
    "a corrupt gzip": (
        _replace("trace.json", lambda p: p.with_name("trace.json.gz").write_bytes(b"\x1f\x8bxx")),
        "trace.json.gz: not a readable gzip file",
    ),
    "a trace that is a folder": (_replace("trace.json", Path.mkdir), "trace.json: not a file"),
    "a trace that is a named pipe": (_replace("trace.json", os.mkfifo), "trace.json: not a file"),
    "a trace that is a device": (
        _replace("trace.json", lambda p: p.symlink_to("/dev/zero")),
        "trace.json: not a file",
    ),
    "no trace": (
        lambda folder: (folder / "trace.json").unlink(),
        "no trace.json or trace.json.gz (not a folder parasim run",
    ),
    "a result that is a list": (_text("result.json", b"[]"), "result.json: an array, not a"),
    "an oom that is a string": (
        _edit_json("result.json", lambda d: d["memory"].update(oom="no") or d),
        "result.json: memory.oom is not true or false",
    ),
    "a step time that is a string": (
        _edit_json("result.json", lambda d: d.update(step_time_s="1 s") or d),
        "result.json: step_time_s is '1 s', not a finite number",
    ),
    "no breakdown": (
        _edit_json("result.json", lambda d: d.pop("breakdown") and d),
        "result.json: no field breakdown.mean.compute",
    ),
    "an odd layout": (
        _edit_json("result.json", lambda d: d.update(layout=[1]) or d),
        "result.json: not in the form of parasim's result.json",
    ),
    "a file, not a folder": (
        lambda folder: shutil.rmtree(folder) or folder.write_text("x"),
        "is not a folder; compare takes the folders",
    ),
}


@pytest.mark.parametrize("what", list(SPOILED))
def test_a_folder_parasim_did_not_write_ends_in_one_line(runs, capsys, tmp_path, what):
    spoil, message = SPOILED[what]
    b, out = runs["b"], tmp_path / "out"
    spoil(b)
    code, printed, err = _compare(capsys, runs["a"], b, "--out", out)
    assert code == 2 and printed == ""
    assert err.startswith("parasim: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (out / "compare.json").exists()


def test_a_trace_larger_than_the_limit_is_refused_before_it_is_read(
    runs, capsys, tmp_path, monkeypatch
):
    b = runs["b"]
    with open(b / "trace.json", "r+b") as handle:  # a sparse file of a terabyte
        handle.truncate(10**12)
    code, _, err = _compare(capsys, runs["a"], b, "--out", tmp_path / "out")
    assert code == 2 and "1,000,000,000,000 bytes; parasim reads at most" in err
    # a small gzip file that would decompress past the limit stops at it
    (b / "trace.json").unlink()
    (b / "trace.json.gz").write_bytes(gzip.compress(b" " * 5_000_000))
    monkeypatch.setattr(chrome_trace, "largest_trace_text", lambda: 1_000_000)
    code, _, err = _compare(capsys, runs["a"], b, "--out", tmp_path / "out")
    assert code == 2 and "trace.json.gz: more than 1,000,000 bytes" in err


def test_the_limit_is_what_two_traces_take_in_half_the_memory(monkeypatch):
    monkeypatch.setattr(chrome_trace, "machine_memory", lambda: 24e9)
    assert chrome_trace.largest_trace_text() == 24e9 / 2 / (2 * 6)
    monkeypatch.setattr(chrome_trace, "machine_memory", lambda: None)
    assert chrome_trace.largest_trace_text() == chrome_trace.TRACE_TEXT_FALLBACK


def test_reading_a_trace_back_keeps_only_the_metadata_it_can_use(runs):
    document = json.loads((runs["a"] / "trace.json").read_text())
    written = read_trace_file(runs["a"] / "trace.json")
    assert written.meta["idle"] and written.meta["gpus_per_node"] == 2
    document["otherData"].update(idle="x", gpus_per_node=-1, stage_of_rank=[], step_time_s="1")
    odd = trace_from_chrome(document, "odd")
    assert {"idle", "gpus_per_node", "stage_of_rank"}.isdisjoint(odd.meta)
    assert odd.step_time == max(r.end for r in odd.records)
    assert odd.records == written.records
    with pytest.raises(TraceFileError, match="^odd: an object without a traceEvents list"):
        trace_from_chrome({"events": []}, "odd")


# ------------------------------------------------------------------ the fuzz itself


@pytest.mark.slow
def test_odd_command_lines_end_in_a_comparison_or_one_line(bases):
    """Forty cases of :mod:`benchmarks.fuzz_compare` at a fixed seed (``python -m
    benchmarks.fuzz_compare --cases 3000`` is the long run)."""
    import random

    rng = random.Random(11)
    outcomes = []
    for _ in range(40):
        case = fuzz_compare.random_case(rng)
        outcome, detail = fuzz_compare.run_case(case, bases)
        assert outcome in ("result", "error"), f"{case.describe()}: {outcome}: {detail}"
        outcomes.append(outcome)
    assert "result" in outcomes and "error" in outcomes


def test_folders_that_look_like_markup_print_as_written(runs, capsys, tmp_path):
    folder = tmp_path / MARKUP
    folder.mkdir(parents=True)
    a, b, out = runs["a"].rename(folder / "a"), runs["b"].rename(folder / "b"), folder / "out"
    code, printed, _ = _compare(capsys, a, b, "--out", out)
    assert code == 0
    assert f"  A  {a}  " in printed and f"  B  {b}  " in printed
    assert f"{out / 'compare.json'}, {out / 'compare.html'}" in printed
