"""Output folders: where a command writes, checked before the work, and filled whole.

* :func:`default_folder` names the folder a command writes to when ``--out`` is not
  given: ``out/<name>`` where ``<name>`` is the scenario's name reduced to one safe
  path component (a shared scenario whose ``name`` is ``../../x`` or an absolute path
  still writes under ``out/``), followed by a short hash of the ``--set`` overrides when
  there are any, so a what-if never overwrites the scenario's own results.
* :func:`check_folder` refuses, before anything is simulated, a folder that cannot be
  written: a file in its place, or a parent that is a file or not writable.
* :func:`staged_folder` gives a command a fresh hidden folder beside the destination to
  write every file into; when the command succeeds the staged folder replaces the
  destination as a whole (two renames), and on every other exit it is removed. A
  destination is only ever replaced whole when parasim wrote it (it holds the
  :data:`MARKER` file, or only files of parasim's own names) or it is empty; a folder
  holding other files receives the new files one by one, as atomic replacements. A
  staging folder left by a killed process is removed by the next command that writes
  beside it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from simulator.common.errors import ParasimError

__all__ = ["MARKER", "safe_component", "default_folder", "check_folder", "staged_folder"]

#: The file that marks a folder as written by parasim (its content: the command).
MARKER = ".parasim"
#: Every name a parasim command writes into its folder (a folder holding only these may
#: be replaced whole even without the marker, as earlier versions wrote none).
OWN_NAMES = re.compile(
    r"^(result\.json|trace\.json|timeline\.html|report\.html|hta|images|[\w.-]+\.(png|svg)|"
    r"(sweep|scale|explain|compare|measured)\.(json|csv|html)|ranks|\.parasim|\..*\.tmp.*|"
    r"\.[\w.-]+\.[\w]{8})$"
)
_STAGE = ".parasim-stage-"
_OLD = ".parasim-old-"


def safe_component(name: str) -> str:
    """``name`` as one harmless path component: runs of characters other than letters,
    digits, ``.``, ``_`` and ``-`` become ``-``, and leading dots and dashes go."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return cleaned[:100] or "scenario"


def default_folder(name: str, suffix: str = "", overrides: Iterable[str] = ()) -> Path:
    """``out/<name><suffix>``, with ``-<hash>`` of the overrides when there are any."""
    folder = safe_component(name) + suffix
    overrides = list(overrides)
    if overrides:
        digest = hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]
        folder += f"-{digest}"
    return Path("out") / folder


def check_folder(path: Path, flag: str = "--out") -> Path:
    """``path``, after checking that a command can create or fill it."""
    if path.exists() and not path.is_dir():
        raise ParasimError(f"{flag}: {path} is a file, not a folder")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ParasimError(f"{flag}: cannot create {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ParasimError(f"{flag}: cannot write in {existing} (permission denied)")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clear_stale(parent: Path, name: str) -> None:
    """Remove staging and old folders of ``name`` left by processes no longer alive."""
    for prefix in (_STAGE, _OLD):
        for leftover in parent.glob(f".{name}{prefix}*"):
            pid = leftover.name.removeprefix(f".{name}{prefix}").split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)


def _replaceable(path: Path) -> bool:
    """Whether ``path`` may be replaced whole: parasim's folder, or an empty one."""
    if (path / MARKER).is_file():
        return True
    return all(OWN_NAMES.match(entry.name) for entry in path.iterdir())


def _swap(stage: Path, out: Path) -> None:
    if not out.exists():
        os.rename(stage, out)
        return
    if _replaceable(out):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}{_OLD}{os.getpid()}-", dir=out.parent))
        os.rename(out, old / out.name)
        os.rename(stage, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    for entry in sorted(stage.iterdir()):
        if entry.name == MARKER:
            continue  # not parasim's folder: it stays unmarked
        target = out / entry.name
        if entry.is_dir():
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(entry, target)
        else:
            os.replace(entry, target)


@contextmanager
def staged_folder(out: Path, command: str = "parasim") -> Iterator[Path]:
    """A fresh folder to write a command's files into, swapped in for ``out`` when the
    block ends normally and removed otherwise (:mod:`module docs <folders>`)."""
    check_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(out.parent, out.name)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}{_STAGE}{os.getpid()}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the folder gets normal permissions
    try:
        (stage / MARKER).write_text(f"written by {command}\n")
        yield stage
        _swap(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
