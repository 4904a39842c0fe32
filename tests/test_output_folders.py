"""Output folders: safe default names, checked before the work, filled whole, and never
a mix of two runs' files however a run is interrupted."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.cli.main import main
from simulator.common.folders import MARKER, default_folder, safe_component, staged_folder

from .conftest import ROOT, SCENARIOS

SMALL = str(SCENARIOS / "small.yaml")


@pytest.mark.parametrize(
    "name, folder",
    [
        ("../../x", "x"),
        ("/etc/passwd", "etc-passwd"),
        ("..", "scenario"),
        ("gpt3 175b (128 GPUs)", "gpt3-175b-128-GPUs"),
        ("llama3-8b-128k-cp", "llama3-8b-128k-cp"),
    ],
)
def test_the_default_folder_is_one_safe_name_under_out(name, folder):
    assert safe_component(name) == folder
    assert default_folder(name) == Path("out") / folder


def test_overrides_get_their_own_folder_and_are_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", SMALL, "--set", "name=../../escape"]) == 0
    assert main(["run", SMALL, "--set", "name=../../escape", "--set", "parallel.sp=true"]) == 0
    folders = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(folders) == 2 and all(f.startswith("escape-") for f in folders)
    assert not (tmp_path.parent / "escape").exists()
    recorded = [
        json.loads((tmp_path / "out" / f / "result.json").read_text())["overrides"] for f in folders
    ]
    assert sorted(map(len, recorded)) == [1, 2]
    assert default_folder("small") != default_folder("small", overrides=["parallel.sp=true"])


def test_an_out_that_cannot_be_written_is_refused_before_simulating(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "sub"):
        assert main(["run", SMALL, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("parasim: error: --out: ") and err.count("\n") == 1
        assert "is a file" in err
    assert blocker.read_text() == "not a folder"


def test_a_folder_with_other_files_keeps_them(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["run", SMALL, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    manifest = json.loads((tmp_path / MARKER).read_text())
    assert "notes.txt" not in manifest["files"]["parasim run"]
    assert "result.json" in manifest["files"]["parasim run"]


def test_a_failed_block_leaves_the_folder_and_no_staging(tmp_path):
    out = tmp_path / "run"
    with staged_folder(out) as stage:
        (stage / "result.json").write_text("first")
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "result.json").write_text("second")
        raise RuntimeError
    assert (out / "result.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "result.json"]


def test_a_failed_block_in_a_new_folder_leaves_no_folder(tmp_path):
    with pytest.raises(RuntimeError), staged_folder(tmp_path / "a" / "b") as stage:
        (stage / "result.json").write_text("half")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writer_s_staging_is_cleared_by_the_next(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    leftover = out / f".parasim-stage-{int(dead.stdout)}-abc"
    leftover.mkdir()
    (leftover / ".parasim-stage").write_text("parasim run\n")
    (leftover / "result.json").write_text("half")
    # a folder of the user's that only looks like one is left alone
    lookalike = out / f".parasim-stage-{int(dead.stdout)}-mine"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    with staged_folder(out) as stage:
        (stage / "result.json").write_text("whole")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, lookalike.name, "result.json"]
    assert (out / "result.json").read_text() == "whole"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != MARKER}


def _committing(folder: Path) -> bool:
    """Whether a killed command was moving its files in (the manifest says so)."""
    return "committing" in json.loads((folder / MARKER).read_text())


@pytest.mark.slow
def test_an_interrupted_run_never_mixes_two_runs_files(tmp_path):
    """SIGINT or SIGKILL at random moments while the second run writes: the folder holds
    either every file of the first run or every file of the second (or, after a SIGKILL
    inside the milliseconds of the final moves, a manifest that says a commit was under
    way and lists every file as parasim's)."""
    first, second = tmp_path / "first", tmp_path / "second"
    sets = ["--set", "model.layers=24"]
    assert main(["run", SMALL, "--out", str(first)]) == 0
    assert main(["run", SMALL, *sets, "--out", str(second)]) == 0
    old, new = _files(first), _files(second)
    assert old.keys() == new.keys() and old != new
    command = [sys.executable, "-m", "simulator.cli.main", "run", SMALL, *sets]
    started = time.perf_counter()
    subprocess.run(
        [*command, "--out", str(tmp_path / "timing")], cwd=ROOT, check=True, capture_output=True
    )
    duration = time.perf_counter() - started
    rng = random.Random(7)
    outcomes = []
    for trial in range(8):
        out = tmp_path / f"trial{trial}"
        shutil.copytree(first, out)
        proc = subprocess.Popen(
            [*command, "--out", str(out)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(rng.uniform(0.3, 1.0) * duration)
        sig = signal.SIGKILL if trial % 2 else signal.SIGINT
        proc.send_signal(sig)
        proc.wait(timeout=60)
        now = {name: data for name, data in _files(out).items() if not name.startswith(".")}
        if sig == signal.SIGKILL and _committing(out):
            assert all(now[name] in (old[name], new[name]) for name in now)
            continue
        assert now in (old, new), f"trial {trial}: a mix of two runs"
        outcomes.append(now == new)
        if sig == signal.SIGINT and proc.returncode == 130:  # not still importing
            assert proc.stderr.read().decode().strip().splitlines()[-1] == "parasim: interrupted"
        if sig == signal.SIGINT:
            hidden = [p.name for p in out.iterdir() if p.name.startswith(".parasim-stage")]
            assert hidden == [], "Ctrl-C leaves no staging folder"
    assert not all(outcomes), "some trial must have been interrupted before the files moved"


# what the console script runs, after a line that says Python and the console script's
# own module are up (a SIGINT before that interrupts the interpreter's start-up or the
# few milliseconds of importing ``simulator.cli.entry``, which no program can catch)
ENTRY = (
    "import sys; from simulator.cli.entry import main; "
    "sys.stderr.write('up\\n'); sys.stderr.flush(); sys.exit(main())"
)


def test_ctrl_c_while_the_command_starts_is_one_line_never_a_traceback(tmp_path):
    """SIGINT at moments across the first 0.3 s of the ``parasim`` script, while it
    imports its modules (a small run's whole command takes about half a second more):
    one line and exit status 130, never a traceback or a folder."""
    rng = random.Random(3)
    interrupted = 0
    for trial in range(8):
        delay = trial * 0.04 + rng.uniform(0, 0.02)
        out = tmp_path / f"run{trial}"
        proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY, "run", str(SCENARIOS / "small.yaml")]
            + ["--out", str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stderr.readline() == b"up\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        text = err.decode()
        assert "Traceback" not in text, f"SIGINT after {delay:.2f} s: {text}"
        if proc.returncode == 0:  # finished first: nothing to interrupt
            continue
        assert text.strip().splitlines() == ["parasim: interrupted"], text
        assert proc.returncode == 130
        assert not out.exists()  # an interrupted start leaves no folder
        interrupted += 1
    assert interrupted >= 4  # most fall inside the start-up


# a command whose Ctrl-C lands where Python cannot raise it, as a SIGINT inside the
# import system's weak-reference callbacks does: it is swallowed, then the command
# would run on for a minute if nothing passed the interruption on
SWALLOWED = """
import sys, time
import simulator.cli.main
from simulator.cli import entry

class Finaliser:
    def __del__(self):
        raise KeyboardInterrupt

def command():
    Finaliser()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pass
    return 0

simulator.cli.main.main = command
sys.exit(entry.main())
"""


# a command whose Ctrl-C is caught inside an extension and raised again as its own error,
# as pydantic-core does when the interruption lands while it builds a serializer
REWRAPPED = """
import os, signal, sys
import simulator.cli.main
from simulator.cli import entry

class SchemaError(Exception):
    pass

def command():
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        raise SchemaError("Error building `model` serializer") from None
    return 0

simulator.cli.main.main = command
sys.exit(entry.main())
"""


@pytest.mark.parametrize("probe", [SWALLOWED, REWRAPPED], ids=["swallowed", "raised-again"])
def test_a_ctrl_c_python_could_not_raise_still_ends_the_command_in_one_line(probe):
    """Swallowed where Python cannot raise it, or caught and raised again as another
    error: either way one line and exit status 130."""
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.stderr.strip().splitlines() == ["parasim: interrupted"], done.stderr
    assert done.returncode == 130


def test_the_console_script_leaves_its_objects_to_the_system_and_its_files_whole(tmp_path):
    """After a command the console script freezes what is left out of the collector
    (the interpreter's last collection would walk it all at exit) and ends the process
    without tearing the interpreter down, its exit handlers run: the files are whole,
    the summary printed, the exit status the command's."""
    probe = (
        "import atexit, gc, sys; from simulator.cli.entry import main; "
        "atexit.register(lambda: sys.stderr.write(f'frozen {gc.get_freeze_count() > 0}\\n')); "
        "main(); sys.stderr.write('torn down\\n')"
    )
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", str(SCENARIOS / "small.yaml"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "frozen True"  # and never "torn down"
    assert "result.json" in done.stdout  # the summary lists the files written
    assert json.loads((out / "result.json").read_text())["step_time_s"] > 0
    bad = subprocess.run(
        [sys.executable, "-c", probe, "run", str(tmp_path / "missing.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# a command that leaves a thread of its own still writing when it returns
LEFT_RUNNING = """
import sys, threading, time
from pathlib import Path
import simulator.cli.main
from simulator.cli import entry

def command():
    def write():
        time.sleep(0.3)
        Path(sys.argv[1]).write_text("done")
    threading.Thread(target=write).start()
    return 0

simulator.cli.main.main = command
sys.exit(entry.main())
"""


def test_the_console_script_waits_for_a_thread_still_running(tmp_path):
    """Ending the process at once is for a command that left nothing running: a thread
    still at work is waited for, as Python's own exit does."""
    target = tmp_path / "written"
    done = subprocess.run(
        [sys.executable, "-c", LEFT_RUNNING, str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "done"


def test_a_summary_cut_short_by_its_reader_ends_quietly(tmp_path):
    """``parasim run ... | head -1``: the pipe closes under the summary, and the command
    ends with its own status and no "Exception ignored" from the last flush."""
    command = [sys.executable, "-m", "simulator.cli.entry", "run", str(SCENARIOS / "small.yaml")]
    command += ["--outputs", "result", "--out", str(tmp_path / "out")]
    reader = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert reader.stdout is not None
    reader.stdout.readline()
    reader.stdout.close()
    stderr = reader.stderr.read() if reader.stderr is not None else ""
    assert reader.wait(timeout=120) in (0, 1), stderr
    assert "Exception ignored" not in stderr and "Traceback" not in stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_summary_to_a_full_disk_is_one_line_never_a_traceback(tmp_path):
    """stdout on a full disk: the files are written, the summary cannot be, and the
    command says so in one line with exit status 1."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "simulator.cli.entry", "run", str(SCENARIOS / "small.yaml")]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*command, "--outputs", "result", "--out", str(out)],
            cwd=ROOT,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["parasim: error: No space left on device"]
    assert json.loads((out / "result.json").read_text())["step_time_s"] > 0


def test_two_commands_finishing_at_once_keep_each_other_s_files(tmp_path):
    """Commits into one folder take turns: the manifest lists both commands' files."""
    import threading

    out = tmp_path / "shared"
    out.mkdir()
    barrier = threading.Barrier(8)

    def command(i: int) -> None:
        with staged_folder(out, f"command {i}") as stage:
            (stage / f"file{i}.json").write_text(str(i))
            barrier.wait()

    threads = [threading.Thread(target=command, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manifest = json.loads((out / MARKER).read_text())
    assert sorted(manifest["files"]) == [f"command {i}" for i in range(8)]
    assert sorted(p.name for p in out.iterdir()) == [MARKER] + [f"file{i}.json" for i in range(8)]
