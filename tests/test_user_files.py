"""Nothing a user owns is ever deleted, replaced or followed into: every command that
writes a folder (``run``, ``sweep``, ``scale``, ``explain``, ``compare``, ``replay``)
leaves every file of the user's in it as it was, refuses (exit 2, one line naming the
folder) where a name it must write is the user's, and replaces only its own files when
run again."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from simulator.cli.main import main
from simulator.common.folders import MARKER

from .conftest import SCENARIOS

SMALL = str(SCENARIOS / "small.yaml")
CPU_TINY = str(SCENARIOS / "cpu-tiny.yaml")

#: Files of every kind a user keeps: plain, hidden, nested, named as parasim's outputs
#: (of other commands than the one run) or as its temporary files.
PLAIN = {
    "photo.png": "a photo",
    "diagram.svg": "<svg/>",
    "notes.txt": "notes",
    ".env.personal": "SECRET=1",
    ".bashrc.20240101": "alias x=y",
    ".thesis.tmp.docx": "chapter 1",
    ".result.json.abcd1234": "looks like a temporary file",
    ".parasim-stage-1-mine/notes.txt": "a folder named like a staging folder",
    "images/precious.jpg": "precious",
    "hta/precious.jpg": "precious",
    "ranks/precious.jpg": "precious",
    "deep/a/b/c.txt": "deep",
}
#: What each command writes (any one of these planted makes it refuse).
WRITES = {
    "run": ["result.json", "report.html", "timeline.html", "trace.json", "plotly.min.js"],
    "sweep": ["sweep.csv", "sweep.json", "sweep.html", "plotly.min.js"],
    "scale": ["scale.csv", "scale.json", "scale.html", "plotly.min.js"],
    "explain": ["explain.json", "explain.html", "plotly.min.js"],
    "compare": ["compare.json", "compare.html", "plotly.min.js"],
    "replay": ["result.json", "trace.json", "plotly.min.js"],
}


def _plant(folder: Path, elsewhere: Path, command: str) -> dict[str, object]:
    """The user's files in ``folder``, and what each must still be afterwards."""
    planted: dict[str, object] = dict(PLAIN)
    own = set(WRITES[command])
    if command in ("run", "replay", "compare"):  # a run's folder: the run's names are its own
        own |= set(WRITES["run"]) | set(WRITES["replay"])
    for names in WRITES.values():  # other commands' names are the user's here
        planted.update({name: f"the user's {name}" for name in names if name not in own})
    for name, content in planted.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(content))
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / "keep.txt").write_text("outside")
    links = {
        "link-to-file": elsewhere / "keep.txt",
        "link-to-folder": elsewhere,
        "dangling": elsewhere / "missing",
        "images/link-out": elsewhere,
    }
    for name, target in links.items():
        (folder / name).symlink_to(target)
        planted[name] = ("symlink", str(target))
    return planted


def _check(folder: Path, elsewhere: Path, planted: dict[str, object]) -> None:
    for name, expected in planted.items():
        path = folder / name
        if isinstance(expected, tuple):
            assert path.is_symlink() and os.readlink(path) == expected[1], name
        else:
            assert not path.is_symlink() and path.read_text() == expected, name
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert (elsewhere / "keep.txt").read_text() == "outside"


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def _argv(command: str, folder: Path, tmp_path: Path) -> list[str]:
    out = ["--out", str(folder)]
    if command == "run":
        return ["run", SMALL, "--fidelity", "analytic", *out]
    if command == "sweep":
        return ["sweep", SMALL, "--fix", "tp=2", "--workers", "1", "--top", "2", "--no-cache", *out]
    if command == "scale":
        return ["scale", SMALL, "--gpus", "8,16", "--workers", "1", *out]
    if command == "explain":
        return ["explain", str(SCENARIOS / "teaching" / "layering-mistake.yaml"), *out]
    if command == "compare":
        first = tmp_path / "first"
        if not first.exists():
            assert _cli(["run", SMALL, "--fidelity", "analytic", "--out", str(first)])[0] == 0
        return ["compare", str(first), str(folder)]
    assert command == "replay"
    return ["replay", CPU_TINY, "--backend", "gloo", "--warmup", "1", "--steps", "1", *out]


def _prepare(command: str, folder: Path) -> None:
    """compare reads a run folder and writes beside it: the folder is a run's."""
    if command == "compare":
        assert (
            _cli(
                [
                    "run",
                    SMALL,
                    "--set",
                    "parallel.sp=true",
                    "--fidelity",
                    "analytic",
                    "--out",
                    str(folder),
                ]
            )[0]
            == 0
        )


COMMANDS = [
    pytest.param("run"),
    pytest.param("sweep", marks=pytest.mark.slow),
    pytest.param("scale", marks=pytest.mark.slow),
    pytest.param("explain", marks=pytest.mark.slow),
    pytest.param("compare", marks=pytest.mark.slow),
    pytest.param("replay", marks=pytest.mark.hardware),
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_file_of_the_user_s_survives_and_a_clash_is_refused(command, tmp_path):
    if command == "replay":
        pytest.importorskip("torch")
    folder, elsewhere = tmp_path / "mine", tmp_path / "elsewhere"
    folder.mkdir()
    _prepare(command, folder)
    planted = _plant(folder, elsewhere, command)
    argv = _argv(command, folder, tmp_path)
    for _ in range(2):  # a second run replaces parasim's own files only
        code, err = _cli(argv)
        assert code in (0, 1), err  # explain exits 1 when it found mistakes
        _check(folder, elsewhere, planted)
    manifest = json.loads((folder / MARKER).read_text())
    listed = {path for files in manifest["files"].values() for path in files}
    assert not listed & set(planted)
    # a name the command must write, planted by the user: refused, nothing touched
    clash = folder / WRITES[command][0]
    clash.unlink()
    clash.write_text("the user's own")
    planted[clash.name] = "the user's own"
    code, err = _cli(argv)
    assert code == 2, err
    assert err.count("\n") == 1 and str(folder) in err and clash.name in err, err
    _check(folder, elsewhere, planted)


def test_a_user_s_folder_under_a_name_parasim_writes_is_never_entered(tmp_path):
    """``hta/`` of the user's (or a symlink named ``hta``) makes ``run --hta`` refuse."""
    folder, elsewhere = tmp_path / "mine", tmp_path / "elsewhere"
    folder.mkdir()
    planted = _plant(folder, elsewhere, "run")
    code, err = _cli(["run", SMALL, "--fidelity", "analytic", "--hta", "--out", str(folder)])
    assert code == 2 and "hta" in err, err
    _check(folder, elsewhere, planted)
    (folder / "hta" / "precious.jpg").unlink()
    (folder / "hta").rmdir()
    (folder / "hta").symlink_to(elsewhere)
    planted["hta"] = ("symlink", str(elsewhere))
    del planted["hta/precious.jpg"]
    code, err = _cli(["run", SMALL, "--fidelity", "analytic", "--hta", "--out", str(folder)])
    assert code == 2 and "symlink" in err, err
    _check(folder, elsewhere, planted)


def test_a_file_parasim_wrote_and_the_user_changed_is_the_user_s(tmp_path):
    folder = tmp_path / "run"
    argv = ["run", SMALL, "--fidelity", "analytic", "--out", str(folder)]
    assert _cli(argv)[0] == 0
    (folder / "report.html").write_text("my annotated report")
    code, err = _cli(argv)
    assert code == 2 and "report.html" in err and "changed" in err, err
    assert (folder / "report.html").read_text() == "my annotated report"


def test_an_earlier_file_of_the_same_command_is_removed_only_while_it_is_parasim_s(tmp_path):
    """A run that no longer writes a file (here the timeline) removes the earlier one,
    but not once the user has changed it."""
    folder = tmp_path / "run"
    full = ["run", SMALL, "--fidelity", "analytic", "--out", str(folder)]
    assert _cli(full)[0] == 0
    assert _cli([*full, "--outputs", "result"])[0] == 0
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "result.json"]
    assert _cli(full)[0] == 0
    (folder / "timeline.html").write_text("kept by the user")
    assert _cli([*full, "--outputs", "result,report"])[0] == 0
    assert (folder / "timeline.html").read_text() == "kept by the user"
    assert (folder / "trace.json").exists() is False


def test_a_folder_of_another_command_keeps_that_command_s_files(tmp_path):
    """compare writes into a run's folder: the run's files stay, both are parasim's."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, sets in ((first, []), (second, ["--set", "parallel.sp=true"])):
        assert _cli(["run", SMALL, "--fidelity", "analytic", *sets, "--out", str(folder)])[0] == 0
    before = {p.name for p in second.iterdir()}
    assert _cli(["compare", str(first), str(second)])[0] == 0
    assert (
        _cli(
            [
                "run",
                SMALL,
                "--fidelity",
                "analytic",
                "--set",
                "parallel.sp=true",
                "--out",
                str(second),
            ]
        )[0]
        == 0
    )
    after = {p.name for p in second.iterdir()}
    assert before | {"compare.json", "compare.html"} == after


def test_calibrate_never_writes_over_a_file_that_is_not_a_profile(tmp_path):
    pytest.importorskip("torch")
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}')
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    for out in (mine, link, tmp_path):
        code, err = _cli(["calibrate", "--nproc", "1", "--backend", "gloo", "--out", str(out)])
        assert code == 2 and err.count("\n") == 1 and str(out) in err, err
    assert mine.read_text() == '{"my": "data"}' and link.is_symlink()


@pytest.mark.parametrize(
    "out, says",
    [
        ("{tmp}/dangling", "is a symlink to"),
        ("/proc/parasim-x", "cannot be written"),
        ("{tmp}/file/sub", "is a file"),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_one_line(out, says, tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "file").write_text("mine")
    code, err = _cli(["run", SMALL, "--outputs", "result", "--out", out.format(tmp=tmp_path)])
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert (tmp_path / "dangling").is_symlink() and not (tmp_path / "missing").exists()
    assert (tmp_path / "file").read_text() == "mine"


def test_an_empty_output_folder_name_is_refused(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["run", SMALL, "--out", ""])
    assert ended.value.code == 2
    assert "empty folder name" in capsys.readouterr().err


def test_a_symlink_at_out_is_written_through_and_never_replaced(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert _cli(["run", SMALL, "--outputs", "result", "--out", str(link)])[0] == 0
    assert link.is_symlink() and (real / "result.json").is_file()
    assert (real / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_cache_folder_of_the_user_s_keeps_every_file(tmp_path):
    """``--cache DIR`` at a folder holding files (a ``.probe`` among them): the sweep
    adds its entries and touches nothing else."""
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    planted = _plant(cache, elsewhere, "sweep")
    (cache / ".probe").write_text("mine")
    planted[".probe"] = "mine"
    argv = ["sweep", SMALL, "--fix", "tp=2", "--workers", "1", "--top", "2"]
    for _ in range(2):
        assert _cli([*argv, "--cache", str(cache), "--out", str(tmp_path / "out")])[0] == 0
        _check(cache, elsewhere, planted)
