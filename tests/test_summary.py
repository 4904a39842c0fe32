"""parasim run's summary: rich tables on a terminal, plain lines on a pipe, the same
facts in both, and every text in it shown as written."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from rich.console import Console

from simulator.cli.main import main
from simulator.report.console import is_terminal
from simulator.report.summary import draw_summary, summarise, write_summary
from simulator.request.scenario import load_scenario
from simulator.run.simulate import run_scenario
from topologies.units import format_time

from .conftest import ROOT, SCENARIOS

BOX = "│┌┏━─"


@pytest.fixture
def piped(monkeypatch):
    """stdout as a pipe is, whatever the environment running the tests says."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)


def _facts(text: str) -> dict[str, str]:
    """The plain summary's ``  name  value`` lines, up to the breakdown."""
    facts = {}
    head = text.split("where the step time goes")[0].splitlines()
    title = next(i for i, line in enumerate(head) if line.startswith("parasim · "))
    for line in head[title + 1 :]:
        name, value = line.strip().split("  ", 1)
        facts[name] = value.strip()
    return facts


def test_a_piped_summary_is_plain_lines_that_never_wrap(piped, capsys, tmp_path):
    out = tmp_path / "out"
    assert (
        main(["run", str(SCENARIOS / "gpt3-175b.yaml"), "--outputs", "result", "--out", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    assert not any(char in text for char in BOX)
    lines = text.splitlines()
    assert lines[0] == "parasim · gpt3-175b" and lines[-1] == f"wrote {out / 'result.json'}"
    facts = _facts(text)
    assert list(facts)[:4] == ["cluster", "model", "layout", "step time"]
    result = json.loads((out / "result.json").read_text())
    assert facts["step time"].startswith(format_time(result["step_time_s"]) + " (80%: ")
    # the longest fact is one line, as long as it is (a terminal-less rich table wraps at 80)
    assert len(f"  trusted as  {facts['trusted as']}") > 80
    assert facts["memory"].endswith("— fits")
    breakdown = lines[lines.index("where the step time goes") + 1 :]
    assert breakdown[0].split() == ["category", "critical", "rank", "0", "mean", "over", "ranks"]
    rows = {row.split()[0]: row for row in breakdown[1:6]}
    assert set(rows) == set(result["breakdown"]["critical"])
    # right-aligned columns: every row of the breakdown ends where its header does
    assert {len(row) for row in breakdown[:6]} == {len(breakdown[0])}


def test_a_terminal_gets_the_same_facts_in_rich_tables(piped):
    result = run_scenario(load_scenario(SCENARIOS / "dp-only-oom.yaml")).result
    summary = summarise(result, ["out/result.json"])
    plain = _stream_text(summary)
    console = Console(width=400, record=True, force_terminal=True, color_system="standard")
    draw_summary(summary, console)
    drawn = console.export_text(clear=False)
    assert any(char in drawn for char in BOX)
    for name, value in _facts(plain).items():
        assert any(name in line and value in line for line in drawn.splitlines()), name
    assert plain.startswith("OUT OF MEMORY: the step does not fit") and drawn.startswith(
        "OUT OF MEMORY: the step does not fit"
    )
    assert "\x1b[1;31mOUT OF MEMORY\x1b[0m" in console.export_text(styles=True)


def _stream_text(summary) -> str:
    stream = io.StringIO()
    write_summary(summary, stream)
    return stream.getvalue()


@pytest.mark.parametrize("terminal", [False, True])
def test_names_and_paths_print_as_written(terminal, monkeypatch, capsys, tmp_path):
    """Square brackets are no markup (``[/]`` closed nothing and ended rich in a
    traceback; ``[red]`` vanished), control characters in a path are quoted."""
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    out = tmp_path / "x[/]y[red]z\x1b[2J" / "out"
    argv = ["run", str(SCENARIOS / "small.yaml"), "--outputs", "result", "--out", str(out)]
    argv += ["--set", 'name="small [bold]:fire:"']
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "parasim · small [bold]:fire:" in text and "\N{FIRE}" not in text
    assert "x[/]y[red]z\\x1b[2J" in text.replace("\n", "")
    assert "\x1b[2J" not in text
    assert ("\x1b[" in text) is terminal  # the terminal's colours, and only there


def test_a_piped_run_never_imports_rich(piped, tmp_path):
    """rich's import and first table are a tenth of a one-configuration run: a summary
    for a pipe is written without it."""
    code = (
        "import sys; from simulator.cli.main import main; "
        "status = main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'), file=sys.stderr); "
        "sys.exit(status)"
    )
    argv = [sys.executable, "-c", code, "run", str(SCENARIOS / "small.yaml"), "--outputs"]
    done = subprocess.run(
        [*argv, "result", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]"
    assert done.stdout.startswith("parasim · small")


@pytest.mark.parametrize(
    "environment,tty,expected",
    [
        ({}, False, False),
        ({}, True, True),
        ({"FORCE_COLOR": "1"}, False, True),
        ({"FORCE_COLOR": ""}, True, False),
        ({"TTY_COMPATIBLE": "1"}, False, True),
        ({"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, True, False),
    ],
)
def test_a_terminal_is_what_rich_takes_for_one(environment, tty, expected, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    class Stream:
        def isatty(self) -> bool:
            return tty

    assert is_terminal(Stream()) is expected
    assert Console(file=Stream()).is_terminal is expected  # rich decides alike
