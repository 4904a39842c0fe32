"""Output folders: where a command writes, checked before the work, and filled with
parasim's own files only.

A folder given with ``--out`` may already hold files of the user's. parasim never
deletes, replaces or follows into them: it writes only its own files, and it knows its
own by the manifest it keeps in the folder, :data:`MARKER` (``.parasim``), which lists
every file and folder each command wrote there with the size, modification time and
inode it left them with. A path counts as parasim's only while it is listed *and*
unchanged since; a file the user edited, replaced or planted under one of parasim's
names is the user's.

* :func:`default_folder` names the folder a command writes to when ``--out`` is not
  given: ``out/<name>`` where ``<name>`` is the scenario's name reduced to one safe
  path component, followed by a short hash of the ``--set`` overrides when there are
  any, so a what-if never overwrites the scenario's own results.
* :func:`check_folder` refuses, before anything is simulated, a folder that cannot be
  written (a file in its place, a dangling symlink, a parent that is a file, not
  writable or not a real folder) and, given the names the command will write, one where
  such a name exists and is not parasim's: one line naming the folder and the name.
* :func:`staged_folder` gives a command a fresh hidden folder *inside* the destination
  to write every file into. When the block ends normally its files are moved into place
  one by one (``os.replace``, atomic each), with Ctrl-C and SIGTERM held back until the
  moves are done, so an interrupted command leaves the earlier files as they were. The
  same command's earlier files that this run did not write again (``trace.json`` when
  the trace is now ``trace.json.gz``) are removed, if unchanged; nothing else is ever
  removed. On every other exit the staging folder is removed, and so are the folders
  the command created, when they are still empty. A staging folder left by a killed
  process is removed by the next command that writes there.

While the files move, the manifest lists both runs' files and says a commit is under
way (``committing``); only a SIGKILL inside those few milliseconds can leave files of
both runs, and every one of them is still parasim's for the next command.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from simulator.common.errors import ParasimError
from simulator.common.files import write_atomically

__all__ = [
    "MARKER",
    "safe_component",
    "default_folder",
    "folder_argument",
    "check_folder",
    "staged_folder",
    "check_own_file",
    "Manifest",
]

#: The manifest of a folder parasim writes into (JSON; :class:`Manifest`).
MARKER = ".parasim"
_FORMAT = "parasim-output"
_VERSION = 1
#: What an earlier parasim wrote in :data:`MARKER`: a line, and no list of files.
_LEGACY = re.compile(r"^written by parasim[\w -]*\n?$")
_STAGE = ".parasim-stage-"
#: The file that marks a staging folder as parasim's own.
_STAGE_MARK = ".parasim-stage"


class FolderError(ParasimError):
    """An output folder that cannot be written, or holds a name that is not parasim's."""


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
        # imported here: hashlib loads OpenSSL (2.5 ms), which a command given --out, and
        # so every command's start, need not pay
        import hashlib

        digest = hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]
        folder += f"-{digest}"
    return Path("out") / folder


def folder_argument(text: str) -> Path:
    """``--out``'s type: a path, never the empty string (which would name the working
    directory without saying so)."""
    if not text.strip():
        import argparse

        raise argparse.ArgumentTypeError("an empty folder name (use --out . for this folder)")
    return Path(text)


# ------------------------------------------------------------------------ the manifest

_Stamp = tuple[int, int, int]  # size, modification time (ns), inode


def _stamp(path: Path) -> _Stamp | None:
    """A regular file's (size, mtime, inode), never following a symlink; None for
    anything else."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def _is_real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


@dataclass
class Manifest:
    """What parasim wrote in a folder: per command, each file's stamp and the folders
    it created (paths relative to the folder, ``/``-separated)."""

    files: dict[str, dict[str, _Stamp]] = field(default_factory=dict)
    folders: dict[str, list[str]] = field(default_factory=dict)
    committing: int | None = None
    #: ``.parasim`` is not a manifest: an earlier parasim's line, or the user's file
    unreadable: str | None = None

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MARKER
        if not os.path.lexists(path):
            return cls()
        if _stamp(path) is None:
            return cls(unreadable="not a file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return cls(unreadable="foreign")
        if _LEGACY.match(text):
            return cls(unreadable="legacy")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return cls(unreadable="foreign")
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            return cls(unreadable="foreign")
        try:  # a manifest edited by hand: any odd entry makes the whole of it the user's
            files = {
                str(command): {str(p): tuple(int(x) for x in s) for p, s in listing.items()}
                for command, listing in data.get("files", {}).items()
            }
            folders = {
                str(command): [str(p) for p in listing]
                for command, listing in data.get("folders", {}).items()
            }
            committing = data.get("committing")
        except (AttributeError, TypeError, ValueError):
            return cls(unreadable="foreign")
        if any(len(s) != 3 for listing in files.values() for s in listing.values()):
            return cls(unreadable="foreign")
        stamps = cast("dict[str, dict[str, _Stamp]]", files)  # each one of three, just checked
        return cls(stamps, folders, committing if isinstance(committing, int) else None)

    def write(self, folder: Path) -> None:
        payload: dict[str, Any] = {
            "format": _FORMAT,
            "version": _VERSION,
            "files": {c: {p: list(s) for p, s in sorted(f.items())} for c, f in self.files.items()},
            "folders": {c: sorted(f) for c, f in self.folders.items()},
        }
        if self.committing is not None:
            payload["committing"] = self.committing
        text = json.dumps(payload, indent=1, sort_keys=True) + "\n"
        write_atomically(folder / MARKER, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def owns_file(self, folder: Path, relative: str) -> bool:
        """Whether ``relative`` is a file parasim wrote there and nobody changed since."""
        stamp = _stamp(folder / relative)
        return stamp is not None and any(
            listing.get(relative) == stamp for listing in self.files.values()
        )

    def owns_folder(self, folder: Path, relative: str) -> bool:
        """Whether ``relative`` is a real folder that parasim created there."""
        return _is_real_folder(folder / relative) and any(
            relative in listing for listing in self.folders.values()
        )


# ------------------------------------------------------------------------- the checks


def _fail(flag: str, path: Path, reason: str) -> FolderError:
    return FolderError(f"{flag}: {path} {reason}")


def _target(path: Path, flag: str) -> Path:
    """The folder ``path`` names: itself, or the folder a symlink at ``path`` points to
    (which is written into, never replaced)."""
    if str(path) == "":
        raise _fail(flag, path, "is an empty folder name")
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if not target.exists():
            raise _fail(flag, path, f"is a symlink to {target}, which does not exist")
        if not target.is_dir():
            raise _fail(flag, path, f"is a symlink to {target}, which is not a folder")
        return target
    return path


def _clash(folder: Path, manifest: Manifest, relative: str, flag: str, shown: Path) -> None:
    """Refuse when ``relative`` exists in ``folder`` and is not parasim's."""
    path = folder / relative
    if not os.path.lexists(path):
        return
    if manifest.owns_file(folder, relative) or manifest.owns_folder(folder, relative):
        return
    if path.is_symlink():
        what = "is a symlink"
    elif manifest.unreadable == "legacy":
        what = "was written by an earlier parasim that kept no list of its files"
    elif _stamp(path) is not None and any(relative in f for f in manifest.files.values()):
        what = "was changed since parasim wrote it"
    else:
        what = "is not parasim's"
    raise _fail(
        flag,
        shown,
        f"holds {relative}, which {what}; parasim writes only its own files: move it, or "
        "choose another folder",
    )


def check_folder(path: Path, flag: str = "--out", names: Iterable[str] = ()) -> Path:
    """``path``, after checking that a command can create or fill it, and that none of
    ``names`` (the files and folders the command writes there) exists there and is not
    parasim's."""
    target = _target(path, flag)
    if os.path.lexists(target) and not target.is_dir():
        raise _fail(flag, path, "is a file, not a folder")
    existing = target
    while not os.path.lexists(existing):
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():
        raise _fail(flag, path, f"cannot be created: {existing} is a dangling symlink")
    if os.path.lexists(existing) and not existing.is_dir():
        raise _fail(flag, path, f"cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _fail(flag, path, f"cannot be written: no permission in {existing}")
    if target.is_dir():
        manifest = Manifest.read(target)
        if manifest.unreadable in ("foreign", "not a file"):
            _clash(target, manifest, MARKER, flag, path)
        for name in names:
            _clash(target, manifest, name, flag, path)
    return path


def check_own_file(path: Path, flag: str, is_own: Callable[[Path], bool], what: str) -> Path:
    """``path``, a file a command writes (a profile), after checking that its folder can
    be written and that nothing of the user's is there: no folder, symlink or other
    kind of file, and no regular file that ``is_own`` does not recognise as ``what``."""
    if os.path.lexists(path):
        if path.is_symlink():
            raise _fail(flag, path, "is a symlink; parasim writes only its own files")
        if path.is_dir():
            raise _fail(flag, path, f"is a folder; {what} is one file")
        if _stamp(path) is None or not is_own(path):
            raise _fail(flag, path, f"exists and is not {what}; parasim writes only its own files")
    check_folder(path.parent if str(path.parent) else Path("."), flag)
    return path


# --------------------------------------------------------------- writing into a folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clear_stale_stages(folder: Path) -> None:
    """Remove staging folders that processes no longer alive left in ``folder``: real
    folders of the staging name that hold the staging mark, nothing else."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(_STAGE) or not entry.is_dir(follow_symlinks=False):
            continue
        pid = entry.name.removeprefix(_STAGE).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)) and _stamp(Path(entry.path, _STAGE_MARK)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _make_folders(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents; the folders created, outermost first."""
    missing = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    created = []
    for folder in reversed(missing):
        os.mkdir(folder)
        created.append(folder)
    return created


def _remove_if_empty(folders: Iterable[Path]) -> None:
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def _staged_paths(stage: Path) -> tuple[list[str], list[str]]:
    """The files and folders written in ``stage`` (relative, parents before children),
    the staging mark left out."""
    files, folders = [], []
    for root, dirs, names in os.walk(stage):
        base = Path(root).relative_to(stage)
        dirs.sort()
        for name in dirs:
            folders.append((base / name).as_posix())
        for name in sorted(names):
            if base == Path(".") and name == _STAGE_MARK:
                continue
            files.append((base / name).as_posix())
    return files, folders


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (in the main thread)."""
    held = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The folder to this process alone (``flock`` on the folder itself, where the
    system has it): two commands that finish at once into one folder take turns, so
    neither loses the other's entries of the manifest."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def _commit(stage: Path, folder: Path, command: str, flag: str, shown: Path) -> None:
    """Move the staged files into ``folder`` (module docs), holding its lock."""
    with _locked(folder):
        _commit_locked(stage, folder, command, flag, shown)


def _commit_locked(stage: Path, folder: Path, command: str, flag: str, shown: Path) -> None:
    manifest = Manifest.read(folder)
    files, folders = _staged_paths(stage)
    for relative in [MARKER, *folders, *files]:
        if relative == MARKER and manifest.unreadable in (None, "legacy"):
            continue  # parasim's own manifest, or an earlier parasim's line
        if relative in folders and manifest.owns_folder(folder, relative):
            continue
        _clash(folder, manifest, relative, flag, shown)
    for relative in folders:  # a folder that exists must be a real one all the way down
        if os.path.lexists(folder / relative) and not _is_real_folder(folder / relative):
            _clash(folder, Manifest(), relative, flag, shown)
    # the staged files are regular files, each with a stamp
    stamps = {relative: cast(_Stamp, _stamp(stage / relative)) for relative in files}
    earlier = manifest.files.get(command, {})
    kept = {
        other: {
            p: s for p, s in listing.items() if p not in stamps and manifest.owns_file(folder, p)
        }
        for other, listing in manifest.files.items()
        if other != command
    }
    created_before = [p for p in manifest.folders.get(command, []) if _is_real_folder(folder / p)]
    with _signals_held():
        journal = Manifest(
            files={**kept, command: {**earlier, **stamps}},
            folders={**manifest.folders, command: sorted({*created_before, *folders})},
            committing=os.getpid(),
        )
        journal.write(folder)
        made = set(created_before)
        for relative in folders:
            if not os.path.lexists(folder / relative):
                os.mkdir(folder / relative)
                made.add(relative)
        for relative in files:
            os.replace(stage / relative, folder / relative)
        for relative, old_stamp in earlier.items():
            if relative not in stamps and _under_real_folders(folder, relative):
                if _stamp(folder / relative) == old_stamp:
                    os.unlink(folder / relative)
        left = set()
        for relative in sorted(made, key=lambda p: p.count("/"), reverse=True):
            if relative in folders:
                left.add(relative)
                continue
            try:
                os.rmdir(folder / relative)
            except OSError:
                left.add(relative)
        final = Manifest(  # the files just moved in are regular files, each with a stamp
            files={**kept, command: {p: cast(_Stamp, _stamp(folder / p)) for p in files}},
            folders={**manifest.folders, command: sorted(left)},
        )
        final.write(folder)


def _under_real_folders(folder: Path, relative: str) -> bool:
    """Whether every folder between ``folder`` and ``relative`` is a real folder (no
    symlink is ever followed to remove a file)."""
    parent = Path(relative).parent
    parts = parent.parts
    return all(_is_real_folder(folder.joinpath(*parts[: i + 1])) for i in range(len(parts)))


def _os_failure(flag: str, path: Path, exc: OSError) -> FolderError:
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return _fail(flag, path, f"cannot be written: {reason}{where}")


@contextmanager
def staged_folder(
    out: Path, command: str = "parasim", names: Iterable[str] = (), flag: str = "--out"
) -> Iterator[Path]:
    """A fresh folder inside ``out`` to write a command's files into, whose files are
    moved into ``out`` when the block ends normally (:mod:`module docs <folders>`)."""
    check_folder(out, flag, names)
    folder = _target(out, flag)
    try:
        created = _make_folders(folder)
    except OSError as exc:
        raise _os_failure(flag, out, exc) from None
    stage: Path | None = None
    committed = False
    try:
        _clear_stale_stages(folder)
        stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE}{os.getpid()}-", dir=folder))
        umask = os.umask(0)
        os.umask(umask)
        stage.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the folders get normal permissions
        (stage / _STAGE_MARK).write_text(f"{command}\n")
        try:
            yield stage
        except OSError as exc:
            raise _os_failure(flag, out, exc) from None
        try:
            _commit(stage, folder, command, flag, out)
        except OSError as exc:
            raise _os_failure(flag, out, exc) from None
        committed = True
    except OSError as exc:
        raise _os_failure(flag, out, exc) from None
    finally:
        if stage is not None and _is_real_folder(stage):
            shutil.rmtree(stage, ignore_errors=True)
        if not committed:
            _remove_if_empty(created)
